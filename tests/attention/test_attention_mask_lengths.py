"""Masks that are really lengths (jax_ops/_src/attention/masks.py): the form check, and the same attention and
gradients from the length path as from the mask path (CPU twin against the XLA reference)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import qkv

import jax_ops
from jax_ops._src.attention import validation
from jax_ops._src.attention.masks import mask_as_lengths, mask_variants
from jax_ops._src.attention.vjp import attention_vjp

B, T, S = 3, 12, 20


def padding(lq, lk, causal=False, rows=T):
    t = np.arange(rows)[:, None]
    s = np.arange(S)[None, :]
    m = (t < np.asarray(lq)[:, None, None]) & (s < np.asarray(lk)[:, None, None])
    if causal:
        m = m & (s <= t)
    return jnp.asarray(m[:, None])


def test_form_check():
    keys = padding([1, 1, 1], [20, 7, 0], rows=1)  # [B,1,1,S] key padding; one request keeps nothing
    lq, lk, (is_padding, is_causal) = mask_as_lengths(keys, B)
    assert lq is None and is_causal is None and bool(is_padding)
    np.testing.assert_array_equal(lk, [20, 7, 0])
    # the same lengths broadcast from one row to the batch
    _, lk1, (is_padding1, _) = mask_as_lengths(keys[1:2], B)
    assert bool(is_padding1) and list(np.asarray(lk1)) == [7, 7, 7]
    both = padding([12, 5, 9], [20, 7, 3])  # flax-style query & key padding [B,1,T,S]
    lq, lk, (is_padding, is_causal) = mask_as_lengths(both, B)
    assert bool(is_padding) and not bool(is_causal)
    np.testing.assert_array_equal(lq, [12, 5, 9])
    np.testing.assert_array_equal(lk, [20, 7, 3])
    causal = padding([12, 5, 9], [20, 7, 3], causal=True)
    lq, lk, (is_padding, is_causal) = mask_as_lengths(causal, B)
    assert not bool(is_padding) and bool(is_causal)
    np.testing.assert_array_equal(lq, [12, 5, 9])
    np.testing.assert_array_equal(lk, [12, 5, 3])  # causal: keys past the last row are never seen
    holes = keys.at[0, 0, 0, 3].set(False)  # not a prefix: the mask path
    assert not bool(mask_as_lengths(holes, B)[2][0])
    shifted = (
        padding([12, 5, 9], [20, 7, 3]).at[1, 0, 2, :].set(False)
    )  # a masked row inside the query prefix
    assert not any(bool(x) for x in mask_as_lengths(shifted, B)[2])


MASKS = {
    "keys": padding([1, 1, 1], [20, 7, 0], rows=1),
    "keys-one": padding([1], [9], rows=1),
    "query-and-keys": padding([12, 5, 9], [20, 7, 3]),
    "causal-padding": padding([12, 5, 9], [20, 7, 3], causal=True),
    "causal-only": padding([12, 12, 12], [20, 20, 20], causal=True),
    "holes": padding([1, 1, 1], [20, 7, 4], rows=1).at[0, 0, 0, 3].set(False),
}


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("name", list(MASKS))
def test_same_attention_and_grads_as_the_mask(name, is_causal):
    mask = MASKS[name]
    q, k, v = qkv(B, T, S, 4, 2, 16, seed=3)
    bias = jax.random.normal(jax.random.key(1), (1, 4, T, S))
    kvl = jnp.asarray([15, 20, 2], jnp.int32)  # combined with the mask's own key lengths

    def loss(impl, q, k, v, bias):
        o, lse = jax_ops.dot_product_attention(
            q, k, v, bias, mask, is_causal=is_causal, key_value_seq_lengths=kvl, implementation=impl,
            return_residual=True,
        )  # fmt: skip
        w = jnp.cos(jnp.arange(o.size, dtype=o.dtype).reshape(o.shape))
        return jnp.sum(o * w), (o, lse)

    grad = jax.grad(loss, argnums=(1, 2, 3, 4), has_aux=True)
    (dq, dk, dv, db), (o, lse) = jax.jit(grad, static_argnums=0)("ffi", q, k, v, bias)
    (rq, rk, rv, rb), (ro, rlse) = jax.jit(grad, static_argnums=0)("xla", q, k, v, bias)
    np.testing.assert_allclose(o, ro, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(rlse))  # the same empty rows
    np.testing.assert_allclose(
        np.where(np.isfinite(rlse), lse, 0), np.where(np.isfinite(rlse), rlse, 0), atol=2e-5
    )
    for got, ref in ((dq, rq), (dk, rk), (dv, rv), (db, rb)):
        np.testing.assert_allclose(got, ref, atol=5e-5, rtol=5e-5)


def test_switch_only_for_head_broadcast_masks():
    q, k, v = qkv(B, T, S, 4, 2, 16)

    def prims(mask):  # the printed jaxpr, custom_vjp bodies included
        def f(q):
            return jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="ffi")

        return str(jax.make_jaxpr(jax.grad(lambda q: jnp.sum(f(q))))(q))

    assert prims(MASKS["keys"]).count("cond[") == 2  # inside the custom_vjp: forward and backward
    assert "cond[" not in prims(jnp.ones((B, 4, T, S), bool))  # per-head masks stay masks
    assert "cond[" not in prims(None)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("name", list(MASKS))
def test_each_branch_where_it_is_taken(name, is_causal):
    """The branch the check picks, run alone (the switch above would hide a wrong length branch behind a
    correct mask branch only if the check also failed): the padding masks take a length branch, and it equals
    the reference with the mask."""
    mask = MASKS[name]
    q, k, v = qkv(B, T, S, 4, 2, 16, seed=5)
    kvl = jnp.asarray([15, 20, 2], jnp.int32)
    cfg, (q, k, v, bias, mask, qsl, kvsl) = validation.normalize(
        q, k, v, None, mask, None, is_causal, None, kvl, None
    )
    index, variants = mask_variants(cfg, q, k, mask, qsl, kvsl)
    assert (int(index) == 0) == (name == "holes")
    c, m, qs, ks = variants[int(index)]
    assert (m is None) == (name != "holes")
    o, lse = attention_vjp(c, q, k, v, bias, m, qs, ks)
    ro, rlse = jax_ops.dot_product_attention(
        q, k, v, None, mask, is_causal=is_causal, key_value_seq_lengths=kvl, implementation="xla",
        return_residual=True,
    )  # fmt: skip
    np.testing.assert_allclose(o, ro, atol=2e-5, rtol=2e-5)
    rlse = np.transpose(np.asarray(rlse), (0, 2, 1))  # the kernel's lse is [B, N, T]
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(rlse))


def test_vmap_over_masks():
    """vmap with a batched mask: the switch becomes a select over the branches, the result the same."""
    q, k, v = qkv(B, T, S, 4, 2, 16, seed=7)
    masks = jnp.stack([MASKS["keys"], MASKS["holes"]])

    def f(mask, impl):
        return jax_ops.dot_product_attention(q, k, v, mask=mask, implementation=impl)

    got = jax.vmap(lambda m: f(m, "ffi"))(masks)
    ref = jax.vmap(lambda m: f(m, "xla"))(masks)
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize(
    "mask", [jnp.asarray(True), jnp.ones((1, 1, 1, 1), bool), padding([3, 12, 0], [1, 1, 1])[..., :1]]
)
def test_masks_broadcast_over_keys_stay_masks(mask):
    """A mask of one key column ([..., 1]) is broadcast over the keys: no key length (it would read as kv_len 1)."""
    q, k, v = qkv(B, T, S, 4, 2, 16, seed=9)
    cfg, (q, k, v, bias, m, qsl, kvsl) = validation.normalize(
        q, k, v, None, mask, None, False, None, None, None
    )
    assert mask_variants(cfg, q, k, m, qsl, kvsl) is None
    got = jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="ffi")
    ref = jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="xla")
    np.testing.assert_allclose(got, ref, atol=2e-5, rtol=2e-5)
