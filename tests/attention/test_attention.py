"""CPU tests of jax_ops.dot_product_attention: the CPU twin of the FFI contract ("ffi") and the XLA reference
("xla") against jax.nn, over the shared case suite (attention_cases.py)."""

import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from attention_cases import SHAPES, TOL, qkv, shape_id
from helpers import rel_err
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_ops
from jax_ops import attention, reference
from jax_ops._src import dispatch
from jax_ops._src.attention import heuristics, validation

BACKENDS = ["ffi", "xla"]  # the CPU twin and the XLA reference run the same cases
ffi_attention = functools.partial(jax_ops.dot_product_attention, implementation="ffi")


def nn_xla(q, k, v, bias=None, mask=None, **kw):
    return jax.nn.dot_product_attention(q, k, v, bias, mask, implementation="xla", **kw)


def nonempty_rows(q, k, v, bias=None, mask=None, **kw):
    """[B, T, N] bool: rows that have at least one allowed key (where jax.nn and the contract agree)."""
    _, lse = jax_ops.dot_product_attention(
        q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), bias, mask,
        implementation="xla", return_residual=True, **kw,
    )  # fmt: skip
    return np.isfinite(np.asarray(lse))


# ------------------------------------------------------------------------------------ forward vs jax.nn
@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("is_causal", [False, True])
def test_forward_matches_jax_nn(shape, is_causal, impl):
    q, k, v = qkv(*shape)
    out = jax_ops.dot_product_attention(q, k, v, is_causal=is_causal, implementation=impl)
    ref = nn_xla(q, k, v, is_causal=is_causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    assert rel_err(out, ref) < TOL[jnp.float32]


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("window", [3, (0, 5), (7, 0), (None, 2), (4, None)])
@pytest.mark.parametrize("is_causal", [False, True])
def test_local_window(window, is_causal, impl):
    q, k, v = qkv(2, 40, 33, 4, 2, 16)
    kw = dict(is_causal=is_causal, local_window_size=window)
    out = jax_ops.dot_product_attention(q, k, v, implementation=impl, **kw)
    ref_kw = dict(kw)
    if isinstance(window, tuple):  # jax.nn has no "unbounded" side: a window wider than S is the same thing
        ref_kw["local_window_size"] = tuple(100 if w is None else w for w in window)
    ref = nn_xla(q, k, v, **ref_kw)
    rows = nonempty_rows(q, k, v, **kw)
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(ref)[rows], atol=2e-5, rtol=2e-5)
    assert np.all(np.asarray(out)[~rows] == 0)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("is_causal", [False, True])
def test_dtypes_vs_fp32_reference(dtype, is_causal):
    q, k, v = qkv(2, 100, 100, 4, 2, 64, dtype=dtype)
    out = jax_ops.dot_product_attention(q, k, v, is_causal=is_causal, implementation="ffi")
    assert out.dtype == dtype
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref = nn_xla(f32(q), f32(k), f32(v), is_causal=is_causal)
    assert rel_err(out, ref) < TOL[dtype]


MASK_SHAPES = [(2, 1, 1, 20), (1, 1, 12, 20), (2, 4, 12, 20), (12, 20), (1, 4, 1, 1)]


@pytest.mark.parametrize("mshape", MASK_SHAPES, ids=str)
def test_mask_broadcast(mshape):
    q, k, v = qkv(2, 12, 20, 4, 2, 16)
    mask = jax.random.bernoulli(jax.random.key(5), 0.7, mshape)
    if mshape == (2, 1, 1, 20):  # key padding: first 5 keys always visible
        mask = mask.at[..., :5].set(True)
    out = jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="ffi")
    ref = nn_xla(q, k, v, mask=mask)
    rows = nonempty_rows(q, k, v, mask=mask)
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(ref)[rows], atol=2e-5, rtol=2e-5)
    assert np.all(np.asarray(out)[~rows] == 0)


BIAS_SHAPES = [(2, 4, 12, 20), (1, 4, 12, 20), (2, 1, 1, 20), (12, 20), (1, 1, 12, 1)]


@pytest.mark.parametrize("bshape", BIAS_SHAPES, ids=str)
@pytest.mark.parametrize("bias_dtype", [jnp.float32, jnp.bfloat16])
def test_bias_broadcast(bshape, bias_dtype):
    q, k, v = qkv(2, 12, 20, 4, 2, 16)
    bias = jax.random.normal(jax.random.key(7), bshape).astype(bias_dtype)
    out = jax_ops.dot_product_attention(q, k, v, bias, is_causal=True, implementation="ffi")
    ref = nn_xla(q, k, v, bias.astype(jnp.float32), is_causal=True)
    assert rel_err(out, ref) < TOL[jnp.float32]


def test_seq_lengths():
    q, k, v = qkv(3, 20, 30, 4, 2, 16)
    qs = jnp.array([20, 7, 1], jnp.int32)
    kvs = jnp.array([30, 12, 3], jnp.int32)
    kw = dict(query_seq_lengths=qs, key_value_seq_lengths=kvs, is_causal=True)
    out = jax_ops.dot_product_attention(q, k, v, implementation="ffi", **kw)
    ref = nn_xla(q, k, v, **kw)  # jax.nn zeroes padded query rows too
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    assert np.all(np.asarray(out)[1, 7:] == 0)


def test_fully_masked_rows_zero_and_finite_grads():
    q, k, v = qkv(2, 8, 10, 2, 1, 16)
    mask = jnp.ones((2, 1, 8, 10), bool).at[0, :, 3, :].set(False).at[1, :, :, :].set(False)
    bias = jnp.zeros((1, 1, 8, 10)).at[0, 0, 5, :].set(-jnp.inf)  # an all -inf bias row is empty too
    out, res = jax_ops.dot_product_attention(q, k, v, bias, mask, implementation="ffi", return_residual=True)
    out, res = np.asarray(out), np.asarray(res)
    assert not np.isnan(out).any()
    assert np.all(out[0, 3] == 0) and np.all(out[0, 5] == 0) and np.all(out[1] == 0)
    assert np.all(res[0, 3] == -np.inf) and np.all(res[1] == -np.inf) and np.isfinite(res[0, 0]).all()

    def loss(impl):
        return lambda q, k, v: jnp.sum(
            jnp.sin(jax_ops.dot_product_attention(q, k, v, bias, mask, implementation=impl))
        )

    g = jax.grad(loss("ffi"), argnums=(0, 1, 2))(q, k, v)
    g_ref = jax.grad(loss("xla"), argnums=(0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref):
        assert np.isfinite(np.asarray(a)).all()
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)
    assert np.all(np.asarray(g[0])[0, 3] == 0) and np.all(np.asarray(g[1])[1] == 0)


def test_empty_key_sequence():
    q, k, v = qkv(1, 5, 0, 2, 2, 8)
    out, res = jax_ops.dot_product_attention(q, k, v, implementation="ffi", return_residual=True)
    assert np.all(np.asarray(out) == 0) and np.all(np.asarray(res) == -np.inf)


def test_return_residual_and_3d_layout():
    q, k, v = qkv(1, 17, 23, 4, 2, 16)
    out, res = ffi_attention(q[0], k[0], v[0], is_causal=True, return_residual=True)
    ref, ref_res = nn_xla(q[0], k[0], v[0], is_causal=True, return_residual=True)
    assert out.shape == (17, 4, 16) and res.shape == (17, 4) and res.dtype == q.dtype
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(res, ref_res, atol=2e-5, rtol=2e-5)


def test_xla_implementation_matches_ffi():
    q, k, v = qkv(2, 17, 30, 4, 2, 16)
    bias = jax.random.normal(jax.random.key(1), (1, 4, 17, 30))
    kw = dict(is_causal=True, local_window_size=(5, 1), key_value_seq_lengths=jnp.array([30, 9], jnp.int32))
    a = jax_ops.dot_product_attention(q, k, v, bias, implementation="ffi", **kw)
    b = jax_ops.dot_product_attention(q, k, v, bias, implementation="xla", **kw)
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=2e-5)


# ---------------------------------------------------------------------------------------------- gradients
GRAD_CASES = {
    "mha_causal": dict(shape=(2, 17, 17, 4, 4, 16), is_causal=True),
    "gqa_T_ne_S": dict(shape=(2, 20, 33, 4, 2, 16)),
    "mqa_window": dict(shape=(1, 30, 30, 4, 1, 8), local_window_size=(4, 2)),
    "seqlens": dict(shape=(2, 12, 70, 2, 1, 16), seqlens=True),
}


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("case", list(GRAD_CASES))
@pytest.mark.parametrize("with_bias", [False, True])
def test_grads_vs_jax_nn(case, with_bias, impl):
    c = dict(GRAD_CASES[case])
    B, T, S, N, K, D = c.pop("shape")
    q, k, v = qkv(B, T, S, N, K, D, seed=3)
    if c.pop("seqlens", False):
        c["query_seq_lengths"] = jnp.array([T, T // 2], jnp.int32)
        c["key_value_seq_lengths"] = jnp.array([S, 5], jnp.int32)
    bias = jax.random.normal(jax.random.key(9), (1, N, T, S)) if with_bias else None
    w = jax.random.normal(jax.random.key(4), (B, T, N, D))

    def loss(fn):
        return lambda q, k, v, b: jnp.sum(w * fn(q, k, v, b, **c))

    ours = lambda q, k, v, b, **kw: jax_ops.dot_product_attention(q, k, v, b, implementation=impl, **kw)  # noqa: E731
    refn = lambda q, k, v, b, **kw: nn_xla(q, k, v, b, **kw)  # noqa: E731
    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
    g = jax.grad(loss(ours), argnums=argnums)(q, k, v, bias)
    g_ref = jax.grad(loss(refn), argnums=argnums)(q, k, v, bias)
    for name, a, b in zip("q k v bias".split(), g, g_ref):
        assert rel_err(a, b) < 1e-5, name


class _GpuDispatch:
    """dispatch as ffi.py sees it on a GPU (the rest of the package keeps the real platform)."""

    @staticmethod
    def platform():
        return "gpu"


@pytest.mark.parametrize("bshape", [(1, 4, 9, 11), (2, 1, 1, 11), (1, 1, 1, 11), (2, 4, 9, 11)])
def test_bias_grad_as_scores(monkeypatch, bshape):
    # The GPU form of the bias gradient (the kernel writes dS [B, N, T, S] f32, XLA sums the broadcast dims),
    # through the CPU twin, which writes either form: against jax.nn's gradient, and the bias-shaped form.
    from jax_ops._src.attention import ffi as attention_ffi

    q, k, v = qkv(2, 9, 11, 4, 2, 8, seed=5)
    bias = jax.random.normal(jax.random.key(6), bshape)
    w = jax.random.normal(jax.random.key(7), q.shape)

    def loss(fn):
        return lambda q, k, v, b: jnp.sum(w * fn(q, k, v, b, is_causal=True))

    ours = lambda q, k, v, b, **kw: jax_ops.dot_product_attention(q, k, v, b, implementation="ffi", **kw)  # noqa: E731
    g_shaped = jax.grad(loss(ours), (0, 1, 2, 3))(q, k, v, bias)
    monkeypatch.setattr(attention_ffi, "dispatch", _GpuDispatch)
    with attention.overrides(hopper_bwd_mods=True):
        g_scores = jax.grad(loss(ours), (0, 1, 2, 3))(q, k, v, bias)
    g_ref = jax.grad(loss(nn_xla), (0, 1, 2, 3))(q, k, v, bias)
    assert g_scores[3].shape == bias.shape and g_scores[3].dtype == bias.dtype
    for name, a, b, c in zip("q k v bias".split(), g_scores, g_ref, g_shaped):
        assert rel_err(a, b) < 1e-5, name
        assert rel_err(a, c) < 1e-6, name


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_grads_low_precision(dtype):
    q, k, v = qkv(1, 40, 40, 4, 2, 32, dtype=dtype)
    w = jax.random.normal(jax.random.key(4), q.shape)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    g = jax.grad(lambda *a: jnp.sum(w * f32(ffi_attention(*a, is_causal=True))), (0, 1, 2))(q, k, v)
    g_ref = jax.grad(lambda *a: jnp.sum(w * nn_xla(*a, is_causal=True)), (0, 1, 2))(f32(q), f32(k), f32(v))
    for a, b in zip(g, g_ref):
        assert a.dtype == dtype
        assert rel_err(a, b) < 2 * TOL[dtype]


def test_check_grads_tiny():
    q, k, v = qkv(1, 3, 5, 2, 1, 4, seed=11)
    bias = jax.random.normal(jax.random.key(2), (1, 2, 3, 5))
    f = lambda q, k, v, b: jax_ops.dot_product_attention(q, k, v, b, is_causal=True, implementation="ffi")  # noqa: E731
    jax.test_util.check_grads(f, (q, k, v, bias), order=1, modes=("rev",), atol=1e-2, rtol=1e-2, eps=1e-2)


# ---------------------------------------------------------------------------------------- transformations
def test_jit_and_vmap():
    q, k, v = qkv(2, 9, 13, 4, 2, 8)
    qv = jnp.stack([q, 2 * q, -q])
    f = jax.jit(jax.vmap(lambda q: ffi_attention(q, k, v, is_causal=True)))
    out = f(qv)
    for i in range(3):
        np.testing.assert_allclose(out[i], nn_xla(qv[i], k, v, is_causal=True), atol=2e-5, rtol=2e-5)
    # vmap over everything, including a broadcast bias and seq lengths
    kv = jnp.stack([k, k[:, ::-1]])
    bias = jax.random.normal(jax.random.key(3), (2, 1, 4, 1, 13))
    sl = jnp.array([[13, 4], [2, 13]], jnp.int32)
    g = lambda q, k, b, s: ffi_attention(q, k, k, b, key_value_seq_lengths=s)  # noqa: E731
    out = jax.vmap(g)(qv[:2], kv, bias, sl)
    for i in range(2):
        ref = nn_xla(qv[i], kv[i], kv[i], bias[i], key_value_seq_lengths=sl[i])
        np.testing.assert_allclose(out[i], ref, atol=2e-5, rtol=2e-5)


def test_vmap_of_grad_per_example_bias_grad():
    q, k, v = qkv(2, 9, 13, 4, 2, 8)
    qv = jnp.stack([q, 0.5 * q, -q])
    bias = jax.random.normal(jax.random.key(3), (1, 4, 9, 13))  # unbatched: per-example grads must differ

    def loss(fn, q, b):
        return jnp.sum(jnp.sin(fn(q, k, v, b, is_causal=True)))

    ours = jax.vmap(jax.grad(lambda q, b: loss(ffi_attention, q, b), (0, 1)), (0, None))(qv, bias)
    ref = jax.vmap(jax.grad(lambda q, b: loss(nn_xla, q, b), (0, 1)), (0, None))(qv, bias)
    assert ours[1].shape == (3, 1, 4, 9, 13)
    for a, b in zip(ours, ref):
        assert rel_err(a, b) < 1e-5
    # grad of a vmapped function (the bias cotangent is summed over the mapped axis)
    gb = jax.grad(lambda b: jnp.sum(jax.vmap(lambda q: loss(ffi_attention, q, b))(qv)))(bias)
    assert rel_err(gb, ref[1].sum(0)) < 1e-5


@pytest.mark.parametrize("bias_batched", [False, True], ids=["shared-bias", "per-example-bias"])
def test_vmap_of_grad_groups_past_the_dbias_scores_budget(monkeypatch, bias_batched):
    # The GPU form of the bias gradient (dS [V*B, N, T, S] f32) under vmap: past DBIAS_SCORES_BYTES the backward
    # runs over groups of examples (a loop), each group's dS within the budget; the gradients are unchanged.
    from jax_ops._src.attention import ffi as attention_ffi

    q, k, v = qkv(1, 9, 11, 4, 2, 8, seed=8)
    qv = jnp.stack([q * s for s in (1.0, 0.5, -1.0, 2.0, -0.25)])  # V = 5: groups of 2, 2, 1
    bias = jax.random.normal(jax.random.key(9), (5, 1, 4, 9, 11) if bias_batched else (1, 4, 9, 11))

    def grads(fn):
        loss = lambda q, b: jnp.sum(jnp.sin(fn(q, k, v, b, is_causal=True)))  # noqa: E731
        return jax.jit(jax.vmap(jax.grad(loss, (0, 1)), (0, 0 if bias_batched else None)))

    monkeypatch.setattr(attention_ffi, "dispatch", _GpuDispatch)
    with attention.overrides(hopper_bwd_mods=True):
        folded = grads(ffi_attention)
        folded_hlo = folded.lower(qv, bias).as_text()
        folded_grads = folded(qv, bias)
        monkeypatch.setattr(heuristics, "DBIAS_SCORES_BYTES", 2 * heuristics.dbias_scores_bytes(1, 4, 9, 11))
        grouped = grads(ffi_attention)
        grouped_hlo = grouped.lower(qv, bias).as_text()
        grouped_grads = grouped(qv, bias)
    assert "stablehlo.while" not in folded_hlo and "stablehlo.while" in grouped_hlo
    ref = grads(nn_xla)(qv, bias)
    assert grouped_grads[1].shape == (5, *bias.shape[bias_batched:])
    for a, b, c in zip(grouped_grads, folded_grads, ref):
        assert rel_err(a, b) < 1e-6
        assert rel_err(a, c) < 1e-5


def _mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))


@pytest.mark.parametrize("kv_heads", [4, 8])  # GQA groups of 2, and MHA (the Shardy rule has no group factor)
def test_named_sharding_jit_no_gather(kv_heads):
    mesh = _mesh()
    q, k, v = qkv(4, 16, 24, 8, kv_heads, 16)
    bias = jax.random.normal(jax.random.key(1), (1, 8, 16, 24))
    s_q = NamedSharding(mesh, P("data", None, "model", None))
    s_b = NamedSharding(mesh, P(None, "model", None, None))
    qs, ks, vs = (jax.device_put(x, s_q) for x in (q, k, v))
    bs = jax.device_put(bias, s_b)

    def loss(q, k, v, b):
        return jnp.sum(jnp.sin(ffi_attention(q, k, v, b, is_causal=True)))

    fwd = jax.jit(lambda q, k, v, b: ffi_attention(q, k, v, b, is_causal=True))
    out = fwd(qs, ks, vs, bs)
    np.testing.assert_allclose(out, nn_xla(q, k, v, bias, is_causal=True), atol=2e-5, rtol=2e-5)
    assert out.sharding.spec[0] == "data" and out.sharding.spec[2] == "model"
    hlo = fwd.lower(qs, ks, vs, bs).compile().as_text()
    assert "all-gather" not in hlo and "all-to-all" not in hlo

    grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))
    g = grad(qs, ks, vs, bs)
    g_ref = jax.grad(lambda *a: jnp.sum(jnp.sin(nn_xla(*a, is_causal=True))), argnums=(0, 1, 2, 3))(
        q, k, v, bias
    )
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) < 1e-5
    assert "all-gather" not in grad.lower(qs, ks, vs, bs).compile().as_text()


def test_shard_map():
    mesh = _mesh()
    q, k, v = qkv(4, 16, 24, 8, 4, 16)
    mask = jax.random.bernoulli(jax.random.key(2), 0.8, (4, 1, 1, 24)).at[..., 0].set(True)
    kvs = jnp.array([24, 10, 3, 24], jnp.int32)
    f = attention.shard_map_attention(
        mesh, batch_axis="data", head_axis="model", is_causal=True, implementation="ffi"
    )
    out = jax.jit(f)(q, k, v, None, mask, None, kvs)
    ref = nn_xla(q, k, v, None, mask, is_causal=True, key_value_seq_lengths=kvs)
    np.testing.assert_allclose(out, ref, atol=2e-5, rtol=2e-5)
    g = jax.grad(lambda q, k, v: jnp.sum(jnp.sin(f(q, k, v, None, mask, None, kvs))), (0, 1, 2))(q, k, v)
    kw = dict(is_causal=True, key_value_seq_lengths=kvs)
    g_ref = jax.grad(lambda q, k, v: jnp.sum(jnp.sin(nn_xla(q, k, v, None, mask, **kw))), (0, 1, 2))(q, k, v)
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) < 1e-5


# ------------------------------------------------------------------------------------- validation / dispatch
@pytest.mark.parametrize(
    "kwargs, exc, match",
    [
        (dict(k_shape=(2, 9, 3, 8)), ValueError, "multiple of"),
        (dict(k_shape=(2, 9, 2, 4)), ValueError, "head dim"),
        (dict(k_shape=(3, 9, 2, 8)), ValueError, "batch"),
        (dict(k_shape=(9, 2, 8)), ValueError, "key must have query's rank"),
        (dict(v_shape=(2, 8, 2, 8)), ValueError, "value has shape"),
        (dict(k_dtype=jnp.float16), TypeError, "share a dtype"),
        (dict(bias=jnp.zeros((2, 4, 7, 8))), ValueError, "bias has shape"),
        (dict(bias=jnp.zeros((1, 1, 2, 4, 7, 9))), ValueError, "bias must have rank"),
        (dict(mask=jnp.ones((1, 1, 7, 9), jnp.int32)), TypeError, "mask must be a bool"),
        (dict(mask=jnp.ones((1, 3, 7, 9), bool)), ValueError, "mask has shape"),
        (dict(query_seq_lengths=jnp.ones((3,), jnp.int32)), ValueError, "query_seq_lengths must have shape"),
        (dict(key_value_seq_lengths=jnp.ones((2,), jnp.float32)), TypeError, "key_value_seq_lengths must be"),
        (dict(local_window_size=-1), ValueError, "local_window_size"),
        (dict(local_window_size=(1, 2, 3)), ValueError, "local_window_size"),
        (dict(implementation="triton"), ValueError, "implementation"),
    ],
)
def test_errors(kwargs, exc, match):
    kwargs = dict(kwargs)
    q = jnp.zeros((2, 7, 4, 8))
    k = jnp.zeros(kwargs.pop("k_shape", (2, 9, 2, 8)), kwargs.pop("k_dtype", jnp.float32))
    v = jnp.zeros(kwargs.pop("v_shape", k.shape), k.dtype)
    with pytest.raises(exc, match=match):
        jax_ops.dot_product_attention(q, k, v, **kwargs)


def test_float64_fallback_and_ffi_error(x64):
    q, k, v = (x.astype(jnp.float64) for x in qkv(1, 5, 6, 2, 1, 8))
    with pytest.raises(ValueError, match="float64"):
        jax_ops.dot_product_attention(q, k, v, implementation="ffi")
    dispatch._warned.discard(("jax_ops.dot_product_attention", attention.unsupported_reason(q.dtype, 8)))
    with pytest.warns(UserWarning, match="float64"):
        out = jax_ops.dot_product_attention(q, k, v)
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(out, nn_xla(q, k, v), atol=1e-6)  # jax.nn runs its softmax in fp32


def test_unsupported_reason_rules():
    assert attention.unsupported_reason(jnp.float32, 64, "cpu") is None
    assert "head dim" in attention.unsupported_reason(jnp.float16, 512, "cpu")
    if "jax_ops_attention_fwd" not in jax_ops._ffi.target_names("CUDA"):
        assert "CUDA" in attention.unsupported_reason(jnp.float16, 128, "gpu")
    else:
        assert attention.unsupported_reason(jnp.bfloat16, 128, "gpu") is None
        assert "float16/bfloat16" in attention.unsupported_reason(jnp.float32, 128, "gpu")
        assert "head dims" in attention.unsupported_reason(jnp.float16, 80, "gpu")


def test_no_warning_on_supported_input():
    q, k, v = qkv(1, 5, 6, 2, 1, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jax_ops.dot_product_attention(q, k, v)


def test_reference_matches_jax_nn_on_nonempty_rows():
    q, k, v = qkv(2, 10, 12, 4, 2, 8)
    o, lse = reference.dot_product_attention(q, k, v, scale=0.3, is_causal=True)
    ref, ref_res = nn_xla(q, k, v, scale=0.3, is_causal=True, return_residual=True)
    np.testing.assert_allclose(o, ref, atol=2e-5, rtol=2e-5)
    np.testing.assert_allclose(jnp.transpose(lse, (0, 2, 1)), ref_res, atol=2e-5, rtol=2e-5)


def test_backward_fallback_without_bwd_kernel(monkeypatch):
    """Where a platform has the forward kernel but no backward one, grads come from the reference's VJP."""
    monkeypatch.setattr(
        heuristics, "bwd_unsupported_reason", lambda cfg, q_shape, seqlen_k: "no backward kernel (test)"
    )
    monkeypatch.setattr(jax_ops._checks, "_warned", set())
    q, k, v = qkv(2, 9, 11, 4, 2, 8)
    bias = jax.random.normal(jax.random.key(3), (1, 4, 9, 11))

    def loss(impl):
        return lambda *a: jnp.sum(
            jnp.sin(jax_ops.dot_product_attention(*a, is_causal=True, implementation=impl))
        )

    with pytest.warns(UserWarning, match="backward"):
        g = jax.grad(loss("ffi"), (0, 1, 2, 3))(q, k, v, bias)
    g_ref = jax.grad(loss("xla"), (0, 1, 2, 3))(q, k, v, bias)
    for a, b in zip(g, g_ref):
        assert rel_err(a, b) < 1e-6


# ------------------------------------------------------------------------------------------ split-KV
def test_kv_splits_policy():
    cfg = validation.Config(1.0, False, -1, -1, False, False, False, False)
    with attention.overrides(kv_splits=4):
        assert heuristics.kv_splits(cfg, 1, 1, 1000, 8) == 4
        assert heuristics.kv_splits(cfg, 1, 1, 999, 8) == 3  # the largest divisor of S not above the target
        assert heuristics.kv_splits(cfg, 1, 1, 997, 8) == 1  # prime S: no reshape possible
        for kw in (dict(is_causal=True), dict(window_left=5), dict(has_bias=True), dict(has_mask=True)):
            assert heuristics.kv_splits(dataclasses.replace(cfg, **kw), 1, 1, 1000, 8) == 1
    with attention.overrides(kv_splits=None):
        assert heuristics.kv_splits(cfg, 1, 1, 1 << 15, 32) == (1 if jax.default_backend() != "gpu" else 8)


def _assert_matches_reference(q, k, v, kw, seed):
    """Our kernel path (under jit) against the reference: output, log-sum-exp residual, gradients of q, k, v."""
    ref, ref_lse = jax_ops.dot_product_attention(q, k, v, implementation="xla", return_residual=True, **kw)
    f = lambda q, k, v: jax_ops.dot_product_attention(  # noqa: E731
        q, k, v, implementation="ffi", return_residual=True, **kw
    )
    out, lse = jax.jit(f)(q, k, v)
    assert rel_err(out, ref) < TOL[jnp.float32]
    np.testing.assert_allclose(np.asarray(lse), np.asarray(ref_lse), rtol=1e-5, atol=1e-5)
    w = jax.random.normal(jax.random.key(seed), q.shape)

    def loss(impl):
        return lambda q, k, v: jnp.sum(w * jax_ops.dot_product_attention(q, k, v, implementation=impl, **kw))

    g = jax.jit(jax.grad(loss("ffi"), (0, 1, 2)))(q, k, v)
    for a, b in zip(g, jax.grad(loss("xla"), (0, 1, 2))(q, k, v)):
        assert rel_err(a, b) < 1e-4


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((2, 1, 1000, 8, 2, 32), {}),  # decode, GQA
        ((2, 5, 1000, 4, 4, 16), dict(key_value_seq_lengths=jnp.array([1000, 130], jnp.int32))),
        (
            (3, 3, 600, 2, 1, 16),
            dict(
                key_value_seq_lengths=jnp.array([0, 599, 150], jnp.int32),  # 0: every chunk empty
                query_seq_lengths=jnp.array([3, 2, 0], jnp.int32),
            ),
        ),
    ],
)
def test_split_kv_matches_unsplit(shape, kw):
    # The split path (keys in 4 chunks folded into the batch, merged by log-sum-exp) against the reference:
    # outputs, residual (log-sum-exp) and gradients; rows with no key stay 0 / -inf.
    q, k, v = qkv(*shape)
    with attention.overrides(kv_splits=4):
        _assert_matches_reference(q, k, v, kw, seed=5)
        # vmap over a leading axis goes through the same split path
        outs = jax.vmap(lambda q: jax_ops.dot_product_attention(q, k, v, implementation="ffi", **kw))(
            jnp.stack([q, 2 * q])
        )
    assert (
        rel_err(outs[1], jax_ops.dot_product_attention(2 * q, k, v, implementation="xla", **kw))
        < TOL[jnp.float32]
    )


def test_gqa_packing_policy_and_result():
    # Few query rows with GQA: the group's query heads become rows of one head (K/V read once per group).
    cfg = validation.Config(0.25, False, -1, -1, False, False, True, True)
    assert heuristics.packs_gqa(cfg, 1, 32, 8) and heuristics.packs_gqa(cfg, 32, 32, 8)
    assert not heuristics.packs_gqa(cfg, 33, 32, 8)  # more than GQA_PACK_MAX_ROWS rows once packed
    assert not heuristics.packs_gqa(cfg, 1, 8, 8)  # no groups
    for kw in (dict(is_causal=True), dict(window_right=3), dict(has_bias=True), dict(has_mask=True)):
        assert not heuristics.packs_gqa(dataclasses.replace(cfg, **kw), 1, 32, 8)
    q, k, v = qkv(2, 3, 50, 6, 2, 16)
    kw = dict(
        query_seq_lengths=jnp.array([3, 1], jnp.int32), key_value_seq_lengths=jnp.array([50, 7], jnp.int32)
    )
    _assert_matches_reference(q, k, v, kw, seed=6)


def test_split_kv_under_named_sharding():
    # The split path folds key chunks into a sharded batch: still no gathers, same result.
    mesh = _mesh()
    q, k, v = qkv(4, 2, 64, 8, 4, 16)
    s = NamedSharding(mesh, P("data", None, "model", None))
    qs, ks, vs = (jax.device_put(x, s) for x in (q, k, v))
    kvl = jax.device_put(jnp.array([64, 10, 33, 0], jnp.int32), NamedSharding(mesh, P("data")))
    fwd = jax.jit(lambda q, k, v, lens: ffi_attention(q, k, v, key_value_seq_lengths=lens))
    with attention.overrides(kv_splits=2):
        out = fwd(qs, ks, vs, kvl)
        hlo = fwd.lower(qs, ks, vs, kvl).compile().as_text()
    ref = jax_ops.dot_product_attention(q, k, v, key_value_seq_lengths=kvl, implementation="xla")
    assert rel_err(out, ref) < TOL[jnp.float32]
    assert "all-gather" not in hlo and "all-to-all" not in hlo


# ---------------------------------------------------------------------------------------------- knobs / default
def test_default_on_cpu_runs_xla():
    # implementation=None on the CPU picks the XLA reference (faster than the single-threaded twin: docs).
    q, k, v = qkv(1, 5, 6, 2, 1, 8)
    if jax.default_backend() == "cpu":
        assert "jax_ops_attention_fwd" not in str(jax.make_jaxpr(jax_ops.dot_product_attention)(q, k, v))
    assert "jax_ops_attention_fwd" in str(jax.make_jaxpr(ffi_attention)(q, k, v))


def test_overrides_reach_the_kernel_attributes():
    q, k, v = qkv(1, 5, 6, 2, 1, 8)
    with attention.overrides(portable=True, fwd_persistent=False, bwd_cluster=2):
        jaxpr = str(jax.make_jaxpr(jax.grad(lambda q: jnp.sum(ffi_attention(q, k, v))))(q))
    assert "portable=True" in jaxpr and "fwd_persistent=0" in jaxpr and "bwd_cluster=2" in jaxpr
    with pytest.raises(TypeError, match="unknown knob"):
        with attention.overrides(kv_split=2):
            pass
    with pytest.raises(ValueError, match="bwd_cluster"):
        with attention.overrides(bwd_cluster=3):
            ffi_attention(q, k, v)
