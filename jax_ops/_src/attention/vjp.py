"""The differentiable forward: ``custom_vjp`` over the kernel targets, with the split-KV and GQA-packed forward
variants, and the reference VJP where a platform has no backward kernel."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_ops import _checks
from jax_ops._src.attention import heuristics
from jax_ops._src.attention.batching import bwd_op, fwd_op
from jax_ops._src.attention.blocked import blocked_attention, dense_fits
from jax_ops._src.attention.config import KNOBS
from jax_ops._src.attention.ffi import fill
from jax_ops._src.attention.masks import switch_on_mask
from jax_ops._src.attention.merge import merge_by_lse
from jax_ops._src.attention.reference import dot_product_attention as reference_attention
from jax_ops._src.attention.validation import Config
from jax_ops._src.vma import vary_like


def _forward_split(cfg: Config, splits: int, q, k, v, qsl, kvsl):
    """The forward over `splits` key chunks folded into the batch, merged by log-sum-exp (fp32)."""
    B, T, N, D = q.shape
    S, K = k.shape[1], k.shape[2]
    chunk = S // splits
    qf = jnp.broadcast_to(q[:, None], (B, splits, T, N, D)).reshape(B * splits, T, N, D)
    kf = k.reshape(B * splits, chunk, K, D)
    vf = v.reshape(B * splits, chunk, K, D)
    kv_len = kvsl if cfg.has_kv_seqlen else jnp.full((B,), S, jnp.int32)
    starts = jnp.arange(splits, dtype=jnp.int32) * chunk
    chunk_len = jnp.clip(kv_len[:, None] - starts[None, :], 0, chunk).reshape(B * splits).astype(jnp.int32)
    qslf = jnp.repeat(qsl, splits) if cfg.has_q_seqlen else qsl
    split_cfg = dataclasses.replace(cfg, has_kv_seqlen=True)
    bias, mask, qslf, _ = fill(split_cfg, None, None, qslf, chunk_len)
    o_parts, lse_parts = fwd_op(split_cfg)(qf, kf, vf, bias, mask, qslf, chunk_len)
    lse_parts = lse_parts.reshape(B, splits, N, T).transpose(0, 1, 3, 2)  # [B, splits, T, N]
    o, lse = merge_by_lse(o_parts.reshape(B, splits, T, N, D), lse_parts, axis=1)
    lse = lse.transpose(0, 2, 1)  # [B, N, T]
    return o.astype(q.dtype), lse.astype(jnp.float32)


def _forward_gqa_packed(cfg: Config, q, k, v, qsl, kvsl):
    """The forward with q [B,T,K·G,D] seen as [B,T·G,K,D] (row t·G+g of kv head k is query head k·G+g)."""
    B, T, N, D = q.shape
    K = k.shape[2]
    G = N // K
    qp = q.reshape(B, T, K, G, D).transpose(0, 1, 3, 2, 4).reshape(B, T * G, K, D)
    qslp = qsl * G if cfg.has_q_seqlen else qsl
    o, lse = _forward(cfg, qp, k, v, None, None, qslp, kvsl)
    o = o.reshape(B, T, G, K, D).transpose(0, 1, 3, 2, 4).reshape(B, T, N, D)
    lse = lse.reshape(B, K, T, G).transpose(0, 1, 3, 2).reshape(B, N, T)
    return o, lse


def _forward(cfg: Config, q, k, v, bias, mask, qsl, kvsl):
    ins = (q, k, v, bias, mask, qsl, kvsl)
    if heuristics.packs_gqa(cfg, q.shape[1], q.shape[2], k.shape[2]):
        return vary_like(_forward_gqa_packed(cfg, q, k, v, qsl, kvsl), ins)
    splits = heuristics.kv_splits(cfg, q.shape[0], q.shape[1], k.shape[1], q.shape[2])
    if splits > 1:
        return vary_like(_forward_split(cfg, splits, q, k, v, qsl, kvsl), ins)
    return vary_like(fwd_op(cfg)(q, k, v, *fill(cfg, bias, mask, qsl, kvsl)), ins)


def _forward_any_mask(cfg: Config, q, k, v, bias, mask, qsl, kvsl):
    """The forward, a mask that is only padding (and causality) run as lengths (masks.py)."""
    return switch_on_mask(
        lambda c, m, qs, ks: _forward(c, q, k, v, bias, m, qs, ks), cfg, q, k, mask, qsl, kvsl
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def attention_vjp(cfg: Config, q, k, v, bias, mask, qsl, kvsl):
    return _forward_any_mask(cfg, q, k, v, bias, mask, qsl, kvsl)


def _attention_fwd(cfg: Config, q, k, v, bias, mask, qsl, kvsl):
    o, lse = _forward_any_mask(cfg, q, k, v, bias, mask, qsl, kvsl)
    return (o, lse), (q, k, v, bias, mask, qsl, kvsl, o, lse)


def reference_call(cfg: Config, q, k, v, bias, mask, qsl, kvsl, return_lse: bool):
    """The jnp path on normalized inputs with cfg's static semantics: ``(o, lse)``, or ``o`` alone. The dense
    reference when its [B, N, T, S] logits fit (blocked.dense_fits), else the same semantics in blocks
    (blocked.py; the ``jnp_block`` knob forces the blocks and their size)."""
    block = KNOBS.jnp_block
    if block is not None or not dense_fits(q.shape, k.shape[1], q.dtype.itemsize):
        kw = {} if block is None else {"block": block}
        return blocked_attention(cfg, q, k, v, bias, mask, qsl, kvsl, return_lse=return_lse, **kw)
    window = (cfg.window_left, cfg.window_right)
    return reference_attention(
        q,
        k,
        v,
        bias,
        mask,
        qsl,
        kvsl,
        scale=cfg.scale,
        is_causal=cfg.is_causal,
        window=window,
        return_lse=return_lse,
    )


def _reference_vjp(cfg: Config, q, k, v, bias, mask, qsl, kvsl, do):
    """Explicit backward fallback (no backward kernel for this platform): the VJP of the reference."""

    def f(q, k, v, bias):
        return reference_call(cfg, q, k, v, bias, mask, qsl, kvsl, return_lse=False)

    _, vjp = jax.vjp(f, q, k, v, bias)
    return vjp(do)


def _backward(cfg: Config, q, k, v, bias, mask, qsl, kvsl, o, lse, do):
    """(dq, dk, dv, dbias or None) of one variant of the call."""
    reason = heuristics.bwd_unsupported_reason(cfg, q.shape, k.shape[1])
    if reason is not None:
        _checks.warn_once(
            f"attention:bwd:{reason}",
            f"jax_ops.dot_product_attention: {reason}; the backward pass uses the XLA reference",
        )
        dq, dk, dv, db = _reference_vjp(cfg, q, k, v, bias, mask, qsl, kvsl, do)
        return dq, dk, dv, db if cfg.has_bias else None
    dq, dk, dv, db = bwd_op(cfg)(q, k, v, *fill(cfg, bias, mask, qsl, kvsl), o, lse, do)
    grads = (dq, dk, dv, db if cfg.has_bias else None)
    return vary_like(grads, (q, k, v, bias, mask, qsl, kvsl, o, lse, do), targets=(q, k, v, bias))


def _attention_bwd(cfg: Config, res, cts):
    q, k, v, bias, mask, qsl, kvsl, o, lse = res
    do, _ = cts  # the residual (lse) is returned under stop_gradient, as jax.nn does
    do = do.astype(q.dtype)
    grads = switch_on_mask(
        lambda c, m, qs, ks: _backward(c, q, k, v, bias, m, qs, ks, o, lse, do), cfg, q, k, mask, qsl, kvsl
    )
    return (*grads, None, None, None)


attention_vjp.defvjp(_attention_fwd, _attention_bwd)
