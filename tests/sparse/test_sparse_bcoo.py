"""BCOO input on the CPU twin: JAX's index semantics (negative indices wrap numpy-style, anything else outside
the matrix is padding), duplicates, the sort-free conversion of a BCOO with ``indices_sorted`` (and the cost model
it promises: no sort in the graph), ``to_csr``, dense @ BCOO, gradients; and CSRPair's ``u @ pair`` and repr."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from csr_helpers import ffi_matmul, ffi_pair
from helpers import rel_err
from jax.experimental import sparse as jsparse

from jax_ops import sparse

M, K = 7, 5
# (row, col) pairs: in range, duplicates, negative in [-dim, -1] (wrap), below -dim / at or past dim (padding)
ROWS = np.array([3, 0, 3, 6, 0, 3, -1, -7, -8, 7, 2, 2, -2, 4, 1])
COLS = np.array([1, 4, 1, 0, 2, 1, 2, 0, 3, 0, -1, -6, -5, 5, 3])


def _reference(rows, cols, vals, m, k):
    """float64 dense matrix under JAX's BCOO semantics, built by hand (independent of both libraries)."""
    d = np.zeros((m, k))
    for r, c, v in zip(rows, cols, vals):
        r = r + m if -m <= r < 0 else r
        c = c + k if -k <= c < 0 else c
        if 0 <= r < m and 0 <= c < k:
            d[r, c] += v
    return d


def _bcoo(kind, seed=0):
    """(BCOO, float64 dense reference) of the ROWS/COLS entries: "unsorted" (shuffled, no flag), "sorted" (JAX's
    sort_indices: negative rows first, flag set), "sorted_nonneg" (sorted, flagged, no negative row)."""
    rng = np.random.default_rng(seed)
    rows, cols = ROWS, COLS
    if kind == "sorted_nonneg":
        keep = rows >= 0
        rows, cols = rows[keep], cols[keep]
    perm = rng.permutation(rows.size)
    rows, cols = rows[perm], cols[perm]
    vals = rng.standard_normal(rows.size).astype(np.float32)
    idx = jnp.asarray(np.stack([rows, cols], 1), jnp.int32)
    A = jsparse.BCOO((jnp.asarray(vals), idx), shape=(M, K))
    if kind != "unsorted":
        A = A.sort_indices()
        assert A.indices_sorted
    return A, _reference(rows, cols, vals.astype(np.float64), M, K)


KINDS = ["unsorted", "sorted", "sorted_nonneg"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("n", [None, 3])
def test_bcoo_follows_jax_semantics(kind, jit, n):
    A, ref = _bcoo(kind)
    # JAX itself agrees with the hand-built reference
    np.testing.assert_allclose(np.asarray(A.todense()), ref, rtol=1e-6)
    x = jnp.asarray(np.random.default_rng(1).standard_normal((K,) if n is None else (K, n)), jnp.float32)
    f = jax.jit(ffi_matmul) if jit else ffi_matmul
    out = f(A, x)
    assert out.shape == ((M,) if n is None else (M, n))
    assert rel_err(out, ref @ np.asarray(x, np.float64)) < 1e-6
    assert rel_err(out, A @ x) < 1e-6
    u = jnp.asarray(np.random.default_rng(2).standard_normal((M,) if n is None else (n, M)), jnp.float32)
    left = (jax.jit(ffi_matmul) if jit else ffi_matmul)(u, A)
    assert rel_err(left, np.asarray(u, np.float64) @ ref) < 1e-6
    pair = ffi_pair(A)
    assert rel_err(pair.matvec(x) if n is None else pair.matmat(x), ref @ np.asarray(x, np.float64)) < 1e-6
    assert rel_err(u @ pair, np.asarray(u, np.float64) @ ref) < 1e-6


@pytest.mark.parametrize("kind", KINDS)
def test_bcoo_grads_match_jax(kind, x64):
    A, _ = _bcoo(kind)
    data = A.data.astype(jnp.float64)
    x = jnp.asarray(np.random.default_rng(3).standard_normal((K, 2)))

    def ours(v, x):
        B = jsparse.BCOO((v, A.indices), shape=A.shape, indices_sorted=A.indices_sorted)
        return jnp.sum(jnp.sin(ffi_matmul(B, x)))

    def theirs(v, x):
        B = jsparse.BCOO((v, A.indices), shape=A.shape, indices_sorted=A.indices_sorted)
        return jnp.sum(jnp.sin(B @ x))

    for jit in (False, True):
        g = jax.jit(jax.grad(ours, (0, 1))) if jit else jax.grad(ours, (0, 1))
        for got, want in zip(g(data, x), jax.grad(theirs, (0, 1))(data, x)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def _primitives(f, *args) -> set[str]:
    """Names of every primitive in f's jaxpr, nested jaxprs included."""
    names = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            names.add(eqn.primitive.name)
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(f)(*args).jaxpr)
    return names


def test_sorted_bcoo_converts_without_a_sort():
    A, ref = _bcoo("sorted_nonneg")
    x = jnp.ones((K,), jnp.float32)
    # concrete and flagged: the rows are counted, no sort at all (outside jit the first row is read on the host)
    assert "sort" not in _primitives(
        lambda d, x: ffi_matmul(jsparse.BCOO((d, A.indices), shape=A.shape, indices_sorted=True), x),
        A.data,
        x,
    )
    # traced and flagged: the count, and the sort only in the branch a negative first row takes
    traced = _primitives(ffi_matmul, A, x)
    assert "cond" in traced
    unflagged = jsparse.BCOO((A.data, A.indices), shape=A.shape)
    plain = _primitives(ffi_matmul, unflagged, x)
    assert "sort" in plain and "cond" not in plain
    # a flagged BCOO whose first row is negative takes the sort (and is still right), inside and outside jit
    S, ref_s = _bcoo("sorted")
    assert int(S.indices[0, 0]) < 0
    for f in (ffi_matmul, jax.jit(ffi_matmul)):
        assert rel_err(f(S, x), ref_s @ np.ones(K)) < 1e-6


@pytest.mark.parametrize("kind", KINDS)
def test_to_csr(kind):
    A, ref = _bcoo(kind)
    for C in (sparse.to_csr(A), jax.jit(sparse.to_csr)(A)):
        assert isinstance(C, jsparse.BCSR) and C.shape == (M, K)
        np.testing.assert_allclose(np.asarray(C.todense()), ref, rtol=1e-6)  # JAX reads it the same way
        x = jnp.asarray(np.random.default_rng(4).standard_normal((K,)), jnp.float32)
        assert rel_err(ffi_matmul(C, x), ref @ np.asarray(x, np.float64)) < 1e-6
    B = sparse.to_csr(A)
    assert sparse.to_csr(B) is B
    assert "sort" not in _primitives(ffi_matmul, B, jnp.ones((K,), jnp.float32))


def test_false_sorted_flag_stays_finite():
    # a BCOO that claims indices_sorted but is not: wrong sums (as in JAX), but finite and nothing out of bounds
    A, _ = _bcoo("unsorted")
    liar = jsparse.BCOO((A.data, A.indices), shape=A.shape, indices_sorted=True)
    out = ffi_matmul(liar, jnp.ones((K, 2), jnp.float32))
    assert out.shape == (M, 2) and np.all(np.isfinite(np.asarray(out)))


def test_pair_rmatmul_and_repr():
    A, ref = _bcoo("sorted_nonneg")
    pair = ffi_pair(A)
    u = np.random.default_rng(5).standard_normal(M).astype(np.float32)
    U = np.random.default_rng(6).standard_normal((4, M)).astype(np.float32)
    for lhs in (u, jnp.asarray(u), U, jnp.asarray(U)):
        out = lhs @ pair
        assert out.shape == lhs.shape[:-1] + (K,)
        assert rel_err(out, np.asarray(lhs, np.float64) @ ref) < 1e-6
    assert rel_err(jax.jit(lambda p, u: u @ p)(pair, jnp.asarray(u)), u.astype(np.float64) @ ref) < 1e-6
    with pytest.raises(ValueError, match="u has shape"):
        jnp.ones((K,), jnp.float32) @ pair
    text = repr(pair)
    assert text.startswith("CSRPair(shape=(7, 5), nnz=") and "dtype=float32" in text
    assert f"plan={pair.plan.algorithm}" in text and f"plan_t={pair.plan_t.algorithm}" in text
    assert "Array" not in text and "[" not in text.split("forms=")[0] and len(text) < 200
