"""Kernel plans: the one place a CSR product's plan (algorithm, lanes per row, split chunk, long-row lists,
segment table) is made — for a CSRPair's two directions, for a plain BCSR/BCOO product, for the N > 1 re-plan
and for the backward pass's transpose. The measurements behind each rule are in docs/design/sparse.md."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.sparse.config import native
from jax_ops._src.sparse.formats import (
    RowProfile,
    _int32_max,
    _is_concrete,
    _sanitize_indptr,
    cusparse_dtypes,
)

ALGORITHMS = ("vector", "warp", "cta", "split", "stream", "segmented", "cusparse")


def alg_code(algorithm: str) -> int:
    """The kernel's ``algorithm`` attribute (the Algorithm enum in ffi_cuda/sparse/spmm_params.h); "warp" is the
    vector kernel with G = 32."""
    return getattr(native(), "algorithm_" + ("vector" if algorithm == "warp" else algorithm))


# Segmented (row-class) plan: rows are classified in chunks of DEFAULT_SEGMENT_ROWS rows (each chunk's G from its own
# average, _vector_group), adjacent chunks with the same G merged into segments (4096: the measured best).
DEFAULT_SEGMENT_ROWS = 4096
# The auto rule (segmented_applies): the warp-per-row class (G = 32) and the other classes each hold >= 10% of nnz.
_SEGMENT_MIN_SHARE = 0.1
# The dense operand a product gathers lives in L1 when it has at most this many bytes (128 KiB; H100/H200 L1 is
# 256 KiB per SM, shared with shared memory): then gathers are L1 hits, and the vector G and the slab model differ.
_L1_BYTES = 128 * 1024
DEFAULT_SPLIT_CHUNK = 256  # nnz per work unit of a long row (the measured best for SpMV and SpMM)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static kernel choice for one CSR matrix: algorithm, lanes per row (SpMV), split chunk and work units."""

    algorithm: str = "vector"
    group: int = 32
    chunk: int = 0
    units: int = 0  # split work units (workspace rows); 0 otherwise


def _vector_group(avg: float) -> int:
    """Lanes per row G of the row-block SpMV kernel (SpmvRowsKernel) for rows of `avg` nnz (thresholds measured
    with ffi_cuda/tools/sparse_spmv_bench.cu): few lanes per row, each with several rows and up to 8 loads in flight
    (G = 1 with 8 steps per iteration; G >= 2 with 2 rows per lane and 4 steps), so rows fill the steps."""
    if avg < 10:
        return 1
    if avg < 64:
        return 4
    if avg < 128:
        return 8
    if avg < 256:
        return 16
    return 32


def _vector_group_for(profile: RowProfile | None, avg: float, k: int, itemsize: int) -> int:
    """G of the vector plan: _vector_group(avg), except G = 8 instead of 4 for varying rows of 16..63 entries
    (16 <= avg < 64, avg < p95 <= 2 avg) whose gathered dense operand is not L1-resident (k * itemsize >
    _L1_BYTES): more loads in flight hide their L2 latency; rows of one length, a wide spread and L1-resident
    operands stay faster at 4 (numbers in docs/design/sparse.md)."""
    g = _vector_group(avg)
    if (
        g == 4
        and profile is not None
        and 16 <= profile.avg < 64
        and profile.avg < profile.p95 <= 2 * profile.avg
        and k * itemsize > _L1_BYTES
    ):
        return 8
    return g


def choose_algorithm(profile: RowProfile | None, m: int, nnz: int, k: int = 0, itemsize: int = 4) -> str:
    """The dispatch rule (docs/design/sparse.md): split for power-law/straggler rows (max > max(2048, 32 avg)); every
    other matrix takes the row-block kernel ("vector") with G lanes per row from the average row length
    (_vector_group; G = 32 is the old warp-per-row). Without a profile (a plain BCSR/BCOO, a traced build) the row
    lengths are unknown, so split whenever a row could exceed a split chunk (nnz > DEFAULT_SPLIT_CHUNK): its cost
    is bounded for any row-length distribution (no lane walks more than a chunk), and a matrix without long rows
    runs the same row-block kernel as vector plus two passes over no work. ``cta`` and ``stream`` stay available
    when forced (slower; docs/design/sparse.md)."""
    del k, itemsize  # no longer part of the rule (the row-block kernel has no shared-memory stage)
    avg = nnz / m if m else 0.0
    if profile is None:
        if nnz > DEFAULT_SPLIT_CHUNK:
            return "split"
        return "warp" if avg >= 256 else "vector"
    if profile.max > max(2048, 32 * profile.avg):
        return "split"
    return "warp" if profile.avg >= 256 else "vector"


def _segment_rows_per_cta(g: int) -> int:
    """Rows a 256-thread CTA of the row-block kernel covers per step (the native SegmentRowsPerCta table)."""
    return dict(zip((1, 2, 4, 8, 16, 32), native().segment_rows_per_cta)).get(
        g, native().segment_rows_per_cta[-1]
    )


def segments_host(indptr: np.ndarray, rows: int = DEFAULT_SEGMENT_ROWS) -> list[tuple[int, int, int]]:
    """Row classes of a concrete indptr: chunks of ``rows`` rows, each with G = _vector_group(chunk average),
    adjacent chunks with equal G merged. Returns [(row begin, row end, G)] covering [0, M) in order."""
    ip = np.asarray(indptr, np.int64)
    bounds = chunk_bounds(ip.shape[0] - 1, rows)
    return segments_from_bounds(bounds, ip[bounds])


def chunk_bounds(m: int, rows: int = DEFAULT_SEGMENT_ROWS) -> np.ndarray:
    """The row bounds of segments_host's chunks: 0, rows, 2 rows, ..., M (int64; [0] when M <= 0)."""
    return np.append(np.arange(0, max(m, 0), max(1, int(rows)), dtype=np.int64), max(m, 0))


def segments_from_bounds(bounds: np.ndarray, indptr_at: np.ndarray) -> list[tuple[int, int, int]]:
    """segments_host from the indptr's values at chunk_bounds (all a device-resident indptr needs to send back)."""
    if bounds.shape[0] < 2:
        return [(0, 0, 1)]
    starts, ends = bounds[:-1], bounds[1:]
    avgs = (indptr_at[1:] - indptr_at[:-1]) / (ends - starts)
    segs: list[list[int]] = []
    for b, e, a in zip(starts.tolist(), ends.tolist(), avgs.tolist()):
        g = _vector_group(a)
        if segs and segs[-1][2] == g:
            segs[-1][1] = e
        else:
            segs.append([b, e, g])
    return [tuple(x) for x in segs]


def segmented_applies(
    indptr: np.ndarray, rows: int = DEFAULT_SEGMENT_ROWS, segs: list[tuple[int, int, int]] | None = None
) -> bool:
    """The segmented plan's auto rule (for a matrix the whole-matrix rule sends to ``vector``): in the segment
    table (segments_host) the warp-per-row class (G = 32, chunk average >= 256) holds >= _SEGMENT_MIN_SHARE of the
    nnz and the other classes together hold >= _SEGMENT_MIN_SHARE too: the one shape where row classes win (a
    few hundred-nnz rows next to many short ones; docs/design/sparse.md). ``segs``: the table
    segments_host(indptr, rows) already computed."""
    ip = np.asarray(indptr, np.int64)
    per_g: dict[int, int] = {}
    for b, e, g in segs if segs is not None else segments_host(ip, rows):
        per_g[g] = per_g.get(g, 0) + int(ip[e] - ip[b])
    total = sum(per_g.values())
    warp = per_g.get(32, 0)
    return total > 0 and warp >= _SEGMENT_MIN_SHARE * total and total - warp >= _SEGMENT_MIN_SHARE * total


def _segment_table(segs) -> tuple[np.ndarray, np.ndarray, int]:
    """(table int32[3 S], CTA prefix int32[S + 1], CTAs) of the segmented kernel: one CTA per row-block step."""
    table = np.asarray([x for seg in segs for x in seg], np.int32)
    ctas = [max(1, -(-(e - b) // _segment_rows_per_cta(g))) for b, e, g in segs]
    ptr = np.concatenate([[0], np.cumsum(ctas)]).astype(np.int64)
    if ptr[-1] > _int32_max():
        raise ValueError("too many CTAs for the segmented plan")
    return table, ptr.astype(np.int32), int(ptr[-1])


def _stream_rows(indptr, m: int, nnz: int) -> int:
    """Rows per CTA for the stream SpMV: the largest power of two in [8, 256] whose blocks average <= half the
    shared-memory stage and (when indptr is concrete) never exceed it. Blocks that still overflow (traced input)
    run the kernel's in-bounds warp-per-row loop."""
    avg = nnz / m if m else 0.0
    lo, cap = native().stream_min_rows, native().stream_cap
    rows = native().stream_max_rows
    while rows > lo and rows * max(avg, 1.0) > cap // 2:
        rows //= 2
    if _is_concrete(indptr) and m > 0:
        ip = np.asarray(indptr, np.int64)
        while rows > lo:
            starts = np.arange(0, m, rows)
            if int((ip[np.minimum(starts + rows, m)] - ip[starts]).max()) <= cap:
                break
            rows //= 2
    return rows


def _group_for(
    algorithm: str, profile: RowProfile | None, m: int, nnz: int, k: int = 0, itemsize: int = 4
) -> int:
    if algorithm in ("warp", "cta"):
        return 32
    avg = profile.avg if profile is not None else (nnz / m if m else 0.0)
    if algorithm in ("split", "cusparse"):  # cusparse: its N > 1 products run the split kernels
        # Short rows only (bounded by the chunk): from the p95, twice the uniform-row G, since a power-law's short
        # rows vary widely. Without a profile the rows may as well be uniform: vector's G for the average.
        if profile is None:
            return _vector_group(min(avg, DEFAULT_SPLIT_CHUNK))
        return min(32, 2 * _vector_group(min(avg, profile.p95)))
    if algorithm == "vector":
        return _vector_group_for(profile, avg, k, itemsize)
    return _vector_group(avg)


# ------------------------------------------------------------------------------------------ long-row lists
def _long_rows_host(indptr: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray, int]:
    lens = np.diff(np.asarray(indptr, np.int64))
    rows = np.nonzero(lens > chunk)[0].astype(np.int32)
    units = -(-lens[rows] // chunk)
    ptr = np.concatenate([[0], np.cumsum(units)]).astype(np.int64)
    if ptr[-1] > _int32_max():
        raise ValueError("too many split work units")
    return rows, ptr.astype(np.int32), int(ptr[-1])


def _long_rows_traced(indptr: jax.Array, nnz: int, chunk: int) -> tuple[jax.Array, jax.Array, int]:
    """Long-row lists with static upper bounds on their sizes (padding rows own zero units)."""
    lens = indptr[1:] - indptr[:-1]
    is_long = lens > chunk
    l_max = nnz // (chunk + 1)
    units_max = nnz // chunk + l_max
    if l_max == 0:
        return jnp.zeros((0,), jnp.int32), jnp.zeros((1,), jnp.int32), 0
    rows = jnp.nonzero(is_long, size=l_max, fill_value=0)[0].astype(jnp.int32)
    valid = jnp.arange(l_max) < jnp.sum(is_long)
    units = jnp.where(valid, (lens[rows] + chunk - 1) // chunk, 0)
    ptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(units).astype(jnp.int32)])
    return rows, ptr, units_max


_EMPTY_LONG = (np.zeros((0,), np.int32), np.zeros((1,), np.int32))


def _cusparse_ws_bytes(m: int, nnz: int) -> int:
    """Workspace of an N = 1 call on the cusparse plan: the zero beta, then room for cuSPARSE's CSR_ALG2 buffer
    (cusparseSpMV_bufferSize has asked for about nnz / 51 bytes; this leaves 6x that, M / 8 and 1 MiB, and the
    handler raises if cuSPARSE ever wants more)."""
    return native().cusparse_zero_bytes + (m + nnz) // 8 + (1 << 20)


def cusparse_applicable(indptr, indices, k: int, dtype) -> bool:
    """Whether the cusparse plan may run cuSPARSE for a CSR: float32/float64 values, nnz > 0, K > 0, and (for
    concrete arrays only) a standard CSR: indptr[0] == 0 and indptr[M] == nnz (so no padding is stored past the
    rows: a padded BCOO or its transpose keeps split) and every column index in [0, K) (checked on the device).
    cuSPARSE reads every stored entry as part of a row, so an entry the kernels skip must not reach it."""
    if (
        np.dtype(dtype) not in cusparse_dtypes()
        or k <= 0
        or indices.shape[0] == 0
        or indptr.shape[0] < 2
        or not _is_concrete(indptr, indices)
    ):
        return False
    ends = np.asarray(indptr[jnp.asarray([0, -1])])
    if int(ends[0]) != 0 or int(ends[1]) != indices.shape[0]:
        return False
    return bool(jnp.all((indices >= 0) & (indices < k)))


def make_plan(
    indptr,
    nnz: int,
    m: int,
    profile: RowProfile | None,
    algorithm: str | None,
    split_chunk: int | None,
    k: int = 0,
    itemsize: int = 4,
    cusparse_ok=lambda: False,
):
    """(Plan, long_rows, long_ptr). ``indptr`` must already be monotone when the plan is split or cusparse.
    ``cusparse_ok()`` (called only when the plan would be split or cusparse): cusparse_applicable for this CSR;
    when false a cusparse plan runs as split (documented fallback)."""
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS} or None, got {algorithm!r}")
    alg = algorithm or choose_algorithm(profile, m, nnz, k, itemsize)
    if (algorithm is None and alg == "split") or alg == "cusparse":
        alg = "cusparse" if cusparse_ok() else "split"
    segs = None  # the segment table, built once on the auto path
    if algorithm is None and alg == "vector" and profile is not None and _is_concrete(indptr):
        segs = segments_host(np.asarray(indptr), DEFAULT_SEGMENT_ROWS)
        if segmented_applies(indptr, segs=segs):
            alg = "segmented"
    seg_rows = DEFAULT_SEGMENT_ROWS if algorithm is None else (split_chunk or DEFAULT_SEGMENT_ROWS)
    group = _group_for(alg, profile, m, nnz, k, itemsize)
    if alg == "stream":
        chunk = _stream_rows(indptr, m, nnz)
        return Plan(alg, group, chunk, 0), jnp.asarray(_EMPTY_LONG[0]), jnp.asarray(_EMPTY_LONG[1])
    if alg == "segmented":
        # the table needs the concrete indptr: traced input takes the vector plan
        if not _is_concrete(indptr):
            return Plan("vector", group, 0, 0), jnp.asarray(_EMPTY_LONG[0]), jnp.asarray(_EMPTY_LONG[1])
        table, ptr, ctas = _segment_table(segs or segments_host(np.asarray(indptr), seg_rows))
        return Plan(alg, group, ctas, 0), jnp.asarray(table), jnp.asarray(ptr)
    if alg not in ("split", "cusparse"):
        return Plan(alg, group, 0, 0), jnp.asarray(_EMPTY_LONG[0]), jnp.asarray(_EMPTY_LONG[1])
    chunk = int(split_chunk or DEFAULT_SPLIT_CHUNK)
    if chunk < 1:
        raise ValueError(f"split_chunk must be >= 1, got {chunk}")
    if _is_concrete(indptr):
        rows, ptr, units = _long_rows_host(np.asarray(indptr), chunk)
        return Plan(alg, group, chunk, units), jnp.asarray(rows), jnp.asarray(ptr)
    rows, ptr, units = _long_rows_traced(indptr, nnz, chunk)
    return Plan(alg, group, chunk, units), rows, ptr


# slots on the 16-byte path, _spmm_slots), so a handful of long rows leaves most of the GPU idle. Below
# _SPMM_MIN_LANES lanes in that grid, with rows averaging at least two split chunks, the product takes the split
# plan instead (DEFAULT_SPLIT_CHUNK-nnz units, a team each, partials summed per row in unit order:
# deterministic), whatever the N = 1 plan is. Long-row lists are built in the graph.
_SPMM_MIN_LANES = 1 << 16
_SPMM_SPLIT_MAX_WORKSPACE = 1 << 28  # bytes of per-unit partials the split SpMM may take


def spmm_takes_split(plan: Plan, m: int, nnz: int, n: int, itemsize: int) -> bool:
    """Whether an N-column product with this plan runs as split (see _SPMM_MIN_LANES)."""
    if n <= 1 or plan.algorithm not in ("vector", "warp", "cta", "segmented") or m == 0:
        return False
    if nnz < 2 * DEFAULT_SPLIT_CHUNK * m:
        return False
    units_max = nnz // DEFAULT_SPLIT_CHUNK + nnz // (DEFAULT_SPLIT_CHUNK + 1)  # _long_rows_traced's bound
    if units_max * n * max(itemsize, 4) > _SPMM_SPLIT_MAX_WORKSPACE:
        return False
    vec = 16 // itemsize if n % (16 // itemsize) == 0 else 1  # the kernel's 16-byte path (when aligned)
    g = min(32, max(2, 1 << max(0, math.ceil(math.log2(-(-n // vec))))))
    tiles = -(-n // (g * vec))
    slots = _spmm_slots(nnz / m, g) if vec > 1 else 1
    return m * g * slots * tiles < _SPMM_MIN_LANES


def _spmm_slots(avg_nnz: float, g: int) -> int:
    """Slots per team of the 16-byte SpMM kernel for rows averaging ``avg_nnz`` (SlotsFor in
    ffi_cuda/sparse/heuristics.h, from its exported thresholds sparse_slots_min_avg: 2, 4, 8 slots)."""
    s = 1
    for slots, min_avg in zip((2, 4, 8), native().slots_min_avg):
        if avg_nnz >= min_avg:
            s = slots
    return min(s, 32 // g)


def plan_pair(indptr, indices, values, indptr_t, indices_t, values_t, m: int, k: int, *, algorithm,
              transpose_algorithm, split_chunk):  # fmt: skip
    """Plans of both directions of a CSRPair: ((profile, plan, long_rows, long_ptr) of A, the same of Aᵀ). The
    profiles need concrete arrays (None under jit: the plans fall back to the static average row length)."""
    nnz = int(indices.shape[0])
    concrete = _is_concrete(indptr, indptr_t)
    itemsize = np.dtype(values.dtype).itemsize
    out = []
    for ip, idx, rows, cols, alg in (
        (indptr, indices, m, k, algorithm),
        (indptr_t, indices_t, k, m, transpose_algorithm),
    ):
        prof = RowProfile.from_indptr(np.asarray(ip)) if concrete else None
        plan, lr, lp = make_plan(
            ip, nnz, rows, prof, alg, split_chunk, cols, itemsize,
            cusparse_ok=lambda ip=ip, idx=idx, cols=cols: cusparse_applicable(ip, idx, cols, values.dtype),
        )  # fmt: skip
        out.append((prof, plan, lr, lp))
    return tuple(out)


def plan_columns(plan: Plan, indptr, indices, values, long_rows, long_ptr, n: int):
    """The plan an N-column product runs: cusparse serves N = 1 only (other N run split's kernels), and few long
    rows take the split plan (spmm_takes_split). Returns (plan, indptr, long_rows, long_ptr)."""
    m = indptr.shape[0] - 1
    nnz = int(indices.shape[0])
    if plan.algorithm == "cusparse" and n != 1:
        plan = dataclasses.replace(plan, algorithm="split")
    if spmm_takes_split(plan, m, nnz, n, np.dtype(values.dtype).itemsize):
        indptr = _sanitize_indptr(indptr, nnz)  # split needs a monotone indptr
        plan, long_rows, long_ptr = make_plan(indptr, nnz, m, None, "split", DEFAULT_SPLIT_CHUNK)
    return plan, indptr, long_rows, long_ptr


def plan_transpose(indptr_t, nnz: int, k: int):
    """(plan, long_rows, long_ptr) of a transpose built in the backward pass (traced: no profile, so split when
    a row can be long)."""
    return make_plan(indptr_t, nnz, k, None, None, None)


def plan_unpaired(indptr, nnz: int, m: int, algorithm, split_chunk):
    """(plan, long_rows, long_ptr) of a plain BCSR/BCOO product: no profile, so split when a row can be long (its
    long-row lists built on the device from indptr). ``indptr`` must be monotone when the plan is split."""
    return make_plan(indptr, nnz, m, None, algorithm, split_chunk)


def unpaired_takes_split(algorithm, nnz: int, m: int) -> bool:
    """Whether plan_unpaired's plan is split (so indptr must be made monotone first)."""
    if algorithm is not None:
        return algorithm in ("split", "cusparse")
    return choose_algorithm(None, m, nnz) == "split"
