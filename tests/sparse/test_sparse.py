"""jax_ops.sparse on the CPU twin: BCSR/BCOO/CSRPair products vs float64 NumPy, every dispatch path, invalid
input semantics, grads, vmap, shard_map."""

import jax
import jax.numpy as jnp
import jax.test_util  # noqa: F401  (check_grads)
import numpy as np
import pytest
import scipy.sparse as sp
from csr_helpers import bcsr as _bcsr
from csr_helpers import ffi_matmul, ffi_pair, ffi_spmm, ffi_spmv
from helpers import rel_err as _rel
from jax.experimental import sparse as jsparse

from jax_ops import sparse
from jax_ops._src.sparse import formats as sformats
from jax_ops._src.sparse import plan as splan

TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-3, jnp.bfloat16: 1e-2}
DTYPES = [np.float32, np.float16, jnp.bfloat16]  # float64 runs in its own x64 tests


def _random_csr(m, k, density, dtype, seed=0, long_row=None):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, random_state=rng, format="csr", dtype=np.float64)
    a.data = rng.standard_normal(a.nnz)
    if long_row is not None and m and k:
        a = a.tolil()
        a[long_row, :] = rng.standard_normal(k)
        a = a.tocsr()
    a.sort_indices()
    a = a.astype(np.float32) if dtype != np.float64 else a
    return a


def _dense_of(bcsr):
    """float64 dense matrix of what the jax values are (after rounding to their dtype)."""
    data = (
        np.asarray(bcsr.data.astype(jnp.float32), np.float64)
        if bcsr.data.dtype != np.float64
        else np.asarray(bcsr.data)
    )
    return sp.csr_matrix(
        (data, np.asarray(bcsr.indices), np.asarray(bcsr.indptr)), shape=bcsr.shape
    ).toarray()


def _rand(shape, dtype, seed=1):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _f64(x):
    return np.asarray(jnp.asarray(x).astype(jnp.float32) if x.dtype != np.float64 else x, np.float64)


# ---------------------------------------------------------------------------------------------- products
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [None, 1, 3, 8, 33])
def test_bcsr_matches_reference(dtype, n):
    a = _random_csr(70, 50, 0.1, dtype)
    A = _bcsr(a, dtype)
    d = _dense_of(A)
    b = _rand((50,) if n is None else (50, n), dtype)
    out = jax.jit(ffi_matmul)(A, b)
    assert out.dtype == np.dtype(dtype) and out.shape == ((70,) if n is None else (70, n))
    assert _rel(out, d @ _f64(b)) < TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algorithm", sparse.ALGORITHMS)
@pytest.mark.parametrize("n", [None, 4, 16])
def test_pair_every_algorithm(dtype, algorithm, n):
    a = _random_csr(64, 48, 0.15, dtype, long_row=5)
    pair = ffi_pair(_bcsr(a, dtype), algorithm=algorithm, transpose_algorithm=algorithm, split_chunk=4)
    # the cusparse plan needs f32/f64 values (else it runs as split, documented)
    expect = "split" if algorithm == "cusparse" and np.dtype(dtype).itemsize < 4 else algorithm
    assert pair.plan.algorithm == expect and pair.plan_t.algorithm == expect
    if algorithm in ("split", "cusparse"):
        assert pair.plan.units > 0 and pair.long_rows.shape[0] > 0
    d = _dense_of(_bcsr(a, dtype))
    x = _rand((48,) if n is None else (48, n), dtype)
    u = _rand((64,) if n is None else (64, n), dtype, seed=2)
    fwd = pair.matvec(x) if n is None else pair.matmat(x)
    bwd = pair.rmatvec(u) if n is None else pair.rmatmat(u)
    assert _rel(fwd, d @ _f64(x)) < TOL[dtype]
    assert _rel(bwd, d.T @ _f64(u)) < TOL[dtype]


@pytest.mark.parametrize("algorithm", sparse.ALGORITHMS)
def test_float64_every_algorithm(x64, algorithm):
    a = _random_csr(60, 45, 0.2, np.float64, long_row=3)
    A = _bcsr(a, np.float64)
    d = a.toarray()
    for n in (None, 5):
        x = _rand((45,) if n is None else (45, n), np.float64)
        out = ffi_matmul(A, x, algorithm=algorithm, split_chunk=3)
        assert out.dtype == np.float64
        assert _rel(out, d @ np.asarray(x)) < 1e-12
    pair = ffi_pair(A, algorithm=algorithm, transpose_algorithm=algorithm, split_chunk=3)
    u = _rand((60,), np.float64)
    assert _rel(pair.rmatvec(u), d.T @ np.asarray(u)) < 1e-12


def test_cusparse_plan_rule():
    """The auto rule takes the cusparse plan where it would take split, only for f32/f64 values whose column
    indices are all in range (cuSPARSE reads every entry of a row); otherwise split. Results match either way."""
    m = 3000
    lens = np.ones(m, np.int64)
    lens[7] = 2999
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = np.concatenate([np.arange(n) for n in lens]).astype(np.int32)
    vals = np.linspace(-1.0, 1.0, indptr[-1])
    ref = sp.csr_matrix((vals, cols, indptr), shape=(m, m))
    x = _rand((m,), np.float32)
    for dtype, want in ((np.float32, "cusparse"), (np.float16, "split")):
        pair = ffi_pair(sp.csr_matrix((vals.astype(dtype), cols, indptr), shape=(m, m)))
        assert pair.plan.algorithm == want, dtype
        assert _rel(pair.matvec(x.astype(dtype)), ref @ np.asarray(x, np.float64)) < TOL[dtype]
    bad = cols.copy()
    bad[indptr[7] + 5] = m + 3  # an entry the kernels skip: cuSPARSE must not see this CSR
    A = jsparse.BCSR(
        (jnp.asarray(vals, jnp.float32), jnp.asarray(bad), jnp.asarray(indptr, jnp.int32)), shape=(m, m)
    )
    assert not sparse.cusparse_applicable(A.indptr, A.indices, m, np.float32)
    pair = ffi_pair(A)
    assert pair.plan.algorithm == "split"
    keep = np.ones(indptr[-1], bool)
    keep[indptr[7] + 5] = False
    ref_bad = sp.csr_matrix((vals * keep, cols, indptr), shape=(m, m))
    assert _rel(pair.matvec(x), ref_bad @ np.asarray(x, np.float64)) < 1e-5
    # forced on a raw BCSR (columns unchecked) it runs as split; under jit the build has no profile (split,
    # the profile-free plan: the columns cannot be checked there, so not cusparse)
    assert _rel(ffi_matmul(A, x, algorithm="cusparse"), ref_bad @ np.asarray(x, np.float64)) < 1e-5
    good = jsparse.BCSR(
        (jnp.asarray(vals, jnp.float32), jnp.asarray(cols), jnp.asarray(indptr, jnp.int32)), shape=(m, m)
    )
    plans = []

    def traced(A, x):
        pair = ffi_pair(A)
        plans.append(pair.plan.algorithm)
        return pair.matvec(x)

    assert _rel(jax.jit(traced)(good, x), ref @ np.asarray(x, np.float64)) < 1e-5
    assert plans == ["split"]
    # a padded BCOO stores its padding past indptr[M] (column 0, in range), and so does its transpose: not a
    # standard CSR, so split on both sides; results exclude the padding
    coo = ref.tocoo()
    pad = 7
    data = jnp.asarray(np.concatenate([coo.data, np.full(pad, 5.0)]), jnp.float32)
    idx = np.concatenate(
        [np.stack([coo.row, coo.col], 1), np.full((pad, 2), [m, 0])]  # row m: out of range, padding
    ).astype(np.int32)
    padded = ffi_pair(jsparse.BCOO((data, jnp.asarray(idx)), shape=(m, m)))
    assert padded.plan.algorithm == "split" and padded.nnz == coo.nnz + pad
    assert _rel(padded.matvec(x), ref @ np.asarray(x, np.float64)) < 1e-5
    assert _rel(padded.rmatvec(x), ref.T @ np.asarray(x, np.float64)) < 1e-5
    # N = 0 on the cusparse plan: an empty product (runs as split)
    pair = ffi_pair(good)
    assert pair.plan.algorithm == "cusparse"
    assert pair.matmat(jnp.zeros((m, 0), jnp.float32)).shape == (m, 0)


def test_profile_dispatch_rules():
    # short rows -> row-block "vector" (G from the average row length); power-law -> split; long rows -> warp
    short = ffi_pair(_bcsr(_random_csr(200, 200, 0.02, np.float32), np.float32))
    assert short.plan.algorithm == "vector" and short.plan.group == 1
    medium = ffi_pair(_bcsr(_random_csr(200, 400, 0.05, np.float32), np.float32))
    assert medium.plan.algorithm == "vector" and medium.plan.group == 4
    m = 3000
    lens = np.ones(m, np.int64)
    lens[7] = 2999
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = np.concatenate([np.arange(n) for n in lens])
    power = ffi_pair(sp.csr_matrix((np.ones(indptr[-1], np.float32), cols, indptr), shape=(m, m)))
    # split's rows; f32 with every column in range: its N = 1 products on cuSPARSE (the cusparse plan)
    assert power.plan.algorithm == "cusparse" and power.plan.units >= 3
    x = _rand((m,), np.float32)
    ref = sp.csr_matrix((np.ones(indptr[-1]), cols, indptr), shape=(m, m)) @ np.asarray(x, np.float64)
    assert _rel(power.matvec(x), ref) < 1e-5
    assert power.plan.chunk == sparse.DEFAULT_SPLIT_CHUNK and power.plan.group == 2
    dense_rows = ffi_pair(sp.csr_matrix(np.ones((4, 1024), np.float32)))
    assert dense_rows.plan.algorithm == "warp" and dense_rows.plan.group == 32


# -------------------------------------------------------------------------------------------- edge cases
@pytest.mark.parametrize("algorithm", [None, *sparse.ALGORITHMS])
def test_edge_shapes(algorithm):
    kw = dict(algorithm=algorithm, split_chunk=2)
    # empty rows
    a = sp.csr_matrix(np.array([[0, 0, 0], [1, 0, 2], [0, 0, 0], [0, 3, 0]], np.float32))
    x = _rand((3,), np.float32)
    assert _rel(ffi_matmul(_bcsr(a, np.float32), x, **kw), a.toarray() @ _f64(x)) < 1e-6
    # nnz = 0
    z = sp.csr_matrix((5, 4), dtype=np.float32)
    out = ffi_matmul(_bcsr(z, np.float32), _rand((4, 3), np.float32), **kw)
    assert out.shape == (5, 3) and np.all(np.asarray(out) == 0)
    # 1x1
    one = sp.csr_matrix(np.array([[2.5]], np.float32))
    assert float(ffi_matmul(_bcsr(one, np.float32), jnp.ones((1,)), **kw)[0]) == 2.5
    # one row holds all nnz
    r = _random_csr(30, 40, 0.0, np.float32, long_row=11)
    xr = _rand((40, 2), np.float32)
    assert _rel(ffi_matmul(_bcsr(r, np.float32), xr, **kw), r.toarray() @ _f64(xr)) < 1e-5
    pair = ffi_pair(_bcsr(r, np.float32), algorithm=algorithm, transpose_algorithm=algorithm, split_chunk=2)
    u = _rand((30,), np.float32)
    assert _rel(pair.rmatvec(u), r.toarray().T @ _f64(u)) < 1e-5


def test_empty_matrix():
    e = sp.csr_matrix((0, 4), dtype=np.float32)
    out = ffi_matmul(_bcsr(e, np.float32), jnp.ones((4,)))
    assert out.shape == (0,)
    e2 = sp.csr_matrix((3, 0), dtype=np.float32)
    out = ffi_matmul(_bcsr(e2, np.float32), jnp.ones((0, 2)))
    assert out.shape == (3, 2) and np.all(np.asarray(out) == 0)
    pair = ffi_pair(_bcsr(e2, np.float32))
    assert pair.rmatvec(jnp.ones((3,))).shape == (0,)


def test_invalid_bcsr_stays_in_bounds():
    # indptr not monotone, past nnz, negative; columns >= K and < 0: clamped/skipped, documented semantics.
    data = jnp.arange(1, 7, dtype=jnp.float32)
    indices = jnp.asarray([0, 9, 1, -3, 2, 1], jnp.int32)
    indptr = jnp.asarray([0, 3, 1, 6, 40], jnp.int32)
    A = jsparse.BCSR((data, indices, indptr), shape=(4, 3))
    x = jnp.asarray([1.0, 10.0, 100.0])
    # per-row clamping (raw BCSR): row0 [0,3) -> 1*x0 + 3*x1 (col 9 skipped); row1 [3,3) empty;
    # row2 [1,6) -> 3*x1 + 5*x2 + 6*x1 (cols 9, -3 skipped); row3 [6,6) empty
    raw = np.array([1 + 30, 0, 30 + 500 + 60, 0], np.float64)
    for alg in ("vector", "warp", "cta"):
        assert np.allclose(np.asarray(ffi_matmul(A, x, algorithm=alg)), raw)
    expect = np.array([1 + 30, 0, 500 + 60, 0], np.float64)
    # split / CSRPair: indptr made monotone first (running max of the clamped indptr) = [0, 3, 3, 6, 6]
    assert np.allclose(np.asarray(ffi_matmul(A, x, algorithm="split", split_chunk=1)), expect)
    pair = ffi_pair(A)
    assert np.allclose(np.asarray(pair.matvec(x)), expect)
    assert np.all(np.isfinite(np.asarray(pair.rmatvec(jnp.ones((4,))))))


def test_fused_axpby_and_per_column_coefficients():
    a = _random_csr(40, 30, 0.2, np.float32)
    pair = ffi_pair(_bcsr(a, np.float32))
    d = a.toarray().astype(np.float64)
    v, u = _rand((30,), np.float32), _rand((40,), np.float32, seed=3)
    alpha = jnp.float32(0.7)
    out = jax.jit(lambda p, v, u, al: p.matvec(v, beta=-al, y=u))(pair, v, u, alpha)
    assert _rel(out, d @ _f64(v) - 0.7 * _f64(u)) < 1e-5
    out = pair.matvec_axpby(v, u, beta=2.0, alpha=jnp.float32(-1.5))
    assert _rel(out, -1.5 * (d @ _f64(v)) + 2 * _f64(u)) < 1e-5
    B, Y = _rand((30, 4), np.float32), _rand((40, 4), np.float32)
    al, be = jnp.asarray([1.0, 2.0, 0.0, -1.0]), jnp.asarray([0.5, 0.0, 1.0, 3.0])
    out = pair.matmat(B, alpha=al, beta=be, y=Y)
    assert _rel(out, (d @ _f64(B)) * np.asarray(al) + _f64(Y) * np.asarray(be)) < 1e-5
    out = pair.rmatvec_axpby(u, v, beta=-0.25)
    assert _rel(out, d.T @ _f64(u) - 0.25 * _f64(v)) < 1e-5


def test_dense_times_sparse():
    a = _random_csr(20, 15, 0.3, np.float32)
    A = _bcsr(a, np.float32)
    d = a.toarray().astype(np.float64)
    u = _rand((20,), np.float32)
    assert _rel(ffi_matmul(u, A), _f64(u) @ d) < 1e-5
    U = _rand((3, 20), np.float32)
    assert _rel(ffi_matmul(U, ffi_pair(A)), _f64(U) @ d) < 1e-5
    assert _rel(ffi_pair(A).T.matvec(u), d.T @ _f64(u)) < 1e-5


def test_scipy_and_implementation_xla():
    a = _random_csr(25, 35, 0.2, np.float32)
    x = _rand((35, 2), np.float32)
    ref = a.toarray().astype(np.float64) @ _f64(x)
    assert _rel(sparse.matmul(a, x), ref) < 1e-5
    assert _rel(sparse.matmul(a, x, implementation="xla"), ref) < 1e-5
    pair = sparse.csr_pair(a, implementation="xla")
    assert _rel(pair.matmat(x), ref) < 1e-5


# ------------------------------------------------------------------------------------------------- grads
def _loss_sparse(values, x, A, algorithm=None):
    B = jsparse.BCSR((values, A.indices, A.indptr), shape=A.shape)
    return jnp.sum(jnp.sin(ffi_matmul(B, x, algorithm=algorithm, split_chunk=2)))


@pytest.mark.parametrize("algorithm", [None, "split"])
def test_grads_match_dense(x64, algorithm):
    a = _random_csr(12, 9, 0.3, np.float64, long_row=4)
    A = _bcsr(a, np.float64)
    rows, cols = np.repeat(np.arange(12), np.diff(a.indptr)), a.indices
    for shape in ((9,), (9, 3)):
        x = _rand(shape, np.float64)
        gv, gx = jax.grad(_loss_sparse, argnums=(0, 1))(A.data, x, A, algorithm)

        def dense_loss(vals, x):
            d = jnp.zeros((12, 9), jnp.float64).at[rows, cols].add(vals)
            return jnp.sum(jnp.sin(d @ x))

        rv, rx = jax.grad(dense_loss, argnums=(0, 1))(A.data, x)
        np.testing.assert_allclose(gv, rv, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(gx, rx, rtol=1e-10, atol=1e-12)
        jax.test_util.check_grads(
            lambda v, x: _loss_sparse(v, x, A, algorithm), (A.data, x), order=1, modes=("rev",)
        )


def test_pair_grads_and_axpby_grads(x64):
    a = _random_csr(10, 8, 0.4, np.float64)
    pair = ffi_pair(_bcsr(a, np.float64))
    v, u = _rand((8,), np.float64), _rand((10,), np.float64, seed=5)

    def f(v, u, al, be):
        return jnp.sum(pair.matvec(v, alpha=al, beta=be, y=u) ** 2) + jnp.sum(pair.rmatvec(u) ** 3)

    args = (v, u, jnp.float64(0.3), jnp.float64(-1.2))
    jax.test_util.check_grads(f, args, order=1, modes=("rev",))
    d = jnp.asarray(a.toarray())

    def fd(v, u, al, be):
        return jnp.sum((al * (d @ v) + be * u) ** 2) + jnp.sum((d.T @ u) ** 3)

    for g, r in zip(jax.grad(f, argnums=(0, 1, 2, 3))(*args), jax.grad(fd, argnums=(0, 1, 2, 3))(*args)):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    # gradient w.r.t. the pair's values (the leaf matvec uses)
    gp = jax.grad(lambda p: jnp.sum(p.matvec(v) ** 2), allow_int=True)(pair)
    gd = jax.grad(lambda d: jnp.sum((d @ v) ** 2))(d)
    rows = np.repeat(np.arange(10), np.diff(a.indptr))
    np.testing.assert_allclose(gp.values, np.asarray(gd)[rows, a.indices], rtol=1e-10)


def test_bcoo_grads(x64):
    rows = np.array([2, 0, 2, 1, 9])
    cols = np.array([1, 3, 1, 0, 0])  # duplicate (2,1); (9,0) is padding
    vals = jnp.asarray([1.0, 2.0, 3.0, 4.0, 5.0])
    idx = jnp.asarray(np.stack([rows, cols], 1), jnp.int32)
    x = _rand((4, 2), np.float64)

    def f(v, x):
        return jnp.sum(ffi_matmul(jsparse.BCOO((v, idx), shape=(3, 4)), x) ** 2)

    def fd(v, x):
        d = jnp.zeros((3, 4)).at[rows[:4], cols[:4]].add(v[:4])
        return jnp.sum((d @ x) ** 2)

    for g, r in zip(jax.grad(f, argnums=(0, 1))(vals, x), jax.grad(fd, argnums=(0, 1))(vals, x)):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------------------ vmap / shard
def _count_spmm_calls(jaxpr_text):
    return jaxpr_text.count("jax_ops_sparse_csr_spmm")


@pytest.mark.parametrize("algorithm", [None, "split"])
def test_vmap_folds_into_spmm(algorithm):
    a = _random_csr(50, 40, 0.1, np.float32, long_row=2)
    pair = ffi_pair(_bcsr(a, np.float32), algorithm=algorithm, transpose_algorithm=algorithm, split_chunk=4)
    d = a.toarray().astype(np.float64)
    X = _rand((6, 40), np.float32)
    U = _rand((6, 50), np.float32, seed=4)
    out = jax.vmap(pair.matvec)(X)
    assert _rel(out, (d @ _f64(X).T).T) < 1e-5
    out = jax.vmap(pair.rmatvec)(U)
    assert _rel(out, (d.T @ _f64(U).T).T) < 1e-5
    text = str(jax.make_jaxpr(jax.vmap(pair.matvec))(X))
    assert "f32[50,6]" in text and _count_spmm_calls(text) == 1, "vmap must be one SpMM call with N = 6"
    # fused update with per-batch beta, as LSMR's block solver uses it
    betas = jnp.linspace(-1, 1, 6, dtype=jnp.float32)
    out = jax.vmap(lambda v, u, b: pair.matvec(v, beta=b, y=u))(X, U, betas)
    assert _rel(out, (d @ _f64(X).T).T + np.asarray(betas)[:, None] * _f64(U)) < 1e-5
    # nested vmap and vmap of SpMM
    Xn = _rand((2, 3, 40), np.float32)
    out = jax.vmap(jax.vmap(pair.matvec))(Xn)
    assert _rel(out, np.einsum("mk,abk->abm", d, _f64(Xn))) < 1e-5
    Bs = _rand((3, 40, 5), np.float32)
    assert _rel(jax.vmap(pair.matmat)(Bs), np.einsum("mk,bkn->bmn", d, _f64(Bs))) < 1e-5
    # grad of vmap
    g = jax.grad(lambda X: jnp.sum(jax.vmap(pair.matvec)(X) ** 2))(X)
    assert _rel(g, 2 * (d.T @ (d @ _f64(X).T)).T) < 1e-5


def test_vmap_over_matrices_falls_back():
    a = _random_csr(10, 8, 0.3, np.float32)
    A = _bcsr(a, np.float32)
    vals = jnp.stack([A.data, 2 * A.data])
    x = _rand((8,), np.float32)
    out = jax.vmap(lambda v: ffi_matmul(jsparse.BCSR((v, A.indices, A.indptr), shape=A.shape), x))(vals)
    d = a.toarray().astype(np.float64)
    assert _rel(out, np.stack([d @ _f64(x), 2 * d @ _f64(x)])) < 1e-5


def test_shard_map_spmm_over_columns():
    devices = jax.devices()
    if len(devices) < 8:
        pytest.skip("needs 8 (fake) devices: tests/conftest.py sets them")
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    a = _random_csr(64, 48, 0.1, np.float32)
    pair = ffi_pair(_bcsr(a, np.float32))
    mesh = Mesh(np.array(devices[:8]), ("x",))
    B = _rand((48, 32), np.float32)
    f = jax.shard_map(
        lambda p, b: p.matmat(b), mesh=mesh, in_specs=(P(), P(None, "x")), out_specs=P(None, "x")
    )
    out = jax.jit(f)(pair, B)
    assert _rel(out, a.toarray().astype(np.float64) @ _f64(B)) < 1e-5


# ------------------------------------------------------------------------------------------- validation
def test_bad_inputs():
    a = _random_csr(6, 5, 0.5, np.float32)
    A = _bcsr(a, np.float32)
    with pytest.raises(ValueError, match="B has shape"):
        ffi_matmul(A, jnp.ones((4,)))
    with pytest.raises(TypeError, match="dtype float64"):
        ffi_matmul(A, np.ones((5,), np.float64))
    with pytest.raises(ValueError, match="x must be a vector"):
        ffi_spmv(A, jnp.ones((5, 2)))
    with pytest.raises(ValueError, match="B must be a matrix"):
        ffi_spmm(A, jnp.ones((5,)))
    with pytest.raises(ValueError, match="must be a vector"):
        ffi_matmul(A, jnp.ones((5, 2, 2)))
    with pytest.raises(TypeError, match="B must be an array"):
        ffi_matmul(A, [1.0] * 5)
    with pytest.raises(ValueError, match="algorithm"):
        ffi_matmul(A, jnp.ones((5,)), algorithm="magic")
    with pytest.raises(ValueError, match="implementation"):
        sparse.matmul(A, jnp.ones((5,)), implementation="cuda")
    batched = jsparse.BCOO.fromdense(jnp.ones((2, 3, 3)), n_batch=1)
    with pytest.raises(ValueError, match="n_batch"):
        ffi_matmul(batched, jnp.ones((3,)))
    with pytest.raises(TypeError, match="A.data must have dtype"):
        ffi_matmul(jsparse.BCSR.fromdense(jnp.ones((3, 3), jnp.int32)), jnp.ones((3,), jnp.int32))
    pair = ffi_pair(A)
    with pytest.raises(ValueError, match="u has shape"):
        pair.rmatvec(jnp.ones((5,)))
    with pytest.raises(ValueError, match="y must have"):
        pair.matmat(jnp.ones((5, 2)), y=jnp.ones((6, 3)))
    with pytest.raises(ValueError, match="alpha must be 0-d"):
        pair.matmat(jnp.ones((5, 2)), alpha=jnp.ones((3,)))
    with pytest.raises(ValueError, match="beta was given without y"):
        pair.matvec(jnp.ones((5,)), beta=2.0)
    with pytest.raises(TypeError, match="matmul needs one sparse operand"):
        ffi_matmul(jnp.ones((2, 2)), jnp.ones((2, 2)))


def test_size_limit_message():
    with pytest.raises(ValueError, match="2\\^31"):
        sformats._check_sizes(2**31, 4, 10)


def test_spmm_of_few_long_rows_takes_split():
    # CSR(Aᵀ) of a tall matrix (few rows of ~1000 nnz): an N > 1 product runs the split plan (units of 256 nnz)
    # whatever the N = 1 plan, in every entry point: matmat/rmatmat with alpha/beta/y, and vmap of rmatvec (one
    # SpMM). Results against float64.
    a = _random_csr(3000, 24, 0.4, np.float32, seed=4)  # Aᵀ: 24 rows of ~1200 nnz
    pair = ffi_pair(_bcsr(a, np.float32))
    d = a.toarray().astype(np.float64)
    assert pair.plan_t.algorithm != "split"
    assert sparse.spmm_takes_split(pair.plan_t, 24, pair.nnz, 16, 4)
    assert not sparse.spmm_takes_split(pair.plan_t, 24, pair.nnz, 1, 4)  # SpMV keeps its plan
    assert not sparse.spmm_takes_split(pair.plan, 3000, pair.nnz, 16, 4)  # short rows keep theirs
    # the lane count includes the 16-byte kernel's slots (SlotsFor): CSR(Aᵀ) of LSMR's 8kv-like matrix (6177 rows
    # of ~892) has 6177 * 4 * 8 lanes >= 2^16 and stays unsplit; 2000 such rows would split
    assert (splan._spmm_slots(892, 4), splan._spmm_slots(19.4, 4), splan._spmm_slots(892, 32)) == (8, 1, 1)
    assert not sparse.spmm_takes_split(sparse.Plan("vector", 32), 6177, 6177 * 892, 16, 4)
    assert sparse.spmm_takes_split(sparse.Plan("vector", 32), 2000, 2000 * 892, 16, 4)
    U, Y = _rand((3000, 16), np.float32), _rand((24, 16), np.float32, seed=2)
    hlo = jax.jit(lambda p, U: p.rmatmat(U)).lower(pair, U).as_text()
    assert "algorithm = 2" in hlo and "chunk = 256" in hlo  # the split kernel (code 2) with 256-nnz units
    al, be = jnp.linspace(-1.0, 1.0, 16), jnp.linspace(2.0, 0.0, 16)
    out = jax.jit(lambda p, U, Y: p.rmatmat(U, alpha=al, beta=be, y=Y))(pair, U, Y)
    assert _rel(out, (d.T @ _f64(U)) * np.asarray(al) + _f64(Y) * np.asarray(be)) < 1e-5
    out = jax.jit(jax.vmap(pair.rmatvec))(U.T)  # [16, 24]
    assert _rel(out, (d.T @ _f64(U)).T) < 1e-5
    out = pair.T.matmat(U[:, :5])  # N = 5: the unvectorised column path
    assert _rel(out, d.T @ _f64(U[:, :5])) < 1e-5
    g = jax.grad(lambda U: jnp.sum(pair.rmatmat(U) ** 2))(U)  # dU = A (2 Aᵀ U): the forward SpMM of A
    assert _rel(g, d @ (2 * (d.T @ _f64(U)))) < 1e-5


def _small_ba(n_obs=2_000, n_cams=8, n_pts=800, seed=6):
    """A small bundle-adjustment-like Jacobian (scipy CSR f32): 2 rows per observation, 9 camera + 3 point columns;
    its CSR(Aᵀ) has 72 camera rows of ~500 (the long class) then 2400 point rows of ~5, like LSMR's ba-like."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    cam, pt = rng.integers(0, n_cams, n_obs), rng.integers(0, n_pts, n_obs)
    cols = np.concatenate(
        [9 * cam[:, None] + np.arange(9), 9 * n_cams + 3 * pt[:, None] + np.arange(3)], axis=1
    )
    cols = np.repeat(cols, 2, axis=0).reshape(-1)
    rows = np.repeat(np.arange(2 * n_obs), 12)
    vals = rng.standard_normal(rows.size).astype(np.float32)
    return sp.csr_matrix((vals, (rows, cols)), shape=(2 * n_obs, 9 * n_cams + 3 * n_pts), dtype=np.float32)


def test_spmm_of_bundle_adjustment_transpose():
    """N > 1 products of CSR(Aᵀ) of a bundle-adjustment-like Jacobian (camera rows of ~500 = 75 % of the nnz,
    then point rows of ~5; the segmented plan for N = 1, the vector path for N > 1): vmap of rmatvec_axpby
    (LSMR's 16-RHS block call), rmatmat with alpha/beta/y, and its gradient, against float64."""
    a = _small_ba()
    pair = ffi_pair(_bcsr(a, np.float32))
    d = a.toarray().astype(np.float64)
    m, k = a.shape
    assert not sparse.spmm_takes_split(pair.plan_t, k, pair.nnz, 16, 4)  # rows average < 512
    U, V = _rand((16, m), np.float32), _rand((16, k), np.float32, seed=2)
    c = jnp.linspace(-0.5, 0.5, 16)
    block = jax.jit(jax.vmap(lambda p, u, v, b: p.rmatvec_axpby(u, v, b), in_axes=(None, 0, 0, 0)))
    ref = (d.T @ _f64(U).T).T + np.asarray(c)[:, None] * _f64(V)
    assert _rel(block(pair, U, V, c), ref) < 1e-5
    Y = _rand((k, 16), np.float32, seed=3)
    al, be = jnp.linspace(-1.0, 1.0, 16), jnp.linspace(2.0, 0.0, 16)
    out = jax.jit(lambda p, U, Y: p.rmatmat(U, alpha=al, beta=be, y=Y))(pair, U.T, Y)
    assert _rel(out, (d.T @ _f64(U).T) * np.asarray(al) + _f64(Y) * np.asarray(be)) < 1e-5
    g = jax.grad(lambda W: jnp.sum(pair.rmatmat(W) ** 2))(U.T)
    assert _rel(g, d @ (2 * (d.T @ _f64(U).T))) < 1e-5


# ------------------------------------------------------------------------------------- the segmented plan
def _ragged_cases():
    """Ragged CSR matrices for the segmented plan: empty rows + one huge row, all rows long, rows at the chunk
    boundary (chunk 8), two contiguous row classes (long then short rows, as CSR(Aᵀ) of bundle adjustment)."""
    rng = np.random.default_rng(7)

    def from_lens(lens, k):
        lens = np.asarray(lens, np.int64)
        indptr = np.concatenate([[0], np.cumsum(lens)])
        cols = rng.integers(0, k, indptr[-1])
        return sp.csr_matrix((rng.standard_normal(indptr[-1]), cols, indptr), shape=(lens.size, k))

    huge = np.where(np.arange(60) % 5 == 0, 0, np.arange(60) % 3)
    huge[7] = 700
    return [
        from_lens(huge, 90),
        from_lens(20 + (np.arange(12) * 7) % 30, 80),
        from_lens(np.tile([0, 7, 8, 9, 16, 17, 1], 9), 40),
        from_lens(np.concatenate([np.full(300, 40), np.full(900, 3)]), 500),
        from_lens(np.concatenate([np.full(300, 300), np.full(3000, 5), np.full(100, 300)]), 2000),
    ]


@pytest.mark.parametrize("dtype", [*DTYPES, np.float64])
def test_segmented_ragged(dtype):
    with jax.enable_x64(dtype == np.float64):
        for a in _ragged_cases():
            A = _bcsr(a, dtype)
            d = _dense_of(A)
            m, k = a.shape
            x, u, y = _rand((k,), dtype), _rand((m,), dtype, seed=2), _rand((m,), dtype, seed=3)
            pair = ffi_pair(A, algorithm="segmented", transpose_algorithm="segmented", split_chunk=8)
            assert pair.plan.algorithm == "segmented"
            out = jax.jit(lambda p, x, y: p.matvec(x, alpha=0.75, beta=-0.5, y=y))(pair, x, y)
            assert _rel(out, 0.75 * (d @ _f64(x)) - 0.5 * _f64(y)) < TOL[dtype]
            assert _rel(jax.jit(lambda p, u: p.rmatvec(u))(pair, u), d.T @ _f64(u)) < TOL[dtype]
            B = _rand((k, 5), dtype)
            assert _rel(jax.jit(lambda p, B: p.matmat(B))(pair, B), d @ _f64(B)) < TOL[dtype]
            raw = ffi_matmul(A, x, algorithm="segmented", split_chunk=8)  # concrete indptr: same plan
            assert _rel(raw, d @ _f64(x)) < TOL[dtype]


def test_split1_removed():
    assert "split1" not in sparse.ALGORITHMS  # measured on the H200 and rejected (docs/design/sparse.md)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        ffi_matmul(_bcsr(_ragged_cases()[0], np.float32), jnp.ones((90,)), algorithm="split1")


def test_segments_rule():
    two = _ragged_cases()[3]  # rows of 40 (G = 4) then rows of 3 (G = 1): no warp-per-row class
    segs = sparse.segments_host(two.indptr, 100)
    assert segs == [(0, 300, 4), (300, 1200, 1)]
    assert not sparse.segmented_applies(two.indptr, 100)
    warp = _ragged_cases()[4]  # rows of 300 (G = 32), rows of 5, rows of 300 again
    assert sparse.segments_host(warp.indptr, 100) == [(0, 300, 32), (300, 3300, 1), (3300, 3400, 32)]
    assert sparse.segmented_applies(warp.indptr, 100)
    uniform = sp.random(5000, 300, density=0.05, format="csr", random_state=1)
    assert not sparse.segmented_applies(uniform.indptr)  # one class
    lens = np.concatenate([np.full(4000, 300), np.full(1000, 3)])  # the short class holds < 10% of nnz
    assert not sparse.segmented_applies(np.concatenate([[0], np.cumsum(lens)]), 100)
    lens = np.concatenate([np.full(30, 300), np.full(20000, 5)])  # the warp class holds < 10% of nnz
    assert not sparse.segmented_applies(np.concatenate([[0], np.cumsum(lens)]), 10)
    table, ptr, ctas = splan._segment_table(segs)
    assert list(table) == [0, 300, 4, 300, 1200, 1]
    assert list(ptr) == [0, 3, 7] and ctas == 7  # 128 rows per CTA at G = 4, 256 at G = 1


def test_segmented_traced_falls_back_to_vector():
    a = _ragged_cases()[3]
    A = _bcsr(a, np.float32)
    x = _rand((a.shape[1],), np.float32)
    out = jax.jit(lambda A, x: ffi_matmul(A, x, algorithm="segmented"))(A, x)
    assert _rel(out, _dense_of(A) @ _f64(x)) < 1e-5


def _auto_plan(indptr, k, itemsize=4):
    """The plan the default dispatch gives a matrix with this concrete indptr and k columns."""
    ip = np.asarray(indptr, np.int64)
    prof = sparse.RowProfile.from_indptr(ip)
    plan, _, _ = splan.make_plan(ip.astype(np.int32), int(ip[-1]), ip.size - 1, prof, None, None, k, itemsize)
    return plan


def _t_indptr(cols, k):
    return np.concatenate([[0], np.cumsum(np.bincount(cols, minlength=k))])


def test_segmented_auto_rule_outcomes():
    """The auto rule on the measured matrices' structure (jax_ops.bench generators): fires on CSR(Aᵀ) of LSMR's
    ba-like Jacobian (18k camera rows of 500, then 600k point rows of 5), not on bundle-adjustment Aᵀ (camera rows
    of ~100: G = 8 class), nor on the suite's Ax matrices or uniform / power-law / LSQ Aᵀ (half-size analogues
    where the full generator is slow; same row classes)."""
    from jax_ops.bench.sparse import (
        gen_bundle_adjustment,
        gen_lsq,
        gen_poisson,
        gen_power_law,
        gen_uniform,
    )

    ip, cols, _, (m, k) = gen_bundle_adjustment(500_000, 2_000, 200_000)  # = LSMR's ba-like 1Mx618k
    t = _t_indptr(cols, k)
    assert [g for _, _, g in sparse.segments_host(t)] == [32, 16, 1]
    plan = _auto_plan(t, m)
    assert plan.algorithm == "segmented" and plan.chunk == splan._segment_table(sparse.segments_host(t))[2]
    assert _auto_plan(ip, k).algorithm == "vector"  # its Ax: 12 per row
    # bundle-adj 1M's classes (camera rows of 100, point rows of 8), half size
    ip, cols, _, (m, k) = gen_bundle_adjustment(500_000, 10_000, 125_000)
    t = _t_indptr(cols, k)
    assert [g for _, _, g in sparse.segments_host(t)] == [8, 1]
    assert (_auto_plan(t, m).algorithm, _auto_plan(t, m).group) == ("vector", 4)
    assert not sparse.segmented_applies(t)
    suite = {
        "uniform": gen_uniform(200_000, 200_000, 16),
        "power-law": gen_power_law(200_000, 200_000),
        "poisson2d": gen_poisson((256, 256)),
        "poisson3d": gen_poisson((32, 32, 32)),
        "lsq 306136": gen_lsq(306_136, 6_177, 18),
        "lsq 936063": gen_lsq(936_063, 23_394, 21),
        "bundle": gen_bundle_adjustment(100_000, 2_000, 25_000),
    }
    for name, (ip, cols, _, (m, k)) in suite.items():
        for what, ipx, kx in (("Ax", ip, k), ("ATu", _t_indptr(cols, k), m)):
            if name == "bundle" and what == "ATu":
                continue  # covered above
            assert not sparse.segmented_applies(ipx), (name, what)
            assert _auto_plan(ipx, kx).algorithm != "segmented", (name, what)


def _prof(avg, p95, mx, rows=1_000_000):
    return sparse.RowProfile(rows, int(avg * rows), avg, p95, mx, 0.3)


def test_vector_group_rule_outcomes():
    """N = 1 vector G (docs/design/sparse.md dispatch table) on the profiles measured on the H200."""
    group = lambda prof, k, itemsize=4: splan._group_for("vector", prof, prof.rows, prof.nnz, k, itemsize)
    assert group(_prof(21.1, 29, 47), 1_000_000) == 8  # power-law 1M Aᵀu (u 4 MB; docs/design/sparse.md)
    assert group(_prof(16.0, 23, 40, 2_000_000), 2_000_000) == 8  # uniform 2M Aᵀu (docs/design/sparse.md)
    assert group(_prof(25.8, 108, 156), 2_000_000) == 4  # bundle 1M Aᵀu: p95 > 2 avg
    assert group(_prof(12.0, 12, 12, 2_000_000), 930_000) == 4  # bundle Ax: one row length (and < 16)
    assert group(_prof(16.0, 16, 16, 2_000_000), 2_000_000) == 4  # uniform Ax: exactly 16 per row
    assert group(_prof(18.0, 25, 39, 306_136), 6_177) == 4  # LSQ Ax: x L1-resident (24.7 KB)
    assert group(_prof(21.0, 29, 46, 936_063), 23_394) == 4  # LSQ Ax: x L1-resident (93.6 KB)
    assert group(_prof(19.4, 12, 636, 618_000), 1_000_000) == 4  # ba-like Aᵀu (p95 < avg; segmented instead)
    assert group(_prof(21.0, 29, 46), 32_768) == 4  # exactly 128 KiB: still L1
    assert group(_prof(21.0, 29, 46), 32_769) == 8
    assert group(_prof(21.0, 29, 46), 20_000, itemsize=8) == 8  # f64: 160 KB
    assert group(_prof(15.9, 23, 40), 1_000_000) == 4  # avg < 16
    assert group(_prof(70.0, 100, 140), 1_000_000) == 8  # avg >= 64: the base rule
    assert splan._group_for("vector", None, 1000, 21_000, 1_000_000) == 4  # traced: avg only
    assert splan._group_for("split", _prof(21.1, 29, 200_000), 1, 1, 1_000_000) == 8  # split: unchanged


def test_default_dispatch_segmented():
    """The auto rule through csr_pair: one 4096-row chunk of rows of 300 (G = 32, 83% of nnz) then 50000 rows of
    5 (G = 1) take the segmented plan; the small two-class case (one mixed 4096-row chunk) stays vector; a traced
    indptr takes the vector plan."""
    small = ffi_pair(_bcsr(_ragged_cases()[4], np.float32))
    assert small.plan.algorithm == "vector"
    rng = np.random.default_rng(5)
    lens = np.concatenate([np.full(4096, 300), np.full(50_000, 5)])
    indptr = np.concatenate([[0], np.cumsum(lens)])
    a = sp.csr_matrix(
        (rng.standard_normal(indptr[-1]).astype(np.float32), rng.integers(0, 3000, indptr[-1]), indptr),
        shape=(lens.size, 3000),
    )
    A = _bcsr(a, np.float32)
    pair = ffi_pair(A)
    assert pair.plan.algorithm == "segmented" and pair.plan_t.algorithm != "segmented"
    x = _rand((a.shape[1],), np.float32)
    ref = a.astype(np.float64) @ _f64(x)
    f = jax.jit(lambda p, x: p.matvec(x))
    assert _rel(f(pair, x), ref) < 1e-5
    assert "algorithm = 4" in f.lower(pair, x).as_text()
    assert _rel(jax.jit(lambda A, x: ffi_matmul(A, x))(A, x), ref) < 1e-5  # traced indptr: vector
