"""The sparse family's public functions: ``matmul`` / ``spmv`` / ``spmm`` over BCSR, BCOO, scipy.sparse or a
CSRPair, and ``profile_of``."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_ops import _checks
from jax_ops._src import dispatch
from jax_ops._src.sparse.csr_pair import CSRPair, backend
from jax_ops._src.sparse.formats import (
    RowProfile,
    _acc_dtype,
    _as_csr,
    _dense,
    _sanitize_indptr,
    _transpose_csr,
    bcoo_conversion,
)
from jax_ops._src.sparse.plan import ALGORITHMS, plan_unpaired, unpaired_takes_split
from jax_ops._src.sparse.vjp import _apply, _Static


def _matmul_sparse_dense(A, B, *, algorithm, split_chunk, implementation, name, transpose=False):
    """``op(A) @ B`` (op(A) = Aᵀ when ``transpose``) for a CSRPair or a plain matrix (no profile)."""
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
        if transpose:
            A = A.T
        return A.matmat(B) if getattr(B, "ndim", 1) == 2 else A.matvec(B)
    from jax.experimental import sparse as jsparse

    run = functools.partial(
        _plain_product, A, B, algorithm=algorithm, split_chunk=split_chunk, implementation=implementation,
        name=name, transpose=transpose,
    )  # fmt: skip
    if isinstance(A, jsparse.BCOO) and not transpose and _is_plain_2d(A) and bcoo_conversion(A) == "either":
        # a traced BCOO with indices_sorted: count its rows, unless the first is negative (then sort)
        return lax.cond(A.indices[0, 0] < 0, lambda: run(conversion="sort"), lambda: run(conversion="count"))
    return run(conversion=None)


def _is_plain_2d(A) -> bool:
    return A.n_batch == 0 and A.n_dense == 0 and A.ndim == 2


def _plain_product(A, B, *, algorithm, split_chunk, implementation, name, transpose, conversion):
    """``op(A) @ B`` for a BCSR/BCOO/scipy matrix through its CSR (or a transpose built here), no profile."""
    from jax.experimental import sparse as jsparse

    indptr, indices, values, m, k = _csr_of(A, transpose, conversion)
    nnz = int(indices.shape[0])
    b2, vec = _dense(name, B, k, values.dtype, what=f"{'Aᵀ' if transpose else 'A'} of shape {(m, k)}")
    impl = backend(implementation)
    # split (also cusparse, which runs as split here: the columns are not checked) and the reference need a
    # monotone indptr; a BCOO's conversion and a transpose give one already
    monotone = transpose or isinstance(A, jsparse.BCOO)
    if (unpaired_takes_split(algorithm, nnz, m) or impl == "xla") and not monotone:
        indptr = _sanitize_indptr(indptr, nnz)
    plan, lr, lp = plan_unpaired(indptr, nnz, m, algorithm, split_chunk)
    n = b2.shape[1]
    acc = _acc_dtype(values.dtype)
    ones = jnp.ones((n,), acc)
    st = _Static(m, k, plan, None, impl)
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


def _csr_of(A, transpose: bool, conversion: str | None = None):
    """(indptr, indices, values, M, K) of A, or of Aᵀ: a BCOO's index columns swapped (one sort), a BCSR's or
    scipy matrix's CSR transposed (one sort)."""
    from jax.experimental import sparse as jsparse

    if transpose and isinstance(A, jsparse.BCOO) and _is_plain_2d(A):
        A = jsparse.BCOO((A.data, A.indices[:, ::-1]), shape=A.shape[::-1])
        transpose = False
    indptr, indices, values, m, k, _ = _as_csr(A, conversion)
    if not transpose:
        return indptr, indices, values, m, k
    indptr = _sanitize_indptr(indptr, int(indices.shape[0]))
    indptr_t, indices_t, values_t = _transpose_csr(indptr, indices, values, m, k)
    return indptr_t, indices_t, values_t, k, m


def to_csr(A):
    """A as a ``jax.experimental.sparse.BCSR`` (2-D, int32 indices): the conversion ``matmul`` makes on every call
    for a BCOO or scipy matrix, made once so a loop can reuse it. A BCOO with ``indices_sorted`` converts with a
    binary search over its rows; any other BCOO is sorted once by (row, col). Padding (any index outside the
    matrix after JAX's wrapping of [-dim, -1]) lies past ``indptr[M]`` or has column K, so it contributes
    nothing, in jax_ops and in JAX. Traceable (works under jit)."""
    from jax.experimental import sparse as jsparse

    if isinstance(A, CSRPair):
        return _pair_as_bcsr(A)
    if isinstance(A, jsparse.BCSR):
        _as_csr(A)  # the same checks
        return A
    indptr, indices, values, m, k, _ = _as_csr(A)
    return jsparse.BCSR((values, indices, indptr), shape=(m, k))


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
        build checks the column indices cuSPARSE needs); None uses the row profile of a CSRPair built outside jit,
        and otherwise (BCSR, BCOO, scipy, a traced pair) the profile-free plan: split whenever a row can be
        longer than a split chunk, whose cost is bounded for any row lengths.
      split_chunk: nnz per work unit of the split algorithm.
      implementation: None (the kernel: on the CPU its twin, faster there than the reference), "ffi" (the kernel)
        or "xla" (the jnp reference).
    """
    dispatch.check_implementation(implementation)
    if algorithm is not None and algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS} or None, got {algorithm!r}")
    if _is_sparse(A):
        return _matmul_sparse_dense(
            A, B, algorithm=algorithm, split_chunk=split_chunk, implementation=implementation, name="B"
        )
    if _is_sparse(B):
        _checks.check_array("A", A)
        if A.ndim not in (1, 2):
            raise ValueError(f"the dense operand A must have rank 1 or 2, got shape {tuple(A.shape)}")
        if A.shape[-1] != B.shape[0]:
            raise ValueError(f"A has shape {tuple(A.shape)} but the sparse B has {B.shape[0]} rows")
        # B @ A = (Aᵀ Bᵀ)ᵀ: the pair's CSR(Aᵀ), or a transpose sorted here
        out = _matmul_sparse_dense(
            B, A.T, algorithm=algorithm, split_chunk=split_chunk, implementation=implementation, name="A",
            transpose=True,
        )  # fmt: skip
        return out.T
    raise TypeError(f"matmul needs one sparse operand, got {type(A).__name__} and {type(B).__name__}")


def _checked_matmul(A, v, name: str, ndim: int, what: str, other: str, **kw) -> jax.Array:
    """matmul(A, v) after checking that v has rank `ndim` (spmv: 1, spmm: 2); the error names `other`."""
    _checks.check_array(name, v)
    if v.ndim != ndim:
        raise ValueError(f"{name} must be {what}, got shape {tuple(v.shape)} (use {other})")
    return matmul(A, v, **kw)


def spmv(
    A, x, *, algorithm: str | None = None, split_chunk: int | None = None, implementation: str | None = None
) -> jax.Array:
    """``A @ x`` for x ``[K]`` (see :func:`matmul`)."""
    kw = dict(algorithm=algorithm, split_chunk=split_chunk, implementation=implementation)
    return _checked_matmul(A, x, "x", 1, "a vector [K]", "spmm for matrices", **kw)


def spmm(
    A, B, *, algorithm: str | None = None, split_chunk: int | None = None, implementation: str | None = None
) -> jax.Array:
    """``A @ B`` for B ``[K, N]`` (see :func:`matmul`)."""
    kw = dict(algorithm=algorithm, split_chunk=split_chunk, implementation=implementation)
    return _checked_matmul(A, B, "B", 2, "a matrix [K, N]", "spmv for vectors", **kw)


def profile_of(A) -> RowProfile:
    """Row profile of a concrete matrix (host-side)."""
    indptr, _, _, _, _, _ = _as_csr(A)
    return RowProfile.from_indptr(np.asarray(indptr))
