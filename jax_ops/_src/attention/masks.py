"""Boolean masks that are really sequence lengths (and causality), routed to the kernels' length path.

A mask of shape ``[B or 1, 1, T or 1, S]`` (one pattern for every head) often only pads: keys ``s >= Lk[b]``
masked (a key-padding mask), rows ``t >= Lq[b]`` masked (query padding), and possibly causal (``s <= t``, as
flax's ``make_attention_mask & make_causal_mask`` build). The kernels run those as lengths and ``is_causal``
without reading a mask element, while a general mask is read per element by the portable kernels. Which form a
mask has is known only from its values, so each call checks it on the device (one pass over the mask) and a
``lax.switch`` (inside the ``custom_vjp``, forward and backward alike, so no residual is
duplicated) runs the length path when the mask equals it exactly, else the mask path: the two give the same
attention (the same allowed keys), so the choice never changes a result beyond rounding.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_ops._src.attention.validation import Config


def mask_as_lengths(mask: jax.Array, batch: int):
    """For a ``[B', 1, T', S]`` bool mask: ``(lq, lk, forms)`` where ``lq``/``lk`` are int32 ``[batch]`` (the rows
    and keys with any allowed entry; ``lq`` is None when ``T' == 1``) and ``forms`` the bool scalars
    ``(mask == padding by lq/lk, mask == that padding & causal)`` (the second only when ``T' == T``, else None)."""
    _, _, rows, keys = mask.shape
    m = mask[:, 0]  # [B', T', S]
    lk = jnp.sum(jnp.any(m, axis=1), axis=-1, dtype=jnp.int32)  # keys any row may see: a prefix if padding
    s = jnp.arange(keys)
    padding = s[None, None, :] < lk[:, None, None]
    lq = is_causal = None
    if rows > 1:  # (rows == T: the caller passes only T' in (1, T))
        t = jnp.arange(rows)
        lq = jnp.sum(jnp.any(m, axis=2), axis=-1, dtype=jnp.int32)
        padding = padding & (t[None, :, None] < lq[:, None, None])
        is_causal = jnp.all(m == (padding & (s[None, :] <= t[:, None])[None]))
    is_padding = jnp.all(m == padding)
    widen = lambda x: None if x is None else jnp.broadcast_to(x, (batch,))  # noqa: E731
    return widen(lq), widen(lk), (is_padding, is_causal)


def _min(a, b):
    return b if a is None else a if b is None else jnp.minimum(a, b)


def mask_variants(cfg: Config, q, k, mask, qsl, kvsl):
    """``(index, variants)``: ``variants[i] = (cfg, mask, qsl, kvsl)`` of one way to run the call (0: with the
    mask; 1: the lengths the mask equals; 2: those & ``is_causal``), ``index`` the int32 scalar of the one the
    mask's values pick. None when the mask is absent or not head-broadcast."""
    if (
        mask is None
        or mask.shape[1] != 1
        or mask.shape[2] not in (1, q.shape[1])
        or mask.shape[3] != k.shape[1]
    ):
        return None  # per-head, or broadcast over the keys (no key length to read)
    lq, lk, (is_padding, is_causal) = mask_as_lengths(mask, q.shape[0])
    qsl2, kvsl2 = _min(qsl, lq), _min(kvsl, lk)
    lengths = dataclasses.replace(cfg, has_mask=False, has_q_seqlen=qsl2 is not None, has_kv_seqlen=True)
    variants = [(cfg, mask, qsl, kvsl), (lengths, None, qsl2, kvsl2)]
    if is_causal is None:
        index = is_padding.astype(jnp.int32)
    elif cfg.is_causal:  # causal & (causal & padding) = causal & padding: the lengths variant as it is
        index = (is_padding | is_causal).astype(jnp.int32)
    else:
        variants.append((dataclasses.replace(lengths, is_causal=True), None, qsl2, kvsl2))
        index = jnp.where(is_padding, 1, jnp.where(is_causal, 2, 0)).astype(jnp.int32)
    return index, variants


def switch_on_mask(fn, cfg: Config, q, k, mask, qsl, kvsl):
    """``fn(cfg, mask, qsl, kvsl)`` of the variant the mask's values pick (``lax.switch``), or of the call as it
    is when the mask has no length form."""
    picked = mask_variants(cfg, q, k, mask, qsl, kvsl)
    if picked is None:
        return fn(cfg, mask, qsl, kvsl)
    index, variants = picked
    return jax.lax.switch(index, [functools.partial(fn, *variant) for variant in variants])
