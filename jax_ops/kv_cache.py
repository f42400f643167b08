"""Paged KV cache for decoding: page pools addressed through a per-request block table.

``create(num_pages, page_size, num_kv_heads, head_dim, dtype, batch, max_pages) -> PagedKVCache``;
``append(cache, k_new, v_new)`` writes one token ``[B, Hkv, D]`` or a chunk ``[B, T, Hkv, D]`` per request;
``decode(q, cache, *, scale=None, softcap=None)`` is paged GQA attention for ``q [B, Hq, D]`` or a causal chunk
``[B, T, Hq, D]``; ``BlockManager`` is the host-side allocator (prefix sharing, copy-on-write) that produces the
block table; ``copy_pages`` applies its copies; ``to_float8`` stores a cache as float8 pages with per-(page, kv
head) scales (``create(..., dtype=jnp.float8_e4m3fn)`` makes an empty one). ``implementation="ffi"`` runs our kernels (CUDA on a GPU, the
CPU twin on the CPU), ``"xla"`` the jnp path, ``None`` the fastest for the platform; ``overrides(splits=n)``
forces the decode's split-KV count. See docs/kv_cache.md.
"""

from jax_ops._src.kv_cache.api import append, copy_pages, decode
from jax_ops._src.kv_cache.block_manager import BlockManager
from jax_ops._src.kv_cache.cache import NO_PAGE, PagedKVCache, create, to_float8
from jax_ops._src.kv_cache.config import overrides

__all__ = [
    "NO_PAGE",
    "BlockManager",
    "PagedKVCache",
    "append",
    "copy_pages",
    "create",
    "decode",
    "overrides",
    "to_float8",
]
