"""Matrix formats: BCSR/BCOO/scipy -> CSR conversion and validation, the CSR transpose, the row profile, and the
checks of the dense operands and coefficients."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_ops import _checks
from jax_ops._src.sparse.config import native


@functools.cache
def value_dtypes() -> tuple[np.dtype, ...]:
    """Value dtypes of the CSR kernels (ffi_cuda/sparse/instantiations/support.h, from the generator's table)."""
    return tuple(np.dtype(name) for name in native().spmm_dtypes)


@functools.cache
def slab_dtypes() -> tuple[np.dtype, ...]:
    """Value dtypes of the column-slab kernels (support.h)."""
    return tuple(np.dtype(name) for name in native().slab_spmv_dtypes)


@functools.cache
def cusparse_dtypes() -> tuple[np.dtype, ...]:
    """Value dtypes of the cusparse plan (support.h)."""
    return tuple(np.dtype(name) for name in native().cusparse_dtypes)


def _int32_max() -> int:
    return native().max_dim


def _acc_dtype(dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


def _is_concrete(*xs) -> bool:
    return not any(isinstance(x, jax.core.Tracer) for x in xs)


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


def _check_sizes(m: int, k: int, nnz: int) -> None:
    for name, v in (("rows", m), ("columns", k), ("nnz", nnz)):
        if v > _int32_max() - 1:
            raise ValueError(f"sparse matrix {name} = {v} >= 2^31 - 1 is not supported (int32 indices)")


def _check_value_dtype(name: str, dtype) -> None:
    if np.dtype(dtype) not in value_dtypes():
        names = [d.name for d in value_dtypes()]
        raise TypeError(
            f"{name} must have dtype {', '.join(names[:-1])} or {names[-1]}, got {np.dtype(dtype)}"
        )


def _sanitize_indptr(indptr: jax.Array, nnz: int) -> jax.Array:
    """Monotone indptr within [0, nnz] (identity on valid input)."""
    if indptr.shape[0] == 0:
        return indptr
    return lax.cummax(jnp.clip(indptr, 0, nnz), axis=0).astype(jnp.int32)


def _wrap(index: jax.Array, dim: int) -> jax.Array:
    """JAX's BCOO index semantics: an index in [-dim, -1] means index + dim (numpy-style); any other index
    outside [0, dim) is padding."""
    index = index.astype(jnp.int32)
    return jnp.where(index < 0, index + dim, index)


def _coo_sort_to_csr(data, rows, cols, m: int, k: int):
    """CSR of COO triplets in any order: wrapped indices sorted by (row, col) with ``lax.sort``; out-of-range
    entries (padding) go past indptr[m]."""
    rows, cols = _wrap(rows, m), _wrap(cols, k)
    valid = (rows >= 0) & (rows < m) & (cols >= 0) & (cols < k)
    r = jnp.where(valid, rows, m)
    c = jnp.where(valid, cols, 0)
    r, c, d = lax.sort((r, c, data), num_keys=2)
    indptr = jnp.searchsorted(r, jnp.arange(m + 1, dtype=jnp.int32), side="left").astype(jnp.int32)
    return indptr, c, d


def _coo_counted_to_csr(data, rows, cols, m: int, k: int):
    """CSR of COO triplets whose rows are non-decreasing and non-negative: row pointers by a count per row and a
    prefix sum, no sort. Rows past m are padding past indptr[m]; a column outside [0, K) after wrapping becomes K
    and stays in its row, contributing nothing (the kernels' rule, and JAX's for a BCSR)."""
    rows = rows.astype(jnp.int32)
    counts = jax.ops.segment_sum(jnp.ones_like(rows), rows, num_segments=m, indices_are_sorted=True)
    indptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts, dtype=jnp.int32)])
    cols = _wrap(cols, k)
    return indptr, jnp.where((cols >= 0) & (cols < k), cols, k), data


@functools.partial(jax.jit, static_argnums=(3, 4, 5))
def _coo_to_csr(data, rows, cols, m: int, k: int, conversion: str):
    """(indptr, indices, values) of COO triplets by ``conversion`` (see bcoo_conversion)."""
    if conversion == "count":
        return _coo_counted_to_csr(data, rows, cols, m, k)
    if conversion == "sort":
        return _coo_sort_to_csr(data, rows, cols, m, k)
    count = functools.partial(_coo_counted_to_csr, m=m, k=k)
    sort = functools.partial(_coo_sort_to_csr, m=m, k=k)
    return lax.cond(rows[0] < 0, sort, count, data, rows, cols)


def bcoo_conversion(A) -> str:
    """How a 2-D BCOO becomes CSR: "sort" (``lax.sort`` by (row, col)) unless ``indices_sorted``; then "count"
    (rows counted, no sort) when its first row is known non-negative, "sort" when negative (a negative row wraps
    to a later row; signed order puts it first), "either" when traced (decided on the device)."""
    if not A.indices_sorted:
        return "sort"
    if A.indices.shape[0] == 0:
        return "count"
    if not _is_concrete(A.indices):
        return "either"
    with jax.ensure_compile_time_eval():  # one element read back (also for a constant inside jit)
        return "sort" if int(A.indices[0, 0]) < 0 else "count"


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


def _as_csr(A, conversion: str | None = None) -> tuple[jax.Array, jax.Array, jax.Array, int, int, bool]:
    """(indptr, indices, values, M, K, is_bcsr) of a BCSR/BCOO/scipy matrix; rejects batched/dense dims.
    ``conversion``: a BCOO's ("sort", "count" or "either"; None: bcoo_conversion's choice)."""
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
        rows, cols = A.indices[:, 0], A.indices[:, 1]
        conversion = conversion or bcoo_conversion(A)
        indptr, cols, data = _coo_to_csr(A.data, rows, cols, m, k, conversion)
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
