"""Plain jax.numpy reference implementations: used by tests and by ``implementation="xla"``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_ops._src.lsmr.reference import lsmr_h_update, lsmr_hbar_x_update, lsmr_step_update  # noqa: F401


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    q_seqlen: jax.Array | None = None,
    kv_seqlen: jax.Array | None = None,
    *,
    scale: float,
    is_causal: bool = False,
    window: tuple[int, int] = (-1, -1),
) -> tuple[jax.Array, jax.Array]:
    """Attention with the semantics of the ``jax_ops_attention_fwd`` contract (``ffi_cuda/attention``).

    ``q [B,T,N,D]``, ``k``/``v [B,S,K,D]`` (N a multiple of K), ``bias``/``mask`` rank 4 broadcastable to
    ``[B,N,T,S]``, seq lengths int32 ``[B]``, ``window = (left, right)`` with -1 for unbounded. fp32 math
    (fp64 for float64 inputs).
    Returns ``(o [B,T,N,D] in q's dtype, lse [B,N,T] float32 or float64)``; rows with no allowed key give ``o = 0`` and
    ``lse = -inf`` (and zero gradients), where ``jax.nn``'s XLA path averages ``v`` instead.
    """

    f32 = jnp.promote_types(q.dtype, jnp.float32)  # fp32 math (fp64 for float64 inputs)
    B, T, N, D = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    qf = q.astype(f32).reshape(B, T, K, G, D)
    logits = jnp.einsum("btkgd,bskd->bkgts", qf, k.astype(f32), precision=jax.lax.Precision.HIGHEST)
    logits = logits.reshape(B, N, T, S) * jnp.asarray(scale, f32)
    if bias is not None:
        logits = logits + bias.astype(f32)
    t = jnp.arange(T)[:, None]
    s = jnp.arange(S)[None, :]
    allowed = jnp.ones((T, S), bool)
    if is_causal:
        allowed &= s <= t
    if window[0] >= 0:
        allowed &= s >= t - window[0]
    if window[1] >= 0:
        allowed &= s <= t + window[1]
    allowed = allowed[None, None]
    if q_seqlen is not None:
        allowed = allowed & (jnp.arange(T)[None, None, :, None] < q_seqlen[:, None, None, None])
    if kv_seqlen is not None:
        allowed = allowed & (jnp.arange(S)[None, None, None, :] < kv_seqlen[:, None, None, None])
    if mask is not None:
        allowed = allowed & mask
    allowed = allowed & (logits > -jnp.inf)
    logits = jnp.where(allowed, logits, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(allowed, jnp.exp(logits - m), 0.0)
    l = jnp.sum(e, axis=-1)  # noqa: E741
    nonempty = l > 0
    o = jnp.einsum("bkgts,bskd->btkgd", e.reshape(B, K, G, T, S), v.astype(f32), precision="highest")
    o = o.reshape(B, T, N, D) / jnp.where(nonempty, l, 1.0).transpose(0, 2, 1)[..., None]
    lse = jnp.where(nonempty, m[..., 0] + jnp.log(jnp.where(nonempty, l, 1.0)), -jnp.inf)
    return o.astype(q.dtype), lse
