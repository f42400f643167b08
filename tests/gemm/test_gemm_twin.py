"""The CPU twin through the raw target (contract: ffi_cuda/gemm/params.h): every output element written, the
dtype decoding, and the handler's own checks (InvalidArgument naming the argument)."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_cases import E4M3, E5M2, operand, oracle, rngs
from helpers import poisoned, rel_err

from jax_ops import _ffi

TARGET = "jax_ops_gemm"


def empty():
    return jnp.zeros((0,), jnp.float32)


def raw(
    a,
    b,
    *,
    b_up=None,
    bias=None,
    c=None,
    residual=None,
    a_scale=None,
    b_scale=None,
    out_shape=None,
    out_dtype=None,
    preact_shape=(0,),
    aliases=None,
    workspace_bytes=0,
    workspace_dtype=jnp.uint8,
    **attrs,
):
    """One direct call of the target (attributes default to a plain GEMM)."""
    kw = dict(
        alpha=1.0,
        beta=0.0,
        activation=0,
        gated=0,
        transpose_a=False,
        transpose_b=False,
        write_preact=False,
        tf32=False,
        plan=0,
    )
    kw.update(attrs)
    kw = {
        k: (
            np.float64(v)
            if k in ("alpha", "beta")
            else np.int64(v)
            if isinstance(v, int) and not isinstance(v, bool)
            else v
        )
        for k, v in kw.items()
    }
    out_dtype = out_dtype or a.dtype
    if out_shape is None:
        out_shape = (a.shape[0], a.shape[1], b.shape[2])
    shapes = (
        jax.ShapeDtypeStruct(out_shape, out_dtype),
        jax.ShapeDtypeStruct(preact_shape, out_dtype),
        jax.ShapeDtypeStruct((workspace_bytes,), workspace_dtype),
    )
    args = [x if x is not None else empty() for x in (a, b, b_up, bias, c, residual, a_scale, b_scale)]
    call = lambda *xs: _ffi.ffi_call(TARGET, shapes, *xs, input_output_aliases=aliases, **kw)[:2]  # noqa: E731
    return jax.jit(call)(*args)


def test_registered():
    assert TARGET in _ffi.target_names("cpu")
    consts = _ffi.constants()
    assert consts["gemm_activations"] == ("identity", "relu", "gelu_tanh", "gelu", "silu")
    assert consts["gemm_plans"] == ("auto", "sm90", "skinny", "simt", "cublaslt")


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 17, 129, 65), (1, 130, 70, 300)])
def test_every_element_written(shape):
    """out aliases a NaN-filled c (beta = 0: c is not read), so an unwritten element stays NaN."""
    B, M, N, K = shape
    r = rngs(2)
    a, b = operand(r[0], (B, M, K), jnp.float32), operand(r[1], (1, K, N), jnp.float32)
    out, _ = raw(a, b, c=poisoned((B, M, N), jnp.float32), aliases={4: 0})
    assert rel_err(out, oracle(a, b)) < 1e-5


def test_fp8_decoding_is_bit_exact():
    """Every e4m3fn / e5m2 code (NaN aside) times 1.0 comes back as its exact value in float32."""
    for dtype in (E4M3, E5M2):
        codes = jnp.arange(256, dtype=jnp.uint8)
        vals = jax.lax.bitcast_convert_type(codes, dtype)
        finite = np.isfinite(np.asarray(vals).astype(np.float32))
        a = vals[finite].reshape(1, -1, 1)
        one = jnp.ones((1, 1, 1), dtype)
        out, _ = raw(a, one, out_dtype=jnp.float32)
        np.testing.assert_array_equal(np.asarray(out).ravel(), np.asarray(a).astype(np.float32).ravel())


def test_zero_k_runs_the_epilogue():
    a, b = jnp.zeros((1, 3, 0), jnp.float32), jnp.zeros((1, 0, 4), jnp.float32)
    bias = jnp.arange(4, dtype=jnp.float32) - 1.5
    out, _ = raw(a, b, bias=bias, activation=1)
    np.testing.assert_array_equal(
        np.asarray(out), np.broadcast_to(np.maximum(np.asarray(bias), 0), (1, 3, 4))
    )


def test_512_cubed_f32_is_not_naive():
    r = rngs(2)
    a, b = operand(r[0], (1, 512, 512), jnp.float32), operand(r[1], (1, 512, 512), jnp.float32)
    raw(a, b)[0].block_until_ready()
    t = time.perf_counter()
    out = raw(a, b)[0].block_until_ready()
    elapsed = time.perf_counter() - t
    assert rel_err(out, oracle(a, b)) < 1e-5
    assert elapsed < 1.0, f"512^3 f32 took {elapsed:.2f} s on the CPU twin"


f32 = jnp.float32
A, W = jnp.ones((2, 4, 8), f32), jnp.ones((1, 8, 5), f32)
BAD = {
    "a must have rank 3": dict(a=jnp.ones((4, 8), f32), out_shape=(2, 4, 5)),
    "but b has K": dict(b=jnp.ones((1, 7, 5), f32)),
    "neither 1 nor": dict(b=jnp.ones((3, 8, 5), f32)),
    "out has shape": dict(out_shape=(2, 4, 6)),
    "bias must be float32 with 5": dict(bias=jnp.ones(4, f32)),
    "bias must be float32": dict(bias=jnp.ones(5, jnp.float16)),
    "c must be": dict(c=jnp.ones((2, 4, 4), f32), beta=1.0),
    "residual must be": dict(residual=jnp.ones((2, 4, 5), jnp.float16)),
    "a_scale must have 1 or M": dict(a_scale=jnp.ones(3, f32)),
    "b_scale must have 1 or 5": dict(b_scale=jnp.ones(4, f32)),
    "needs a_scale and b_scale": dict(
        a=jnp.ones((2, 4, 8), jnp.int8), b=jnp.ones((1, 8, 5), jnp.int8), out_dtype=f32
    ),
    "but b is": dict(a=jnp.ones((2, 4, 8), jnp.bfloat16), b=jnp.ones((1, 8, 5), jnp.float16)),
    "same dtype": dict(out_dtype=jnp.float16),
    "writes float16, bfloat16 or float32": dict(
        a=jnp.ones((2, 4, 8), E4M3), b=jnp.ones((1, 8, 5), E4M3), out_dtype=jnp.float64
    ),
    "tf32 applies to float32": dict(
        a=jnp.ones((2, 4, 8), jnp.float16), b=jnp.ones((1, 8, 5), jnp.float16), tf32=True
    ),
    "activation id": dict(activation=9),
    "plan id": dict(plan=7),
    "cannot be transposed": dict(gated=2, transpose_b=True, b=jnp.ones((1, 10, 8), f32)),
    "even column count": dict(gated=2, b=jnp.ones((1, 8, 5), f32)),
    "b_up is given": dict(b_up=jnp.ones((1, 8, 5), f32)),
    "b_up has shape": dict(gated=1, b_up=jnp.ones((1, 8, 4), f32)),
    "c is not supported with a gated": dict(
        gated=1, b_up=jnp.ones((1, 8, 5), f32), c=jnp.ones((2, 4, 5), f32)
    ),
    "preact has": dict(write_preact=True, preact_shape=(2, 4, 4)),
    "workspace must be a rank-1 uint8": dict(workspace_bytes=16, workspace_dtype=f32),
}


@pytest.mark.parametrize("message", list(BAD))
def test_handler_rejects_bad_input(message):
    kw = dict(BAD[message])
    a, b = kw.pop("a", A), kw.pop("b", W)
    with pytest.raises(Exception, match=f"INVALID_ARGUMENT: .*{message}"):
        jax.block_until_ready(raw(a, b, **kw))
