"""The public functions of the attention family: ``dot_product_attention`` and ``shard_map_attention``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from jax_ops._src import dispatch
from jax_ops._src.attention.heuristics import unsupported_reason
from jax_ops._src.attention.validation import normalize
from jax_ops._src.attention.vjp import attention_vjp, reference_call

# None: the fastest correct path (on the CPU the XLA reference, see docs/attention.md); "ffi": our kernel (the CPU
# twin on the CPU); "xla": the jnp reference; "cudnn": jax.nn's cuDNN path, unchanged.
IMPLEMENTATIONS = (*dispatch.IMPLEMENTATIONS, "cudnn")


def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size: int | tuple[int | None, int | None] | None = None,
    implementation: str | None = None,
    return_residual: bool = False,
):
    """Scaled dot-product attention; same signature and layouts as :func:`jax.nn.dot_product_attention`.

    Args:
      query: ``[B, T, N, H]`` or ``[T, N, H]``; float16, bfloat16 or float32 for the kernel.
      key, value: ``[B, S, K, H]`` or ``[S, K, H]``, query's dtype; ``N % K == 0``.
      bias: optional, rank <= 4, broadcastable to ``[B, N, T, S]`` (each dim 1 or full); added to the scaled
        logits. Cast to float32 unless it is float32 or query's dtype. Differentiable.
      mask: optional bool, rank <= 4, broadcastable to ``[B, N, T, S]``; True = attend.
      scale: static float; default ``1 / sqrt(H)``.
      is_causal: key ``s`` is visible to query ``t`` iff ``s <= t`` (top-left aligned, as jax.nn).
      query_seq_lengths, key_value_seq_lengths: integer ``[B]``; rows ``t >= q_len`` / keys ``s >= kv_len``
        are padding (padded query rows return 0).
      local_window_size: ``w`` or ``(left, right)``: keys ``t - left <= s <= t + right``.
      implementation: ``None`` | ``"ffi"`` | ``"xla"`` | ``"cudnn"`` (see the module docstring).
      return_residual: also return the log-sum-exp, shape ``[B, T, N]`` (``[T, N]``), query's dtype, under
        ``stop_gradient``; ``-inf`` on rows with no allowed key.

    Returns:
      The output, shaped like ``query`` (and the residual when ``return_residual``).
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "cudnn":
        return jax.nn.dot_product_attention(
            query,
            key,
            value,
            bias,
            mask,
            scale=scale,
            is_causal=is_causal,
            query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=local_window_size,
            implementation="cudnn",
            return_residual=return_residual,
        )
    out_shape = tuple(jnp.shape(query))
    cfg, (q, k, v, bias, mask, qsl, kvsl) = normalize(
        query,
        key,
        value,
        bias,
        mask,
        scale,
        is_causal,
        query_seq_lengths,
        key_value_seq_lengths,
        local_window_size,
    )
    reason = unsupported_reason(q.dtype, q.shape[3]) if implementation != "xla" else None
    path = dispatch.choose(
        "jax_ops.dot_product_attention", implementation, unsupported=reason, default_on_cpu="xla"
    )
    if path == "ffi":
        o, lse = attention_vjp(cfg, q, k, v, bias, mask, qsl, kvsl)
    else:
        # The log-sum-exp only when returned: an empty row's -inf would trip jax.debug_infs in eager mode.
        o_lse = reference_call(cfg, q, k, v, bias, mask, qsl, kvsl, return_lse=return_residual)
        o, lse = o_lse if return_residual else (o_lse, None)
    o = o.reshape(out_shape)
    if not return_residual:
        return o
    res = jax.lax.stop_gradient(jnp.transpose(lse, (0, 2, 1)).astype(q.dtype))
    return o, res.reshape(out_shape[:-1])


def shard_map_attention(mesh, *, batch_axis=None, head_axis=None, **kwargs):
    """``jax.shard_map`` version of :func:`dot_product_attention` for ``[B, T, N, H]`` inputs.

    Returns ``f(query, key, value, bias=None, mask=None, query_seq_lengths=None, key_value_seq_lengths=None)``
    whose inputs are sharded as ``P(batch_axis, None, head_axis, None)`` (bias/mask: their batch/head dims when
    full, else replicated; seq lengths ``P(batch_axis)``); each shard runs the kernel on its local block with no
    communication in the forward pass (``head_axis`` must divide the kv heads K). ``kwargs`` are the static
    keywords of :func:`dot_product_attention` (scale, is_causal, local_window_size, implementation, ...).

    In a hand-written ``jax.shard_map``, call :func:`dot_product_attention` on the local blocks the same way;
    differentiate it there with ``check_vma=False`` (jax 0.10 rejects its backward pass under vma checking).
    """

    def bspec(x, B, N):
        if x is None:
            return None
        shape = (1,) * (4 - x.ndim) + tuple(x.shape)
        return P(
            batch_axis if shape[0] == B and B > 1 else None, head_axis if shape[1] == N and N > 1 else None
        )

    def f(query, key, value, bias=None, mask=None, query_seq_lengths=None, key_value_seq_lengths=None):
        B, N = query.shape[0], query.shape[2]
        if bias is not None:
            bias = bias.reshape((1,) * (4 - bias.ndim) + tuple(bias.shape))
        if mask is not None:
            mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
        qspec = P(batch_axis, None, head_axis, None)
        sspec = P(batch_axis)
        args = (query, key, value, bias, mask, query_seq_lengths, key_value_seq_lengths)
        specs = (qspec, qspec, qspec, bspec(bias, B, N), bspec(mask, B, N), sspec, sspec)
        present = [i for i, a in enumerate(args) if a is not None]
        ret_res = kwargs.get("return_residual", False)
        out_specs = (qspec, P(batch_axis, None, head_axis)) if ret_res else qspec

        def local(*xs):
            full = [None] * len(args)
            for i, x in zip(present, xs):
                full[i] = x
            q, k, v, b, m, qs, ks = full
            return dot_product_attention(
                q, k, v, b, m, query_seq_lengths=qs, key_value_seq_lengths=ks, **kwargs
            )

        # check_vma=False: with jax 0.10 the backward pass of this custom_vjp is rejected under vma checking
        # (its cotangents come back without varying-axes types); the kernel is purely per-shard.
        smap = jax.shard_map(
            local, mesh=mesh, in_specs=tuple(specs[i] for i in present), out_specs=out_specs, check_vma=False
        )
        return smap(*(args[i] for i in present))

    return f
