"""Public functions of the kv_cache family, with their argument checks."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops import _ffi
from jax_ops._checks import check_array
from jax_ops._src import dispatch
from jax_ops._src.kv_cache import ffi, heuristics, reference
from jax_ops._src.kv_cache.cache import DTYPES, PagedKVCache, check_cache, is_concrete


def _append_unsupported() -> str | None:
    if "jax_ops_kv_cache_append" not in _ffi.target_names("cpu"):
        return "this build has no kv_cache targets"
    if dispatch.platform() == "gpu" and not _ffi.has_cuda_build():
        return "this build has no CUDA kernels"
    return None


def _check_tokens(name: str, value, cache: PagedKVCache) -> jax.Array:
    value = check_array(name, value, dtypes=DTYPES)
    want = (cache.batch, cache.num_kv_heads, cache.head_dim)
    if value.ndim not in (3, 4) or (value.shape[0],) + tuple(value.shape[-2:]) != want:
        raise ValueError(
            f"{name} must be [B, Hkv, D] or [B, T, Hkv, D] with (B, Hkv, D) = {want}, got shape "
            f"{tuple(value.shape)}"
        )
    if not cache.quantized and np.dtype(value.dtype) != np.dtype(cache.k_pages.dtype):
        raise TypeError(
            f"{name} has dtype {np.dtype(value.dtype)} but the cache pages are {cache.k_pages.dtype}"
        )
    return value if value.ndim == 4 else value[:, None]


def append(
    cache: PagedKVCache,
    k_new: jax.Array,
    v_new: jax.Array,
    *,
    return_status: bool = False,
    implementation: str | None = None,
):
    """Writes one token (``[B, Hkv, D]``) or a chunk (``[B, T, Hkv, D]``) per request at ``lengths[b]``, returns
    the cache with ``lengths + T``.

    float8 pages: each (page, kv head) the chunk writes gets the scale ``max(its scale so far, p)`` with ``p`` the
    smallest power of two such that ``amax(new rows) <= 448 p`` (so far = nothing when the write starts at the
    page's row 0); rows already in the page are re-scaled when the scale grows (exact, being a power of two).
    Values round to nearest even; a page holding only zeros has scale 0.

    A request whose tokens would reach a block-table slot with no page (``-1``, out of range, or past
    ``max_pages``) is not written and keeps its length. Outside jit that raises ``ValueError`` naming the request;
    inside jit nothing is raised: pass ``return_status=True`` to get ``(cache, status [B] int32)`` with 0 = written,
    1 = not written (past the request's allocated pages), and check it.
    """
    check_cache(cache)
    dispatch.check_implementation(implementation)
    k = _check_tokens("k_new", k_new, cache)
    v = _check_tokens("v_new", v_new, cache)
    if k.shape != v.shape:
        raise ValueError(f"v_new has shape {tuple(v_new.shape)} but k_new has shape {tuple(k_new.shape)}")
    if k.dtype != v.dtype:
        raise TypeError(f"v_new has dtype {np.dtype(v.dtype)} but k_new has {np.dtype(k.dtype)}")
    path = dispatch.choose("kv_cache.append", implementation, unsupported=_append_unsupported())
    new, status = ffi.append_ffi(cache, k, v) if path == "ffi" else reference.append(cache, k, v)
    if return_status:
        return new, status
    if is_concrete(status):
        failed = np.flatnonzero(np.asarray(status) != reference.STATUS_OK)
        if failed.size:
            b = int(failed[0])
            raise ValueError(
                f"append: request {b} (length {int(cache.lengths[b])}, {k.shape[1]} new tokens) would write past "
                f"its allocated pages (block_table row {np.asarray(cache.block_table[b]).tolist()}); nothing "
                f"written for requests {failed.tolist()}"
            )
    return new


def decode(
    q: jax.Array,
    cache: PagedKVCache,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    implementation: str | None = None,
) -> jax.Array:
    """Paged GQA attention of ``q [B, Hq, D]`` (one token) or ``[B, T, Hq, D]`` (a chunk, causal within it: query
    ``t`` is at position ``lengths[b] - T + t``) over each request's ``lengths[b]`` cached tokens.

    ``Hq`` a multiple of the cache's ``Hkv``; ``scale`` defaults to ``1/sqrt(D)``; ``softcap`` applies
    ``softcap * tanh(logits / softcap)`` to the scaled logits. fp32 softmax state; a query with no visible key
    (length 0) returns 0. Returns q's shape and dtype. ``q`` has the pages' dtype, or any of float16, bfloat16,
    float32 over float8 pages (dequantised with their scales).
    """
    check_cache(cache)
    dispatch.check_implementation(implementation)
    q = check_array("q", q, dtypes=DTYPES)
    if q.ndim not in (3, 4):
        raise ValueError(f"q must be [B, Hq, D] or [B, T, Hq, D], got shape {tuple(q.shape)}")
    B, Hq, D = q.shape[0], q.shape[-2], q.shape[-1]
    if B != cache.batch:
        raise ValueError(f"q has batch {B} but cache.block_table has {cache.batch} rows")
    if D != cache.head_dim:
        raise ValueError(f"q has head dim {D} but the cache pages have {cache.head_dim}")
    if Hq % cache.num_kv_heads:
        raise ValueError(f"q's {Hq} heads are not a multiple of the cache's {cache.num_kv_heads} kv heads")
    if not cache.quantized and np.dtype(q.dtype) != np.dtype(cache.k_pages.dtype):
        raise TypeError(f"q has dtype {np.dtype(q.dtype)} but the cache pages are {cache.k_pages.dtype}")
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be positive or None, got {softcap!r}")
    q4 = q if q.ndim == 4 else q[:, None]
    path = dispatch.choose(
        "kv_cache.decode",
        implementation,
        unsupported=heuristics.decode_unsupported(q.dtype, cache.k_pages.dtype, D),
        default_on_cpu="xla",
    )
    if path == "ffi":
        n_splits = heuristics.splits(
            B, cache.num_kv_heads, q4.shape[1] * (Hq // cache.num_kv_heads), cache.capacity
        )
        options = heuristics.kernel_options(n_splits)
        o = ffi.decode_ffi(q4, cache, scale=scale, softcap=softcap, splits=n_splits, **options)
    else:
        o = reference.decode(q4, cache, scale=scale, softcap=softcap)
    return o if q.ndim == 4 else o[:, 0]


def copy_pages(cache: PagedKVCache, copies) -> PagedKVCache:
    """Applies the ``(src, dst)`` page copies a ``BlockManager.extend`` returned (copy-on-write), in both pools."""
    check_cache(cache)
    copies = list(copies)
    if not copies:
        return cache
    pairs = np.asarray(copies, np.int32).reshape(-1, 2)
    if pairs.min() < 0 or pairs.max() >= cache.num_pages:
        raise ValueError(f"copies must hold page ids in [0, {cache.num_pages}), got {copies}")
    return reference.copy_pages(cache, jnp.asarray(pairs[:, 0]), jnp.asarray(pairs[:, 1]))
