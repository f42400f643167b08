"""Shared pieces of the gemm tests (CPU twin, XLA path, GPU): a float64 NumPy oracle written independently of the
library, operand generators per dtype and the error bounds per output dtype."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
from scipy.special import erf

ACTIVATIONS = [None, "relu", "gelu_tanh", "gelu", "silu"]
F16, BF16, F32, F64 = jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64
E4M3, E5M2, INT8 = jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.int8
DTYPES = [F16, BF16, F32, F64, E4M3, E5M2, INT8]
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]

# ||out - oracle|| / ||oracle|| bounds by output dtype: one rounding of the output plus the accumulation.
TOL = {F16: 2e-3, BF16: 1e-2, F32: 1e-5, F64: 1e-12}


def tol(dtype) -> float:
    return next(v for k, v in TOL.items() if np.dtype(k) == np.dtype(dtype))


def default_out(dtype):
    if np.dtype(dtype) in (np.dtype(E4M3), np.dtype(E5M2), np.dtype(INT8)):
        return BF16
    return dtype


def f64(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


def act64(name, z):
    if name in (None, "identity"):
        return z
    if name == "relu":
        return np.maximum(z, 0.0)
    if name == "gelu_tanh":
        return 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (z + 0.044715 * z**3)))
    if name == "gelu":
        return 0.5 * z * (1.0 + erf(z / math.sqrt(2.0)))
    if name == "silu":
        with np.errstate(over="ignore"):
            return z / (1.0 + np.exp(-z))
    raise ValueError(name)


def oracle(a, b, *, bias=None, c=None, alpha=1.0, beta=0.0, activation=None, residual=None, transpose_a=False,
           transpose_b=False, a_scale=None, b_scale=None):  # fmt: skip
    """act(alpha * (op(a) @ op(b)) * a_scale * b_scale + beta * c + bias) + residual in float64."""
    A, B = f64(a), f64(b)
    A = np.swapaxes(A, -1, -2) if transpose_a else A
    B = np.swapaxes(B, -1, -2) if transpose_b else B
    z = np.matmul(A, B)
    if a_scale is not None:
        s = f64(a_scale)
        z = z * (s[..., None] if s.size > 1 else s.reshape(()))  # per row of op(a), or per tensor
    if b_scale is not None:
        s = f64(b_scale)
        z = z * (s if s.size > 1 else s.reshape(()))
    z = alpha * z
    if beta != 0:
        z = z + beta * f64(c)
    if bias is not None:
        z = z + f64(bias)
    y = act64(activation, z)
    return y + f64(residual) if residual is not None else y


def gated_oracle(x, w_gate, w_up=None, activation="silu", *, bias=None, residual=None):
    X = f64(x)
    if w_up is None:
        wg, wu = f64(w_gate)[:, 0], f64(w_gate)[:, 1]
    else:
        wg, wu = f64(w_gate), f64(w_up)
    zg, zu = X @ wg, X @ wu
    if bias is not None:
        zg, zu = zg + f64(bias)[0], zu + f64(bias)[1]
    y = act64(activation, zg) * zu
    return y + f64(residual) if residual is not None else y


def rngs(n: int, seed: int = 0) -> list[np.random.Generator]:
    """n independent NumPy generators (NumPy draws: no per-shape compile of jax.random)."""
    return [np.random.default_rng([seed, i]) for i in range(n)]


def operand(rng, shape, dtype, scale=1.0):
    """Random values representable in ``dtype`` (int8: integers in [-127, 127])."""
    if np.dtype(dtype) == np.dtype(INT8):
        return jnp.asarray(rng.integers(-127, 128, shape), INT8)
    return jnp.asarray((scale * rng.standard_normal(shape)).astype(np.float32)).astype(dtype)


def uniform(rng, shape, low, high):
    return jnp.asarray(rng.uniform(low, high, shape).astype(np.float32))


def scales(rng, dtype, M, N):
    """(a_scale, b_scale) for float8/int8 (per row and per column for int8, per tensor / per column for fp8)."""
    if np.dtype(dtype) == np.dtype(INT8):
        return uniform(rng, (M,), 0.5, 1.5) / 127, uniform(rng, (N,), 0.5, 1.5) / 127
    if np.dtype(dtype) in (np.dtype(E4M3), np.dtype(E5M2)):
        return jnp.float32(0.25), uniform(rng, (N,), 0.5, 1.5)
    return None, None


def epilogue_case(dtype, transpose_a, transpose_b, *, B=2, M=17, N=20, K=33, seed=0):
    """Operands of a full epilogue (bias, c with beta, residual; scales for float8/int8) with shared weights."""
    k = rngs(6, seed)
    a = operand(k[0], (B, K, M) if transpose_a else (B, M, K), dtype)
    b = operand(k[1], (N, K) if transpose_b else (K, N), dtype, scale=K**-0.5)
    out = default_out(dtype)
    a_scale, b_scale = scales(k[2], dtype, M, N)
    kw = dict(
        bias=operand(k[3], (N,), F64 if dtype == F64 else F32),
        c=operand(k[4], (B, M, N), out),
        beta=0.5,
        alpha=0.75,
        residual=operand(k[5], (B, M, N), out),
        transpose_a=transpose_a,
        transpose_b=transpose_b,
        a_scale=a_scale,
        b_scale=b_scale,
    )
    return a, b, kw


def split_static(kw):
    """gemm keywords -> (array operands, static attributes): arrays can be jit arguments, the rest cannot."""
    static = {k: v for k, v in kw.items() if k in ("alpha", "beta", "transpose_a", "transpose_b")}
    return {k: v for k, v in kw.items() if k not in static}, static
