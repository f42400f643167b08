"""The public functions of the gemm family: ``gemm``, ``linear`` and ``gated_linear``."""

from __future__ import annotations

from jax_ops._src import dispatch
from jax_ops._src.gemm.ffi import fill, unsupported_reason
from jax_ops._src.gemm.reference import gemm_reference
from jax_ops._src.gemm.validation import Call, gated_call, gemm_call, operand
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
