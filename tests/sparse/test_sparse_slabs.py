"""Column-slab Aᵀu (CSRPair.rmatvec with slabs) on the CPU twin: forced slabs vs a float64 NumPy reference on
ragged shapes, the slab format and work list, BCOO padding/duplicates, jit/grad/vmap, and the predicate."""

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import jax.test_util  # noqa: F401  (check_grads)
import numpy as np
import pytest
import scipy.sparse as sp
from csr_helpers import bcsr as _bcsr
from csr_helpers import ffi_matmul, ffi_pair
from helpers import rel_err as _rel
from jax.experimental import sparse as jsparse

from jax_ops import sparse
from jax_ops._src.sparse import slabs as sslabs

SLAB_TARGET = "jax_ops_sparse_slab_spmv"

TOL = {np.float32: 1e-5, np.float64: 1e-12}


def _from_lens(m, k, lens, seed):
    rng = np.random.default_rng(seed)
    lens = np.asarray(lens, np.int64)
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = np.concatenate([np.sort(rng.choice(k, size=n, replace=False)) for n in lens]) if lens.sum() else []
    vals = rng.standard_normal(int(indptr[-1]))
    return sp.csr_matrix((vals, np.asarray(cols, np.int64), indptr), shape=(m, k))


def _ragged():
    """5003 x 37 (m not a multiple of W = 836 or of 4), rows 836..1671 empty (an empty slab), columns 3 and 17
    unused (empty Aᵀ rows)."""
    rng = np.random.default_rng(11)
    lens = np.where((np.arange(5003) >= 836) & (np.arange(5003) < 1672), 0, 1 + rng.integers(0, 9, 5003))
    a = _from_lens(5003, 37, lens, 11).tolil()
    a[:, 3] = 0
    a[:, 17] = 0
    a = a.tocsr()
    a.eliminate_zeros()
    return a


CASES = {
    "ragged": (_ragged, 836),
    "n=1": (lambda: _from_lens(777, 1, [1 if i % 3 else 0 for i in range(777)], 12), 100),
    "tiny 3x5": (lambda: _from_lens(3, 5, [2, 0, 3], 13), 1000),
    "long slab rows": (lambda: sp.csr_matrix(np.random.default_rng(14).standard_normal((4000, 3))), 1000),
}


@pytest.fixture
def width():
    """Sets the slab width (in entries of the value dtype) by shrinking the shared-memory budget."""
    with contextlib.ExitStack() as stack:

        def set_width(w, itemsize):
            stack.enter_context(sparse.overrides(slab_smem_bytes=w * itemsize))

        yield set_width


def _check_format(pair, a):
    """The slab arrays hold exactly Aᵀ, each (slab, row) ascending in u, and the work list covers every cell."""
    s = pair.slabs_t
    plan = s.plan
    m, n = a.shape
    ptr, col, val = np.asarray(s.ptr), np.asarray(s.col), np.asarray(s.val)
    assert ptr.shape == (plan.slabs * n + 1,) and col.dtype == np.uint16
    assert plan.slabs == -(-m // plan.width) and plan.width % 4 == 0
    dense = np.zeros((n, m))
    for sl in range(plan.slabs):
        for r in range(n):
            p0, p1 = ptr[sl * n + r], ptr[sl * n + r + 1]
            loc = col[p0:p1].astype(np.int64)
            assert np.all(np.diff(loc) > 0) and np.all(loc < min(plan.width, m - sl * plan.width))
            dense[r, sl * plan.width + loc] += val[p0:p1]
    np.testing.assert_allclose(dense, a.T.toarray(), rtol=1e-6)
    work = np.asarray(s.work).reshape(-1, 3)
    assert work.shape[0] == plan.items
    cover = np.zeros((plan.slabs, n), np.int64)
    for sl, r0, r1 in work:
        assert r0 < r1
        cover[sl, r0:r1] += 1
    assert np.all(cover == 1)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_forced_slabs_vs_reference(case, dtype, width):
    gen, w = CASES[case]
    a = gen()
    m, n = a.shape
    with jax.enable_x64(dtype == np.float64):
        width(w, np.dtype(dtype).itemsize)
        pair = ffi_pair(_bcsr(a, dtype), slabs=True)
        assert pair.slabs_t is not None and pair.slabs_t.plan.width == (
            w if m > w else pair.slabs_t.plan.width
        )
        _check_format(pair, a.astype(np.float64))
        rng = np.random.default_rng(5)
        u = rng.standard_normal(m)
        assert SLAB_TARGET in str(jax.make_jaxpr(pair.rmatvec)(jnp.zeros((m,), dtype)))  # no silent CSR path
        y = rng.standard_normal(n)
        ud, yd = jnp.asarray(u, dtype), jnp.asarray(y, dtype)
        u64 = np.asarray(ud, np.float64)
        y64 = np.asarray(yd, np.float64)
        a64 = a.astype(dtype).astype(np.float64)
        # errors relative to |A|ᵀ|u| + |y| (sums with cancellation, e.g. the n = 1 case, stay meaningful)
        scale = np.linalg.norm(abs(a64).T @ abs(u64) + abs(y64))
        tol = TOL[dtype] * scale

        def err(out, ref):
            out = np.asarray(out, np.float64)
            assert np.all(np.isfinite(out)), "non-finite output"
            return np.linalg.norm(out - ref)

        assert err(pair.rmatvec(ud), a64.T @ u64) < tol
        assert err(pair.rmatvec(ud, alpha=0.75), 0.75 * (a64.T @ u64)) < tol
        assert err(pair.rmatvec(ud, alpha=0.75, beta=-0.5, y=yd), 0.75 * (a64.T @ u64) - 0.5 * y64) < tol
        assert err(pair.rmatvec_axpby(ud, yd, -2.0), a64.T @ u64 - 2.0 * y64) < 2 * tol
        al = jnp.asarray(0.0, np.dtype(dtype))
        assert err(pair.rmatvec(ud, alpha=al, beta=1.0, y=yd), y64) == 0
        # same result as the CSR(Aᵀ) path
        plain = ffi_pair(_bcsr(a, dtype), slabs=False)
        assert plain.slabs_t is None
        assert err(pair.rmatvec(ud, beta=0.5, y=yd), np.asarray(plain.rmatvec(ud, beta=0.5, y=yd))) < tol


def test_slab_format_one_slab_and_work_lists(width):
    a = _ragged()
    pair = ffi_pair(_bcsr(a, np.float32), slabs=True)  # default budget: one slab
    assert pair.slabs_t.plan.slabs == 1
    _check_format(pair, a)
    # the static (traced-build) work list covers every cell too
    for rows, j, items in ((37, 6, 264), (1, 8, 264), (1000, 3, 2), (5, 100, 7)):
        w = sslabs._slab_work_static(rows, j, items).reshape(-1, 3)
        cover = np.zeros((j, rows), np.int64)
        for sl, r0, r1 in w:
            cover[sl, r0:r1] += 1
        assert np.all(cover == 1)


def test_bcoo_padding_duplicates_with_slabs(width):
    width(100, 4)
    rng = np.random.default_rng(3)
    m, n, nnz = 1003, 29, 4000
    rows = rng.integers(0, m, nnz)
    cols = rng.integers(0, n, nnz)
    rows[:50] = rows[50:100]  # duplicates
    cols[:50] = cols[50:100]
    rows[-30:] = m + 5  # padding: out-of-range indices contribute nothing
    cols[-60:-30] = -n - 1  # below -K: padding too ([-K, -1] would wrap, as in JAX)
    vals = rng.standard_normal(nnz).astype(np.float32)
    A = jsparse.BCOO((jnp.asarray(vals), jnp.asarray(np.stack([rows, cols], 1), jnp.int32)), shape=(m, n))
    keep = (rows < m) & (cols >= 0)
    ref = sp.coo_matrix((vals[keep].astype(np.float64), (rows[keep], cols[keep])), shape=(m, n)).tocsr()
    pair = ffi_pair(A, slabs=True)
    assert pair.slabs_t.plan.slabs == 11
    u = rng.standard_normal(m).astype(np.float32)
    assert _rel(pair.rmatvec(jnp.asarray(u)), ref.T @ u.astype(np.float64)) < 1e-5
    assert _rel(ffi_matmul(jnp.asarray(u), pair), ref.T @ u.astype(np.float64)) < 1e-5


def test_jit_grad_vmap_with_slabs(x64, width):
    width(100, 8)
    a = _from_lens(450, 13, np.random.default_rng(4).integers(0, 6, 450), 4)
    slab = ffi_pair(_bcsr(a, np.float64), slabs=True)
    plain = ffi_pair(_bcsr(a, np.float64), slabs=False)
    assert slab.slabs_t.plan.slabs == 5
    rng = np.random.default_rng(8)
    u = jnp.asarray(rng.standard_normal(450))
    y = jnp.asarray(rng.standard_normal(13))
    # the pair as a jit argument
    f = jax.jit(lambda p, u, y: p.rmatvec(u, alpha=0.5, beta=2.0, y=y))
    np.testing.assert_allclose(f(slab, u, y), f(plain, u, y), rtol=1e-12)
    d = jnp.asarray(a.toarray())

    def loss(p, u, al, be, y):
        return jnp.sum(p.rmatvec(u, alpha=al, beta=be, y=y) ** 3)

    args = (u, jnp.float64(0.3), jnp.float64(-1.2), y)
    jax.test_util.check_grads(lambda *xs: loss(slab, *xs), args, order=1, modes=("rev",))
    g_slab = jax.grad(lambda *xs: loss(slab, *xs), argnums=(0, 1, 2, 3))(*args)
    g_ref = jax.grad(lambda u, al, be, y: jnp.sum((al * (d.T @ u) + be * y) ** 3), argnums=(0, 1, 2, 3))(
        *args
    )
    for g, r in zip(g_slab, g_ref):
        np.testing.assert_allclose(g, r, rtol=1e-10, atol=1e-12)
    assert SLAB_TARGET in str(jax.make_jaxpr(slab.rmatvec)(u))
    assert SLAB_TARGET not in str(jax.make_jaxpr(plain.rmatvec)(u))
    # value gradients arrive on the leaf the product read: slabs_t.val (values_t gets none), entry by entry
    # d/d a_ic sum((Aᵀu)²) = 2 (Aᵀu)_c u_i, and they are the gradient of the function of that leaf
    gp = jax.grad(lambda p: jnp.sum(p.rmatvec(u) ** 2), allow_int=True)(slab)
    assert not np.any(np.asarray(gp.values_t))
    sl = slab.slabs_t
    ptr, col = np.asarray(sl.ptr), np.asarray(sl.col).astype(np.int64)
    pos = np.arange(col.size)
    cell = np.searchsorted(ptr, pos, side="right") - 1
    un, atu = np.asarray(u), np.asarray(d.T @ u)
    i = (cell // sl.plan.rows) * sl.plan.width + col
    live = pos < ptr[-1]
    expected = np.where(live, 2 * atu[cell % sl.plan.rows] * un[np.where(live, i, 0)], 0)
    np.testing.assert_allclose(gp.slabs_t.val, expected, rtol=1e-10, atol=1e-12)

    def of_slab_values(val):
        p = dataclasses.replace(slab, slabs_t=dataclasses.replace(sl, val=val))
        return jnp.sum(p.rmatvec(u) ** 2)

    jax.test_util.check_grads(of_slab_values, (sl.val,), order=1, modes=("rev",))
    # vmap over u folds into the CSR(Aᵀ) SpMM; a batch of one stays on slabs
    U = jnp.asarray(rng.standard_normal((3, 450)))
    np.testing.assert_allclose(jax.vmap(slab.rmatvec)(U), (d.T @ U.T).T, rtol=1e-10)
    np.testing.assert_allclose(jax.vmap(slab.rmatvec)(U[:1]), (d.T @ U[:1].T).T, rtol=1e-10)
    assert SLAB_TARGET in str(jax.make_jaxpr(jax.vmap(slab.rmatvec))(U[:1]))
    np.testing.assert_allclose(slab.rmatmat(U.T), d.T @ U.T, rtol=1e-10)
    # .T swaps the roles: (Aᵀ).matvec uses the slabs
    np.testing.assert_allclose(slab.T.matvec(u), d.T @ u, rtol=1e-10)
    assert slab.T.slabs is slab.slabs_t and slab.T.slabs_t is None


def test_pair_built_under_jit_with_slabs(width):
    width(100, 4)
    a = _from_lens(700, 9, np.random.default_rng(6).integers(0, 5, 700), 6)
    A = _bcsr(a, np.float32)
    u = jnp.asarray(np.random.default_rng(7).standard_normal(700), jnp.float32)

    @jax.jit
    def f(A, u):
        return ffi_pair(A, slabs=True).rmatvec(u)

    assert _rel(f(A, u), a.T @ np.asarray(u, np.float64)) < 1e-5


def test_slab_errors_and_half_types():
    a = _from_lens(50, 4, [2] * 50, 1)
    with pytest.raises(ValueError, match="slabs=True needs float32 or float64"):
        ffi_pair(_bcsr(a, np.float16), slabs=True)
    assert ffi_pair(_bcsr(a, jnp.bfloat16)).slabs_t is None
    # an existing pair is returned as built; asking it for the other slab choice is an error, not a no-op
    pair = ffi_pair(_bcsr(a, np.float32), slabs=False)
    assert ffi_pair(pair) is pair and ffi_pair(pair, slabs=False) is pair
    with pytest.raises(ValueError, match="slabs=True for a CSRPair built without slabs"):
        ffi_pair(pair, slabs=True)


@pytest.mark.parametrize(
    "cc,fits", [("9.0", True), ("8.0", True), ("10.0", True), ("8.6", False), ("8.9", False)]
)
def test_predicate_only_where_the_gpu_fits_a_slab(cc, fits, monkeypatch):
    # W is sized for SLAB_SMEM_BYTES per block; GPUs with a smaller per-block opt-in (sm_86/89: 99 KB) would refuse
    # the launch, so slabs=None must not build slabs for them.
    gpu = type("FakeGpu", (), {"platform": "gpu", "compute_capability": cc})()
    monkeypatch.setattr(jax, "devices", lambda *a, **k: [gpu])
    assert sslabs._slabs_fit_device() is fits


@pytest.mark.parametrize(
    "name,m,n,nnz,use",
    [
        ("lsq 306136x6177 ~18/row", 306_136, 6_177, 306_136 * 18, True),
        ("lsq 936063x23394 ~21/row", 936_063, 23_394, 936_063 * 21, True),
        ("uniform 2M 16/row", 2_000_000, 2_000_000, 32_000_000, False),
        ("poisson 2-D 2048^2", 2048**2, 2048**2, 5 * 2048**2 - 4 * 2048, False),
        ("poisson 3-D 128^3", 128**3, 128**3, 7 * 128**3 - 6 * 128**2, False),
        ("power-law 1M", 1_000_000, 1_000_000, 40_000_000, False),
        ("bundle-adjustment 1M obs", 2_000_000, 20_000 * 9 + 250_000 * 3, 24_000_000, False),
        ("lsq 30613x617 (u fits L1)", 30_613, 617, 30_613 * 18, False),
    ],
)
def test_predicate(name, m, n, nnz, use):
    # Aᵀu of an m x n matrix: rows = n outputs, u of m entries; f32 on an H200-sized GPU (132 SMs).
    model = sparse.slab_model(n, m, nnz, 4, items=264)
    assert model.use == use, (name, model)
    assert sparse.slab_model(n, m, nnz, 8, items=264).use == use, name


def test_predicate_group_rule():
    assert sparse.slab_group(25.5) == 4 and sparse.slab_group(81.1) == 8
    assert sparse.slab_group(3.0) == 4 and sparse.slab_group(200) == 16 and sparse.slab_group(900) == 32


def test_native_slab_handler_revalidates():
    # Bypass the Python checks: the C++ handler must refuse bad shapes/dtypes, not read out of bounds.
    from jax_ops import _ffi

    m, n, w = 10, 3, 4  # J = 3
    f32 = jnp.float32

    def call(
        ptr_len=3 * n + 1, col_dtype=jnp.uint16, val_dtype=f32, work_len=3, y_len=0, width=w, group=4, ws=9
    ):
        out = (jax.ShapeDtypeStruct((n,), val_dtype), jax.ShapeDtypeStruct((ws,), val_dtype))
        return jax.jit(
            lambda: _ffi.ffi_call(
                "jax_ops_sparse_slab_spmv",
                out,
                jnp.zeros(ptr_len, jnp.int32),
                jnp.zeros(5, col_dtype),
                jnp.zeros(5, val_dtype),
                jnp.zeros(work_len, jnp.int32),
                jnp.zeros(m, val_dtype),
                jnp.ones(1, val_dtype),
                jnp.ones(1, val_dtype),
                jnp.zeros(y_len, val_dtype),
                width=np.int64(width),
                group=np.int32(group),
            )
        )()

    call()  # valid (all-empty slabs): runs
    for kwargs, msg in (
        ({"ptr_len": 9}, "ptr has 9 entries; expected J\\*n \\+ 1 = 10"),
        ({"col_dtype": jnp.int32}, "col must be a rank-1 uint16 array"),
        ({"val_dtype": jnp.float16}, "expected f32 or f64"),
        ({"work_len": 4}, "triples"),
        ({"y_len": 2}, "y must be empty or have the shape of out"),
        ({"width": 6}, "width must be a multiple of 4"),
        ({"group": 2}, "group must be 4, 8, 16 or 32"),
        ({"ws": 8}, "workspace must be a rank-1"),
    ):
        with pytest.raises(Exception, match=msg):
            call(**kwargs)


def test_lsmr_with_slabs(width):
    # LSMR's products (vmapped with a batch of one) take the slab path and give the same solution.
    from jax_ops import lsmr

    width(200, 4)
    a = _from_lens(1500, 20, np.random.default_rng(9).integers(1, 6, 1500), 9)
    b = jnp.asarray(np.random.default_rng(10).standard_normal(1500), jnp.float32)
    slab = ffi_pair(_bcsr(a, np.float32), slabs=True)
    plain = ffi_pair(_bcsr(a, np.float32), slabs=False)
    jaxpr = str(jax.make_jaxpr(lambda p, b: lsmr(p, b, maxiter=5).x)(slab, b))
    assert SLAB_TARGET in jaxpr
    xs = lsmr(slab, b, atol=1e-7, btol=1e-7).x
    xp = lsmr(plain, b, atol=1e-7, btol=1e-7).x
    xr = np.linalg.lstsq(a.toarray(), np.asarray(b, np.float64), rcond=None)[0]
    assert _rel(xs, xr) < 1e-4 and _rel(xs, xp) < 1e-5


@pytest.mark.parametrize("shape", [(0, 5), (6, 0), (0, 0)])
def test_forced_slabs_on_empty_shapes(shape):
    a = sp.csr_matrix(shape, dtype=np.float32)
    pair = ffi_pair(_bcsr(a, np.float32), slabs=True)
    assert pair.slabs_t is None
    out = pair.rmatvec(jnp.ones((shape[0],), jnp.float32))
    assert out.shape == (shape[1],) and not np.any(np.asarray(out))
