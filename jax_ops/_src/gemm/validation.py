"""Argument checks of gemm / linear / gated_linear and the static configuration of one call: everything a user can
get wrong raises here, at trace time, naming the argument, before any kernel sees it."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.gemm import config
from jax_ops._src.gemm.activations import activation_id, canonical

F16, BF16, F32, F64 = (np.dtype(d) for d in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))
FP8 = (np.dtype(jnp.float8_e4m3fn), np.dtype(jnp.float8_e5m2))
INT8 = np.dtype(jnp.int8)
INPUT_DTYPES = (F16, BF16, F32, F64, *FP8, INT8)
GATED = ("none", "separate", "packed")  # ids 0, 1, 2 as params.h's Gated


def kind(dtype) -> str | None:
    """The dtype class of params.h's rules: "half" (f16/bf16), "f32", "f64", "fp8", "int8", or None."""
    dt = np.dtype(dtype)
    if dt in (F16, BF16):
        return "half"
    if dt == F32:
        return "f32"
    if dt == F64:
        return "f64"
    if dt in FP8:
        return "fp8"
    if dt == INT8:
        return "int8"
    return None


def out_dtypes(in_dtype) -> tuple[np.dtype, ...]:
    """The output dtypes params.h allows for an input dtype; the first is the default."""
    k = kind(in_dtype)
    if k == "half":
        return (np.dtype(in_dtype), F32)
    if k in ("f32", "f64"):
        return (np.dtype(in_dtype),)
    return (BF16, F16, F32)  # fp8, int8


@dataclasses.dataclass(frozen=True)
class Config:
    """Static attributes of one call (hashable: keys the custom_vmap/custom_partitioning caches)."""

    out_dtype: np.dtype
    activation: str = "identity"
    gated: str = "none"
    transpose_a: bool = False
    transpose_b: bool = False
    alpha: float = 1.0
    beta: float = 0.0
    tf32: bool = False
    write_preact: bool = False
    plan: str = "auto"  # the knob's value when the call was traced
    # The batch is contracted too: out [1, M, N] = sum_b op(a_b) @ op(b_b) (a shared weight's gradient). Needs a
    # transposed a ([B, K, M]), b [B, K, N] and no epilogue but alpha; the kernel sees one GEMM of B*K rows.
    sum_batch: bool = False

    def attrs(self) -> dict[str, Any]:
        """The contract's attributes (ffi_cuda/gemm/params.h)."""
        return dict(
            alpha=np.float64(self.alpha),
            beta=np.float64(self.beta),
            activation=np.int64(activation_id(self.activation)),
            gated=np.int64(GATED.index(self.gated)),
            transpose_a=bool(self.transpose_a),
            transpose_b=bool(self.transpose_b),
            write_preact=bool(self.write_preact),
            tf32=bool(self.tf32),
            plan=np.int64(config.plan_id(self.plan)),
        )


@dataclasses.dataclass(frozen=True)
class Call:
    """One validated call: its Config, the operands in the op's layout (None = absent) and the output's shape.

    Operands (the op's layout, see ffi.py): a [B, M, K] ([B, K, M] transposed), b [Bb, K, N] ([Bb, N, K]; packed
    gated: [Bb, K, 2, N]), b_up like b or None, bias [N] (gated [2, N]), c / residual [B, M, N] of the out dtype,
    a_scale [1], [M] or [B, M] (shared weights only), b_scale [1] or [N] (gated [2, N])."""

    cfg: Config
    operands: tuple
    out_shape: tuple[int, ...]


def _array(name: str, x) -> jax.Array:
    if x is None or isinstance(x, (str, bytes)):
        raise TypeError(f"{name} must be an array, got {type(x).__name__}")
    try:
        return jnp.asarray(x)
    except (TypeError, ValueError) as e:
        raise TypeError(f"{name} must be an array, got {type(x).__name__}") from e


def operand(name: str, x) -> jax.Array:
    x = _array(name, x)
    if kind(x.dtype) is None:
        names = ", ".join(str(d) for d in INPUT_DTYPES)
        raise TypeError(f"{name} has dtype {x.dtype}; the GEMM takes {names}")
    if x.ndim == 0:
        raise ValueError(f"{name} must have rank >= 1, got a scalar")
    return x


def _static_number(name: str, x) -> float:
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a static Python number (a kernel attribute), got {type(x).__name__}")
    return float(x)


def _tf32(precision, dtype) -> bool:
    """precision=None or HIGHEST: exact fp32 products; DEFAULT / HIGH ("tensorfloat32", ...): TF32 for f32."""
    if isinstance(precision, (tuple, list)):
        if len(precision) != 2 or precision[0] != precision[1]:
            raise ValueError(f"precision must be one value for both operands, got {precision!r}")
        precision = precision[0]
    if precision is None:
        return False
    try:
        p = jax.lax.Precision(precision)
    except (ValueError, TypeError) as e:
        raise ValueError(f"precision must be None, a jax.lax.Precision or its name, got {precision!r}") from e
    return kind(dtype) == "f32" and p != jax.lax.Precision.HIGHEST


def _float_operand(name: str, x, dtype) -> jax.Array:
    x = _array(name, x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    return x.astype(dtype)


def _broadcast_operand(name: str, x, shape, dtype) -> jax.Array:
    x = _float_operand(name, x, dtype)
    try:
        ok = np.broadcast_shapes(x.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"{name} has shape {x.shape}, which does not broadcast to the output's {tuple(shape)}"
        )
    return jnp.broadcast_to(x, shape)


def _bias_dtype(in_dtype) -> np.dtype:
    return F64 if kind(in_dtype) == "f64" else F32


def _check_pair(a, b, b_name: str = "b") -> None:
    ka, kb = kind(a.dtype), kind(b.dtype)
    same = np.dtype(a.dtype) == np.dtype(b.dtype) or (ka == "fp8" and kb == "fp8")
    if not same:
        raise TypeError(
            f"{b_name} has dtype {b.dtype} but a has {a.dtype}: both operands must have one dtype "
            "(float8 e4m3fn/e5m2 may pair)"
        )


def _scales(dtype, a_scale, b_scale, batch, M: int, N: int):
    """The dequantisation scales of float8 / int8 as [1], [M] or [B, M] (``batch`` given: per token) and [1] or
    [N], float32; None for float inputs (where they are an error)."""
    if kind(dtype) not in ("fp8", "int8"):
        if a_scale is not None or b_scale is not None:
            raise ValueError(f"a_scale / b_scale apply to float8 and int8 inputs only, not {dtype}")
        return None, None
    if a_scale is None or b_scale is None:
        raise ValueError(f"{dtype} inputs need a_scale and b_scale (float32 dequantisation scales)")
    a_scale, b_scale = _float_operand("a_scale", a_scale, F32), _float_operand("b_scale", b_scale, F32)
    if a_scale.size == 1:
        a_scale = a_scale.reshape(1)
    elif batch and a_scale.shape == batch + (M,):
        a_scale = a_scale.reshape(math.prod(batch), M)
    elif a_scale.shape != (M,):
        per_token = f" or per row of each batch {batch + (M,)}" if batch else ""
        raise ValueError(f"a_scale must be a scalar, per row ({M},){per_token}, got {a_scale.shape}")
    if b_scale.size == 1:
        b_scale = b_scale.reshape(1)
    elif b_scale.shape != (N,):
        raise ValueError(f"b_scale must be a scalar or per column ({N},), got {b_scale.shape}")
    return a_scale, b_scale


def gemm_call(
    a,
    b,
    *,
    bias,
    c,
    alpha,
    beta,
    activation,
    residual,
    out_dtype,
    transpose_a,
    transpose_b,
    precision,
    a_scale,
    b_scale,
) -> Call:
    a, b = operand("a", a), operand("b", b)
    _check_pair(a, b)
    ta, tb = bool(transpose_a), bool(transpose_b)
    if ta and a.ndim < 2:
        raise ValueError("transpose_a needs a of rank >= 2")
    if tb and b.ndim < 2:
        raise ValueError("transpose_b needs b of rank >= 2")
    vec_a, vec_b = a.ndim == 1, b.ndim == 1
    a = a[None, :] if vec_a else a
    b = b[:, None] if vec_b else b
    a_mat, b_mat = tuple(a.shape[-2:]), tuple(b.shape[-2:])
    M, K = a_mat[::-1] if ta else a_mat
    Kb, N = b_mat[::-1] if tb else b_mat
    if K != Kb:
        raise ValueError(
            f"a has K = {K} (shape {a.shape}, transpose_a={ta}) but b has K = {Kb} (shape {b.shape}, transpose_b={tb})"
        )
    try:
        batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
    except ValueError as e:
        raise ValueError(f"a's batch dims {a.shape[:-2]} and b's {b.shape[:-2]} do not broadcast") from e
    allowed = out_dtypes(a.dtype)
    out_dt = allowed[0] if out_dtype is None else np.dtype(out_dtype)
    if out_dt not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"out_dtype {out_dt} is not available for {a.dtype} inputs (choose from {names})")
    alpha, beta = _static_number("alpha", alpha), _static_number("beta", beta)
    act = canonical(activation)
    tf32 = _tf32(precision, a.dtype)

    B = math.prod(batch)
    a3 = jnp.broadcast_to(a, batch + a_mat).reshape(B, *a_mat)
    Bb = 1 if math.prod(b.shape[:-2]) == 1 else B
    b3 = jnp.broadcast_to(b, (batch if Bb > 1 else ()) + b_mat).reshape(Bb, *b_mat)
    per_token = Bb == 1 and not ta  # the kernel folds the batch into M: a row scale may differ per batch
    out_shape = batch + ((M,) if not vec_a else ()) + ((N,) if not vec_b else ())

    def out_operand(name, x):
        if x is None:
            return None
        return _broadcast_operand(name, x, out_shape, out_dt).reshape(B, M, N)

    if beta != 0 and c is None:
        raise ValueError(f"beta = {beta} needs c")
    c3 = out_operand("c", c)
    c3 = c3 if beta != 0 else None  # c is read only when beta != 0 (params.h)
    res3 = out_operand("residual", residual)
    if bias is not None:
        bias = _float_operand("bias", bias, _bias_dtype(a.dtype))
        if bias.shape != (N,):
            raise ValueError(f"bias must have shape ({N},) (one value per output column), got {bias.shape}")
    a_scale, b_scale = _scales(a.dtype, a_scale, b_scale, batch if per_token else None, M, N)
    cfg = Config(
        out_dtype=out_dt,
        activation=act,
        transpose_a=ta,
        transpose_b=tb,
        alpha=alpha,
        beta=beta,
        tf32=tf32,
        plan=config.KNOBS.plan,
    )
    return Call(cfg, (a3, b3, None, bias, c3, res3, a_scale, b_scale), out_shape)


def gated_call(x, w_gate, w_up, activation, bias, residual) -> Call:
    x, w_gate = operand("x", x), operand("w_gate", w_gate)
    if kind(x.dtype) not in ("half", "f32", "f64"):
        raise TypeError(
            f"gated_linear takes float16, bfloat16, float32 or float64 inputs, got x of {x.dtype}"
        )
    _check_pair(x, w_gate, "w_gate")
    K = x.shape[-1]
    if w_up is None:
        if w_gate.ndim != 3 or w_gate.shape[1] != 2:
            raise ValueError(
                f"w_gate must be [K, 2, N] (the packed layout) when w_up is None, got {w_gate.shape}"
            )
        gated, N = "packed", w_gate.shape[2]
    else:
        w_up = operand("w_up", w_up)
        _check_pair(x, w_up, "w_up")
        if w_gate.ndim != 2:
            raise ValueError(f"w_gate must be [K, N], got {w_gate.shape}")
        if w_up.shape != w_gate.shape:
            raise ValueError(f"w_up has shape {w_up.shape} but w_gate has {w_gate.shape}")
        gated, N = "separate", w_gate.shape[1]
    if w_gate.shape[0] != K:
        raise ValueError(f"x has K = {K} (shape {x.shape}) but w_gate has K = {w_gate.shape[0]}")
    act = canonical(activation)
    lead = tuple(x.shape[:-1])
    M = math.prod(lead)
    out_dt = np.dtype(x.dtype)
    if bias is not None:
        bias = _float_operand("bias", bias, _bias_dtype(x.dtype))
        if bias.shape != (2, N):
            raise ValueError(f"bias must have shape (2, {N}) (gate row, up row), got {bias.shape}")
    res = None
    if residual is not None:
        res = _broadcast_operand("residual", residual, lead + (N,), out_dt).reshape(1, M, N)
    b3 = w_gate[None]
    up3 = None if w_up is None else w_up[None]
    cfg = Config(out_dtype=out_dt, activation=act, gated=gated, plan=config.KNOBS.plan)
    return Call(cfg, (x.reshape(1, M, K), b3, up3, bias, None, res, None, None), lead + (N,))
