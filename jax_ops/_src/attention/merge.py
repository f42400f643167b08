"""The log-sum-exp merge of attention outputs computed over disjoint key chunks (split-KV), shared by the
attention forward and the paged decode."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def merge_by_lse(o_parts: jax.Array, lse_parts: jax.Array, axis: int = 0) -> tuple[jax.Array, jax.Array]:
    """Merges chunk outputs ``o_parts [..., D]`` (each normalised over its own chunk) by their natural-log sums of
    exp ``lse_parts`` (``o_parts``'s shape without D) along ``axis``: ``(o, lse)`` in float32 (float64 for
    float64 parts). A chunk with no allowed key has lse -inf and weight 0; a row empty in every chunk gives o = 0,
    lse = -inf; NaN stays NaN."""
    acc = jnp.promote_types(jnp.promote_types(o_parts.dtype, lse_parts.dtype), jnp.float32)
    lse_parts = lse_parts.astype(acc)
    top = jnp.max(lse_parts, axis=axis, keepdims=True)  # NaN when a chunk's row is NaN: it stays NaN below
    top = jnp.where(top == -jnp.inf, 0.0, top)  # all chunks empty: weights 0, lse -inf, o 0
    w = jnp.exp(lse_parts - top)  # exp(-inf) = 0 for empty chunks
    total = jnp.sum(w, axis=axis, keepdims=True)
    empty = total == 0
    lse = jnp.where(empty, -jnp.inf, jnp.log(jnp.where(empty, 1.0, total)) + top)
    w = w / jnp.where(empty, 1.0, total)
    o = jnp.sum(w[..., None] * o_parts.astype(acc), axis=axis)
    return o, jnp.squeeze(lse, axis)
