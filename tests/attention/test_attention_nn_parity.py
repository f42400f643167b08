"""What jax.nn's own attention tests exercise, on our CPU paths (the CPU twin "ffi" and the XLA reference "xla")
against jax.nn's XLA path: every mask mode with a bias and its gradient, GQA with and without vmap, float64
masks under jax.debug_infs, and no warnings on supported inputs."""

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import qkv
from helpers import rel_err

import jax_ops

IMPLS = ["ffi", "xla"]
B, T, S, N, K, D = 2, 12, 16, 4, 2, 8


def nn_xla(q, k, v, bias=None, mask=None, **kw):
    return jax.nn.dot_product_attention(q, k, v, bias, mask, implementation="xla", **kw)


def custom_mask(shape, seed):
    """A random bool mask in which key 0 is always visible, so no row is empty (where jax.nn's rule differs)."""
    return jax.random.bernoulli(jax.random.key(seed), 0.6, shape).at[..., 0].set(True)


# mask mode -> (keywords of the call, bias shape). Every mode carries a bias, so dbias is checked in each; the bias
# and mask shapes cover the broadcast forms (key padding [B,1,1,S], shared [1,1,T,S], per head, full, rank 2).
MODES = {
    "bias": (dict(), (B, N, T, S)),
    "causal": (dict(is_causal=True), (1, N, T, S)),
    "padding": (dict(query_seq_lengths=(T, 7), key_value_seq_lengths=(S, 5)), (B, 1, 1, S)),
    "custom": (dict(mask=(B, 1, T, S)), (1, 1, T, S)),
    "key_padding_mask": (dict(mask=(B, 1, 1, S)), (T, S)),
    "custom_padding": (dict(mask=(1, N, T, S), query_seq_lengths=(5, T)), (B, 1, T, S)),
    "causal_window": (dict(is_causal=True, local_window_size=(3, 2)), (1, 1, T, S)),
}


def mode_kwargs(mode):
    kw, bias_shape = MODES[mode]
    kw = dict(kw)
    if "mask" in kw:
        kw["mask"] = custom_mask(kw["mask"], seed=len(mode))
    for name in ("query_seq_lengths", "key_value_seq_lengths"):
        if name in kw:
            kw[name] = jnp.array(kw[name], jnp.int32)
    return kw, jax.random.normal(jax.random.key(3), bias_shape)


@pytest.mark.parametrize("mode", list(MODES))
def test_mask_modes_with_bias_grad(mode):
    q, k, v = qkv(B, T, S, N, K, D, seed=1)
    kw, bias = mode_kwargs(mode)
    w = jax.random.normal(jax.random.key(4), q.shape)

    def value_and_grads(fn):
        loss = lambda q, k, v, b: jnp.sum(w * fn(q, k, v, b, **kw))  # noqa: E731
        return jax.jit(lambda *a: (fn(*a, **kw), jax.grad(loss, (0, 1, 2, 3))(*a)))(q, k, v, bias)

    ref, g_ref = value_and_grads(nn_xla)
    for impl in IMPLS:
        ours = functools.partial(jax_ops.dot_product_attention, implementation=impl)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # supported inputs: no fallback, no warning
            out, g = value_and_grads(ours)
        assert rel_err(out, ref) < 1e-5, impl
        for name, a, b in zip(("dq", "dk", "dv", "dbias"), g, g_ref):
            assert a.shape == b.shape, name
            assert rel_err(a, b) < 1e-5, f"{impl} {name}"


@pytest.mark.parametrize("kv_heads,use_vmap", [(2, False), (2, True), (1, True)])  # GQA, MQA
def test_gqa_with_and_without_vmap(kv_heads, use_vmap):
    q, k, v = qkv(B, T, S, N, kv_heads, D, seed=2)
    if use_vmap:  # a leading mapped axis of 2 over every input
        q, k, v = (jnp.stack([x, -0.5 * x]) for x in (q, k, v))
    w = jax.random.normal(jax.random.key(5), q.shape)

    def value_and_grads(fn):
        f = jax.vmap(fn) if use_vmap else fn
        loss = lambda q, k, v: jnp.sum(w * f(q, k, v))  # noqa: E731
        return jax.jit(lambda *a: (f(*a), jax.grad(loss, (0, 1, 2))(*a)))(q, k, v)

    ref, g_ref = value_and_grads(lambda q, k, v: nn_xla(q, k, v, is_causal=True))
    for impl in IMPLS:
        out, g = value_and_grads(
            functools.partial(jax_ops.dot_product_attention, is_causal=True, implementation=impl)
        )
        assert rel_err(out, ref) < 1e-5, impl
        for name, a, b in zip(("dq", "dk", "dv"), g, g_ref):
            assert rel_err(a, b) < 1e-5, f"{impl} {name}"


def test_float64_masks_under_debug_infs(x64):
    # The reference masks with a finite fill, so finite float64 inputs with masked keys, and even a row with no
    # key, create no inf on the way: eagerly (every op's result is checked) and jitted, forward and gradient; only
    # the residual of an empty row is -inf by definition.
    q, k, v = (x.astype(jnp.float64) for x in qkv(B, T, S, N, K, D, seed=3))
    mask = custom_mask((B, 1, T, S), seed=6).at[1, 0, 4].set(False)  # row 4 of batch 1: no key
    rows = np.asarray(mask.any(-1)).transpose(0, 2, 1)  # [B, T, 1]: rows with a key
    f = lambda q, k, v: jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="xla")  # noqa: E731
    with jax.debug_infs(True):
        assert np.all(np.asarray(f(*(jnp.zeros_like(x) for x in (q, k, v)))) == 0)  # jax#37422's inputs
        out = f(q, k, v)
        g = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), (0, 1, 2)))(q, k, v)
        out_jit = jax.jit(f)(q, k, v)
        full = custom_mask((B, 1, T, S), seed=6)
        _, res = jax_ops.dot_product_attention(q, k, v, mask=full, implementation="xla", return_residual=True)
    assert out.dtype == jnp.float64 and np.isfinite(np.asarray(res)).all()
    np.testing.assert_array_equal(out, out_jit)
    assert all(np.isfinite(np.asarray(x)).all() for x in g)
    ref = jax.jit(nn_xla)(q, k, v, mask=mask)  # jax.nn runs its softmax in float32
    np.testing.assert_allclose(
        np.where(rows[..., None], out, 0), np.where(rows[..., None], ref, 0), atol=1e-6
    )
    assert np.all(np.asarray(out)[1, 4] == 0)


def test_float32_masks_under_debug_infs_ffi():
    # The CPU twin with masked keys (no empty row: the kernel's residual of an empty row is -inf by contract).
    q, k, v = qkv(B, T, S, N, K, D, seed=4)
    mask = custom_mask((B, N, T, S), seed=7)
    kw = dict(mask=mask, is_causal=True, key_value_seq_lengths=jnp.array([S, 6], jnp.int32))
    f = lambda q, k, v: jax_ops.dot_product_attention(q, k, v, implementation="ffi", **kw)  # noqa: E731
    with jax.debug_infs(True):
        out = f(q, k, v)
        g = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), (0, 1, 2)))(q, k, v)
    assert rel_err(out, jax.jit(functools.partial(nn_xla, **kw))(q, k, v)) < 1e-5
    assert all(np.isfinite(np.asarray(x)).all() for x in g)
