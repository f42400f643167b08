"""Column slabs: Aᵀ stored slab by slab for N = 1 ``Aᵀ u`` of a tall A (contract in
ffi_cuda/sparse/slab_spmv_params.h), their cost model (slab_model) and their build."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_ops._src import dispatch
from jax_ops._src.sparse.config import native, slab_smem_bytes
from jax_ops._src.sparse.formats import _int32_max, _is_concrete, _row_ids
from jax_ops._src.sparse.plan import _L1_BYTES, _vector_group

# Aᵀu of a tall A (m x n, m >> n) as a sweep of CSR(Aᵀ) gathers u (MBs) at random from L2: one 32-byte sector per
# 4-byte read. The column-slab format cuts u's index range into J slabs of W entries that fit in shared memory
# and stores Aᵀ slab by slab with uint16 local columns (contract in ffi_cuda/sparse/slab_spmv_params.h): a CTA
# stages u[slab] in shared memory and gathers from there; pass 2 sums the per-(slab, row) partials in slab order.
# Built once (on device, with a stable sort) when the CSRPair is built and the predicate (slab_model) says it pays.
# Only f32/f64 (half types keep CSR(Aᵀ)); only N = 1 products (rmatvec, rmatvec_axpby; vmap folds into SpMM).
_HBM_BPS, _L2_BPS, _SECTORS_PER_S = 3.5e12, 8e12, 140e9  # H200, measured (docs/design/sparse.md)


# Largest dynamic shared memory one block may opt into, by compute capability (CUDA C++ Programming Guide); other
# GPUs are taken to have the 99 KB of the sm_86/89/120 parts, less than the slab shared memory (slab_smem_bytes).
_SMEM_OPTIN_BY_CC = {(8, 0): 163 * 1024, (8, 7): 163 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024}
_SMEM_OPTIN_OTHER = 99 * 1024


def _slabs_fit_device() -> bool:
    """Whether the first visible GPU can run the slab kernel's the slab shared memory (slab_smem_bytes) per block (True without a GPU: the
    CPU twin takes any width). The predicate uses it, so ``slabs=None`` never builds slabs a GPU would refuse."""
    gpu = dispatch.first_gpu()
    if gpu is None:
        return True
    cc = dispatch.compute_capability(gpu)
    return cc is not None and _SMEM_OPTIN_BY_CC.get(cc, _SMEM_OPTIN_OTHER) >= slab_smem_bytes()


def slab_shape(cols: int, itemsize: int) -> tuple[int, int]:
    """(W, J) for a gathered vector of ``cols`` entries: the fewest slabs of at most the slab shared memory (slab_smem_bytes), equal widths
    rounded up to a multiple of 4 (so each slab starts 16-byte aligned)."""
    w_max = max(4, min(slab_smem_bytes() // itemsize, native().slab_max_width) & ~3)
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
    items = dispatch.sm_count() * native().slab_ctas_per_sm if items is None else items
    w, j = slab_shape(cols, itemsize)
    cells = j * rows
    per = nnz / cells if cells else 0.0
    bytes_slab = nnz * (itemsize + 2) + (cells + 1) * 4 + 2 * cells * itemsize + (cols + rows) * itemsize
    staged = max(items, j) * w * itemsize
    us_slab = (bytes_slab / _HBM_BPS + staged / _L2_BPS) * 1e6 + 2.0
    bytes_csr = nnz * (itemsize + 4) + (rows + 1) * 4 + (cols + rows) * itemsize
    l1_resident = cols * itemsize <= _L1_BYTES
    us_csr = max(bytes_csr / _HBM_BPS, 0.0 if l1_resident else nnz / _SECTORS_PER_S) * 1e6
    use = not l1_resident and rows > 0 and nnz >= 8 * cells and cells + 1 <= _int32_max() and us_slab < us_csr
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
    items = dispatch.sm_count() * native().slab_ctas_per_sm if items is None else items
    w, j = slab_shape(m, itemsize)
    if j * k + 1 > _int32_max():
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
