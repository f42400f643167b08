"""The paged KV cache family: page pools addressed through a per-request block table (docs/kv_cache.md)."""
