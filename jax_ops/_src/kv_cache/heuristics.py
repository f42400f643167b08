"""Which paged-decode path runs and how many key splits it uses: every rule here, its reason in one line."""

from __future__ import annotations

import numpy as np

from jax_ops import _ffi
from jax_ops._src import dispatch
from jax_ops._src.kv_cache.cache import FP8
from jax_ops._src.kv_cache.config import KNOBS

# Split-KV: split each request's keys so that (16-row query blocks x kv heads x requests x splits) CTAs fill one
# wave of CTAS_PER_SM per SM (all resident at once: no tail wave, one ramp), keeping >= SPLIT_MIN_KEYS of the
# table's capacity per split (smaller splits cost more in the merge than they gain), and at most the kernel merge's
# split count when it is asked for (merge="kernel": more splits would merge in XLA). The CPU twin runs one split
# unless forced.
CTAS_PER_SM = 2  # the decode kernel's occupancy (kernels.cu __launch_bounds__)
SPLIT_MIN_KEYS = 256
MAX_SPLITS = 64


def splits(batch: int, num_kv_heads: int, packed_rows: int, capacity: int) -> int:
    """The split count of one decode: the ``splits`` knob when set, else the rule above (GPU only)."""
    forced = KNOBS.splits
    if forced is not None:
        if int(forced) < 1:
            raise ValueError(f"kv_cache splits override must be >= 1, got {forced!r}")
        return int(forced)
    if dispatch.platform() != "gpu":
        return 1
    ctas = batch * num_kv_heads * -(-packed_rows // 16)
    want = CTAS_PER_SM * dispatch.sm_count() // max(ctas, 1)
    most = (
        int(_ffi.constants()["kv_cache_max_kernel_merge_splits"]) if KNOBS.merge == "kernel" else MAX_SPLITS
    )
    return int(max(1, min(want, capacity // SPLIT_MIN_KEYS, most)))


def kernel_options(splits: int) -> dict:
    """The decode kernel's ``tma_load`` and ``merge_in_kernel`` attributes from the ``load`` / ``merge`` knobs
    (in-kernel merging needs 2..kv_cache_max_kernel_merge_splits splits; other counts merge in XLA)."""
    load, merge = KNOBS.load, KNOBS.merge
    if load not in ("cp.async", "tma"):
        raise ValueError(f"kv_cache load must be 'cp.async' or 'tma', got {load!r}")
    if merge not in ("xla", "kernel"):
        raise ValueError(f"kv_cache merge must be 'xla' or 'kernel', got {merge!r}")
    most = int(_ffi.constants()["kv_cache_max_kernel_merge_splits"])
    return dict(tma_load=load == "tma", merge_in_kernel=merge == "kernel" and 2 <= splits <= most)


def decode_unsupported(dtype, page_dtype, head_dim: int) -> str | None:
    """Why our decode kernel cannot run queries of ``dtype`` over ``page_dtype`` pages on this platform (None when
    it can)."""
    if "jax_ops_kv_cache_decode" not in _ffi.target_names("cpu"):
        return "this build has no kv_cache targets"
    if dispatch.platform() != "gpu":
        return None  # the CPU twin runs every dtype and head dim
    if not _ffi.has_cuda_build():
        return "this build has no CUDA kernels"
    consts = _ffi.constants()
    if np.dtype(dtype).name not in consts["kv_cache_cuda_dtypes"]:
        return f"the CUDA paged decode takes {consts['kv_cache_cuda_dtypes']} queries, not {np.dtype(dtype).name}"
    if np.dtype(page_dtype) not in (np.dtype(dtype), FP8):
        return f"the CUDA paged decode reads pages of q's dtype or float8_e4m3fn, not {np.dtype(page_dtype).name}"
    if head_dim not in consts["kv_cache_cuda_decode_head_dims"]:
        return f"the CUDA paged decode supports head dims {consts['kv_cache_cuda_decode_head_dims']}, not {head_dim}"
    return None
