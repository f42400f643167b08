"""Which path runs: the support matrix (read from the native build's constants) and the Python-side dispatch
rules of the forward (split-KV, GQA packing). The CUDA-side rules are in ffi_cuda/attention/heuristics.h."""

from __future__ import annotations

import functools

import numpy as np

from jax_ops import _ffi
from jax_ops._src import dispatch
from jax_ops._src.attention.config import KNOBS
from jax_ops._src.attention.validation import Config

FWD_TARGET = "jax_ops_attention_fwd"
BWD_TARGET = "jax_ops_attention_bwd"
KERNEL_DTYPES = (np.dtype(np.float16), np.dtype("bfloat16"), np.dtype(np.float32))


@functools.cache
def support() -> dict[str, object]:
    """The native support matrix: the contract's head-dim bound and what the CUDA build instantiates
    (ffi_cuda/attention/instantiations/support.h, written by generate_instantiations.py from its table)."""
    c = _ffi.constants()
    return dict(
        max_head_dim=int(c["attention_max_head_dim"]),
        cuda_dtypes=tuple(np.dtype(name) for name in c["attention_cuda_dtypes"]),
        cuda_fwd_head_dims=tuple(int(d) for d in c["attention_cuda_fwd_head_dims"]),
        cuda_bwd_head_dims=tuple(int(d) for d in c["attention_cuda_bwd_head_dims"]),
        cuda_sm90_bwd_head_dims=tuple(int(d) for d in c["attention_cuda_sm90_bwd_head_dims"]),
    )


def unsupported_reason(query_dtype, head_dim: int, platform: str | None = None) -> str | None:
    """Why the FFI kernel cannot run these inputs (None when it can). ``platform`` defaults to JAX's default
    backend; on "gpu" the build must provide the CUDA attention target."""
    dtype = np.dtype(query_dtype)
    s = support()
    if dtype not in KERNEL_DTYPES:
        return f"dtype {dtype} is not supported by the attention kernel (float16, bfloat16, float32)"
    if not 1 <= head_dim <= s["max_head_dim"]:
        return f"head dim {head_dim} is outside the kernel's range [1, {s['max_head_dim']}]"
    platform = platform or dispatch.platform()
    if platform == "gpu":
        if FWD_TARGET not in _ffi.target_names("CUDA"):
            return "this jax_ops build has no CUDA attention kernel (jax_ops_attention_fwd)"
        if dtype not in s["cuda_dtypes"]:
            return f"the CUDA attention kernel supports float16/bfloat16, not {dtype}"
        if head_dim not in s["cuda_fwd_head_dims"]:
            return f"the CUDA attention kernel supports head dims {s['cuda_fwd_head_dims']}, not {head_dim}"
    if platform not in ("cpu", "gpu"):
        return f"no attention kernel for platform {platform!r}"
    return None


# The CUDA backward's bias gradient is dS as [B, N, T, S] float32, summed by XLA over the bias's broadcast dims;
# above this many bytes of it the reference backward (blocked, O(block) memory) runs instead, and vmap's fold runs
# in groups of examples that stay below it (batching.py).
DBIAS_SCORES_BYTES = 4 << 30


def dbias_scores_bytes(B: int, N: int, T: int, S: int) -> int:
    """Bytes of the CUDA backward's dS [B, N, T, S] float32."""
    return 4 * B * N * T * S


def bwd_unsupported_reason(cfg: Config, q_shape, seqlen_k: int) -> str | None:
    """Why the backward kernel cannot run (None when it can): the explicit reference fallback's reason."""
    if dispatch.platform() != "gpu":
        return None
    if BWD_TARGET not in _ffi.target_names("CUDA"):
        return "this build has no CUDA attention backward kernel (jax_ops_attention_bwd)"
    B, T, N, head_dim = q_shape
    head_dims = support()["cuda_bwd_head_dims"]
    if head_dim not in head_dims:
        return f"the CUDA attention backward supports head dims {head_dims}, not {head_dim}"
    if cfg.has_bias:
        # Only the Hopper kernels compute it (ffi_cuda/attention/heuristics.h, Sm90BwdSupports).
        hopper_dims = support()["cuda_sm90_bwd_head_dims"]
        if not cfg.tuning.hopper_bwd_mods:
            return "the CUDA attention bias gradient is off (knob hopper_bwd_mods)"
        if dispatch.compute_capability(dispatch.first_gpu()) != (9, 0) or cfg.tuning.portable:
            return "the CUDA attention backward computes a bias gradient only in its Hopper (sm_90a) kernels"
        if head_dim not in hopper_dims or not float(np.float32(cfg.scale)) > 0 or T == 0 or seqlen_k == 0:
            return f"the CUDA attention bias gradient needs head dims {hopper_dims}, scale > 0 and T, S > 0"
        if dbias_scores_bytes(B, N, T, seqlen_k) > DBIAS_SCORES_BYTES:
            return "the CUDA attention bias gradient's [B, N, T, S] float32 dS would pass 4 GiB"
    return None


# Split-KV policy: split while the forward grid (64-query-row blocks x heads x batch) would cover less than half of
# SPLIT_KV_TARGET_CTAS (two waves on a 132-SM H100/H200), keeping >= SPLIT_KV_MIN_KEYS keys per chunk. Only on a
# GPU backend (the CPU twin gains nothing). The kv_splits knob (overrides(kv_splits=n)) forces a count on any backend.
SPLIT_KV_TARGET_CTAS = 264
SPLIT_KV_MIN_KEYS = 1024


def kv_splits(cfg: Config, batch: int, seqlen_q: int, seqlen_k: int, num_heads: int) -> int:
    """How many equal key chunks the forward splits into (1 = no split). The count divides S, so splitting is a
    reshape; position-dependent rules (causal, window) and bias/mask keep the unsplit kernel."""
    if cfg.is_causal or cfg.window_left >= 0 or cfg.window_right >= 0 or cfg.has_bias or cfg.has_mask:
        return 1
    forced = KNOBS.kv_splits
    if forced is not None:
        want = int(forced)
    else:
        if dispatch.platform() != "gpu":
            return 1
        ctas = batch * num_heads * -(-seqlen_q // 64)
        if 2 * ctas > SPLIT_KV_TARGET_CTAS:
            return 1
        want = min(-(-SPLIT_KV_TARGET_CTAS // ctas), seqlen_k // SPLIT_KV_MIN_KEYS)
    for d in range(min(want, seqlen_k), 1, -1):
        if seqlen_k % d == 0:
            return d
    return 1


# GQA packing: with few query rows (decode), the G query heads that share a kv head become G·T rows of one head,
# so each K/V tile is read once per group instead of once per query head. Position-free calls only (no causal,
# window, bias or mask: those tie a row to its position t); query lengths scale by G. At most one Hopper CTA of
# rows after packing.
GQA_PACK_MAX_ROWS = 128


def packs_gqa(cfg: Config, seqlen_q: int, num_heads: int, num_kv_heads: int) -> bool:
    """Whether the forward packs the query heads of each GQA group into the rows of one head."""
    if cfg.is_causal or cfg.window_left >= 0 or cfg.window_right >= 0 or cfg.has_bias or cfg.has_mask:
        return False
    groups = num_heads // num_kv_heads
    return groups > 1 and seqlen_q * groups <= GQA_PACK_MAX_ROWS
