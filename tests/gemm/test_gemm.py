"""jax_ops.gemm / linear / gated_linear on the CPU: the twin ("ffi") and the XLA path ("xla") against the float64
oracle of gemm_cases.py over the epilogue x dtype x transpose matrix, odd sizes, batch broadcasting, and the
argument errors."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_cases import (
    ACTIVATIONS,
    BF16,
    DTYPES,
    E4M3,
    E5M2,
    F16,
    F32,
    F64,
    INT8,
    TRANSPOSES,
    default_out,
    epilogue_case,
    gated_oracle,
    operand,
    oracle,
    rngs,
    scales,
    split_static,
    tol,
    uniform,
)
from helpers import rel_err

import jax_ops
from jax_ops import gemm_ops

BACKENDS = ["ffi", "xla"]


def each_activation(impl, a, b, kw):
    """gemm under every activation, traced into one jit (one compile for the five kernels)."""
    arrays, static = split_static(kw)

    def run(a, b, arrays):
        return [
            jax_ops.gemm(a, b, activation=act, implementation=impl, **arrays, **static) for act in ACTIVATIONS
        ]

    return jax.jit(run)(a, b, arrays)


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=lambda t: f"ta{int(t[0])}tb{int(t[1])}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_epilogue_matrix_twin(dtype, transposes, x64):
    """Every activation with bias, alpha, beta * c and residual (and the scales of float8 / int8)."""
    a, b, kw = epilogue_case(dtype, *transposes)
    for activation, out in zip(ACTIVATIONS, each_activation("ffi", a, b, kw)):
        assert out.shape == (2, 17, 20) and out.dtype == default_out(dtype)
        assert rel_err(out, oracle(a, b, activation=activation, **kw)) < tol(out.dtype), activation


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_epilogue_matrix_xla(dtype, x64):
    a, b, kw = epilogue_case(dtype, False, True)
    for activation, out in zip(ACTIVATIONS, each_activation("xla", a, b, kw)):
        assert out.dtype == default_out(dtype)
        assert rel_err(out, oracle(a, b, activation=activation, **kw)) < tol(out.dtype), activation


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("mnk", [(1, 1, 1), (1, 17, 1000), (17, 129, 1), (129, 1000, 17), (1000, 17, 129)])
def test_odd_sizes(mnk, impl):
    M, N, K = mnk
    k = rngs(3)
    a, b = operand(k[0], (M, K), F32), operand(k[1], (K, N), F32, K**-0.5)
    bias = operand(k[2], (N,), F32)
    out = jax_ops.gemm(a, b, bias=bias, activation="gelu", implementation=impl)
    assert out.shape == (M, N)
    assert rel_err(out, oracle(a, b, bias=bias, activation="gelu")) < 1e-5


@pytest.mark.parametrize("impl", BACKENDS)
def test_large_bf16_ragged(impl):
    k = rngs(2)
    a, b = operand(k[0], (3, 130, 1000), BF16), operand(k[1], (1000, 257), BF16, 1000**-0.5)
    out = jax_ops.gemm(a, b, activation="silu", implementation=impl)
    assert rel_err(out, oracle(a, b, activation="silu")) < tol(BF16)


BROADCAST_SHAPES = [
    ((2, 3, 5, 7), (3, 7, 4)), ((5, 7), (4, 7, 6)), ((2, 1, 5, 7), (3, 7, 4)), ((7,), (7, 4)), ((2, 5, 7), (7,)),
    ((7,), (7,)), ((7,), (3, 7, 4)), ((0, 5, 7), (7, 4)), ((5, 0), (0, 3)),
]  # fmt: skip


@pytest.mark.parametrize("impl", BACKENDS)
def test_batch_broadcast_as_matmul(impl):
    k = rngs(2)
    args = [(operand(k[0], sa, F32), operand(k[1], sb, F32)) for sa, sb in BROADCAST_SHAPES]
    outs = jax.jit(lambda args: [jax_ops.gemm(a, b, implementation=impl) for a, b in args])(args)
    for (a, b), out in zip(args, outs):
        ref = np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))
        assert out.shape == ref.shape
        np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", BACKENDS)
def test_batched_weights_and_transposes(impl):
    """b with its own batch (Bb = B) under every transpose pair, a per-row int8 a_scale over a batch."""
    k = rngs(2)
    for ta, tb in TRANSPOSES:
        a = operand(k[0], (3, 9, 5) if ta else (3, 5, 9), F32)
        b = operand(k[1], (3, 6, 9) if tb else (3, 9, 6), F32)
        out = jax_ops.gemm(a, b, transpose_a=ta, transpose_b=tb, implementation=impl)
        assert rel_err(out, oracle(a, b, transpose_a=ta, transpose_b=tb)) < 1e-5


@pytest.mark.parametrize("impl", BACKENDS)
def test_int8_per_token_scales_over_a_batch(impl, x64):
    k = rngs(4)
    a, b = operand(k[0], (2, 5, 16), INT8), operand(k[1], (16, 7), INT8)
    a_scale = uniform(k[2], (2, 5), 0.5, 1.5) / 127  # one scale per token
    b_scale = uniform(k[3], (7,), 0.5, 1.5) / 127
    out = jax_ops.gemm(a, b, a_scale=a_scale, b_scale=b_scale, out_dtype=F32, implementation=impl)
    assert rel_err(out, oracle(a, b, a_scale=a_scale, b_scale=b_scale)) < 1e-6


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize(
    "pair", [(BF16, F32), (F16, F32), (E4M3, F16), (E4M3, F32), (E5M2, BF16), (INT8, F16), (INT8, F32)]
)
def test_out_dtypes(pair, impl, x64):
    dtype, out_dtype = pair
    k = rngs(3)
    a, b = operand(k[0], (9, 24), dtype), operand(k[1], (24, 11), dtype, 24**-0.5)
    a_scale, b_scale = scales(k[2], dtype, 9, 11)
    out = jax_ops.gemm(a, b, out_dtype=out_dtype, a_scale=a_scale, b_scale=b_scale, implementation=impl)
    assert out.dtype == out_dtype
    assert rel_err(out, oracle(a, b, a_scale=a_scale, b_scale=b_scale)) < tol(out_dtype) * (
        10 if pair[0] == INT8 and out_dtype == F32 else 1
    )


@pytest.mark.parametrize("impl", BACKENDS)
def test_mixed_fp8_pair(impl, x64):
    k = rngs(2)
    a, b = operand(k[0], (6, 32), E4M3), operand(k[1], (32, 10), E5M2, 0.2)
    out = jax_ops.gemm(a, b, a_scale=2.0, b_scale=0.5, implementation=impl)
    assert rel_err(out, oracle(a, b, a_scale=jnp.float32(2.0), b_scale=jnp.float32(0.5))) < tol(BF16)


def test_tf32_precision_reaches_the_twin():
    k = rngs(2)
    a, b = operand(k[0], (64, 512), F32), operand(k[1], (512, 64), F32)
    ref = oracle(a, b)
    exact = jax_ops.gemm(a, b, implementation="ffi")
    tf32 = jax_ops.gemm(a, b, precision="tensorfloat32", implementation="ffi")
    assert rel_err(exact, ref) < 1e-6
    assert 1e-6 < rel_err(tf32, ref) < 3e-3  # TF32 operand rounding: 10 mantissa bits
    default = jax_ops.gemm(a, b, precision=jax.lax.Precision.DEFAULT, implementation="ffi")
    np.testing.assert_array_equal(np.asarray(default), np.asarray(tf32))
    highest = jax_ops.gemm(a, b, precision="highest", implementation="ffi")
    np.testing.assert_array_equal(np.asarray(highest), np.asarray(exact))


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("lead", [(1,), (3, 7), (37,)])
def test_gated_linear(lead, packed, impl):
    K, N = 40, 24
    k = rngs(5)
    x = operand(k[0], lead + (K,), F32)
    wg, wu = operand(k[1], (K, N), F32, K**-0.5), operand(k[2], (K, N), F32, K**-0.5)
    bias, res = operand(k[3], (2, N), F32), operand(k[4], lead + (N,), F32)
    weights = (jnp.stack([wg, wu], axis=1),) if packed else (wg, wu)
    outs = jax.jit(lambda x, w, bias, res: [
        jax_ops.gated_linear(x, *w, activation=act, bias=bias, residual=res, implementation=impl)
        for act in ACTIVATIONS])(x, weights, bias, res)  # fmt: skip
    for activation, out in zip(ACTIVATIONS, outs):
        assert out.shape == lead + (N,)
        ref = gated_oracle(x, wg, wu, activation, bias=bias, residual=res)
        assert rel_err(out, ref) < 1e-5, activation


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("dtype", [F16, BF16, F64])
def test_gated_linear_dtypes(dtype, impl, x64):
    k = rngs(3)
    x, wg, wu = (
        operand(k[0], (5, 64), dtype),
        operand(k[1], (64, 48), dtype, 0.125),
        operand(k[2], (64, 48), dtype),
    )
    out = jax_ops.gated_linear(x, wg, wu, implementation=impl)
    assert out.dtype == dtype
    assert rel_err(out, gated_oracle(x, wg, wu)) < tol(dtype)


@pytest.mark.parametrize("impl", BACKENDS)
def test_linear(impl):
    k = rngs(4)
    x, w = operand(k[0], (2, 3, 16), F32), operand(k[1], (16, 8), F32)
    bias, res = operand(k[2], (8,), F32), operand(k[3], (8,), F32)  # a residual that broadcasts
    out = jax_ops.linear(x, w, bias, "relu", res, implementation=impl)
    assert rel_err(out, oracle(x, w, bias=bias, activation="relu", residual=res)) < 1e-6


@pytest.mark.parametrize("impl", BACKENDS)
def test_nan_propagates(impl):
    k = rngs(2)
    a, b = operand(k[0], (6, 16), F32), operand(k[1], (16, 5), F32)
    a = a.at[2, 3].set(jnp.nan)
    for activation in ACTIVATIONS:
        out = np.asarray(jax_ops.gemm(a, b, activation=activation, implementation=impl))
        assert np.all(np.isnan(out[2])), activation
        assert np.all(np.isfinite(np.delete(out, 2, axis=0))), activation
    bias = jnp.zeros(5).at[1].set(jnp.inf)
    out = np.asarray(jax_ops.gemm(a, b, bias=bias, activation="relu", implementation=impl))
    assert np.all(np.isposinf(np.delete(out[:, 1], 2)))


@pytest.mark.parametrize("impl", BACKENDS)
def test_vector_operands_take_output_shaped_epilogue_operands(impl):
    r = rngs(4)
    a, b, res = operand(r[0], (3, 5, 7), F32), operand(r[1], (7,), F32), operand(r[2], (3, 5), F32)
    out = jax_ops.gemm(a, b, residual=res, c=res, beta=2.0, implementation=impl)  # output [3, 5]
    ref = np.asarray(a, np.float64) @ np.asarray(b, np.float64) + 3 * np.asarray(res, np.float64)
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)


def test_beta_zero_does_not_read_c():
    a, b = jnp.ones((2, 3)), jnp.ones((3, 4))
    out = jax_ops.gemm(a, b, c=jnp.full((2, 4), jnp.nan), beta=0.0, implementation="ffi")
    np.testing.assert_array_equal(np.asarray(out), 3.0)


def _lowered(impl):
    f = jax.jit(functools.partial(jax_ops.gemm, implementation=impl))
    return f.lower(jnp.ones((4, 8)), jnp.ones((8, 2))).as_text()


def test_default_on_cpu_is_xla_and_ffi_is_the_twin():
    assert "jax_ops_gemm" not in _lowered(None)
    assert "jax_ops_gemm" in _lowered("ffi")
    assert "jax_ops_gemm" not in _lowered("xla")


def test_plan_knob():
    a, b = jnp.ones((2, 3)), jnp.ones((3, 4))
    for plan in ("auto", "sm90", "skinny", "simt", "cublaslt"):  # the twin runs every plan
        with gemm_ops.overrides(plan=plan):
            np.testing.assert_array_equal(np.asarray(jax_ops.gemm(a, b, implementation="ffi")), 3.0)
    with gemm_ops.overrides(plan="fastest"), pytest.raises(ValueError, match="knob plan must be one of"):
        jax_ops.gemm(a, b, implementation="ffi")
    with pytest.raises(TypeError, match="unknown knob"):
        gemm_ops.overrides(tile=128).__enter__()


def test_jit_and_activation_table():
    assert sorted(gemm_ops.ACTIVATIONS) == sorted(["identity", "relu", "gelu_tanh", "gelu", "silu"])
    k = rngs(2)
    a, b = operand(k[0], (5, 7), F32), operand(k[1], (7, 3), F32)
    f = jax.jit(lambda a, b: jax_ops.gemm(a, b, activation="gelu_tanh", alpha=2.0, implementation="ffi"))
    assert rel_err(f(a, b), oracle(a, b, alpha=2.0, activation="gelu_tanh")) < 1e-6


f32 = jnp.ones((4, 8), F32)
w32 = jnp.ones((8, 5), F32)
ERRORS = [
    (TypeError, "b has dtype bfloat16 but a has float32", lambda: jax_ops.gemm(f32, w32.astype(BF16))),
    (TypeError, "b has dtype float8_e4m3fn but a has int8",
     lambda: jax_ops.gemm(f32.astype(INT8), w32.astype(E4M3))),
    (TypeError, "a has dtype int32", lambda: jax_ops.gemm(f32.astype(jnp.int32), w32)),
    (TypeError, "a must be an array", lambda: jax_ops.gemm("x", w32)),
    (ValueError, "a has K = 8 .* but b has K = 7", lambda: jax_ops.gemm(f32, jnp.ones((7, 5)))),
    (ValueError, "batch dims", lambda: jax_ops.gemm(jnp.ones((2, 4, 8)), jnp.ones((3, 8, 5)))),
    (ValueError, "transpose_a needs a of rank >= 2", lambda: jax_ops.gemm(jnp.ones(8), w32, transpose_a=True)),
    (ValueError, "bias must have shape \\(5,\\)", lambda: jax_ops.gemm(f32, w32, bias=jnp.ones(4))),
    (TypeError, "bias must have a floating dtype", lambda: jax_ops.gemm(f32, w32, bias=jnp.ones(5, jnp.int32))),
    (ValueError, "float8_e4m3fn inputs need a_scale and b_scale",
     lambda: jax_ops.gemm(f32.astype(E4M3), w32.astype(E4M3))),
    (ValueError, "int8 inputs need a_scale and b_scale",
     lambda: jax_ops.gemm(f32.astype(INT8), w32.astype(INT8), a_scale=1.0)),
    (ValueError, "apply to float8 and int8 inputs only", lambda: jax_ops.gemm(f32, w32, a_scale=1.0)),
    (ValueError, "a_scale must be a scalar, per row \\(4,\\)",
     lambda: jax_ops.gemm(f32.astype(INT8), w32.astype(INT8), a_scale=jnp.ones(3), b_scale=1.0)),
    (ValueError, "b_scale must be a scalar or per column \\(5,\\)",
     lambda: jax_ops.gemm(f32.astype(INT8), w32.astype(INT8), a_scale=1.0, b_scale=jnp.ones(4))),
    (TypeError, "out_dtype float16 is not available for float32",
     lambda: jax_ops.gemm(f32, w32, out_dtype=F16)),
    (TypeError, "out_dtype float64 is not available for int8",
     lambda: jax_ops.gemm(f32.astype(INT8), w32.astype(INT8), a_scale=1.0, b_scale=1.0, out_dtype=F64)),
    (ValueError, "activation must be None or one of", lambda: jax_ops.gemm(f32, w32, activation="tanh")),
    (ValueError, "beta = 1.0 needs c", lambda: jax_ops.gemm(f32, w32, beta=1.0)),
    (ValueError, "c has shape \\(3, 5\\)", lambda: jax_ops.gemm(f32, w32, c=jnp.ones((3, 5)), beta=1.0)),
    (ValueError, "c has shape \\(3, 5\\)", lambda: jax_ops.gemm(f32, w32, c=jnp.ones((3, 5)))),
    (ValueError, "residual has shape \\(4, 4\\)", lambda: jax_ops.gemm(f32, w32, residual=jnp.ones((4, 4)))),
    (TypeError, "alpha must be a static Python number", lambda: jax_ops.gemm(f32, w32, alpha=jnp.float32(2))),
    (ValueError, "precision must be None", lambda: jax_ops.gemm(f32, w32, precision="fp16")),
    (ValueError, "implementation must be one of", lambda: jax_ops.gemm(f32, w32, implementation="cublas")),
    (ValueError, "w must be \\[K, N\\]", lambda: jax_ops.linear(f32, jnp.ones((1, 8, 5)))),
    (ValueError, "w_up has shape", lambda: jax_ops.gated_linear(f32, w32, jnp.ones((8, 4)))),
    (ValueError, "w_gate must be \\[K, 2, N\\]", lambda: jax_ops.gated_linear(f32, w32)),
    (ValueError, "x has K = 8 .* but w_gate has K = 7",
     lambda: jax_ops.gated_linear(f32, jnp.ones((7, 5)), jnp.ones((7, 5)))),
    (TypeError, "gated_linear takes float16, bfloat16, float32 or float64",
     lambda: jax_ops.gated_linear(f32.astype(E4M3), w32.astype(E4M3), w32.astype(E4M3))),
    (TypeError, "w_up has dtype float16 but a has float32",
     lambda: jax_ops.gated_linear(f32, w32, w32.astype(F16))),
    (ValueError, "bias must have shape \\(2, 5\\)", lambda: jax_ops.gated_linear(f32, w32, w32, bias=jnp.ones(5))),
]  # fmt: skip


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: e[1][:40])
def test_bad_input_raises_naming_the_argument(error):
    exc, message, call = error
    with pytest.raises(exc, match=message):
        call()
