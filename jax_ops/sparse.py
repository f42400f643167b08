"""Sparse SpMV/SpMM over CSR (``jax.experimental.sparse`` BCSR/BCOO, scipy.sparse) with row-profile dispatch.

Public API:
  * ``matmul(A, B)`` / ``spmv(A, x)`` / ``spmm(A, B)`` for ``A`` a 2-D BCSR, BCOO (n_batch=0, n_dense=0) or
    :class:`CSRPair`, ``B`` dense ``[K]`` or ``[K, N]``; ``matmul(B, A)`` for dense ``B`` ``[M]`` / ``[N, M]``.
  * :class:`CSRPair`: CSR(A) and CSR(Aᵀ) built once (the transpose on device, with ``jax.lax.sort``) plus the
    row profiles of both, which pick the kernel statically. ``.matvec``, ``.rmatvec`` (a row-major sweep of
    CSR(Aᵀ), no atomics), ``.matmat``, ``.rmatmat``, ``.T``, ``.shape``, ``.dtype``. Every product takes the fused
    epilogue ``out = alpha * (A @ B) + beta * y`` (alpha/beta run-time 0-d or per-column arrays), which is what
    LSMR's ``u <- A v - alpha u`` needs in one pass.

Dtypes: values f16, bf16, f32, f64 (the dense operand has the same dtype; half types accumulate in f32, f64 in
f64), int32 indices. nnz and dims must be < 2^31.

Semantics: BCOO entries with an index out of range are padding and contribute nothing; duplicates are summed;
unsorted BCOO is sorted once when converted. Invalid BCSR never reads or writes out of bounds: each row r uses
[clamp(indptr[r], 0, nnz), clamp(indptr[r+1], that, nnz)) (a decreasing indptr gives an empty row), and entries
whose column is outside [0, K) contribute nothing. A CSRPair (and the "split" algorithm) first makes indptr
monotone (running maximum of the clamped indptr), so on invalid input the two may differ; both are finite
and write every output.

Gradients: ``custom_vjp`` w.r.t. the values (the sampled product g[row]·B[col]), the dense operand (Aᵀ g through
the pair's transpose, or a transpose built in the backward pass for plain BCSR/BCOO), and alpha, beta, y.

Batching: ``vmap`` over the dense operand (and y/alpha/beta) folds the batch into SpMM columns — one kernel call,
never a loop. Batched matrices (values under vmap) fall back to ``lax.map``; BCOO/BCSR with n_batch > 0 are
rejected.

Partitioning: row-independent. Under ``jax.shard_map`` shard the dense operand over N (columns) and replicate
the matrix: each shard runs SpMM on its local columns with no communication.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_ops import _checks, _ffi

__all__ = [
    "BlockPlan",
    "Blocks",
    "CSRPair",
    "MAX_BLOCK_ROWS",
    "RowProfile",
    "SlabModel",
    "Slabs",
    "block_rows_host",
    "csr_pair",
    "matmul",
    "slab_model",
    "spmm",
    "spmv",
    "ALGORITHMS",
]

ALGORITHMS = ("vector", "warp", "cta", "split", "stream", "segmented", "cusparse")
_ALG_CODE = {
    "vector": 0,
    "warp": 0,
    "cta": 1,
    "split": 2,
    "stream": 3,
    "segmented": 4,
    "cusparse": 5,
    "blocks": 6,
}
# The cusparse plan (split's lists for N > 1; N = 1 f32/f64 products on cuSPARSE's deterministic CSR_ALG2): the
# auto rule takes it where it would take split. H200, spmv_bench --tails (2026-12-01), power-law 1M Ax: split
# 204.9 µs, cuSPARSE CSR_ALG2 171.6 µs with descriptors and buffer query per call (as the FFI handler does),
# 166.0 with a preprocess kept across calls (not possible without handler state); the default algorithm 166.5 is
# not bitwise repeatable there (19 of 19 runs differed). Where split is not chosen CSR_ALG2 was slower than the
# row-block kernels (bundle Ax 99 vs 72 µs, ba-like Aᵀu 62.5 vs 46.5) or equal (uniform, power-law Aᵀu).
_F32_F64 = (np.dtype(np.float32), np.dtype(np.float64))  # the dtypes of the slab and cusparse paths
_CUSPARSE_ZERO_BYTES = 256  # kCusparseZeroBytes in spmm_params.h
# Segmented (row-class) plan: rows are classified in chunks of DEFAULT_SEGMENT_ROWS rows (each chunk's G from its own
# average, _vector_group), adjacent chunks with the same G merged into segments. 4096 rows per chunk: H200 --tails,
# LSMR ba-like Aᵀu 46.8 µs (1024 rows, without the 4-CTA/SM bound: 48.9; 16384: 90.9).
DEFAULT_SEGMENT_ROWS = 4096
# The auto rule (segmented_applies): the warp-per-row class (G = 32) and the other classes each hold >= 10% of nnz.
_SEGMENT_MIN_SHARE = 0.1
# The dense operand a product gathers lives in L1 when it has at most this many bytes (128 KiB; H100/H200 L1 is
# 256 KiB per SM, shared with shared memory): then gathers are L1 hits, and the vector G and the slab model differ.
_L1_BYTES = 128 * 1024
# CSR-stream SpMV: products of a block of rows staged in shared memory (must match kStreamCap in spmm_params.h).
STREAM_CAP = 4096
_STREAM_ROWS = (8, 256)  # rows per CTA: a power of two in this range
_VALUE_DTYPES = tuple(np.dtype(d) for d in (np.float16, jnp.bfloat16, np.float32, np.float64))
_INT32_MAX = 2**31 - 1
DEFAULT_SPLIT_CHUNK = 256  # nnz per work unit of a long row (SpMV and SpMM: faster than 1024 on the H200)


def _acc_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


def _next_pow2(v: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(v, 1.0))))


# ----------------------------------------------------------------------------------------------- row profile
@dataclasses.dataclass(frozen=True)
class RowProfile:
    """Row-length statistics of a CSR matrix (computed on the host from a concrete indptr)."""

    rows: int
    nnz: int
    avg: float
    p95: float
    max: int
    cv: float  # coefficient of variation (std / mean)

    @staticmethod
    def from_indptr(indptr: np.ndarray) -> RowProfile:
        indptr = np.asarray(indptr, np.int64)
        lens = np.diff(indptr)
        m = int(lens.size)
        if m == 0:
            return RowProfile(0, 0, 0.0, 0.0, 0, 0.0)
        avg = float(lens.mean())
        return RowProfile(
            rows=m,
            nnz=int(indptr[-1] - indptr[0]),
            avg=avg,
            p95=float(np.percentile(lens, 95)),
            max=int(lens.max()),
            cv=float(lens.std() / avg) if avg > 0 else 0.0,
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static kernel choice for one CSR matrix: algorithm, lanes per row (SpMV), split chunk and work units."""

    algorithm: str = "vector"
    group: int = 32
    chunk: int = 0
    units: int = 0  # split work units (workspace rows); 0 otherwise


def _vector_group(avg: float) -> int:
    """Lanes per row G of the row-block SpMV kernel (SpmvRowsKernel) for rows of `avg` nnz, measured on the H200
    (ffi_cuda/tools/spmv_bench.cu): few lanes per row, each with several rows and up to 8 loads in flight
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
    _L1_BYTES). Measured on the H200 (spmv_bench --tails, 2026-12-01): power-law 1M Aᵀu (avg 21.1, p95 29, u 4 MB)
    G = 4 167.2 µs, G = 8 150.0; uniform 2M Aᵀu (avg 16, p95 23, u 8 MB) 272.8 vs 257.1. Kept at 4: rows of one
    length (uniform Ax, exactly 16: 0.96x cuSPARSE; bundle Ax, 12: G = 8 129.5 vs 72.7), a wide spread (bundle 1M
    Aᵀu, p95 108 > 2 avg: G = 8 102.5 vs 99.4) and L1-resident x (LSQ Ax, avg 18-21: 1.25x / 1.03x cuSPARSE)."""
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
    """The dispatch rule (docs/sparse.md): split for power-law/straggler rows (max > max(2048, 32 avg)); every
    other matrix takes the row-block kernel ("vector") with G lanes per row from the average row length
    (_vector_group; G = 32 is the old warp-per-row). Without a profile (traced input) the static average row
    length picks the same way. ``cta`` and ``stream`` stay available when forced (measured slower on the H200)."""
    del k, itemsize  # no longer part of the rule (the row-block kernel has no shared-memory stage)
    avg = nnz / m if m else 0.0
    if profile is None:
        return "warp" if avg >= 256 else "vector"
    if profile.max > max(2048, 32 * profile.avg):
        return "split"
    return "warp" if profile.avg >= 256 else "vector"


def _segment_rows_per_cta(g: int) -> int:
    """Rows a 256-thread CTA of the row-block kernel covers per step (SegmentRowsPerCta in spmm_params.h)."""
    return 8 * (32 if g == 1 else 2 * (32 // g))


def segments_host(indptr: np.ndarray, rows: int = DEFAULT_SEGMENT_ROWS) -> list[tuple[int, int, int]]:
    """Row classes of a concrete indptr: chunks of ``rows`` rows, each with G = _vector_group(chunk average),
    adjacent chunks with equal G merged. Returns [(row begin, row end, G)] covering [0, M) in order."""
    ip = np.asarray(indptr, np.int64)
    m = ip.shape[0] - 1
    if m <= 0:
        return [(0, 0, 1)]
    rows = max(1, int(rows))
    starts = np.arange(0, m, rows)
    ends = np.minimum(starts + rows, m)
    avgs = (ip[ends] - ip[starts]) / (ends - starts)
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
    nnz and the other classes together hold >= _SEGMENT_MIN_SHARE too. Measured on the H200 (spmv_bench --tails,
    2026-12-01), the only win: CSR(Aᵀ) of LSMR's ba-like Jacobian (~18k camera rows of ~500, then ~600k point rows
    of ~5; avg 19.4): vector G = 4 60.2 µs (0.73x cuSPARSE), segmented 46.8 (0.93x). No gain where the long class
    is G = 8 (bundle-adjustment 1M Aᵀu, camera rows ~100: 104-111 vs 99.4), and slower on one-class matrices
    (bundle Ax 0.81x vs 1.06x, uniform Aᵀu 0.85x vs 0.90x), which the rule never picks. ``segs``: the table
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
    if ptr[-1] > _INT32_MAX:
        raise ValueError("too many CTAs for the segmented plan")
    return table, ptr.astype(np.int32), int(ptr[-1])


def _stream_rows(indptr, m: int, nnz: int) -> int:
    """Rows per CTA for the stream SpMV: the largest power of two in [8, 256] whose blocks average <= half the
    shared-memory stage and (when indptr is concrete) never exceed it. Blocks that still overflow (traced input)
    run the kernel's in-bounds warp-per-row loop."""
    avg = nnz / m if m else 0.0
    rows = _STREAM_ROWS[1]
    while rows > _STREAM_ROWS[0] and rows * max(avg, 1.0) > STREAM_CAP // 2:
        rows //= 2
    if _is_concrete(indptr) and m > 0:
        ip = np.asarray(indptr, np.int64)
        while rows > _STREAM_ROWS[0]:
            starts = np.arange(0, m, rows)
            if int((ip[np.minimum(starts + rows, m)] - ip[starts]).max()) <= STREAM_CAP:
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
        # rows vary widely (measured: G = 8 for the 1M power-law matrix; G = 4 was 7% slower).
        if profile is not None:
            avg = min(avg, profile.p95)
        return min(32, 2 * _vector_group(avg))
    if algorithm == "vector":
        return _vector_group_for(profile, avg, k, itemsize)
    return _vector_group(avg)


# ------------------------------------------------------------------------------------------- CSR conversion
def _check_sizes(m: int, k: int, nnz: int) -> None:
    for name, v in (("rows", m), ("columns", k), ("nnz", nnz)):
        if v > _INT32_MAX - 1:
            raise ValueError(f"sparse matrix {name} = {v} >= 2^31 - 1 is not supported (int32 indices)")


def _check_value_dtype(name: str, dtype) -> None:
    if np.dtype(dtype) not in _VALUE_DTYPES:
        raise TypeError(
            f"{name} must have dtype float16, bfloat16, float32 or float64, got {np.dtype(dtype)}"
        )


def _sanitize_indptr(indptr: jax.Array, nnz: int) -> jax.Array:
    """Monotone indptr within [0, nnz] (identity on valid input)."""
    if indptr.shape[0] == 0:
        return indptr
    return lax.cummax(jnp.clip(indptr, 0, nnz), axis=0).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _coo_to_csr(data, rows, cols, m: int, k: int):
    """Sorts COO triplets by (row, col); out-of-range entries (padding) go past indptr[m]."""
    valid = (rows >= 0) & (rows < m) & (cols >= 0) & (cols < k)
    r = jnp.where(valid, rows, m).astype(jnp.int32)
    c = jnp.where(valid, cols, 0).astype(jnp.int32)
    r, c, d = lax.sort((r, c, data), num_keys=2)
    indptr = jnp.searchsorted(r, jnp.arange(m + 1, dtype=jnp.int32), side="left").astype(jnp.int32)
    return indptr, c, d


def _row_ids(indptr: jax.Array, nnz: int) -> tuple[jax.Array, jax.Array]:
    """Row of every position of a monotone indptr and whether the position lies inside some row."""
    p = jnp.arange(nnz, dtype=jnp.int32)
    m = indptr.shape[0] - 1
    row = jnp.searchsorted(indptr, p, side="right").astype(jnp.int32) - 1
    inside = (p >= indptr[0]) & (p < indptr[m]) if m >= 0 else jnp.zeros((nnz,), bool)
    return jnp.clip(row, 0, max(m - 1, 0)), inside


@functools.partial(jax.jit, static_argnums=(3, 4))
def _transpose_csr(indptr, indices, values, m: int, k: int):
    """CSR(Aᵀ) from a CSR(A) with a monotone indptr: a stable 2-key sort by (column, row) on device."""
    nnz = indices.shape[0]
    row, inside = _row_ids(indptr, nnz)
    valid = inside & (indices >= 0) & (indices < k)
    key = jnp.where(valid, indices, k).astype(jnp.int32)
    key, row_t, values_t = lax.sort((key, row, values), num_keys=2)
    indptr_t = jnp.searchsorted(key, jnp.arange(k + 1, dtype=jnp.int32), side="left").astype(jnp.int32)
    return indptr_t, row_t, values_t


def _as_csr(A) -> tuple[jax.Array, jax.Array, jax.Array, int, int, bool]:
    """(indptr, indices, values, M, K, is_bcsr) of a BCSR/BCOO/scipy matrix; rejects batched/dense dims."""
    from jax.experimental import sparse as jsparse

    if isinstance(A, (jsparse.BCSR, jsparse.BCOO)):
        kind = type(A).__name__
        if A.n_batch != 0 or A.n_dense != 0 or A.ndim != 2:
            raise ValueError(
                f"A must be a 2-D {kind} with n_batch=0 and n_dense=0, got shape {A.shape}, n_batch={A.n_batch}, "
                f"n_dense={A.n_dense}; batched sparse matrices are not supported (vmap over the dense operand "
                "instead)"
            )
        m, k = (int(d) for d in A.shape)
        nnz = int(A.data.shape[0])
        _check_sizes(m, k, nnz)
        _check_value_dtype("A.data", A.data.dtype)
        if isinstance(A, jsparse.BCSR):
            return A.indptr.astype(jnp.int32), A.indices.astype(jnp.int32), A.data, m, k, True
        indptr, cols, data = _coo_to_csr(A.data, A.indices[:, 0], A.indices[:, 1], m, k)
        return indptr, cols, data, m, k, False
    if type(A).__module__.startswith("scipy.sparse") and hasattr(A, "tocsr"):
        csr = A.tocsr()
        m, k = (int(d) for d in csr.shape)
        _check_sizes(m, k, int(csr.nnz))
        _check_value_dtype("A.data", csr.data.dtype)
        return (
            jnp.asarray(np.asarray(csr.indptr, np.int32)),
            jnp.asarray(np.asarray(csr.indices, np.int32)),
            jnp.asarray(csr.data),
            m,
            k,
            True,
        )
    raise TypeError(
        f"A must be a jax.experimental.sparse BCSR/BCOO, a scipy.sparse matrix or a CSRPair, got {type(A).__name__}"
    )


# ------------------------------------------------------------------------------------------- column slabs
# Aᵀu of a tall A (m x n, m >> n) as a sweep of CSR(Aᵀ) gathers u (MBs) at random from L2: one 32-byte sector per
# 4-byte read. The column-slab format cuts u's index range into J slabs of W entries that fit in shared memory
# and stores Aᵀ slab by slab with uint16 local columns (contract in ffi_cuda/sparse/slab_spmv_params.h): a CTA
# stages u[slab] in shared memory and gathers from there; pass 2 sums the per-(slab, row) partials in slab order.
# Built once (on device, with a stable sort) when the CSRPair is built and the predicate (slab_model) says it pays.
# Only f32/f64 (half types keep CSR(Aᵀ)); only N = 1 products (rmatvec, rmatvec_axpby; vmap folds into SpMM).
SLAB_SMEM_BYTES = (
    115712  # shared memory per CTA for u[slab]: 2 CTAs per SM on H100/H200 (228 KB/SM, 1 KB reserved)
)
SLAB_CTAS_PER_SM = 2  # must match kSlabCtasPerSm (ffi_cuda/sparse/slab_spmv_kernels.h)
_SLAB_MAX_WIDTH = 65536  # local columns are uint16
_SLAB_GROUPS = (4, 8, 16, 32)
_DEFAULT_SMS = 132  # H100/H200 SXM, used when no GPU is visible (CPU builds, traced tests)
_HBM_BPS, _L2_BPS, _SECTORS_PER_S = 3.5e12, 8e12, 140e9  # H200, measured (docs/sparse.md)


# Largest dynamic shared memory one block may opt into, by compute capability (CUDA C++ Programming Guide); other
# GPUs are taken to have the 99 KB of the sm_86/89/120 parts, less than SLAB_SMEM_BYTES.
_SMEM_OPTIN_BY_CC = {(8, 0): 163 * 1024, (8, 7): 163 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024}
_SMEM_OPTIN_OTHER = 99 * 1024


def _slabs_fit_device() -> bool:
    """Whether the first visible GPU can run the slab kernel's SLAB_SMEM_BYTES per block (True without a GPU: the
    CPU twin takes any width). The predicate uses it, so ``slabs=None`` never builds slabs a GPU would refuse."""
    try:
        for d in jax.devices():
            if d.platform == "gpu":
                try:
                    major, minor = (int(x) for x in str(d.compute_capability).split(".")[:2])
                except (AttributeError, TypeError, ValueError):
                    return False
                return _SMEM_OPTIN_BY_CC.get((major, minor), _SMEM_OPTIN_OTHER) >= SLAB_SMEM_BYTES
    except RuntimeError:
        pass
    return True


def _sm_count() -> int:
    try:
        for d in jax.devices():
            cc = getattr(d, "core_count", None)
            if d.platform == "gpu" and cc:
                return int(cc)
    except RuntimeError:
        pass
    return _DEFAULT_SMS


def slab_shape(cols: int, itemsize: int) -> tuple[int, int]:
    """(W, J) for a gathered vector of ``cols`` entries: the fewest slabs of at most SLAB_SMEM_BYTES, equal widths
    rounded up to a multiple of 4 (so each slab starts 16-byte aligned)."""
    w_max = max(4, min(SLAB_SMEM_BYTES // itemsize, _SLAB_MAX_WIDTH) & ~3)
    j = max(1, -(-cols // w_max))
    w = max(4, (-(-cols // j) + 3) & ~3)
    return w, max(1, -(-cols // w))


@dataclasses.dataclass(frozen=True)
class SlabModel:
    """The slab predicate's numbers for Aᵀu with ``rows`` outputs, a gathered u of ``cols`` entries, ``nnz``."""

    width: int
    slabs: int
    per_slab_row: float  # nnz / (rows * J): average entries of a (slab, row)
    us_slab: float
    us_csr: float
    use: bool


def slab_model(rows: int, cols: int, nnz: int, itemsize: int, items: int | None = None) -> SlabModel:
    """When column slabs pay for ``out[rows] = Aᵀ u``, u of length ``cols`` (ported from the bench experiment).

    Slabs are used when all hold: (1) u does not already live in L1 (cols * itemsize > 128 KB; then the CSR
    kernel's gathers are L1 hits); (2) nnz >= 8 * rows * J, i.e. (slab, row) segments average >= 8 entries, so the
    ptr and partial traffic (12 bytes per (slab, row)) stays <= ~25 % of the matrix bytes (6 per entry in f32);
    (3) the bytes model says slabs are faster than CSR(Aᵀ):
      slab = (nnz*(itemsize+2) + (J*rows+1)*4 + 2*J*rows*itemsize + (cols+rows)*itemsize) / HBM
             + (every CTA stages its slab from L2: max(items, J) * W * itemsize) / L2 + 2 us (second launch),
      CSR  = max(bytes / HBM, nnz / (random L2 sectors per second)),
    with HBM 3.5 TB/s, L2 8 TB/s and 140 G sectors/s measured on the H200. ``items``: CTAs of one wave
    (SMs * 2)."""
    items = _sm_count() * SLAB_CTAS_PER_SM if items is None else items
    w, j = slab_shape(cols, itemsize)
    cells = j * rows
    per = nnz / cells if cells else 0.0
    bytes_slab = nnz * (itemsize + 2) + (cells + 1) * 4 + 2 * cells * itemsize + (cols + rows) * itemsize
    staged = max(items, j) * w * itemsize
    us_slab = (bytes_slab / _HBM_BPS + staged / _L2_BPS) * 1e6 + 2.0
    bytes_csr = nnz * (itemsize + 4) + (rows + 1) * 4 + (cols + rows) * itemsize
    l1_resident = cols * itemsize <= _L1_BYTES
    us_csr = max(bytes_csr / _HBM_BPS, 0.0 if l1_resident else nnz / _SECTORS_PER_S) * 1e6
    use = not l1_resident and rows > 0 and nnz >= 8 * cells and cells + 1 <= _INT32_MAX and us_slab < us_csr
    return SlabModel(w, j, per, us_slab, us_csr, bool(use))


def slab_group(per_slab_row: float) -> int:
    """Lanes per (slab, row) of the slab kernel: the vector plan's thresholds (_vector_group), at least 4."""
    return max(4, _vector_group(per_slab_row))


@dataclasses.dataclass(frozen=True)
class SlabPlan:
    """Static shape of a column-slab operator: ``rows`` outputs, u of ``cols``, J slabs of ``width``."""

    rows: int
    cols: int
    width: int
    slabs: int
    group: int
    items: int


@dataclasses.dataclass(frozen=True)
class Slabs:
    """Aᵀ in column slabs (arrays as in slab_spmv_params.h) with its static plan; a registered pytree."""

    ptr: jax.Array  # int32 [J*rows + 1]
    col: jax.Array  # uint16 [nnz]
    val: jax.Array  # [nnz]
    work: jax.Array  # int32 [3*items]
    plan: SlabPlan


jax.tree_util.register_dataclass(Slabs, data_fields=["ptr", "col", "val", "work"], meta_fields=["plan"])


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _slab_arrays(indptr, indices, values, m: int, k: int, w: int):
    """(ptr, col, val) of the slabs of Aᵀ from CSR(A) (monotone indptr): entry (i, c) goes to cell
    (s = i // w, c) with local column i - s*w; a stable sort by cell keeps i ascending inside a cell."""
    nnz = indices.shape[0]
    j = max(1, -(-m // w))
    cells = j * k
    row, inside = _row_ids(indptr, nnz)
    valid = inside & (indices >= 0) & (indices < k)
    s = row // w
    cell = jnp.where(valid, s * k + indices, cells).astype(jnp.int32)
    local = (row - s * w).astype(jnp.uint16)
    cell, local, val = lax.sort((cell, local, values), num_keys=1, is_stable=True)
    ptr = jnp.searchsorted(cell, jnp.arange(cells + 1, dtype=jnp.int32), side="left").astype(jnp.int32)
    return ptr, local, val


def _slab_work_host(ptr: np.ndarray, rows: int, j: int, items: int) -> np.ndarray:
    """Work list from a concrete ptr: slab s gets max(1, round(items * nnz_s / nnz)) items (at most rows), cut at
    equal nnz; empty ranges are dropped (an empty slab keeps one item: its partials must be written)."""
    if rows == 0:
        return np.zeros((0,), np.int32)
    ptr = np.asarray(ptr, np.int64)
    sl = np.arange(j)
    starts, ends = ptr[sl * rows], ptr[(sl + 1) * rows]
    nnz_s = ends - starts
    total = int(ptr[-1] - ptr[0])
    c = np.rint(items * nnz_s / total) if total > 0 else np.ones(j)
    c = np.clip(c, 1, rows).astype(np.int64)
    rep = np.repeat(sl, c)
    kk = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
    target = starts[rep] + (nnz_s[rep] * kk + c[rep] - 1) // c[rep]
    r = np.clip(np.searchsorted(ptr, target, side="left") - rep * rows, 0, rows)
    r0 = np.where(kk == 0, 0, r)
    r1 = np.where(kk == c[rep] - 1, rows, np.roll(r0, -1))
    r1 = np.maximum(r1, r0)
    keep = r1 > r0
    return np.stack([rep[keep], r0[keep], r1[keep]], axis=1).astype(np.int32).reshape(-1)


def _slab_work_static(rows: int, j: int, items: int) -> np.ndarray:
    """Work list without a concrete ptr (pair built under jit): every slab cut into equal row ranges."""
    if rows == 0:
        return np.zeros((0,), np.int32)
    c = int(min(rows, max(1, round(items / j))))
    bounds = (np.arange(c + 1) * rows) // c
    r0, r1 = bounds[:-1], bounds[1:]
    keep = r1 > r0
    r0, r1 = r0[keep], r1[keep]
    sl = np.repeat(np.arange(j), r0.size)
    return np.stack([sl, np.tile(r0, j), np.tile(r1, j)], axis=1).astype(np.int32).reshape(-1)


def _build_slabs(indptr, indices, values, m: int, k: int, items: int | None = None) -> Slabs:
    """Slabs of Aᵀ for the CSR(A) (m x k, monotone indptr) a CSRPair holds."""
    itemsize = np.dtype(values.dtype).itemsize
    items = _sm_count() * SLAB_CTAS_PER_SM if items is None else items
    w, j = slab_shape(m, itemsize)
    if j * k + 1 > _INT32_MAX:
        raise ValueError(
            f"column slabs of a {m}x{k} matrix need J*n = {j * k} cells (>= 2^31); use slabs=False"
        )
    ptr, col, val = _slab_arrays(indptr, indices, values, m, k, w)
    if _is_concrete(ptr):
        work = _slab_work_host(np.asarray(ptr), k, j, items)
    else:
        work = _slab_work_static(k, j, items)
    nnz = int(indices.shape[0])
    plan = SlabPlan(k, m, w, j, slab_group(nnz / (j * k) if k else 0.0), int(work.size // 3))
    return Slabs(ptr, col, val, jnp.asarray(work), plan)


# ------------------------------------------------------------------------------------------------ row blocks
# Rows that share a column list: in a bundle-adjustment Jacobian the 2 rows of an observation (A), a camera's 9
# rows and a point's 3 (Aᵀ); in a PDE system with R unknowns per node, the node's R rows. The blocks form ("R x 1
# BSR", the csr_spmm contract's blocks plan in ffi_cuda/sparse/spmm_params.h) stores the column list once per
# block of R consecutive rows and the R values of a position side by side, so an N = 1 product reads 4 + 4/R index
# bytes per entry instead of 8 and gathers the dense operand once per R entries. Found on the host (O(nnz) per R)
# when a CSRPair is built from concrete arrays; N = 1 products use it, others the CSR arrays.
MAX_BLOCK_ROWS = 4  # kMaxBlockRows in ffi_cuda/sparse/spmm_params.h


def _block_positions(ip: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(block indptr int64[M/R + 1], positions int64[P, R]): the CSR position of entry p of every block's row i,
    for a monotone indptr whose rows come in blocks of R equal lengths."""
    m = ip.shape[0] - 1
    blen = np.diff(ip)[::r]
    bptr = np.concatenate([[0], np.cumsum(blen)])
    within = np.arange(int(bptr[-1])) - np.repeat(bptr[:-1], blen)
    pos = np.stack([np.repeat(ip[i:m:r], blen) + within for i in range(r)], axis=1)
    return bptr, pos


# Blocks whose column lists block_rows_host compares first, so a matrix whose row lengths repeat but whose columns
# do not (bundle adjustment's A at R = 4) is rejected without a pass over all its entries.
_BLOCK_PROBE = 4096


def block_rows_host(indptr, indices, min_rows: int = 2) -> int:
    """The largest R in [max(2, min_rows), MAX_BLOCK_ROWS] such that rows R·b .. R·b + R - 1 hold the same column
    list (same length, same columns in the same order) for every block b; 1 when no R does. Host (concrete
    arrays)."""
    ip = np.asarray(indptr, np.int64)
    m = ip.shape[0] - 1
    lens = np.diff(ip)
    idx = None

    def same_columns(ptr, r):
        cols = idx[_block_positions(ptr, r)[1]]
        return bool((cols == cols[:, :1]).all())

    for r in range(MAX_BLOCK_ROWS, max(2, min_rows) - 1, -1):
        if m <= 0 or m % r:
            continue
        lr = lens.reshape(-1, r)
        if not (lr == lr[:, :1]).all():
            continue
        idx = np.asarray(indices) if idx is None else idx
        probe = min(m // r, _BLOCK_PROBE) * r  # rows of the first blocks
        if same_columns(ip[: probe + 1], r) and (probe == m or same_columns(ip, r)):
            return r
    return 1


# The auto rule: the blocks form serves N = 1 products when R >= 3. H200, spmv_bench --blocks (2026-12-01, µs, f32):
# Aᵀu of bundle-adjustment 1M (R = 3) CSR vector 99.7 -> blocks 61.9 (cuSPARSE 74.7), of LSMR's ba-like Jacobian
# segmented 46.0 -> 30.7 (43.3); but A x of both (R = 2, 12 entries per row, the pair's x gathers already L1
# hits) slower: 72.3 -> 79.2-80.9 and 40.4 -> 43.6-44.3. (blocks=True builds the form for any R.)
_BLOCKS_MIN_ROWS = 3


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """Static shape of a blocks form: R rows per block, M / R block rows, CTAs of its segment table."""

    rows: int
    block_rows: int
    ctas: int


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A matrix in the blocks form (arrays as in spmm_params.h) with its static plan; a registered pytree.
    ``values[R p + i]`` is the entry of row R b + i at position p of block row b."""

    indptr: jax.Array
    indices: jax.Array
    values: jax.Array
    seg_table: jax.Array
    seg_ptr: jax.Array
    plan: BlockPlan


jax.tree_util.register_dataclass(
    Blocks, data_fields=["indptr", "indices", "values", "seg_table", "seg_ptr"], meta_fields=["plan"]
)


def _build_blocks(indptr, indices, values, r: int) -> Blocks:
    """The blocks form with R rows per block of a concrete CSR (monotone indptr) whose rows come in such blocks
    (block_rows_host). The values are gathered on the device from ``values`` (gradients flow through the build)."""
    ip = np.asarray(indptr, np.int64)
    bptr, pos = _block_positions(ip, r)
    cols = np.asarray(indices)[pos[:, 0]]
    vals = jnp.asarray(values)[jnp.asarray(pos.reshape(-1).astype(np.int32))]
    table, seg_ptr, ctas = _segment_table(segments_host(bptr, DEFAULT_SEGMENT_ROWS))
    plan = BlockPlan(r, (ip.shape[0] - 1) // r, ctas)
    return Blocks(
        jnp.asarray(bptr.astype(np.int32)),
        jnp.asarray(cols),
        vals,
        jnp.asarray(table),
        jnp.asarray(seg_ptr),
        plan,
    )


# ------------------------------------------------------------------------------------------ long-row lists
def _long_rows_host(indptr: np.ndarray, chunk: int) -> tuple[np.ndarray, np.ndarray, int]:
    lens = np.diff(np.asarray(indptr, np.int64))
    rows = np.nonzero(lens > chunk)[0].astype(np.int32)
    units = -(-lens[rows] // chunk)
    ptr = np.concatenate([[0], np.cumsum(units)]).astype(np.int64)
    if ptr[-1] > _INT32_MAX:
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
    (cusparseSpMV_bufferSize asked for nnz / 51 bytes on the H200's cuSPARSE for every suite matrix, whatever M:
    ba-like A and Aᵀ, 1M and 618k rows, both 235087 bytes; this leaves 6x that, M / 8 and 1 MiB, and the handler
    raises if cuSPARSE ever wants more)."""
    return _CUSPARSE_ZERO_BYTES + (m + nnz) // 8 + (1 << 20)


def cusparse_applicable(indptr, indices, k: int, dtype) -> bool:
    """Whether the cusparse plan may run cuSPARSE for a CSR: float32/float64 values, nnz > 0, K > 0, and (for
    concrete arrays only) a standard CSR: indptr[0] == 0 and indptr[M] == nnz (so no padding is stored past the
    rows: a padded BCOO or its transpose keeps split) and every column index in [0, K) (checked on the device).
    cuSPARSE reads every stored entry as part of a row, so an entry the kernels skip must not reach it."""
    if (
        np.dtype(dtype) not in _F32_F64
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


def _make_plan(
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


# ------------------------------------------------------------------------------------------- kernel core
def _xla_spmm(indptr, indices, values, b2, alpha, beta, y):
    """Reference (implementation="xla"): same semantics for a monotone indptr, accumulating in Acc."""
    m = indptr.shape[0] - 1
    k = b2.shape[0]
    acc = _acc_dtype(values.dtype)
    nnz = indices.shape[0]
    row, inside = _row_ids(indptr, nnz)
    valid = inside & (indices >= 0) & (indices < k)
    col = jnp.clip(indices, 0, max(k - 1, 0))
    if k == 0 or nnz == 0:
        prod = jnp.zeros((m, b2.shape[1]), acc)
    else:
        contrib = jnp.where(valid, values.astype(acc), 0)[:, None] * b2[col].astype(acc)
        prod = jax.ops.segment_sum(contrib, row, num_segments=m)
    out = alpha[None, :] * prod
    if y.size:
        out = out + beta[None, :] * y.astype(acc)
    return out.astype(values.dtype)


# SpMM (N > 1) on matrices with few, long rows: each (row, column tile) gets one team of G column lanes (times S
# slots on the 16-byte path, _spmm_slots), so a handful of long rows leaves most of the GPU idle. Below
# _SPMM_MIN_LANES lanes in that grid, with rows averaging at least two split chunks, the product takes the split
# plan instead (DEFAULT_SPLIT_CHUNK-nnz units, a team each, partials summed per row in unit order:
# deterministic), whatever the N = 1 plan is. Long-row lists are built in the graph. (CSR(Aᵀ) of LSMR's 8kv-like
# matrix, 6177 rows of ~900, no longer splits: 32 lanes per row run it 2.2x faster than the split plan did.)
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
    """Slots per team of the 16-byte SpMM kernel for rows averaging ``avg_nnz``; SlotsFor in
    ffi_cuda/sparse/spmm_kernels_impl.cuh must match."""
    s = 8 if avg_nnz >= 256 else 4 if avg_nnz >= 128 else 2 if avg_nnz >= 64 else 1
    return min(s, 32 // g)


def _ffi_spmm(indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr, *, plan: Plan):
    m = indptr.shape[0] - 1
    n = b2.shape[1]
    if plan.algorithm == "cusparse" and n != 1:  # cuSPARSE serves N = 1; other N run split's kernels
        plan = dataclasses.replace(plan, algorithm="split")
    if spmm_takes_split(plan, m, int(indices.shape[0]), n, np.dtype(values.dtype).itemsize):
        indptr = _sanitize_indptr(indptr, int(indices.shape[0]))  # split needs a monotone indptr
        plan, long_rows, long_ptr = _make_plan(
            indptr, int(indices.shape[0]), m, None, "split", DEFAULT_SPLIT_CHUNK
        )
    acc = _acc_dtype(values.dtype)
    out = jax.ShapeDtypeStruct((m, n), values.dtype)
    if plan.algorithm == "cusparse":
        ws_len = -(-_cusparse_ws_bytes(m, int(indices.shape[0])) // acc.itemsize)
    else:
        ws_len = max(plan.units * n, 1)
    ws = jax.ShapeDtypeStruct((ws_len,), acc)
    aliases = {6: 0} if y.size else None
    res, _ = _ffi.ffi_call(
        "jax_ops_sparse_csr_spmm",
        (out, ws),
        indptr,
        indices,
        values,
        b2,
        alpha,
        beta,
        y,
        long_rows,
        long_ptr,
        input_output_aliases=aliases,
        algorithm=np.int32(_ALG_CODE[plan.algorithm]),
        group=np.int32(plan.group),
        chunk=np.int64(plan.chunk),
    )
    return res


def _map_batch(core, axis_size, args, in_batched):
    """vmap with a batched matrix: one kernel call per batch element (not a hot path, documented)."""
    full = tuple(a if bt else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, bt in zip(args, in_batched))
    return lax.map(lambda xs: core(*xs), full)


def _fold_batch(v, m, b2, alpha, beta, y, batched):
    """vmap over (b2 [k, n], alpha [n], beta [n], y [m, n] or [0]) folded into v·n SpMM columns."""

    def full(x, is_batched):
        return x if is_batched else jnp.broadcast_to(x, (v, *x.shape))

    k, n = b2.shape[-2], b2.shape[-1]
    bf = jnp.moveaxis(full(b2, batched[0]), 0, 1).reshape(k, v * n)
    af = full(alpha, batched[1]).reshape(v * n)
    betaf = full(beta, batched[2]).reshape(v * n)
    if y.size == 0:
        yf = jnp.zeros((0,), y.dtype)
    else:
        yf = jnp.moveaxis(full(y, batched[3]), 0, 1).reshape(m, v * n)
    return bf, af, betaf, yf


def _unfold_batch(out, v):
    """[m, v·n] SpMM columns back to the batch [v, m, n]."""
    m, vn = out.shape
    return jnp.moveaxis(out.reshape(m, v, vn // v), 1, 0)


@functools.cache
def _core(plan: Plan, implementation: str | None):
    """``out[M, N] = alpha * (A @ b2) + beta * y`` as a custom_vmap'd kernel call (vmap folds into N)."""

    @jax.custom_batching.custom_vmap
    def core(indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr):
        if implementation == "xla":
            return _xla_spmm(indptr, indices, values, b2, alpha, beta, y)
        return _ffi_spmm(indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr, plan=plan)

    @core.def_vmap
    def _rule(axis_size, in_batched, indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr):
        args = (indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr)
        if any(in_batched[i] for i in (0, 1, 2, 7, 8)):
            return _map_batch(core, axis_size, args, in_batched), True
        bf, af, betaf, yf = _fold_batch(axis_size, indptr.shape[0] - 1, b2, alpha, beta, y, in_batched[3:7])
        out = core(indptr, indices, values, bf, af, betaf, yf, long_rows, long_ptr)
        return _unfold_batch(out, axis_size), True

    return core


def _ffi_slab(ptr, col, val, work, b2, alpha, beta, y, *, plan: SlabPlan):
    """``alpha * (Aᵀ u) + beta * y`` through jax_ops_sparse_slab_spmv (b2 = u as [m, 1], y [n, 1] or [0])."""
    n = plan.rows
    acc = _acc_dtype(val.dtype)
    out = jax.ShapeDtypeStruct((n,), val.dtype)
    ws = jax.ShapeDtypeStruct((max(plan.slabs * n, 1),), acc)
    y1 = y.reshape(-1)
    res, _ = _ffi.ffi_call(
        "jax_ops_sparse_slab_spmv",
        (out, ws),
        ptr,
        col,
        val,
        work,
        b2.reshape(-1),
        alpha,
        beta,
        y1,
        input_output_aliases={7: 0} if y1.size else None,
        width=np.int64(plan.width),
        group=np.int32(plan.group),
    )
    return res[:, None]


def _ffi_blocks(bptr, bcol, bval, seg_table, seg_ptr, b2, alpha, beta, y, *, plan: BlockPlan):
    """``alpha * (A x) + beta * y`` through the csr_spmm target's blocks plan (b2 = x as [K, 1], y [M, 1] or
    [0])."""
    m = plan.rows * plan.block_rows
    out = jax.ShapeDtypeStruct((m, 1), bval.dtype)
    ws = jax.ShapeDtypeStruct((1,), _acc_dtype(bval.dtype))
    res, _ = _ffi.ffi_call(
        "jax_ops_sparse_csr_spmm",
        (out, ws),
        bptr,
        bcol,
        bval,
        b2,
        alpha,
        beta,
        y,
        seg_table,
        seg_ptr,
        input_output_aliases={6: 0} if y.size else None,
        algorithm=np.int32(_ALG_CODE["blocks"]),
        group=np.int32(32),  # not read: the segment table holds the lanes per block row
        chunk=np.int64(plan.ctas),
    )
    return res


def _alt_leaves(alt) -> tuple:
    """The array leaves of an N = 1 form (Slabs or Blocks), in the order its kernel call takes them."""
    if isinstance(alt, Slabs):
        return (alt.ptr, alt.col, alt.val, alt.work)
    return (alt.indptr, alt.indices, alt.values, alt.seg_table, alt.seg_ptr)


@functools.cache
def _alt_core(alt_plan, plan: Plan, implementation: str | None):
    """N = 1 product through another form of the matrix (column slabs for SlabPlan, row blocks for BlockPlan);
    vmap folds the batch into the columns of a CSR SpMM (``_core``), or stays on the form when the folded width is
    still 1. ``args``: the CSR arrays (indptr, indices, values, long_rows, long_ptr), the form's leaves
    (_alt_leaves), then b2, alpha, beta, y."""
    ffi_alt = _ffi_slab if isinstance(alt_plan, SlabPlan) else _ffi_blocks

    @jax.custom_batching.custom_vmap
    def core(*args):
        indptr, indices, values, long_rows, long_ptr = args[:5]
        b2, alpha, beta, y = args[-4:]
        if b2.shape[1] != 1:
            return _core(plan, implementation)(
                indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr
            )
        return ffi_alt(*args[5:-4], b2, alpha, beta, y, plan=alt_plan)

    @core.def_vmap
    def _rule(axis_size, in_batched, *args):
        if any(in_batched[:-4]):
            return _map_batch(core, axis_size, args, in_batched), True
        b2, alpha, beta, y = args[-4:]
        bf, af, betaf, yf = _fold_batch(axis_size, args[0].shape[0] - 1, b2, alpha, beta, y, in_batched[-4:])
        out = core(*args[:-4], bf, af, betaf, yf)
        return _unfold_batch(out, axis_size), True

    return core


# ------------------------------------------------------------------------------------ differentiable op
@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    k: int
    plan: Plan
    plan_t: Plan | None  # None: no transposed CSR given (built in the backward pass)
    implementation: str | None
    alt: SlabPlan | BlockPlan | None = None  # the N = 1 form the forward product runs on (slabs or blocks)


def _sampled(indptr, indices, g, b2, k):
    """d/d values: sum_n g[row_p, n] * b2[col_p, n] for valid positions, 0 elsewhere."""
    nnz = indices.shape[0]
    acc = _acc_dtype(g.dtype)
    row, inside = _row_ids(indptr, nnz)
    valid = inside & (indices >= 0) & (indices < k)
    col = jnp.clip(indices, 0, max(k - 1, 0))
    if nnz == 0 or k == 0 or g.shape[0] == 0:
        return jnp.zeros((nnz,), acc)
    s = jnp.sum(g[row].astype(acc) * b2[col].astype(acc), axis=-1)
    return jnp.where(valid, s, 0)


def _uses_alt(st: _Static, alt, b2) -> bool:
    """Whether the product runs on the N = 1 form ``alt`` (column slabs or blocks; N = 1, not the XLA path)."""
    return st.alt is not None and alt is not None and b2.shape[1] == 1 and st.implementation != "xla"


def _product(st: _Static, a_arrays, values, alt, b2, alpha, beta, y):
    indptr, indices, long_rows, long_ptr = a_arrays
    if _uses_alt(st, alt, b2):
        return _alt_core(st.alt, st.plan, st.implementation)(
            indptr, indices, values, long_rows, long_ptr, *_alt_leaves(alt), b2, alpha, beta, y
        )
    return _core(st.plan, st.implementation)(indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr)


def _slab_sampled(slabs: Slabs, plan: SlabPlan, ga, b2):
    """d/d slabs.val of ``ga · (Aᵀ b2)``: entry p of cell (slab s, row r) with local column c gets
    ga[r] * b2[s·W + c] (0 for the padding past ptr[-1])."""
    nnz = slabs.val.shape[0]
    acc = _acc_dtype(ga.dtype)
    if nnz == 0 or plan.rows == 0 or plan.cols == 0:
        return jnp.zeros((nnz,), slabs.val.dtype)
    cell, inside = _row_ids(slabs.ptr, nnz)
    i = (cell // plan.rows) * plan.width + slabs.col.astype(jnp.int32)
    valid = inside & (i < plan.cols)
    g = ga[cell % plan.rows, 0].astype(acc) * b2[jnp.clip(i, 0, plan.cols - 1), 0].astype(acc)
    return jnp.where(valid, g, 0).astype(slabs.val.dtype)


def _blocks_sampled(bl: Blocks, ga, b2):
    """d/d bl.values of ``ga · (A b2)``: value R p + i (row R b + i, position p of block row b, column c) gets
    ga[R b + i] * b2[c] (0 for an invalid column or a position outside every block row)."""
    r = bl.plan.rows
    npos = bl.indices.shape[0]
    k = b2.shape[0]
    acc = _acc_dtype(ga.dtype)
    if npos == 0 or k == 0 or bl.plan.block_rows == 0:
        return jnp.zeros((r * npos,), bl.values.dtype)
    brow, inside = _row_ids(bl.indptr, npos)
    valid = inside & (bl.indices >= 0) & (bl.indices < k)
    xc = b2[jnp.clip(bl.indices, 0, k - 1), 0].astype(acc)
    rows = brow[:, None] * r + jnp.arange(r, dtype=jnp.int32)[None, :]
    g = ga[rows, 0].astype(acc) * xc[:, None]
    return jnp.where(valid[:, None], g, 0).reshape(-1).astype(bl.values.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _apply(st: _Static, a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y):
    return _product(st, a_arrays, values, alt, b2, alpha, beta, y)


def _apply_fwd(st, a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y):
    out = _apply(st, a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y)
    return out, (a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y)


def _zero_cotangent(x):
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def _apply_bwd(st, res, g):
    a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y = res
    indptr, indices, long_rows, long_ptr = a_arrays
    acc = _acc_dtype(values.dtype)
    n = b2.shape[1]
    ga = (g.astype(acc) * alpha[None, :]).astype(values.dtype)
    ones = jnp.ones((n,), acc)
    empty = jnp.zeros((0,), values.dtype)
    # dB = Aᵀ (alpha * g): a row-major sweep of CSR(Aᵀ)
    if st.plan_t is not None:
        t_indptr, t_indices, t_long_rows, t_long_ptr = t_arrays
        gb = _core(st.plan_t, st.implementation)(
            t_indptr, t_indices, t_values, ga, ones, ones, empty, t_long_rows, t_long_ptr
        )
    else:
        mono = _sanitize_indptr(indptr, indices.shape[0])
        t_indptr, t_indices, tv = _transpose_csr(mono, indices, values, st.m, st.k)
        plan_t, t_lr, t_lp = _make_plan(t_indptr, indices.shape[0], st.k, None, None, None)
        gb = _core(plan_t, st.implementation)(t_indptr, t_indices, tv, ga, ones, ones, empty, t_lr, t_lp)
    # d values: on the leaf the product read: slabs.val or blocks.values when it ran on that form, else values.
    g_alt = jax.tree_util.tree_map(_zero_cotangent, alt)
    if _uses_alt(st, alt, b2):
        gv = jnp.zeros_like(values)
        if isinstance(alt, Slabs):
            g_alt = dataclasses.replace(g_alt, val=_slab_sampled(alt, st.alt, ga, b2))
        else:
            g_alt = dataclasses.replace(g_alt, values=_blocks_sampled(alt, ga, b2))
    else:
        mono = _sanitize_indptr(indptr, indices.shape[0])
        gv = _sampled(mono, indices, ga, b2, st.k).astype(values.dtype)
    # d alpha = sum_rows g * (A b2) (recomputed; dead code under jit when alpha is a constant)
    ab = _product(st, a_arrays, values, alt, b2, ones, ones, empty)
    galpha = jnp.sum(g.astype(acc) * ab.astype(acc), axis=0)
    if y.size:
        gbeta = jnp.sum(g.astype(acc) * y.astype(acc), axis=0)
        gy = (g.astype(acc) * beta[None, :]).astype(y.dtype)
    else:
        gbeta = jnp.zeros_like(beta)
        gy = jnp.zeros_like(y)
    zero_like = lambda t: jax.tree_util.tree_map(lambda x: np.zeros(x.shape, jax.dtypes.float0), t)
    return (
        zero_like(a_arrays),
        zero_like(t_arrays),
        gv,
        jnp.zeros_like(t_values),
        g_alt,
        gb.astype(b2.dtype),
        galpha,
        gbeta,
        gy,
    )


_apply.defvjp(_apply_fwd, _apply_bwd)


# ------------------------------------------------------------------------------------------------ helpers
def _coef(name: str, c, n: int, acc: np.dtype, default: float) -> jax.Array:
    if c is None:
        return jnp.full((n,), default, acc)
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return jnp.full((n,), c, acc)
    _checks.check_array(name, c)
    if not jnp.issubdtype(c.dtype, jnp.floating):
        raise TypeError(f"{name} must be a floating-point scalar or array, got dtype {np.dtype(c.dtype)}")
    if tuple(c.shape) not in ((), (n,)):
        raise ValueError(f"{name} must be 0-d or have shape ({n},) (one per column), got {tuple(c.shape)}")
    return jnp.broadcast_to(jnp.asarray(c).astype(acc), (n,))


def _dense(name: str, x, rows: int, dtype, *, what: str) -> tuple[jax.Array, bool]:
    """x as [rows, N] and whether it was a vector. Raises naming ``name``."""
    _checks.check_array(name, x)
    if x.ndim not in (1, 2):
        raise ValueError(
            f"{name} must be a vector [{rows}] or a matrix [{rows}, N], got shape {tuple(x.shape)}"
        )
    if x.shape[0] != rows:
        raise ValueError(f"{name} has shape {tuple(x.shape)} but {what} needs {rows} rows")
    if np.dtype(x.dtype) != np.dtype(dtype):
        raise TypeError(
            f"{name} has dtype {np.dtype(x.dtype)} but the sparse matrix has dtype {np.dtype(dtype)}"
        )
    x = jnp.asarray(x)
    return (x[:, None], True) if x.ndim == 1 else (x, False)


# ------------------------------------------------------------------------------------------------ CSRPair
@dataclasses.dataclass(frozen=True)
class CSRPair:
    """CSR(A) and CSR(Aᵀ) of one matrix with their row profiles and static kernel plans (a registered pytree).

    Build with :meth:`from_matrix` (or :func:`csr_pair`) from a BCSR, BCOO or scipy.sparse matrix. The profile is
    computed on the host when the inputs are concrete (outside ``jit``); inside ``jit`` the plan falls back to
    the static average row length. Gradients w.r.t. values arrive on the leaf the product used (``values`` for
    ``matvec``/``matmat``, ``values_t`` for ``rmatvec``/``rmatmat``; ``blocks.values``/``blocks_t.values`` or
    ``slabs_t.val`` for an N = 1 product that ran on row blocks or column slabs).
    """

    indptr: jax.Array
    indices: jax.Array
    values: jax.Array
    long_rows: jax.Array
    long_ptr: jax.Array
    indptr_t: jax.Array
    indices_t: jax.Array
    values_t: jax.Array
    long_rows_t: jax.Array
    long_ptr_t: jax.Array
    shape: tuple[int, int]
    plan: Plan
    plan_t: Plan
    profile: RowProfile | None
    profile_t: RowProfile | None
    implementation: str | None = None
    slabs: Slabs | None = None  # column slabs of A, for A x (not built today)
    slabs_t: Slabs | None = None  # column slabs of Aᵀ, for Aᵀ u (rmatvec, N = 1)
    blocks: Blocks | None = None  # A in row blocks, for A x (N = 1; before slabs)
    blocks_t: Blocks | None = None  # Aᵀ in row blocks, for Aᵀ u (N = 1; before slabs)

    @classmethod
    def from_matrix(
        cls,
        A,
        *,
        algorithm: str | None = None,
        transpose_algorithm: str | None = None,
        split_chunk: int | None = None,
        implementation: str | None = None,
        slabs: bool | None = None,
        blocks: bool | None = None,
    ) -> CSRPair:
        """Builds the pair. ``algorithm``/``transpose_algorithm`` override the profile's choice (testing);
        ``split_chunk`` sets the nnz per work unit of the split algorithm. ``slabs``: build the column-slab
        form of Aᵀ used by N = 1 ``rmatvec`` (True), never (False), or when :func:`slab_model` says it pays
        for this shape (None; f32/f64 only). ``blocks``: build the row-block form of A and of Aᵀ where their rows
        come in blocks sharing a column list (block_rows_host), used by N = 1 products instead of CSR and slabs:
        wherever found (True), never (False), or for blocks of at least 3 rows (None, the measured rule; not for
        Aᵀ when slabs=True asks for slabs). Both need concrete arrays (outside jit); a traced build has neither."""
        _checks.check_implementation(implementation)
        if isinstance(A, CSRPair):
            has_blocks = A.blocks if A.blocks is not None else A.blocks_t
            for name, opt, have in (("slabs", slabs, A.slabs_t), ("blocks", blocks, has_blocks)):
                if opt is not None and opt != (have is not None):
                    raise ValueError(
                        f"{name}={opt} for a CSRPair built {'with' if have is not None else 'without'} {name}: "
                        f"build the pair from the matrix (BCSR/BCOO/scipy) with the {name} option instead"
                    )
            return A
        indptr, indices, values, m, k, _ = _as_csr(A)
        nnz = int(indices.shape[0])
        indptr = _sanitize_indptr(indptr, nnz)
        indptr_t, indices_t, values_t = _transpose_csr(indptr, indices, values, m, k)
        concrete = _is_concrete(indptr, indptr_t)
        prof = RowProfile.from_indptr(np.asarray(indptr)) if concrete else None
        prof_t = RowProfile.from_indptr(np.asarray(indptr_t)) if concrete else None
        itemsize = np.dtype(values.dtype).itemsize
        plan, lr, lp = _make_plan(
            indptr, nnz, m, prof, algorithm, split_chunk, k, itemsize,
            cusparse_ok=lambda: cusparse_applicable(indptr, indices, k, values.dtype),
        )  # fmt: skip
        plan_t, lr_t, lp_t = _make_plan(
            indptr_t, nnz, k, prof_t, transpose_algorithm, split_chunk, m, itemsize,
            cusparse_ok=lambda: cusparse_applicable(indptr_t, indices_t, m, values.dtype),
        )  # fmt: skip
        slabs_forced = slabs is True  # an explicit slabs=True keeps Aᵀu on slabs unless blocks=True too
        slab_ok = np.dtype(values.dtype) in _F32_F64
        if slabs and not slab_ok:
            raise ValueError(
                f"slabs=True needs float32 or float64 values, got {np.dtype(values.dtype)} (half types use CSR(Aᵀ))"
            )
        if slabs is None:
            slabs = slab_ok and _slabs_fit_device() and slab_model(k, m, nnz, itemsize).use
        # (an empty A has nothing to gather: slabs=True builds none)
        slabs_t = _build_slabs(indptr, indices, values, m, k) if slabs and m > 0 and k > 0 else None
        min_rows = 2 if blocks else _BLOCKS_MIN_ROWS

        def blocks_of(ip, idx, vals):
            r = block_rows_host(ip, idx, min_rows) if blocks is not False and concrete and nnz > 0 else 1
            return _build_blocks(ip, idx, vals, r) if r >= min_rows else None

        blocks_a = blocks_of(indptr, indices, values)
        blocks_t = blocks_of(indptr_t, indices_t, values_t) if blocks or not slabs_forced else None
        return cls(
            indptr,
            indices,
            values,
            lr,
            lp,
            indptr_t,
            indices_t,
            values_t,
            lr_t,
            lp_t,
            (m, k),
            plan,
            plan_t,
            prof,
            prof_t,
            implementation,
            None,
            slabs_t,
            blocks_a,
            blocks_t,
        )

    # -- properties
    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.values.dtype)

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def T(self) -> CSRPair:  # noqa: N802
        return CSRPair(
            self.indptr_t,
            self.indices_t,
            self.values_t,
            self.long_rows_t,
            self.long_ptr_t,
            self.indptr,
            self.indices,
            self.values,
            self.long_rows,
            self.long_ptr,
            (self.shape[1], self.shape[0]),
            self.plan_t,
            self.plan,
            self.profile_t,
            self.profile,
            self.implementation,
            self.slabs_t,
            self.slabs,
            self.blocks_t,
            self.blocks,
        )

    # -- products
    def _product(self, transpose: bool, b, alpha, beta, y, name: str):
        m, k = self.shape
        if transpose:
            m, k = k, m
        b2, vec = _dense(name, b, k, self.dtype, what=f"{'Aᵀ' if transpose else 'A'} of shape {(m, k)}")
        n = b2.shape[1]
        acc = _acc_dtype(self.dtype)
        if y is None:
            y2 = jnp.zeros((0,), self.dtype)
            if beta is not None:
                raise ValueError("beta was given without y")
        else:
            y2, _ = _dense("y", y, m, self.dtype, what="the output")
            if tuple(y2.shape) != (m, n):
                raise ValueError(
                    f"y must have the output's shape {(m,) if vec else (m, n)}, got {tuple(y.shape)}"
                )
        alpha_a = _coef("alpha", alpha, n, acc, 1.0)
        beta_a = _coef("beta", beta, n, acc, 1.0)
        a_arr = (self.indptr, self.indices, self.long_rows, self.long_ptr)
        t_arr = (self.indptr_t, self.indices_t, self.long_rows_t, self.long_ptr_t)
        # the N = 1 form of this direction's matrix: blocks, else column slabs, else none (CSR)
        forms = (self.blocks_t, self.slabs_t) if transpose else (self.blocks, self.slabs)
        alt = next((f for f in forms if f is not None), None) if n == 1 else None
        alt_plan = alt.plan if alt is not None else None
        if transpose:
            st = _Static(m, k, self.plan_t, self.plan, self.implementation, alt_plan)
            out = _apply(st, t_arr, a_arr, self.values_t, self.values, alt, b2, alpha_a, beta_a, y2)
        else:
            st = _Static(m, k, self.plan, self.plan_t, self.implementation, alt_plan)
            out = _apply(st, a_arr, t_arr, self.values, self.values_t, alt, b2, alpha_a, beta_a, y2)
        return out[:, 0] if vec else out

    def matvec(self, x, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (A @ x) + beta * y`` for x ``[K]`` (y ``[M]``; without y: ``alpha * A @ x``)."""
        return self._product(False, x, alpha, beta, y, "x")

    def rmatvec(self, u, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (Aᵀ @ u) + beta * y`` for u ``[M]``: a row-major sweep of CSR(Aᵀ) (no atomics)."""
        return self._product(True, u, alpha, beta, y, "u")

    def matmat(self, B, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (A @ B) + beta * y`` for B ``[K, N]``; alpha/beta 0-d or per column ``[N]``."""
        return self._product(False, B, alpha, beta, y, "B")

    def rmatmat(self, U, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (Aᵀ @ U) + beta * y`` for U ``[M, N]``."""
        return self._product(True, U, alpha, beta, y, "U")

    def matvec_axpby(self, v, u, beta, alpha=None) -> jax.Array:
        """LSMR's fused update ``alpha * A v + beta * u`` (e.g. ``beta = -alpha_k`` for ``u <- A v - alpha_k u``)."""
        return self._product(False, v, alpha, beta, u, "v")

    def rmatvec_axpby(self, u, v, beta, alpha=None) -> jax.Array:
        """``alpha * Aᵀ u + beta * v`` in one pass."""
        return self._product(True, u, alpha, beta, v, "u")

    def __matmul__(self, other):
        return self.matmat(other) if getattr(other, "ndim", 1) == 2 else self.matvec(other)

    def todense(self) -> jax.Array:
        m, k = self.shape
        return _xla_spmm(
            self.indptr,
            self.indices,
            self.values,
            jnp.eye(k, dtype=self.dtype),
            jnp.ones((k,), _acc_dtype(self.dtype)),
            jnp.ones((k,), _acc_dtype(self.dtype)),
            jnp.zeros((0,), self.dtype),
        )


jax.tree_util.register_dataclass(
    CSRPair,
    data_fields=[
        "indptr",
        "indices",
        "values",
        "long_rows",
        "long_ptr",
        "indptr_t",
        "indices_t",
        "values_t",
        "long_rows_t",
        "long_ptr_t",
        "slabs",
        "slabs_t",
        "blocks",
        "blocks_t",
    ],
    meta_fields=["shape", "plan", "plan_t", "profile", "profile_t", "implementation"],
)


def csr_pair(A, **kwargs) -> CSRPair:
    """:meth:`CSRPair.from_matrix`."""
    return CSRPair.from_matrix(A, **kwargs)


# ----------------------------------------------------------------------------------------- free functions
def _matmul_sparse_dense(A, B, *, algorithm, split_chunk, implementation, name):
    if isinstance(A, CSRPair):
        if algorithm is not None or split_chunk is not None:  # testing: rebuild with the forced plan
            A = CSRPair.from_matrix(
                _pair_as_bcsr(A),
                algorithm=algorithm,
                transpose_algorithm=algorithm,
                split_chunk=split_chunk,
                implementation=A.implementation,
                slabs=A.slabs_t is not None,
                blocks=None if A.blocks is not None or A.blocks_t is not None else False,
            )
        if implementation is not None:
            A = dataclasses.replace(A, implementation=implementation)
        return A.matmat(B) if getattr(B, "ndim", 1) == 2 else A.matvec(B)
    indptr, indices, values, m, k, _ = _as_csr(A)
    nnz = int(indices.shape[0])
    b2, vec = _dense(name, B, k, values.dtype, what=f"A of shape {(m, k)}")
    if algorithm in ("split", "cusparse") or implementation == "xla":
        indptr = _sanitize_indptr(indptr, nnz)  # (cusparse runs as split here: the columns are not checked)
    plan, lr, lp = _make_plan(indptr, nnz, m, None, algorithm, split_chunk)
    n = b2.shape[1]
    acc = _acc_dtype(values.dtype)
    ones = jnp.ones((n,), acc)
    st = _Static(m, k, plan, None, implementation)
    empty_t = (jnp.zeros((0,), jnp.int32),) * 4
    out = _apply(
        st,
        (indptr, indices, lr, lp),
        empty_t,
        values,
        jnp.zeros((0,), values.dtype),
        None,
        b2,
        ones,
        ones,
        jnp.zeros((0,), values.dtype),
    )
    return out[:, 0] if vec else out


def _pair_as_bcsr(p: CSRPair):
    from jax.experimental import sparse as jsparse

    return jsparse.BCSR((p.values, p.indices, p.indptr), shape=p.shape)


def _is_sparse(x) -> bool:
    if isinstance(x, CSRPair):
        return True
    mod = type(x).__module__
    return type(x).__name__ in ("BCSR", "BCOO") or mod.startswith("scipy.sparse")


def matmul(
    A, B, *, algorithm: str | None = None, split_chunk: int | None = None, implementation: str | None = None
) -> jax.Array:
    """``A @ B`` for sparse A (BCSR, BCOO, scipy.sparse or CSRPair) and dense B ``[K]``/``[K, N]``, or
    ``B @ A`` for dense B ``[M]``/``[N, M]`` (computed as ``(Aᵀ Bᵀ)ᵀ``; cheap for a CSRPair, a transpose build
    otherwise).

    Args:
      algorithm: force one of ALGORITHMS (testing; "cusparse" on a BCSR/BCOO runs as split, since only a CSRPair
        build checks the column indices cuSPARSE needs); None uses the row profile of a CSRPair or, for BCSR/BCOO,
        the static average row length (vector or warp).
      split_chunk: nnz per work unit of the split algorithm.
      implementation: None/"ffi" (the kernel) or "xla" (the jnp reference).
    """
    _checks.check_implementation(implementation)
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS} or None, got {algorithm!r}")
    if _is_sparse(A):
        return _matmul_sparse_dense(
            A, B, algorithm=algorithm, split_chunk=split_chunk, implementation=implementation, name="B"
        )
    if _is_sparse(B):
        pair = B if isinstance(B, CSRPair) else CSRPair.from_matrix(B, implementation=implementation)
        if implementation is not None:
            pair = dataclasses.replace(pair, implementation=implementation)
        _checks.check_array("A", A)
        if A.ndim == 1:
            return pair.rmatvec(A)
        if A.ndim != 2:
            raise ValueError(f"the dense operand A must have rank 1 or 2, got shape {tuple(A.shape)}")
        return pair.rmatmat(A.T).T
    raise TypeError(f"matmul needs one sparse operand, got {type(A).__name__} and {type(B).__name__}")


def spmv(
    A, x, *, algorithm: str | None = None, split_chunk: int | None = None, implementation: str | None = None
) -> jax.Array:
    """``A @ x`` for x ``[K]`` (see :func:`matmul`)."""
    _checks.check_array("x", x)
    if x.ndim != 1:
        raise ValueError(f"x must be a vector [K], got shape {tuple(x.shape)} (use spmm for matrices)")
    return matmul(A, x, algorithm=algorithm, split_chunk=split_chunk, implementation=implementation)


def spmm(
    A, B, *, algorithm: str | None = None, split_chunk: int | None = None, implementation: str | None = None
) -> jax.Array:
    """``A @ B`` for B ``[K, N]`` (see :func:`matmul`)."""
    _checks.check_array("B", B)
    if B.ndim != 2:
        raise ValueError(f"B must be a matrix [K, N], got shape {tuple(B.shape)} (use spmv for vectors)")
    return matmul(A, B, algorithm=algorithm, split_chunk=split_chunk, implementation=implementation)


def profile_of(A) -> RowProfile:
    """Row profile of a concrete matrix (host-side)."""
    indptr, _, _, _, _, _ = _as_csr(A)
    return RowProfile.from_indptr(np.asarray(indptr))
