"""The kv_cache family's jax.numpy implementation (``implementation="xla"``): a scatter append and a paged decode
that walks the page slots with an online softmax, reading one page per request per step (never a gathered copy
of the cache)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_ops._src.kv_cache.cache import PagedKVCache, fp8_scale, quantize

# append's per-request status codes (ffi_cuda/kv_cache/params.h).
STATUS_OK = 0
STATUS_PAST_ALLOCATED_PAGES = 1


@jax.jit
def append(cache: PagedKVCache, k_new: jax.Array, v_new: jax.Array) -> tuple[PagedKVCache, jax.Array]:
    """Writes ``k_new``/``v_new [B, T, Hkv, D]`` at positions ``lengths[b] + t``; returns the cache and a status
    ``[B]`` int32. A request whose chunk reaches a slot past ``max_pages`` or without a page in range gets
    ``STATUS_PAST_ALLOCATED_PAGES``: none of its tokens are written and its length is unchanged."""
    B, T = k_new.shape[:2]
    P, page = cache.num_pages, cache.page_size
    pos = cache.lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]  # [B, T]
    slot = pos // page
    in_table = (pos >= 0) & (slot < cache.max_pages)
    page_id = jnp.take_along_axis(cache.block_table, jnp.minimum(slot, cache.max_pages - 1), axis=1)
    ok_token = in_table & (page_id >= 0) & (page_id < P)
    ok = jnp.all(ok_token, axis=1)  # [B]
    # A failed request's tokens go to page P (out of range): mode="drop" skips them.
    target = jnp.where(ok[:, None], page_id, P)
    offset = pos % page
    lengths = cache.lengths + jnp.where(ok, T, 0).astype(jnp.int32)
    status = jnp.where(ok, STATUS_OK, STATUS_PAST_ALLOCATED_PAGES).astype(jnp.int32)
    if cache.quantized:
        k_pages, k_scales = _append_quantized(cache, cache.k_pages, cache.k_scales, k_new, ok)
        v_pages, v_scales = _append_quantized(cache, cache.v_pages, cache.v_scales, v_new, ok)
        new = PagedKVCache(k_pages, v_pages, cache.block_table, lengths, k_scales, v_scales)
        return new, status
    k_pages = cache.k_pages.at[target, offset].set(k_new.astype(cache.k_pages.dtype), mode="drop")
    v_pages = cache.v_pages.at[target, offset].set(v_new.astype(cache.v_pages.dtype), mode="drop")
    return PagedKVCache(
        k_pages=k_pages, v_pages=v_pages, block_table=cache.block_table, lengths=lengths
    ), status


def _append_quantized(cache: PagedKVCache, pages, scales, new, ok):
    """The float8 append of one pool (rules in api.append): per (request, page written, kv head) the new scale,
    the page's earlier rows re-quantised where it grew, then the new rows."""
    B, T, Hkv, D = new.shape
    P, page = cache.num_pages, cache.page_size
    f32 = jnp.float32
    length = cache.lengths
    first_slot, row0 = length // page, length % page  # [B]
    segments = (T + page - 1) // page + 1  # pages a chunk of T rows can touch
    seg_slot = first_slot[:, None] + jnp.arange(segments, dtype=jnp.int32)[None]  # [B, segments]
    seg_used = ok[:, None] & (seg_slot * page < (length + T)[:, None])
    seg_page = jnp.take_along_axis(cache.block_table, jnp.clip(seg_slot, 0, cache.max_pages - 1), axis=1)
    seg_target = jnp.where(seg_used, seg_page, P)  # P: dropped
    t_seg = (length[:, None] + jnp.arange(T, dtype=jnp.int32)[None]) // page - first_slot[:, None]  # [B, T]
    x = new.astype(f32)
    row_amax = jnp.max(jnp.abs(x), axis=-1)  # [B, T, Hkv]
    b_idx = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
    amax = jnp.zeros((B, segments, Hkv), f32).at[b_idx, t_seg].max(row_amax)
    old = jnp.where(
        (jnp.arange(segments)[None, :, None] == 0) & (row0[:, None, None] > 0),
        scales[jnp.clip(seg_page, 0, P - 1)],
        0.0,
    )
    scale = jnp.maximum(old, fp8_scale(amax))  # [B, segments, Hkv]
    # The first page's rows before row0 re-quantised to its new scale where it grew.
    first_page = jnp.clip(seg_page[:, 0], 0, P - 1)
    grew = ok & (row0 > 0)  # [B]; per head below
    regrown = quantize(pages[first_page].astype(f32) * old[:, 0, None, :, None], scale[:, 0, None, :, None])
    keep_old = (jnp.arange(page)[None, :, None] >= row0[:, None, None]) | ~(scale[:, 0] > old[:, 0])[
        :, None, :
    ]
    first_rows = jnp.where(keep_old[..., None], pages[first_page], regrown)  # [B, page, Hkv, D]
    pages = pages.at[jnp.where(grew, first_page, P)].set(first_rows, mode="drop")
    t_scale = jnp.take_along_axis(scale, t_seg[:, :, None], axis=1)  # [B, T, Hkv]
    pos = length[:, None] + jnp.arange(T, dtype=jnp.int32)[None]
    target = jnp.where(ok[:, None], jnp.take_along_axis(seg_target, t_seg, axis=1), P)
    pages = pages.at[target, pos % page].set(quantize(x, t_scale[..., None]), mode="drop")
    scales = scales.at[seg_target].set(scale, mode="drop")
    return pages, scales


@functools.partial(jax.jit, static_argnames=("scale", "softcap"))
def decode(q: jax.Array, cache: PagedKVCache, *, scale: float, softcap: float | None) -> jax.Array:
    """Paged GQA attention of ``q [B, T, Hq, D]`` over each request's ``lengths[b]`` tokens; query ``t`` sits at
    position ``lengths[b] - T + t`` and sees keys ``s <= lengths[b] - T + t`` (causal within the chunk).

    fp32 softmax state; rows with no key give 0. GQA by index mapping: query head
    ``h`` reads kv head ``h // (Hq // Hkv)``. Block-table entries of unused slots are never read; an out-of-range
    entry of a used slot is clamped into ``[0, P)`` (the host check rejects it outside jit).
    """
    f32 = jnp.promote_types(q.dtype, jnp.float32)
    B, T, Hq, D = q.shape
    Hkv, page = cache.num_kv_heads, cache.page_size
    G = Hq // Hkv
    qf = q.astype(f32).reshape(B, T, Hkv, G, D) * jnp.asarray(scale, f32)
    lengths = jnp.clip(cache.lengths, 0, cache.max_pages * page)
    q_pos = lengths[:, None] - T + jnp.arange(T)[None, :]  # [B, T]
    low = jnp.finfo(f32).min  # the running max starts finite, so no -inf - -inf

    def page_step(j, state):
        m, denom, acc = state  # [B, Hkv, G, T], [B, Hkv, G, T], [B, Hkv, G, T, D]
        page_id = jnp.clip(cache.block_table[:, j], 0, cache.num_pages - 1)
        kp = cache.k_pages[page_id].astype(f32)  # [B, page, Hkv, D]: one page per request
        vp = cache.v_pages[page_id].astype(f32)
        if cache.quantized:
            kp = kp * cache.k_scales[page_id][:, None, :, None].astype(f32)
            vp = vp * cache.v_scales[page_id][:, None, :, None].astype(f32)
        logits = jnp.einsum("btkgd,bskd->bkgts", qf, kp, precision=jax.lax.Precision.HIGHEST)
        if softcap is not None:
            logits = softcap * jnp.tanh(logits / softcap)
        k_pos = j * page + jnp.arange(page)  # [page]
        allowed = (k_pos[None, None, :] < lengths[:, None, None]) & (
            k_pos[None, None, :] <= q_pos[:, :, None]
        )
        allowed = allowed[:, None, None]  # [B, 1, 1, T, page]
        m_new = jnp.maximum(m, jnp.max(jnp.where(allowed, logits, low), axis=-1))
        p = jnp.where(allowed, jnp.exp(jnp.where(allowed, logits, m_new[..., None]) - m_new[..., None]), 0.0)
        alpha = jnp.exp(m - m_new)
        denom = denom * alpha + jnp.sum(p, axis=-1)
        acc = acc * alpha[..., None] + jnp.einsum("bkgts,bskd->bkgtd", p, vp, precision="highest")
        return m_new, denom, acc

    state = (
        jnp.full((B, Hkv, G, T), low, f32),
        jnp.zeros((B, Hkv, G, T), f32),
        jnp.zeros((B, Hkv, G, T, D), f32),
    )
    used_pages = (jnp.max(lengths) + page - 1) // page  # slots past every request's length are skipped
    _, denom, acc = jax.lax.fori_loop(0, used_pages, page_step, state)
    empty = denom == 0
    o = jnp.where(empty[..., None], 0.0, acc / jnp.where(empty, 1.0, denom)[..., None])
    return o.transpose(0, 3, 1, 2, 4).reshape(B, T, Hq, D).astype(q.dtype)


@jax.jit
def copy_pages(cache: PagedKVCache, src: jax.Array, dst: jax.Array) -> PagedKVCache:
    """Copies pages ``src[i]`` to ``dst[i]`` in both pools and their scales (the copy-on-write copies of the
    BlockManager)."""
    copy = lambda x: None if x is None else x.at[dst].set(x[src])  # noqa: E731
    return PagedKVCache(
        k_pages=copy(cache.k_pages),
        v_pages=copy(cache.v_pages),
        block_table=cache.block_table,
        lengths=cache.lengths,
        k_scales=copy(cache.k_scales),
        v_scales=copy(cache.v_scales),
    )
