"""The sparse case suite shared by the backends' test files (CPU twin "ffi", XLA reference "xla", CUDA).

A case is a matrix generator (float64 scipy CSR, values rounded to the case's dtype before use), a column count
N (None: a vector operand), a dtype, an entry point and, for the CSRPair products, an alpha/beta/y epilogue.
Every product is checked against float64 NumPy on the rounded inputs with helpers.rel_err < helpers.tol(dtype).
A backend's file builds its operands on its device and calls :func:`run_entry` / :func:`run_epilogue`.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp
from jax.experimental import sparse as jsparse

from jax_ops import sparse

DTYPES = [np.float32, np.float64, np.float16, jnp.bfloat16]  # every dtype the CPU twin supports
NS = [None, 1, 5]  # a vector, a one-column matrix, an odd column count


def _random(m, k, density, seed):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, random_state=rng, format="csr", dtype=np.float64)
    a.data = rng.standard_normal(a.nnz)
    return a


def _from_lengths(lens, k, seed):
    """CSR with row r holding lens[r] distinct sorted random columns of k."""
    rng = np.random.default_rng(seed)
    lens = np.minimum(np.asarray(lens, np.int64), k)
    cols = [np.sort(rng.choice(k, size=n, replace=False)) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(lens)])
    idx = np.concatenate(cols).astype(np.int32) if len(cols) else np.zeros(0, np.int32)
    return sp.csr_matrix((rng.standard_normal(int(indptr[-1])), idx, indptr), shape=(len(lens), k))


def _ragged(seed):
    """Power-law row lengths (0 to all of K) with empty rows and one full row: split/warp territory."""
    rng = np.random.default_rng(seed)
    lens = np.minimum((rng.pareto(1.2, 97) * 3).astype(np.int64), 61)
    lens[::7] = 0
    lens[40] = 61
    return _from_lengths(lens, 61, seed)


def _empty_rows(seed):
    """Most rows (and, for Aᵀ, most columns) empty."""
    a = _random(45, 38, 0.1, seed).tolil()
    a[::2, :] = 0
    a[:, 1::3] = 0
    a = a.tocsr()
    a.eliminate_zeros()
    return a


def _one_long_row(seed):
    """One row holds every nnz (the other rows and Aᵀ's rows are short or empty)."""
    lens = np.zeros(30, np.int64)
    lens[11] = 40
    return _from_lengths(lens, 40, seed)


# name -> generator(seed) of a float64 scipy CSR with sorted indices
MATRICES = {
    "random70x50": lambda s: _random(70, 50, 0.1, s),
    "ragged97x61": _ragged,
    "empty_rows45x38": _empty_rows,
    "one_long_row30x40": _one_long_row,
    "dense_rows4x300": lambda s: _random(4, 300, 1.0, s),
    "tall257x3": lambda s: _random(257, 3, 0.5, s),
    "1x1": lambda s: sp.csr_matrix(np.array([[2.5]])),
    "1x9": lambda s: _random(1, 9, 0.6, s),
    "9x1": lambda s: _random(9, 1, 0.6, s),
    "nnz0_5x4": lambda s: sp.csr_matrix((5, 4), dtype=np.float64),
    "0x4": lambda s: sp.csr_matrix((0, 4), dtype=np.float64),
    "3x0": lambda s: sp.csr_matrix((3, 0), dtype=np.float64),
}

# The entry points of one product check:
#   bcsr, bcoo, scipy: sparse.matmul(A, B) on a BCSR / a shuffled (unsorted) BCOO / the scipy matrix
#   spmv_spmm:        sparse.spmv(A, x) for N = None, sparse.spmm(A, B) otherwise, on the BCSR
#   jit_bcsr:         jax.jit(sparse.matmul)(A, B) on the BCSR (traced: no host profile)
#   jit_bcoo_sorted:  jax.jit(sparse.matmul)(A, B) on a BCOO with indices_sorted (traced: rows counted, no sort)
#   pair, pair_t:     CSRPair matvec/matmat and rmatvec/rmatmat
#   pair_T:           CSRPair.T.matvec/matmat (Aᵀ B through the swapped pair)
#   left:             sparse.matmul(U, A) for dense U [M] / [N, M]
ENTRIES = [
    "bcsr",
    "bcoo",
    "scipy",
    "spmv_spmm",
    "jit_bcsr",
    "jit_bcoo_sorted",
    "pair",
    "pair_t",
    "pair_T",
    "left",
]

# alpha/beta/y epilogues of the CSRPair products: (alpha, beta, with y); "col" = a per-column [N] array
# (scalars exact in every dtype, so the float64 reference uses the kernels' coefficients)
EPILOGUES = {
    "alpha": (0.75, None, False),
    "y": (None, None, True),
    "beta_y": (None, -0.625, True),
    "alpha_beta_y": (-1.5, 2.0, True),
    "percol": ("col", "col", True),
}


F32, F64, F16, BF16 = np.float32, np.float64, np.float16, jnp.bfloat16
_ODD = ["dense_rows4x300", "tall257x3", "1x1", "1x9", "9x1", "nnz0_5x4", "0x4", "3x0"]
_KERNELS = [
    "random70x50",
    "ragged97x61",
    "empty_rows45x38",
    "one_long_row30x40",
]  # vector/split/warp, empty rows

# The product cases (matrix, dtype, N): a chosen cover, not the full product (each case costs compiles):
#   every matrix in float32 as a vector and as N = 5; N = 1 (the blocks/slabs path) where rows differ;
#   the other dtypes on a ragged and an empty-row matrix plus one odd size, as a vector and as N = 5.
CASES = (
    [(m, F32, n) for m in _KERNELS + _ODD for n in (None, 5)]
    + [(m, F32, 1) for m in _KERNELS]
    + [(m, d, n) for d in (F64, F16, BF16) for m in ["ragged97x61", "empty_rows45x38", "1x9"]
       for n in (None, 5)]
)  # fmt: skip

# The epilogue cases: every dtype on one matrix, and float32 on ragged / empty-row / nnz = 0 matrices.
EPILOGUE_CASES = (
    [("random70x50", d, n) for d in DTYPES for n in (None, 5)]
    + [("ragged97x61", F32, None), ("ragged97x61", F32, 5), ("empty_rows45x38", F32, 1), ("nnz0_5x4", F32, 5)]
)  # fmt: skip


def case_id(case) -> str:
    name, dtype, n = case
    return f"{name}-{dtype_id(dtype)}-{n_id(n)}"


def dtype_id(dtype) -> str:
    return np.dtype(dtype).name


def n_id(n) -> str:
    return "vec" if n is None else f"N{n}"


def x64_for(dtype):
    """The context a dtype's case runs in: float64 needs jax_enable_x64."""
    return jax.enable_x64(True) if np.dtype(dtype) == np.float64 else contextlib.nullcontext()


def rounded64(x) -> np.ndarray:
    """float64 copy of what a jax array holds (after rounding to its dtype)."""
    x = jnp.asarray(x)
    return np.asarray(x.astype(jnp.float32) if x.dtype != jnp.float64 else x, np.float64)


def matrix(name: str, dtype, seed: int = 0):
    """(scipy CSR with values in dtype, or float32 for half types; float64 dense reference of those values)."""
    a = MATRICES[name](seed).tocsr()
    a.sort_indices()
    vals = rounded64(jnp.asarray(a.data, dtype))
    ref = sp.csr_matrix((vals, a.indices, a.indptr), shape=a.shape).toarray()
    store = np.float64 if np.dtype(dtype) == np.float64 else np.float32
    return sp.csr_matrix((vals.astype(store), a.indices, a.indptr), shape=a.shape), ref


def bcsr(a, dtype, device=None):
    """BCSR of a scipy matrix with values in dtype and int32 indices (on ``device`` if given)."""
    arrs = (jnp.asarray(a.data, dtype), jnp.asarray(a.indices, jnp.int32), jnp.asarray(a.indptr, jnp.int32))
    if device is not None:
        arrs = jax.device_put(arrs, device)
    return jsparse.BCSR(arrs, shape=a.shape)


def bcoo(a, dtype, seed=0, device=None, sorted_=False):
    """BCOO of a scipy matrix with its entries in a random order (unsorted, no duplicates), or in (row, col)
    order with ``indices_sorted`` set (``sorted_``)."""
    coo = a.tocoo()
    perm = np.lexsort((coo.col, coo.row)) if sorted_ else np.random.default_rng(seed).permutation(coo.nnz)
    idx = np.stack([coo.row[perm], coo.col[perm]], 1).astype(np.int32).reshape(-1, 2)
    arrs = (jnp.asarray(coo.data[perm], dtype), jnp.asarray(idx))
    if device is not None:
        arrs = jax.device_put(arrs, device)
    return jsparse.BCOO(arrs, shape=a.shape, indices_sorted=sorted_)


def dense(shape, dtype, seed=1, device=None):
    """(a random jax array in dtype, its float64 copy)."""
    x = jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)
    if device is not None:
        x = jax.device_put(x, device)
    return x, rounded64(x)


def run_entry(entry: str, a, ref, n, dtype, implementation: str, device=None):
    """(out, float64 expected) of one entry point of ``a`` (scipy, values in dtype) times a dense operand."""
    m, k = a.shape
    kw = dict(implementation=implementation)
    A = bcsr(a, dtype, device)
    transposed = entry in ("pair_t", "pair_T", "left")
    rows = m if transposed else k
    b, b64 = dense((rows,) if n is None else (rows, n), dtype, device=device)
    if entry == "bcsr":
        return sparse.matmul(A, b, **kw), ref @ b64
    if entry == "bcoo":
        return sparse.matmul(bcoo(a, dtype, device=device), b, **kw), ref @ b64
    if entry == "scipy":  # (f32/f64 only: see entries_for)
        return sparse.matmul(a.astype(np.dtype(dtype)), b, **kw), ref @ b64
    if entry == "spmv_spmm":
        f = sparse.spmv if n is None else sparse.spmm
        return f(A, b, **kw), ref @ b64
    if entry == "jit_bcsr":
        return jax.jit(lambda A, b: sparse.matmul(A, b, **kw))(A, b), ref @ b64
    if entry == "jit_bcoo_sorted":
        S = bcoo(a, dtype, device=device, sorted_=True)
        return jax.jit(lambda A, b: sparse.matmul(A, b, **kw))(S, b), ref @ b64
    pair = sparse.csr_pair(A, **kw)
    if entry == "pair":
        return (pair.matvec(b) if n is None else pair.matmat(b)), ref @ b64
    if entry == "pair_t":
        return (pair.rmatvec(b) if n is None else pair.rmatmat(b)), ref.T @ b64
    if entry == "pair_T":
        return (pair.T.matvec(b) if n is None else pair.T.matmat(b)), ref.T @ b64
    if entry == "left":
        u = b if n is None else b.T  # [M] or [N, M]
        return sparse.matmul(u, A, **kw), (b64 if n is None else b64.T) @ ref
    raise ValueError(entry)


def entries_for(dtype, implementation: str = "ffi") -> list[str]:
    """The entry points of a case: "scipy" for f32/f64 (what scipy.sparse holds), "jit_bcsr" and "jit_bcoo_sorted"
    for float32 (the traced plan and the conversion do not depend on the dtype); on "xla" (whose every new nnz and
    shape costs compiles) none of those nor "bcoo" (the same jnp product as "bcsr" after the BCOO -> CSR
    conversion, which "ffi" checks)."""
    d = np.dtype(dtype)
    traced = {"jit_bcsr", "jit_bcoo_sorted"}
    skip = traced | {"bcoo"} if implementation == "xla" else set() if d == np.float32 else traced
    return [e for e in ENTRIES if e not in skip and (e != "scipy" or d.itemsize >= 4)]


def expected_shape(entry, a, n):
    m, k = a.shape
    out_rows = k if entry in ("pair_t", "pair_T", "left") else m
    if n is None:
        return (out_rows,)
    return (n, out_rows) if entry == "left" else (out_rows, n)


def run_epilogue(epilogue: str, transpose: bool, a, ref, n, dtype, implementation: str, device=None):
    """(out, float64 expected) of ``alpha * (op(A) @ B) + beta * y`` on a CSRPair (op = Aᵀ when transpose)."""
    alpha, beta, with_y = EPILOGUES[epilogue]
    m, k = a.shape
    op = ref.T if transpose else ref
    rows, out_rows = (m, k) if transpose else (k, m)
    shape = lambda r: (r,) if n is None else (r, n)  # noqa: E731
    b, b64 = dense(shape(rows), dtype, device=device)
    y, y64 = dense(shape(out_rows), dtype, seed=3, device=device) if with_y else (None, 0.0)
    cols = 1 if n is None else n
    if alpha == "col":  # per-column coefficients (exact in f32), including 0 and 1
        alpha = jnp.asarray(np.linspace(-1.0, 2.0, cols), jnp.float32)
        beta = jnp.asarray(np.linspace(1.0, -0.5, cols) if cols > 1 else [0.0], jnp.float32)
        if n is None:
            alpha, beta = alpha[0], beta[0]
    a64 = 1.0 if alpha is None else np.asarray(alpha, np.float64)
    be64 = 1.0 if beta is None else np.asarray(beta, np.float64)
    pair = sparse.csr_pair(bcsr(a, dtype, device), implementation=implementation)
    f = (
        (pair.rmatvec if n is None else pair.rmatmat)
        if transpose
        else (pair.matvec if n is None else pair.matmat)
    )
    out = f(b, alpha=alpha, beta=beta, y=y)
    return out, a64 * (op @ b64) + be64 * y64
