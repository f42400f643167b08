"""The public functions of the gemm family: ``gemm``, ``linear``, ``gated_linear`` and ``k_sharded_gemm`` (a K-split
GEMM inside ``jax.shard_map``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src import dispatch
from jax_ops._src.gemm.activations import canonical
from jax_ops._src.gemm.ffi import fill, unsupported_reason
from jax_ops._src.gemm.reference import epilogue, gemm_reference
from jax_ops._src.gemm.validation import (
    F32,
    F64,
    Call,
    Config,
    _broadcast_operand,
    _float_operand,
    _static_number,
    gated_call,
    gemm_call,
    kind,
    operand,
    out_dtypes,
)
from jax_ops._src.gemm.vjp import gemm_vjp


def _run(op: str, call: Call, implementation: str | None):
    reason = unsupported_reason() if implementation != "xla" else None
    # On the CPU, XLA's multithreaded dot beats the single-threaded twin (docs/gemm.md): None runs XLA there.
    path = dispatch.choose(op, implementation, unsupported=reason, default_on_cpu="xla")
    if path == "ffi":
        out = gemm_vjp(call.cfg, *fill(call.operands))
    else:
        out = gemm_reference(call.cfg, *call.operands)[0]
    return out.reshape(call.out_shape)


def gemm(
    a,
    b,
    *,
    bias=None,
    c=None,
    alpha: float = 1.0,
    beta: float = 0.0,
    activation: str | None = None,
    residual=None,
    out_dtype=None,
    transpose_a: bool = False,
    transpose_b: bool = False,
    precision=None,
    a_scale=None,
    b_scale=None,
    implementation: str | None = None,
):
    """``act(alpha * op(a) @ op(b) + beta * c + bias) + residual``, rounded once to ``out_dtype``.

    Args:
      a: ``[..., M, K]`` (``[..., K, M]`` with ``transpose_a``), or ``[K]`` as in ``jnp.matmul``.
      b: ``[K, N]`` or ``[..., K, N]`` (``[..., N, K]`` with ``transpose_b``), or ``[K]``. Leading batch dims of a
        and b broadcast like ``jnp.matmul``.
      bias: ``[N]``, added before the activation (float32; float64 for float64 inputs).
      c: broadcastable to the output, scaled by ``beta`` (read only when ``beta != 0``; required then).
      alpha, beta: static Python numbers.
      activation: None / "identity", "relu", "gelu_tanh", "gelu" (exact erf), "silu".
      residual: broadcastable to the output, added after the activation.
      out_dtype: default: float16/bfloat16 -> the same; float32 -> float32; float64 -> float64; float8/int8 ->
        bfloat16. Half inputs may write float32; float8/int8 write float16, bfloat16 or float32.
      transpose_a, transpose_b: op(x) = x^T over the last two dims (read in place, no copy).
      precision: None or HIGHEST: exact fp32 products for float32; DEFAULT / HIGH ("tensorfloat32"): TF32.
      a_scale, b_scale: float8 and int8 dequantisation scales (both required): a_scale a scalar or per row of
        op(a) ``[M]``, b_scale a scalar or per column ``[N]``; the product is scaled before alpha.
      implementation: None (CPU: XLA; GPU: our kernel), "ffi" (our kernel; the CPU twin on the CPU) or "xla".

    Differentiable (custom_vjp) for float16/bfloat16/float32/float64 in a, b, bias, c and residual. The matrix
    dims of c / residual follow the output's; see docs/gemm.md for the dtype table.
    """
    dispatch.check_implementation(implementation)
    call = gemm_call(
        a,
        b,
        bias=bias,
        c=c,
        alpha=alpha,
        beta=beta,
        activation=activation,
        residual=residual,
        out_dtype=out_dtype,
        transpose_a=transpose_a,
        transpose_b=transpose_b,
        precision=precision,
        a_scale=a_scale,
        b_scale=b_scale,
    )
    return _run("jax_ops.gemm", call, implementation)


def linear(
    x, w, bias=None, activation: str | None = None, residual=None, *, implementation: str | None = None
):
    """The layer ``act(x @ w + bias) + residual`` for ``x [..., K]`` and ``w [K, N]`` (gemm's rules otherwise)."""
    w = operand("w", w)
    if w.ndim != 2:
        raise ValueError(f"w must be [K, N], got shape {w.shape}")
    return gemm(x, w, bias=bias, activation=activation, residual=residual, implementation=implementation)


def gated_linear(
    x,
    w_gate,
    w_up=None,
    activation: str | None = "silu",
    *,
    bias=None,
    residual=None,
    implementation: str | None = None,
):
    """``act(x @ w_gate + bias[0]) * (x @ w_up + bias[1]) + residual`` (SwiGLU with "silu", GeGLU with "gelu").

    Args:
      x: ``[..., K]``, float16, bfloat16, float32 or float64; any number of rows (decode included).
      w_gate, w_up: ``[K, N]`` each, x's dtype; or ``w_gate`` ``[K, 2, N]`` with ``w_up=None`` (the packed layout:
        ``w_gate[:, 0]`` gates, ``w_gate[:, 1]`` is the up projection).
      bias: optional ``[2, N]`` (gate row, up row).
      residual: broadcastable to ``[..., N]``.

    One kernel computes both products and combines them in its epilogue (no weight concatenation).
    Differentiable (custom_vjp) in every array argument.
    """
    dispatch.check_implementation(implementation)
    call = gated_call(x, w_gate, w_up, activation, bias, residual)
    return _run("jax_ops.gated_linear", call, implementation)


def k_sharded_gemm(
    a,
    b,
    *,
    axis_name,
    scatter_dimension: int | None = None,
    bias=None,
    c=None,
    alpha: float = 1.0,
    beta: float = 0.0,
    activation: str | None = None,
    residual=None,
    out_dtype=None,
    transpose_a: bool = False,
    transpose_b: bool = False,
    precision=None,
    a_scale=None,
    b_scale=None,
    implementation: str | None = None,
):
    """:func:`gemm` inside a ``jax.shard_map`` whose ``axis_name`` (a mesh axis or a tuple of them) splits K: ``a``
    and ``b`` are this shard's K slices (matrices or batches of them, ``[..., M, Kl]`` / ``[..., Kl, N]`` or
    transposed). The local product runs without epilogue into f32 partial sums (f64 for float64), which are summed
    over ``axis_name``: ``psum``, or with ``scatter_dimension`` (an output dim, e.g. -2 for M, -1 for N)
    ``psum_scatter`` (tiled), leaving this shard's block of that dim. The epilogue then runs once on the reduced
    block, so ``bias``, ``c``, ``residual``, ``a_scale`` and ``b_scale`` are that block's (gemm's shapes with the
    scattered dim's local size). Differentiable like :func:`gemm` (float types)."""
    dispatch.check_implementation(implementation)
    a, b = operand("a", a), operand("b", b)
    if a.ndim < 2 or b.ndim < 2:
        raise ValueError(f"k_sharded_gemm takes matrices (rank >= 2), got a {a.shape} and b {b.shape}")
    names = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    if not names or not all(isinstance(n, str) for n in names):
        raise ValueError(f"axis_name must be a mesh axis name or a tuple of them, got {axis_name!r}")
    k = kind(a.dtype)
    scaled = k in ("fp8", "int8")
    if scaled and (a_scale is None or b_scale is None):
        raise ValueError(f"{a.dtype} inputs need a_scale and b_scale (float32 dequantisation scales)")
    if not scaled and (a_scale is not None or b_scale is not None):
        raise ValueError(f"a_scale / b_scale apply to float8 and int8 inputs only, not {a.dtype}")
    unit = jnp.ones((), F32) if scaled else None  # the real scales apply after the reduction
    partial = gemm_call(
        a, b, bias=None, c=None, alpha=1.0, beta=0.0, activation=None, residual=None,
        out_dtype=F64 if k == "f64" else F32, transpose_a=transpose_a, transpose_b=transpose_b,
        precision=precision, a_scale=unit, b_scale=unit,
    )  # fmt: skip
    allowed = out_dtypes(a.dtype)
    out_dt = allowed[0] if out_dtype is None else np.dtype(out_dtype)
    if out_dt not in allowed:
        choices = ", ".join(str(d) for d in allowed)
        raise TypeError(f"out_dtype {out_dt} is not available for {a.dtype} inputs (choose from {choices})")
    alpha, beta = _static_number("alpha", alpha), _static_number("beta", beta)
    cfg = Config(out_dtype=out_dt, activation=canonical(activation), alpha=alpha, beta=beta)
    acc = _run("jax_ops.k_sharded_gemm", partial, implementation)
    if scatter_dimension is None:
        acc = jax.lax.psum(acc, axis_name)
    else:
        if not -acc.ndim <= scatter_dimension < acc.ndim:
            raise ValueError(
                f"scatter_dimension must be a dim of the {acc.ndim}-d output, got {scatter_dimension}"
            )
        acc = jax.lax.psum_scatter(acc, axis_name, scatter_dimension=scatter_dimension % acc.ndim, tiled=True)
    shape = tuple(acc.shape)
    M, N = shape[-2:]
    if beta != 0 and c is None:
        raise ValueError(f"beta = {beta} needs c")
    c = _broadcast_operand("c", c, shape, out_dt) if c is not None and beta != 0 else None
    residual = _broadcast_operand("residual", residual, shape, out_dt) if residual is not None else None
    if bias is not None:
        bias = _float_operand("bias", bias, F64 if k == "f64" else F32)
        if bias.shape != (N,):
            raise ValueError(f"bias must have shape ({N},) (this block's output columns), got {bias.shape}")
    if scaled:
        a_scale, b_scale = _float_operand("a_scale", a_scale, F32), _float_operand("b_scale", b_scale, F32)
        if a_scale.size != 1 and a_scale.shape not in ((M,), shape[:-1]):
            raise ValueError(
                f"a_scale must be a scalar or per row {(M,)} or {shape[:-1]}, got {a_scale.shape}"
            )
        if b_scale.size != 1 and b_scale.shape != (N,):
            raise ValueError(f"b_scale must be a scalar or per column ({N},), got {b_scale.shape}")
    return epilogue(cfg, [acc], bias, c, residual, a_scale, b_scale)[0]
