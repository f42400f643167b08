"""The profile-free dispatch on the CPU twin: a plain BCSR/BCOO/scipy matrix, a CSRPair built under jit and the
transpose a backward pass builds have no row profile, so they take the split plan whenever a row can be longer
than a split chunk: its cost is bounded on any row-length distribution (a 33k-entry row is cut into chunks, not
walked by one group of lanes). Checked on a power-law matrix with a row over 32k entries, empty rows and a
single dense row, through every entry point and BCOO form, inside and outside jit, against float64."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from csr_helpers import ffi_matmul, ffi_pair
from helpers import rel_err
from jax.experimental import sparse as jsparse

from jax_ops import sparse
from jax_ops._ffi import constants

M, K = 3000, 33_500
LONG = 33_000  # > 32k entries in one row


def _power_law(seed=0):
    """float64 CSR: Pareto row lengths (many empty), row 17 with LONG entries, row 29 dense (all K)."""
    rng = np.random.default_rng(seed)
    lens = np.minimum((rng.pareto(1.1, M) * 2).astype(np.int64), 2000)
    lens[::5] = 0  # empty rows
    lens[17], lens[29] = LONG, K
    cols = [np.sort(rng.choice(K, size=n, replace=False)) for n in lens]
    indptr = np.concatenate([[0], np.cumsum(lens)])
    a = sp.csr_matrix((rng.standard_normal(int(indptr[-1])), np.concatenate(cols), indptr), shape=(M, K))
    assert a.getnnz(axis=1).max() == K and (a.getnnz(axis=1) == 0).sum() >= M // 5
    return a


def _ffi_algorithms(f, *args) -> list[str]:
    """The algorithm attribute of every csr_spmm call in f's jaxpr (nested jaxprs included), by name."""
    names = {
        int(v): k[len("sparse_algorithm_") :]
        for k, v in constants().items()
        if k.startswith("sparse_algorithm_")
    }
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.params.get("target_name") == "jax_ops_sparse_csr_spmm":
                found.append(names[int(dict(eqn.params["attributes"])["algorithm"])])
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(f)(*args).jaxpr)
    return found


def _bcoo_padded(a, seed=0, sort=False):
    """BCOO of a with duplicates (an entry split in two halves) and padding (indices past the matrix, below
    -dim), shuffled unless ``sort`` (then JAX's sort_indices, flag set)."""
    rng = np.random.default_rng(seed)
    coo = a.tocoo()
    rows, cols, vals = coo.row.astype(np.int64), coo.col.astype(np.int64), coo.data.copy()
    dup = rng.choice(vals.size, 50, replace=False)
    vals[dup] *= 0.5
    rows = np.concatenate([rows, rows[dup], [M, 3, -M - 1, M + 7]])
    cols = np.concatenate([cols, cols[dup], [0, K, 5, -K - 2]])
    vals = np.concatenate([vals, vals[dup], [1.0, 2.0, 3.0, 4.0]])
    perm = rng.permutation(vals.size)
    idx = jnp.asarray(np.stack([rows[perm], cols[perm]], 1), jnp.int32)
    A = jsparse.BCOO((jnp.asarray(vals[perm], jnp.float32), idx), shape=(M, K))
    return A.sort_indices() if sort else A


@pytest.fixture(scope="module")
def problem():
    a = _power_law()
    a32 = a.astype(np.float32)
    ref = a32.astype(np.float64).toarray()
    x = jnp.asarray(np.random.default_rng(1).standard_normal(K), jnp.float32)
    u = jnp.asarray(np.random.default_rng(2).standard_normal(M), jnp.float32)
    return a32, ref, x, u


ENTRIES = ["bcsr", "bcoo", "bcoo_sorted", "scipy"]


def _operand(entry, a32):
    if entry == "bcsr":
        return jsparse.BCSR.from_scipy_sparse(a32)
    if entry == "bcoo":
        return _bcoo_padded(a32)
    if entry == "bcoo_sorted":
        return _bcoo_padded(a32, sort=True)
    return a32


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("jit", [False, True])
def test_plain_products_take_split(problem, entry, jit):
    a32, ref, x, u = problem
    A = _operand(entry, a32)
    x64, u64 = np.asarray(x, np.float64), np.asarray(u, np.float64)
    X = jnp.stack([x, -2 * x, x + 1], 1)
    if entry == "scipy" and jit:
        run = lambda f, *args: jax.jit(lambda *t: f(A, *t))(*args)  # noqa: E731  (scipy is not a pytree)
    else:
        run = (lambda f, *args: jax.jit(f)(A, *args)) if jit else (lambda f, *args: f(A, *args))  # noqa: E731
    assert rel_err(run(ffi_matmul, x), ref @ x64) < 1e-5
    assert rel_err(run(ffi_matmul, X), ref @ np.asarray(X, np.float64)) < 1e-5
    assert rel_err(run(lambda A, u: ffi_matmul(u, A), u), u64 @ ref) < 1e-5
    if entry != "scipy":
        algs = _ffi_algorithms(ffi_matmul, A, x) + _ffi_algorithms(lambda A, u: ffi_matmul(u, A), A, u)
        assert algs and set(algs) == {"split"}, algs


def test_traced_pair_and_backward_transpose_take_split(problem):
    a32, ref, x, u = problem
    A = jsparse.BCSR.from_scipy_sparse(a32)

    def traced(A, x, u):
        pair = ffi_pair(A)
        assert pair.plan.algorithm == "split" and pair.plan_t.algorithm == "split"  # no profile under jit
        return pair.matvec(x), pair.rmatvec(u)

    ax, atu = jax.jit(traced)(A, x, u)
    assert rel_err(ax, ref @ np.asarray(x, np.float64)) < 1e-5
    assert rel_err(atu, ref.T @ np.asarray(u, np.float64)) < 1e-5
    # d/dx of sum(u * (A x)) = Aᵀ u: the transpose sorted in the backward pass, planned without a profile
    g = jax.jit(jax.grad(lambda x: jnp.sum(u * ffi_matmul(A, x))))(x)
    assert rel_err(g, ref.T @ np.asarray(u, np.float64)) < 1e-5
    assert set(_ffi_algorithms(jax.grad(lambda x: jnp.sum(u * ffi_matmul(A, x))), x)) == {"split"}


def test_profiled_pair_keeps_its_plans(problem):
    a32, ref, x, _ = problem
    pair = ffi_pair(a32)  # outside jit: the host profile picks (split's rows -> cusparse for f32)
    assert pair.plan.algorithm == "cusparse" and pair.profile.max == K
    assert rel_err(pair.matvec(x), ref @ np.asarray(x, np.float64)) < 1e-5
    uniform = sp.random(2000, 2000, density=0.01, format="csr", dtype=np.float32, random_state=3)
    assert ffi_pair(uniform).plan.algorithm == "vector"
    # the same uniform matrix without a profile: split, with vector's lanes per row for its short rows
    algs = _ffi_algorithms(ffi_matmul, jsparse.BCSR.from_scipy_sparse(uniform), jnp.ones(2000, jnp.float32))
    assert algs == ["split"]
    assert sparse.choose_algorithm(None, 2000, uniform.nnz) == "split"
    assert sparse.choose_algorithm(None, 10, 200) == "vector"  # no row can exceed a chunk


def test_invalid_bcsr_default_plan_is_in_bounds():
    # a raw BCSR with a decreasing / out-of-range indptr and bad columns: the default (split) first makes indptr
    # monotone (running maximum of the clamped indptr), and every output is written
    rng = np.random.default_rng(4)
    nnz = 1000
    indptr = np.array([0, 600, 300, 900, 2000, 2000, -5, 1000], np.int32)
    cols = rng.integers(-3, 12, nnz).astype(np.int32)
    vals = rng.standard_normal(nnz).astype(np.float32)
    A = jsparse.BCSR((jnp.asarray(vals), jnp.asarray(cols), jnp.asarray(indptr)), shape=(7, 10))
    x = jnp.asarray(rng.standard_normal(10), jnp.float32)
    mono = np.maximum.accumulate(np.clip(indptr, 0, nnz))
    want = np.zeros(7)
    for r in range(7):
        for p in range(mono[r], mono[r + 1]):
            if 0 <= cols[p] < 10:
                want[r] += float(vals[p]) * float(x[cols[p]])
    for f in (ffi_matmul, jax.jit(ffi_matmul)):
        out = f(A, x)
        assert _ffi_algorithms(ffi_matmul, A, x) == ["split"]
        np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
