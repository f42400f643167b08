"""The raw FFI calls of the kv_cache targets (contract: ffi_cuda/kv_cache/params.h)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops import _ffi
from jax_ops._src.attention.merge import merge_by_lse
from jax_ops._src.kv_cache.cache import PagedKVCache


def _scales(cache: PagedKVCache) -> tuple[jax.Array, jax.Array]:
    """The scale operands: the cache's ``[P, Hkv]`` scales for float8 pages, else empty float32 arrays."""
    if cache.quantized:
        return cache.k_scales, cache.v_scales
    empty = jnp.zeros((0,), jnp.float32)
    return empty, empty


def append_ffi(cache: PagedKVCache, k_new: jax.Array, v_new: jax.Array) -> tuple[PagedKVCache, jax.Array]:
    """``k_new``/``v_new [B, T, Hkv, D]`` written in place into the pools and scales (aliased: donate the cache
    under jit, else XLA copies them first); returns the cache and the status ``[B]`` int32."""
    B = cache.batch
    k_scales, v_scales = _scales(cache)
    like = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    shapes = (
        like(cache.k_pages),
        like(cache.v_pages),
        like(k_scales),
        like(v_scales),
        jax.ShapeDtypeStruct((B,), jnp.int32),
        jax.ShapeDtypeStruct((B,), jnp.int32),
    )
    k_pages, v_pages, k_scales, v_scales, lengths, status = _ffi.ffi_call(
        "jax_ops_kv_cache_append",
        shapes,
        cache.k_pages,
        cache.v_pages,
        k_scales,
        v_scales,
        cache.block_table,
        cache.lengths,
        k_new,
        v_new,
        input_output_aliases={0: 0, 1: 1, 2: 2, 3: 3},
        vmap_method="sequential",
    )
    if not cache.quantized:
        k_scales = v_scales = None
    new = PagedKVCache(k_pages, v_pages, cache.block_table, lengths, k_scales, v_scales)
    return new, status


def decode_ffi(
    q: jax.Array,
    cache: PagedKVCache,
    *,
    scale: float,
    softcap: float | None,
    splits: int,
    tma_load: bool = False,
    merge_in_kernel: bool = False,
) -> jax.Array:
    """Paged decode of ``q [B, T, Hq, D]``: one kernel launch, plus the log-sum-exp merge when ``splits > 1``
    unless the kernel merges them itself (``merge_in_kernel``)."""
    B, T, Hq, D = q.shape
    f32 = jnp.float32
    split = splits > 1 and not merge_in_kernel
    shapes = (
        jax.ShapeDtypeStruct((0,) if split else q.shape, q.dtype),
        jax.ShapeDtypeStruct((splits, B, T, Hq, D) if split else (0,), f32),
        jax.ShapeDtypeStruct((splits, B, T, Hq) if split else (0,), f32),
    )
    o, o_parts, lse_parts = _ffi.ffi_call(
        "jax_ops_kv_cache_decode",
        shapes,
        q,
        cache.k_pages,
        cache.v_pages,
        *_scales(cache),
        cache.block_table,
        cache.lengths,
        scale=np.float32(scale),
        softcap=np.float32(softcap or 0.0),
        splits=int(splits),
        tma_load=bool(tma_load),
        merge_in_kernel=bool(merge_in_kernel),
        vmap_method="sequential",
    )
    if not split:
        return o
    merged, _ = merge_by_lse(o_parts, lse_parts, axis=0)
    return merged.astype(q.dtype)
