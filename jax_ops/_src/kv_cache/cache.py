"""``PagedKVCache``: the page pools, the block table and the lengths, as one registered pytree."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._checks import check_array

# The block-table entry of a slot with no page allocated.
NO_PAGE = -1
# Token / query dtypes, and the page dtypes stored as they are.
DTYPES = (np.dtype(np.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32))
# Quantised pages: float8 e4m3 with a float32 scale per (page, kv head); a stored value means value * scale.
FP8 = np.dtype(jnp.float8_e4m3fn)
FP8_MAX = 448.0  # the largest finite e4m3 value: a page's scale maps its largest magnitude into (224, 448]
PAGE_DTYPES = DTYPES + (FP8,)


@dataclasses.dataclass(frozen=True)
class PagedKVCache:
    """K and V page pools ``[P, page_size, Hkv, D]``, ``block_table [B, max_pages]`` int32 (page ids, ``-1`` for
    an unallocated slot) and ``lengths [B]`` int32 (tokens held per request). Token ``s`` of request ``b`` lives at
    ``k_pages[block_table[b, s // page_size], s % page_size]``.

    float8 (e4m3) pools carry ``k_scales`` / ``v_scales [P, Hkv]`` float32: row ``r`` of head ``h`` in page ``p``
    holds ``k_pages[p, r, h] * k_scales[p, h]``. Other pools have ``None`` there."""

    k_pages: jax.Array
    v_pages: jax.Array
    block_table: jax.Array
    lengths: jax.Array
    k_scales: jax.Array | None = None
    v_scales: jax.Array | None = None

    @property
    def num_pages(self) -> int:
        return self.k_pages.shape[0]

    @property
    def quantized(self) -> bool:
        """Whether the pools are float8 with per-(page, kv head) scales."""
        return np.dtype(self.k_pages.dtype) == FP8

    @property
    def page_size(self) -> int:
        return self.k_pages.shape[1]

    @property
    def num_kv_heads(self) -> int:
        return self.k_pages.shape[2]

    @property
    def head_dim(self) -> int:
        return self.k_pages.shape[3]

    @property
    def batch(self) -> int:
        return self.block_table.shape[0]

    @property
    def max_pages(self) -> int:
        return self.block_table.shape[1]

    @property
    def capacity(self) -> int:
        """Tokens a request can hold: ``max_pages * page_size``."""
        return self.max_pages * self.page_size

    def replace(self, **changes) -> PagedKVCache:
        """A copy with some fields replaced (e.g. a new ``block_table`` from the ``BlockManager``), re-checked."""
        return check_cache(dataclasses.replace(self, **changes))


jax.tree_util.register_dataclass(
    PagedKVCache,
    data_fields=["k_pages", "v_pages", "block_table", "lengths", "k_scales", "v_scales"],
    meta_fields=[],
)


def create(
    num_pages: int,
    page_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype,
    batch: int,
    max_pages: int,
) -> PagedKVCache:
    """An empty cache: zero page pools, every block-table slot unallocated (``-1``), every length 0.

    ``dtype`` float16, bfloat16 or float32 stores tokens as they are; ``jnp.float8_e4m3fn`` stores them quantised
    with zero ``k_scales`` / ``v_scales [num_pages, num_kv_heads]`` (append sets them)."""
    for name, value in (
        ("num_pages", num_pages),
        ("page_size", page_size),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("batch", batch),
        ("max_pages", max_pages),
    ):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if np.dtype(dtype) not in PAGE_DTYPES:
        raise TypeError(f"dtype must be one of ({', '.join(map(str, PAGE_DTYPES))}), got {np.dtype(dtype)}")
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    scales = jnp.zeros((num_pages, num_kv_heads), jnp.float32) if np.dtype(dtype) == FP8 else None
    return PagedKVCache(
        k_pages=jnp.zeros(shape, dtype),
        v_pages=jnp.zeros(shape, dtype),
        block_table=jnp.full((batch, max_pages), NO_PAGE, jnp.int32),
        lengths=jnp.zeros((batch,), jnp.int32),
        k_scales=scales,
        v_scales=scales,
    )


def fp8_scale(amax: jax.Array) -> jax.Array:
    """The smallest power of two ``p`` with ``amax <= 448 p``, kept in [2^-126, 2^118]; 0 for 0, ``amax`` itself
    when NaN or infinite (``Fp8Scale`` in ffi_cuda/kv_cache/params.h)."""
    m, k = jnp.frexp(amax)
    j = jnp.clip(jnp.where(m <= 0.875, k - 9, k - 8), -126, 118)
    p = jax.lax.bitcast_convert_type(((j + 127) << 23).astype(jnp.int32), jnp.float32)
    return jnp.where((amax > 0) & jnp.isfinite(amax), p, amax)


def quantize(x: jax.Array, scale: jax.Array) -> jax.Array:
    """float32 ``x / scale`` for a power-of-two scale (exact: a multiply by its inverse, built from the exponent
    bits) rounded to the nearest float8 e4m3, ties to even, saturating at ±448; 0 where the scale is 0 or not
    finite."""
    bits = jax.lax.bitcast_convert_type(scale.astype(jnp.float32), jnp.int32)
    inverse = jax.lax.bitcast_convert_type(jnp.int32(254 << 23) - bits, jnp.float32)
    inverse = jnp.where((scale > 0) & jnp.isfinite(scale), inverse, 0.0)
    return jnp.clip(x * inverse, -FP8_MAX, FP8_MAX).astype(jnp.float8_e4m3fn)


def to_float8(cache: PagedKVCache) -> PagedKVCache:
    """``cache`` with float8 pages: each (page, kv head) quantised under the scale ``append`` would give its
    largest magnitude (the smallest power of two p with amax <= 448 p)."""
    check_cache(cache)
    if cache.quantized:
        return cache

    def pool(pages):
        x = pages.astype(jnp.float32)
        scales = fp8_scale(jnp.max(jnp.abs(x), axis=(1, 3)))
        return quantize(x, scales[:, None, :, None]), scales

    (k, k_scales), (v, v_scales) = pool(cache.k_pages), pool(cache.v_pages)
    return PagedKVCache(k, v, cache.block_table, cache.lengths, k_scales, v_scales)


def is_concrete(*values) -> bool:
    """True when every value is a concrete array (eager mode), so its contents can be checked on the host."""
    return not any(isinstance(v, jax.core.Tracer) for v in values)


def check_cache(cache) -> PagedKVCache:
    """Trace-time shape/dtype checks of every field; outside jit also the contents of the table and lengths."""
    if not isinstance(cache, PagedKVCache):
        raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}")
    k = check_array("cache.k_pages", cache.k_pages, dtypes=PAGE_DTYPES)
    v = check_array("cache.v_pages", cache.v_pages, dtypes=PAGE_DTYPES)
    if k.ndim != 4:
        raise ValueError(f"cache.k_pages must be [P, page_size, Hkv, D], got shape {tuple(k.shape)}")
    if tuple(v.shape) != tuple(k.shape) or v.dtype != k.dtype:
        raise ValueError(
            f"cache.v_pages ({tuple(v.shape)}, {v.dtype}) must match cache.k_pages ({tuple(k.shape)}, {k.dtype})"
        )
    for name in ("k_scales", "v_scales"):
        scales = getattr(cache, name)
        if not cache.quantized:
            if scales is not None:
                raise ValueError(
                    f"cache.{name} must be None for {k.dtype} pages (only float8 pages are scaled)"
                )
            continue
        if scales is None:
            raise ValueError(f"cache.{name} [P, Hkv] float32 is required with float8 pages")
        check_array(f"cache.{name}", scales, dtypes=(np.float32,))
        if tuple(scales.shape) != (k.shape[0], k.shape[2]):
            raise ValueError(
                f"cache.{name} must have shape (P, Hkv) = {(k.shape[0], k.shape[2])}, got {tuple(scales.shape)}"
            )
    table = check_array("cache.block_table", cache.block_table, dtypes=(np.int32,))
    lengths = check_array("cache.lengths", cache.lengths, dtypes=(np.int32,))
    if table.ndim != 2:
        raise ValueError(f"cache.block_table must be [B, max_pages], got shape {tuple(table.shape)}")
    if tuple(lengths.shape) != (table.shape[0],):
        raise ValueError(f"cache.lengths must have shape ({table.shape[0]},), got {tuple(lengths.shape)}")
    if is_concrete(table, lengths):
        check_contents(np.asarray(table), np.asarray(lengths), k.shape[0], k.shape[1])
    return cache


def check_contents(table: np.ndarray, lengths: np.ndarray, num_pages: int, page_size: int) -> None:
    """Host check: lengths in ``[0, max_pages * page_size]``, every slot a length uses holds a page in range."""
    capacity = table.shape[1] * page_size
    bad = np.flatnonzero((lengths < 0) | (lengths > capacity))
    if bad.size:
        b = int(bad[0])
        raise ValueError(
            f"cache.lengths[{b}] = {int(lengths[b])} is outside [0, max_pages * page_size = {capacity}]"
        )
    used = np.arange(table.shape[1])[None, :] < -(-lengths[:, None] // page_size)
    out = used & ((table < 0) | (table >= num_pages))
    if out.any():
        b, j = (int(i) for i in np.argwhere(out)[0])
        raise ValueError(
            f"cache.block_table[{b}, {j}] = {int(table[b, j])} is not a page in [0, {num_pages}) but "
            f"cache.lengths[{b}] = {int(lengths[b])} uses that slot"
        )
