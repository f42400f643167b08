"""GPU tests of the attention kernels: CUDA target vs the CPU twin vs jax.nn (fp32 reference).

Tests with "small" in their name are the quick cases (the sanitizer runs the standalone tools: docs/architecture.md).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import (
    NONFINITE_CASES,
    SHAPES,
    assert_nonfinite_grads,
    assert_nonfinite_outputs,
    nonfinite_case,
    shape_id,
)
from helpers import rel_err

import jax_ops
from jax_ops import attention
from jax_ops._src.attention import heuristics, validation

pytestmark = pytest.mark.gpu

TOL = {jnp.float16: 2e-3, jnp.bfloat16: 1e-2, jnp.float32: 1e-4}


def _needs_cuda_target():
    # The kernels exist: on a GPU a build without them is broken, not a reason to skip.
    if "jax_ops_attention_fwd" not in jax_ops._ffi.target_names("CUDA"):
        pytest.fail(
            "this build has no CUDA attention target (jax_ops_attention_fwd): build with JAX_OPS_CUDA=ON"
        )


def rel_l2(a, b) -> float:
    return rel_err(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32))


def inputs(B, T, S, N, K, D, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(kk, shp, jnp.float32).astype(dtype) for kk, shp in
                 zip(ks, ((B, T, N, D), (B, S, K, D), (B, S, K, D))))  # fmt: skip


def on_cpu(fn, *args):
    """The CPU twin: the same jitted function with inputs committed to the host."""
    return jax.jit(fn)(*jax.device_put(args, jax.devices("cpu")[0]))


def run_case(shape, dtype, grads=False, **kw):
    _needs_cuda_target()
    q, k, v = inputs(*shape, dtype)
    f = lambda q, k, v: jax_ops.dot_product_attention(q, k, v, implementation="ffi", **kw)  # noqa: E731
    out = jax.jit(f)(q, k, v)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref = jax_ops.dot_product_attention(f32(q), f32(k), f32(v), implementation="xla", **kw)
    assert rel_l2(out, ref) < TOL[dtype]
    if q.shape[1] * k.shape[1] <= 300_000:  # the single-threaded CPU twin is slow on the large cases
        assert rel_l2(out, on_cpu(f, q, k, v)) < TOL[dtype]
    if grads:
        w = jax.random.normal(jax.random.key(1), q.shape, jnp.float32)
        loss = lambda fn: lambda q, k, v: jnp.sum(w * fn(q, k, v).astype(jnp.float32))  # noqa: E731
        g = jax.jit(jax.grad(loss(f), (0, 1, 2)))(q, k, v)
        ref_f = lambda q, k, v: jax_ops.dot_product_attention(q, k, v, implementation="xla", **kw)  # noqa: E731
        g_ref = jax.grad(loss(ref_f), (0, 1, 2))(f32(q), f32(k), f32(v))
        for a, b in zip(g, g_ref):
            assert rel_l2(a, b) < 2 * TOL[dtype]


# The shared forward cases (attention_cases.SHAPES) on CUDA, where the head dim has a CUDA kernel.
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[5] in (32, 64, 96, 128, 256)], ids=shape_id)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_small_shared_cases(shape, dtype, is_causal):
    assert shape[5] in heuristics.support()["cuda_fwd_head_dims"]
    run_case(shape, dtype, is_causal=is_causal)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("is_causal", [False, True])
def test_small_fwd(dtype, is_causal):
    run_case((1, 17, 33, 2, 1, 64), dtype, is_causal=is_causal)


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_bwd_gqa(dtype):
    run_case((2, 40, 40, 4, 2, 64), dtype, grads=True, is_causal=True)


@pytest.mark.parametrize(
    "shape,kw",
    [
        ((1, 70, 70, 2, 2, 128), dict(is_causal=False)),
        ((2, 33, 130, 4, 1, 32), dict(is_causal=True)),
        ((1, 129, 65, 6, 2, 96), dict(is_causal=False, local_window_size=(20, 5))),
        (
            (2, 64, 100, 4, 2, 64),
            dict(
                key_value_seq_lengths=jnp.array([100, 37], jnp.int32),
                query_seq_lengths=jnp.array([64, 50], jnp.int32),
            ),
        ),
    ],
)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_bwd_kernel_variants(shape, kw, dtype):
    # The CUDA backward (no bias) against the fp32 reference's gradients: GQA/MQA, T != S, windows, seq lengths
    # (padded query rows and keys get zero gradients), tails of every head dim it supports.
    run_case(shape, dtype, grads=True, **kw)


def test_small_bwd_masked_rows_have_finite_zero_grads():
    _needs_cuda_target()
    q, k, v = inputs(1, 8, 16, 2, 2, 64, jnp.bfloat16)
    mask = jnp.ones((1, 1, 8, 16), bool).at[0, 0, 3].set(False)
    f = lambda q, k, v: jnp.sum(jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="ffi")
                                .astype(jnp.float32))  # fmt: skip
    dq, dk, dv = jax.jit(jax.grad(f, (0, 1, 2)))(q, k, v)
    for g in (dq, dk, dv):
        assert np.isfinite(np.asarray(g, np.float32)).all()
    assert np.all(np.asarray(dq[0, 3, 0], np.float32) == 0)


@pytest.mark.parametrize("D", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_head_dims(D, dtype):
    run_case((2, 300, 257, 4, 4, D), dtype, is_causal=True)


@pytest.mark.parametrize("T,S", [(1, 1000), (1000, 1), (1000, 1000), (4096, 4096), (4097, 1023)])
def test_long_and_tails(T, S):
    run_case((1, T, S, 8, 2, 128), jnp.bfloat16, is_causal=True)


def test_masks_bias_seqlens_window():
    _needs_cuda_target()
    B, T, S, N, K, D = 2, 200, 300, 8, 2, 128
    q, k, v = inputs(B, T, S, N, K, D, jnp.bfloat16)
    mask = jax.random.bernoulli(jax.random.key(3), 0.9, (B, 1, 1, S))
    bias = jax.random.normal(jax.random.key(4), (1, N, T, S)).astype(jnp.bfloat16)
    kw = dict(
        local_window_size=(64, 8),
        query_seq_lengths=jnp.array([200, 150], jnp.int32),
        key_value_seq_lengths=jnp.array([300, 77], jnp.int32),
    )
    out = jax_ops.dot_product_attention(q, k, v, bias, mask, implementation="ffi", **kw)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref = jax_ops.dot_product_attention(f32(q), f32(k), f32(v), f32(bias), mask, implementation="xla", **kw)
    assert rel_l2(out, ref) < TOL[jnp.bfloat16]


def test_small_fully_masked_rows():
    _needs_cuda_target()
    q, k, v = inputs(1, 8, 16, 2, 2, 64, jnp.float16)
    mask = jnp.ones((1, 1, 8, 16), bool).at[0, 0, 3].set(False)
    out, res = jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="ffi", return_residual=True)
    assert np.all(np.asarray(out[0, 3], np.float32) == 0) and np.all(
        np.asarray(res[0, 3], np.float32) == -np.inf
    )
    assert not np.isnan(np.asarray(out, np.float32)).any()


# Shapes (B, T, S, N, K, D) run on both kernel paths (Hopper and portable): GQA/MQA, T = 1, S = 1, ragged tails,
# a causal window, query and key lengths.
BOTH_PATHS_CASES = [
    ((2, 300, 517, 4, 2, 128), dict(is_causal=True)),
    ((1, 1, 1000, 4, 1, 64), dict()),
    ((2, 1000, 1, 2, 2, 128), dict()),
    ((1, 777, 777, 2, 2, 128), dict(is_causal=True, local_window_size=(100, 0))),
    (
        (2, 640, 640, 4, 4, 64),
        dict(
            is_causal=True,
            query_seq_lengths=jnp.array([500, 640], jnp.int32),
            key_value_seq_lengths=jnp.array([333, 17], jnp.int32),
        ),
    ),
]


@pytest.mark.parametrize("shape,kw", BOTH_PATHS_CASES)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_forward_kernels_both_paths(shape, kw, dtype):
    # Head dims 64/128 without bias/mask take the Hopper kernel on an H100/H200; the portable knob forces the
    # portable one. Both against the fp32 reference, outputs and log-sum-exp.
    _needs_cuda_target()
    q, k, v = inputs(*shape, dtype)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref, ref_lse = jax_ops.dot_product_attention(
        f32(q), f32(k), f32(v), implementation="xla", return_residual=True, **kw
    )
    outs = {}
    for portable in ("0", "1"):
        with attention.overrides(portable=portable == "1"):
            out, lse = jax_ops.dot_product_attention(
                q, k, v, implementation="ffi", return_residual=True, **kw
            )
        assert rel_l2(out, ref) < TOL[dtype]
        finite = np.isfinite(np.asarray(ref_lse))
        np.testing.assert_allclose(np.asarray(lse)[finite], np.asarray(ref_lse)[finite], atol=2e-2, rtol=1e-3)
        outs[portable] = np.asarray(out, np.float32)
    assert rel_l2(outs["0"], outs["1"]) < TOL[dtype]


# Masks and biases of every broadcast kind through the Hopper forward's mask/bias variant and the portable kernel:
# (shape (B, T, S, N, K, D), mask shape, bias shape, bias dtype (None: q's), keywords). Random masks (never pure
# padding, so they stay masks) with whole rows False; odd S (unaligned rows); T = 1; T != S; GQA.
def _mods_cases():
    B2, N4 = 2, 4
    return [
        ((B2, 300, 517, N4, 2, 128), (B2, 1, 300, 517), None, None, dict(is_causal=True)),
        ((B2, 300, 517, N4, 2, 64), None, (1, N4, 300, 517), None, dict()),
        ((B2, 257, 255, N4, 4, 128), (1, 1, 257, 255), (B2, N4, 257, 255), jnp.float32, dict()),
        ((1, 200, 130, 2, 1, 64), (1, 2, 200, 130), (1, 1, 1, 130), None, dict(local_window_size=(50, 20))),
        ((B2, 1, 1000, N4, 1, 128), (B2, 1, 1, 1000), (B2, 1, 1, 1000), jnp.float32, dict()),
        (
            (B2, 640, 640, 2, 2, 64),
            (B2, 1, 640, 1),
            (1, 2, 640, 640),
            None,
            dict(is_causal=True, key_value_seq_lengths=jnp.array([640, 333], jnp.int32)),
        ),
    ]


@pytest.mark.parametrize("case", range(6))
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_forward_mask_bias_both_paths(case, dtype):
    _needs_cuda_target()
    shape, mask_shape, bias_shape, bias_dtype, kw = _mods_cases()[case]
    q, k, v = inputs(*shape, dtype, seed=case)
    km, kb = jax.random.split(jax.random.key(100 + case))
    mask = None
    if mask_shape is not None:
        mask = jax.random.bernoulli(km, 0.7, mask_shape)
        if mask_shape[2] > 1:
            mask = mask.at[..., 3, :].set(False)  # a row with no allowed key
        else:
            mask = mask.at[0].set(False)  # a batch with no allowed key
    bias = None
    if bias_shape is not None:
        bias = (2 * jax.random.normal(kb, bias_shape, jnp.float32)).astype(bias_dtype or dtype)
    f32 = lambda x: None if x is None else x.astype(jnp.float32)  # noqa: E731
    ref, ref_lse = jax_ops.dot_product_attention(
        f32(q), f32(k), f32(v), f32(bias), mask, implementation="xla", return_residual=True, **kw
    )
    outs = {}
    for portable in (False, True):
        with attention.overrides(portable=portable):
            out, lse = jax.jit(
                lambda q, k, v, b, m: jax_ops.dot_product_attention(
                    q, k, v, b, m, implementation="ffi", return_residual=True, **kw
                )
            )(q, k, v, bias, mask)
        out = np.asarray(out, np.float32)
        assert np.isfinite(out).all()
        assert rel_l2(out, ref) < TOL[dtype]
        finite = np.isfinite(np.asarray(ref_lse))
        assert not np.isfinite(np.asarray(lse, np.float32)[~finite]).any()
        np.testing.assert_allclose(
            np.asarray(lse, np.float32)[finite], np.asarray(ref_lse)[finite], atol=3e-2, rtol=1e-3
        )
        outs[portable] = out
    assert rel_l2(outs[False], outs[True]) < TOL[dtype]


@pytest.mark.parametrize("case", range(6))
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_backward_mask_both_paths(case, dtype):
    # The masks of the forward cases through the Hopper backward's mask/bias variant (knob hopper_bwd_mods) and
    # the portable backward (the knob off), after the same Hopper forward; gradients against the fp32 reference's.
    _needs_cuda_target()
    shape, mask_shape, _, _, kw = _mods_cases()[case]
    if mask_shape is None:
        mask_shape = (shape[0], 1, shape[1], shape[2])
    q, k, v = inputs(*shape, dtype, seed=case)
    mask = jax.random.bernoulli(jax.random.key(200 + case), 0.7, mask_shape)
    if mask_shape[2] > 1:
        mask = mask.at[..., 3, :].set(False)  # a row with no allowed key
    w = jax.random.normal(jax.random.key(1), q.shape, jnp.float32)

    def loss(impl):
        return lambda q, k, v: jnp.sum(
            w
            * jax_ops.dot_product_attention(q, k, v, mask=mask, implementation=impl, **kw).astype(jnp.float32)
        )

    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref = jax.grad(loss("xla"), (0, 1, 2))(f32(q), f32(k), f32(v))
    grads = {}
    for hopper in (True, False):
        with attention.overrides(hopper_bwd_mods=hopper):
            step = jax.jit(jax.grad(loss("ffi"), (0, 1, 2)))
            hlo = step.lower(q, k, v).as_text()
            g = step(q, k, v)
        # The masked backward call asks for the Hopper kernels (portable = false) only with the knob on.
        masked_bwd = [
            line
            for line in hlo.splitlines()
            if "@jax_ops_attention_bwd" in line and "has_mask = true" in line
        ]
        assert masked_bwd and all(f"portable = {str(not hopper).lower()}" in line for line in masked_bwd)
        for name, a, b in zip("qkv", g, ref):
            a = np.asarray(a, np.float32)
            assert np.isfinite(a).all(), name
            assert rel_l2(a, b) < 2 * TOL[dtype], name
        grads[hopper] = g
    for a, b in zip(grads[False], grads[True]):
        assert rel_l2(a, b) < 2 * TOL[dtype]
    # The same forward, two backward kernels (a silent fallback in C++ would run the portable one twice): their
    # summation orders differ, which float16's rounding shows on every case (bfloat16's hides it on case 4's few
    # terms per gradient element).
    if dtype == jnp.float16:
        assert any(
            not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(grads[False], grads[True])
        )


@pytest.mark.parametrize("case", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_backward_bias(case, dtype, monkeypatch):
    # The bias gradient of the Hopper backward (dS [B, N, T, S] f32 from the dQ kernel, summed by XLA over the
    # bias's broadcast dims) for every broadcast kind of the forward cases, with their masks, against the fp32
    # reference's; no fallback warning (the kernel ran, not the reference VJP).
    _needs_cuda_target()
    monkeypatch.setattr(jax_ops._checks, "_warned", set())
    shape, mask_shape, bias_shape, bias_dtype, kw = _mods_cases()[case]
    q, k, v = inputs(*shape, dtype, seed=case)
    mask = None if mask_shape is None else jax.random.bernoulli(jax.random.key(300 + case), 0.7, mask_shape)
    bias = (2 * jax.random.normal(jax.random.key(400 + case), bias_shape)).astype(bias_dtype or dtype)
    w = jax.random.normal(jax.random.key(1), q.shape, jnp.float32)

    def loss(impl):
        return lambda q, k, v, b: jnp.sum(
            w * jax_ops.dot_product_attention(q, k, v, b, mask, implementation=impl, **kw).astype(jnp.float32)
        )

    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref = jax.grad(loss("xla"), (0, 1, 2, 3))(f32(q), f32(k), f32(v), f32(bias))
    with warnings.catch_warnings(record=True) as caught, attention.overrides(hopper_bwd_mods=True):
        warnings.simplefilter("always")
        g = jax.jit(jax.grad(loss("ffi"), (0, 1, 2, 3)))(q, k, v, bias)
    assert not [
        w for w in caught if "XLA reference" in str(w.message)
    ]  # the reference-VJP fallback's warning
    assert g[3].shape == bias.shape and g[3].dtype == bias.dtype
    for name, a, b in zip(("q", "k", "v", "bias"), g, ref):
        a = np.asarray(a, np.float32)
        assert np.isfinite(a).all(), name
        assert rel_l2(a, b) < 2 * TOL[dtype], name


@pytest.mark.parametrize("portable", [False, True])
def test_small_bias_of_lowest_finite(portable):
    # A bias of finfo(float32).min (a mask written as a bias) on every key of some rows: finite logits, so those
    # rows average V uniformly as in jax.nn (the log2 domain of the kernels overflows there unless kept finite).
    _needs_cuda_target()
    q, k, v = inputs(2, 130, 200, 4, 2, 128, jnp.bfloat16)
    bias = jnp.zeros((2, 1, 130, 200), jnp.float32).at[:, :, 3:9, :].set(jnp.finfo(jnp.float32).min)
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref = jax_ops.dot_product_attention(f32(q), f32(k), f32(v), bias, implementation="xla")
    with attention.overrides(portable=portable):
        out = jax.jit(lambda *a: jax_ops.dot_product_attention(*a, implementation="ffi"))(q, k, v, bias)
    out = np.asarray(out, np.float32)
    uniform = np.repeat(np.asarray(f32(v)).mean(axis=1, keepdims=True), 2, axis=2)  # [B, 1, N, D]: GQA 2
    np.testing.assert_allclose(out[:, 3:9], np.broadcast_to(uniform, out[:, 3:9].shape), atol=2e-2)
    assert rel_l2(out, ref) < TOL[jnp.bfloat16]


@pytest.mark.parametrize("is_causal", [False, True])
def test_longest_sequence_32k(is_causal):
    # N = 32768: the two forward kernels (independent implementations) agree, and sampled rows match an fp64
    # numpy reference.
    _needs_cuda_target()
    T, H, D = 32768, 2, 128
    q, k, v = inputs(1, T, T, H, H, D, jnp.bfloat16)
    outs = {}
    for portable in ("0", "1"):
        with attention.overrides(portable=portable == "1"):
            outs[portable] = np.asarray(
                jax_ops.dot_product_attention(q, k, v, is_causal=is_causal, implementation="ffi"), np.float32
            )
    assert rel_l2(outs["0"], outs["1"]) < 1e-2
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    for t in (0, 1, 4097, T - 1):
        s_hi = t + 1 if is_causal else T
        logits = kn[0, :s_hi, 0] @ qn[0, t, 0] / np.sqrt(D)
        p = np.exp(logits - logits.max())
        ref = (p / p.sum()) @ vn[0, :s_hi, 0]
        assert rel_l2(outs["0"][0, t, 0], ref) < 1e-2


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_split_kv_decode(dtype):
    # Decode (T = 1) with per-batch kv lengths through the split-KV path: forced 8 chunks, and the default policy
    # (which splits this shape on a GPU), against the fp32 reference.
    _needs_cuda_target()
    B, S, N, K, D = 2, 4096, 8, 2, 128
    q, k, v = inputs(B, 1, S, N, K, D, dtype)
    kw = dict(key_value_seq_lengths=jnp.array([4096, 1000], jnp.int32))
    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    ref = jax_ops.dot_product_attention(f32(q), f32(k), f32(v), implementation="xla", **kw)
    assert (
        heuristics.kv_splits(validation.Config(D**-0.5, False, -1, -1, False, False, False, True), B, 1, S, N)
        > 1
    )
    for forced in (8, None):
        with attention.overrides(kv_splits=forced):
            out = jax_ops.dot_product_attention(q, k, v, implementation="ffi", **kw)
        assert rel_l2(out, ref) < TOL[dtype]


# GQA shapes for the Hopper backward's dK/dV cluster size J (Sm90BwdDkDvCluster in heuristics.h):
# J = 4 for a causal/window mask, 4 | G and at most one wave of dK/dV CTAs at J = 1
# (ceil(S / 128) x K x B <= SMs), else J = 2 for even G. The J picked on an H100/H200 (114-132 SMs) is noted;
# BOTH_PATHS_CASES' first case is G = 2 causal (J = 2).
GQA_CLUSTER_CASES = [
    ((1, 384, 384, 8, 2, 128), dict(is_causal=True)),  # G = 4, 6 CTAs: J = 4
    ((1, 640, 640, 16, 2, 64), dict(is_causal=True)),  # G = 8, 10 CTAs: J = 4 (2 heads per CTA)
    ((40, 256, 256, 8, 2, 64), dict(is_causal=True)),  # G = 4, 160 CTAs: J = 2
]


@pytest.mark.parametrize(
    "shape,kw",
    BOTH_PATHS_CASES
    + [((2, 300, 517, 4, 1, 64), dict()), ((1, 500, 700, 4, 2, 64), dict(local_window_size=(64, 8)))]
    + GQA_CLUSTER_CASES[:1],
)
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_small_backward_kernels_both_paths(shape, kw, dtype):
    # Head dims 64/128 without bias/mask take the Hopper backward (attention_bwd_sm90_impl.cuh) on an H100/H200;
    # the portable knob forces the portable one. Both against the fp32 reference's gradients, and against each other.
    _needs_cuda_target()
    q, k, v = inputs(*shape, dtype)
    w = jax.random.normal(jax.random.key(1), q.shape, jnp.float32)

    def loss(impl):
        return lambda q, k, v: jnp.sum(
            w * jax_ops.dot_product_attention(q, k, v, implementation=impl, **kw).astype(jnp.float32)
        )

    f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
    g_ref = jax.grad(loss("xla"), (0, 1, 2))(f32(q), f32(k), f32(v))
    # With one key (S = 1) P is identically 1, so dS = P (dP - delta) and with it dq and dk are exactly 0: every
    # implementation returns rounding noise there, which a relative error cannot judge. Those two are held to an
    # absolute bound on the scale of dv instead.
    scale = float(np.max(np.abs(np.asarray(g_ref[2]))))

    def err(name, a, b):
        if shape[2] == 1 and name in ("dq", "dk"):
            return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)))) / scale
        return rel_l2(a, b)

    grads = {}
    for portable in ("0", "1"):
        with attention.overrides(portable=portable == "1"):  # an attribute: read at trace time
            g = jax.grad(loss("ffi"), (0, 1, 2))(q, k, v)
        for name, a, b in zip(("dq", "dk", "dv"), g, g_ref):
            e = err(name, a, b)
            assert e < 2 * TOL[dtype], f"{name} (portable={portable}): error {e:.2e}"
        grads[portable] = [np.asarray(a, np.float32) for a in g]
    for name, a, b in zip(("dq", "dk", "dv"), grads["0"], grads["1"]):
        assert err(name, a, b) < 2 * TOL[dtype], name


@pytest.mark.parametrize("shape,kw", GQA_CLUSTER_CASES[1:])  # the first runs in the both-paths backward test
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
def test_bwd_gqa_cluster(shape, kw, dtype):
    # The default Hopper backward on GQA shapes where the cluster rule picks J = 4 (G = 8) and J = 2 (G = 4,
    # more CTAs than SMs), against the fp32 reference's gradients.
    run_case(shape, dtype, grads=True, **kw)


# The non-finite cases of test_attention_nonfinite.py on the CUDA kernels: 200 x 200 causal spans several query and
# key tiles of both paths (the NaN / Inf sits inside a tile that also holds masked entries). With portable=False the
# forward and the backward take the Hopper kernels (fp16 at head dim 64, bf16 at 128; a mask or bias: their
# mask/bias variants).
@pytest.mark.parametrize("case", NONFINITE_CASES)
@pytest.mark.parametrize("dtype,D", [(jnp.float16, 64), (jnp.bfloat16, 128)])
@pytest.mark.parametrize("portable", [False, True])
def test_small_nonfinite_inputs(case, dtype, D, portable):
    _needs_cuda_target()
    c = nonfinite_case(case, 2, 200, 200, 4, 2, D, dtype=dtype)
    a = c.args
    kw = dict(is_causal=True, return_residual=True)

    def f(q, k, v, bias, mask, q_seqlen, impl="ffi"):
        return jax_ops.dot_product_attention(
            q, k, v, bias, mask, query_seq_lengths=q_seqlen, implementation=impl, **kw
        )

    w = jax.random.normal(jax.random.key(7), a["q"].shape, jnp.float32)

    def loss(q, k, v, bias):
        return jnp.sum(w * f(q, k, v, bias, a["mask"], a["q_seqlen"])[0].astype(jnp.float32))

    argnums = (0, 1, 2) if a["bias"] is None else (0, 1, 2, 3)
    # portable=False: the Hopper kernels, their mask/bias variants in the backward too (hopper_bwd_mods).
    with attention.overrides(
        portable=portable, hopper_bwd_mods=not portable
    ):  # read at trace time: fresh jits
        out, lse = jax.jit(f)(**a)
        grads = jax.jit(jax.grad(loss, argnums))(a["q"], a["k"], a["v"], a["bias"])
    e = dict(c.expected)
    e.update({name: e[name].astype(jnp.float32) for name in ("q", "k", "v")})
    ref, ref_lse = f(**e, impl="xla")
    assert_nonfinite_outputs(c, out, lse, ref, ref_lse, atol=1e-2 if dtype == jnp.float16 else 3e-2)
    assert_nonfinite_grads(c, [np.asarray(g, np.float32) for g in grads])
