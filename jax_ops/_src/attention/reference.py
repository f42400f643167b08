"""The attention family's jax.numpy reference: the semantics of the ``jax_ops_attention_fwd`` contract."""

from __future__ import annotations

import jax
import jax.numpy as jnp


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
    return_lse: bool = True,
):
    """Attention with the semantics of the ``jax_ops_attention_fwd`` contract (``ffi_cuda/attention``).

    ``q [B,T,N,D]``, ``k``/``v [B,S,K,D]`` (N a multiple of K), ``bias``/``mask`` rank 4 broadcastable to
    ``[B,N,T,S]``, seq lengths int32 ``[B]``, ``window = (left, right)`` with -1 for unbounded. fp32 math
    (fp64 for float64 inputs).
    Returns ``(o [B,T,N,D] in q's dtype, lse [B,N,T] float32 or float64)``, or ``o`` alone when not
    ``return_lse``; rows with no allowed key give ``o = 0`` and ``lse = -inf`` (and zero gradients), where
    ``jax.nn``'s XLA path averages ``v`` instead. NaN and Inf propagate as in ``jax.nn`` (docs/attention.md).
    Finite inputs create no intermediate inf (safe under ``jax.debug_infs``) except the ``-inf`` of an empty
    row's ``lse``, which is only computed when ``return_lse``.
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
    # The row max over the allowed logits only (NaN if one is NaN; a masked logit never takes part, whatever its
    # k or bias hold), at least the lowest finite value: never -inf, so no -inf - -inf below.
    low = jnp.finfo(f32).min
    m = jnp.maximum(jnp.max(jnp.where(allowed, logits, low), axis=-1, keepdims=True), low)
    m = jax.lax.stop_gradient(m)
    # where() inside the exp too: masked entries see exp(0), so no overflow (and no inf cotangent) from them.
    e = jnp.where(allowed, jnp.exp(jnp.where(allowed, logits, m) - m), 0.0)
    l = jnp.sum(e, axis=-1)  # noqa: E741
    empty = l == 0  # no allowed key, or all of them -inf; a NaN l (NaN or +inf logit) is not empty
    l_safe = jnp.where(empty, 1.0, l)
    o = jnp.einsum("bkgts,bskd->btkgd", e.reshape(B, K, G, T, S), v.astype(f32), precision="highest")
    o = o.reshape(B, T, N, D) / l_safe.transpose(0, 2, 1)[..., None]
    o = jnp.where(empty.transpose(0, 2, 1)[..., None], 0.0, o).astype(q.dtype)  # 0 even if a masked v is NaN
    if not return_lse:
        return o
    lse = jnp.where(empty, -jnp.inf, m[..., 0] + jnp.log(l_safe))
    return o, lse
