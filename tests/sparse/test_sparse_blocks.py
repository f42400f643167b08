"""Row blocks (rows sharing a column list, the csr_spmm target's blocks plan) on the CPU twin: detection, the
format, N = 1 products in both directions vs a float64 reference for every dtype and block height, ragged block
rows, invalid columns, alpha/beta/y, jit/grad/vmap, the auto rule, and the native handler's checks."""

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

from jax_ops import _ffi, sparse
from jax_ops._src.sparse import blocks as sparse_blocks
from jax_ops._src.sparse import plan as sparse_plan
from jax_ops.bench.sparse import gen_bundle_adjustment

TOL = {np.float16: 3e-3, jnp.bfloat16: 2e-2, np.float32: 1e-5, np.float64: 1e-12}


def _blocked(mb, k, r, seed, empty_every=0):
    """mb * r x k: block row b has its own random column list (some empty when empty_every), its r rows have
    independent values on that list."""
    rng = np.random.default_rng(seed)
    lens = rng.integers(1, 40, mb)
    if empty_every:
        lens[::empty_every] = 0
    rows, cols = [], []
    for b, n in enumerate(lens):
        c = np.sort(rng.choice(k, size=min(int(n), k), replace=False))
        for i in range(r):
            rows.append(np.full(c.size, b * r + i))
            cols.append(c)
    rows, cols = np.concatenate(rows), np.concatenate(cols)
    return sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(mb * r, k))


def _bundle():
    ip, ix, v, shape = gen_bundle_adjustment(3000, 40, 900)
    return sp.csr_matrix((v, ix, ip), shape=shape)


def _runs_blocks(f, *args) -> bool:
    """Whether the traced function calls the csr_spmm target with the blocks plan (algorithm 6)."""
    hlo = jax.jit(f).lower(*args).as_text()
    return "jax_ops_sparse_csr_spmm" in hlo and "algorithm = 6 : i32" in hlo


def test_block_rows_detection():
    a = _bundle()
    assert sparse.block_rows(a.indptr, a.indices) == 2
    at = a.T.tocsr()
    at.sort_indices()
    assert sparse.block_rows(at.indptr, at.indices) == 3  # cameras (9 rows) and points (3 rows)
    for r in (2, 3, 4):
        b = _blocked(50, 300, r, r)
        assert sparse.block_rows(b.indptr, b.indices) == r
    rnd = sp.random(60, 50, density=0.1, format="csr", random_state=0)
    assert sparse.block_rows(rnd.indptr, rnd.indices) == 1
    b = _blocked(50, 300, 2, 5)
    assert sparse.block_rows(b.indptr[:-1], b.indices[: b.indptr[-2]]) == 1  # 99 rows: no R divides
    # equal lengths, one column differs in one block
    idx = b.indices.copy()
    idx[b.indptr[41] + 1] = (idx[b.indptr[41] + 1] + 1) % 300
    assert sparse.block_rows(b.indptr, idx) == 1
    assert sparse.block_rows(np.zeros(1, np.int32), np.zeros(0, np.int32)) == 1
    # min_rows: only R >= min_rows is looked for (the auto rule passes 3)
    assert sparse.block_rows(a.indptr, a.indices, 3) == 1
    assert sparse.block_rows(at.indptr, at.indices, 3) == 3
    assert sparse.block_rows(at.indptr, at.indices, 4) == 1


def test_block_rows_rejects_a_mismatch_in_any_block():
    b = _blocked(50, 300, 4, 3)
    assert sparse.block_rows(b.indptr, b.indices) == 4
    for block in (0, 2, 20, 49):  # the first, early, middle and last blocks; the last row of each
        idx = b.indices.copy()
        row = 4 * block + 3
        idx[b.indptr[row]] = (idx[b.indptr[row]] + 1) % 300
        assert sparse.block_rows(b.indptr, idx) == 1, block
    # padding past the rows (a padded BCOO's transpose) is not part of any block
    padded = np.concatenate([b.indices, np.arange(7, dtype=b.indices.dtype)])
    assert sparse.block_rows(b.indptr, padded) == 4


def _blocks_reference(indptr, indices, values, r):
    """The blocks form by loops: block b's columns are its first row's, row R b + i's values at R p + i."""
    bptr, cols, vals = [0], [], []
    for b in range((len(indptr) - 1) // r):
        s, e = indptr[r * b], indptr[r * b + 1]
        cols.extend(indices[s:e])
        for p in range(e - s):
            vals.extend(values[indptr[r * b + i] + p] for i in range(r))
        bptr.append(bptr[-1] + e - s)
    return np.asarray(bptr), np.asarray(cols), np.asarray(vals)


@pytest.mark.parametrize("r", [2, 3, 4])
def test_block_build_matches_a_loop_reference(r):
    """The device-built form equals the loop reference bit for bit, with empty block rows, a leading offset in
    indptr and padding entries after the rows."""
    a = _blocked(64, 120, r, 20 + r, empty_every=6)
    lead, tail = 5, 3
    indptr = a.indptr.astype(np.int32) + lead
    indices = np.concatenate([np.arange(lead), a.indices, np.arange(tail)]).astype(np.int32)
    values = np.concatenate([np.full(lead, 9.0), a.data, np.full(tail, 9.0)]).astype(np.float32)
    assert sparse.block_rows(indptr, indices) == r
    form = sparse_blocks._build_blocks(jnp.asarray(indptr), jnp.asarray(indices), jnp.asarray(values), r)
    bptr, cols, vals = _blocks_reference(indptr, indices, values, r)
    np.testing.assert_array_equal(np.asarray(form.indptr), bptr)
    np.testing.assert_array_equal(np.asarray(form.indices), cols)
    np.testing.assert_array_equal(np.asarray(form.values), vals)
    assert form.plan.rows == r and form.plan.block_rows == 64
    table, seg_ptr, ctas = sparse_plan._segment_table(sparse.segments_host(bptr))
    np.testing.assert_array_equal(np.asarray(form.seg_table), table)
    np.testing.assert_array_equal(np.asarray(form.seg_ptr), seg_ptr)
    assert form.plan.ctas == ctas


def test_blocks_format(x64):
    a = _blocked(37, 90, 3, 1, empty_every=5)
    pair = ffi_pair(_bcsr(a, np.float64), blocks=True)
    bl = pair.blocks
    assert bl.plan.rows == 3 and bl.plan.block_rows == 37
    bptr, bcol, bval = np.asarray(bl.indptr), np.asarray(bl.indices), np.asarray(bl.values)
    assert bval.shape == (3 * bcol.size,)
    for b in range(37):
        s, e = bptr[b], bptr[b + 1]
        for i in range(3):
            row = a.getrow(3 * b + i)
            np.testing.assert_array_equal(bcol[s:e], row.indices)
            np.testing.assert_array_equal(bval[3 * s + i : 3 * e : 3], row.data)
    table = np.asarray(bl.seg_table).reshape(-1, 3)
    assert table[0, 0] == 0 and table[-1, 1] == 37 and int(np.asarray(bl.seg_ptr)[-1]) == bl.plan.ctas


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16, np.float32, np.float64])
@pytest.mark.parametrize("r", [2, 3, 4])
def test_products_against_reference(x64, dtype, r):
    a = _blocked(301, 257, r, 10 + r, empty_every=7)  # ragged block rows, every 7th empty
    a.data[::11] = 0.0  # explicit zeros stay stored
    pair = ffi_pair(_bcsr(a, dtype), blocks=True)
    assert pair.blocks is not None and pair.blocks.plan.rows == r
    rng = np.random.default_rng(r)
    x = rng.standard_normal(257).astype(dtype)
    y = rng.standard_normal(a.shape[0]).astype(dtype)
    ad = a.copy()
    ad.data = np.asarray(np.asarray(a.data, dtype), np.float64)  # the stored (rounded) values
    xd, yd = np.asarray(x, np.float64), np.asarray(y, np.float64)
    assert _rel(pair.matvec(jnp.asarray(x)), ad @ xd) < TOL[dtype]
    out = pair.matvec(jnp.asarray(x), alpha=-1.5, beta=0.25, y=jnp.asarray(y))
    assert _rel(out, -1.5 * (ad @ xd) + 0.25 * yd) < TOL[dtype]
    assert _runs_blocks(pair.matvec, jnp.asarray(x))


def test_transpose_blocks_and_auto_rule(x64):
    a = _bundle()
    pair = ffi_pair(_bcsr(a, np.float64))
    assert pair.blocks is None  # R = 2 (observation rows): CSR, as measured
    assert pair.blocks_t is not None and pair.blocks_t.plan.rows == 3
    assert ffi_pair(_bcsr(a, np.float64), blocks=False).blocks_t is None
    forced = ffi_pair(_bcsr(a, np.float64), blocks=True)
    assert forced.blocks.plan.rows == 2
    rng = np.random.default_rng(3)
    u = jnp.asarray(rng.standard_normal(a.shape[0]))
    x = jnp.asarray(rng.standard_normal(a.shape[1]))
    np.testing.assert_allclose(pair.rmatvec(u), a.T @ np.asarray(u), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(forced.matvec(x), a @ np.asarray(x), rtol=1e-12, atol=1e-12)
    assert _runs_blocks(pair.rmatvec, u) and not _runs_blocks(pair.matvec, x)
    # .T swaps the forms; matmul(u, A) and LSMR's fused update use them too
    assert pair.T.blocks is pair.blocks_t and pair.T.blocks_t is None
    np.testing.assert_allclose(ffi_matmul(u, pair), a.T @ np.asarray(u), rtol=1e-12, atol=1e-12)
    v = jnp.asarray(rng.standard_normal(a.shape[1]))
    np.testing.assert_allclose(
        pair.rmatvec_axpby(u, v, -0.7), a.T @ np.asarray(u) - 0.7 * np.asarray(v), rtol=1e-12, atol=1e-12
    )
    # a pair built under jit has no concrete arrays: no blocks, same results
    traced = jax.jit(lambda m: ffi_pair(m).rmatvec(u))(_bcsr(a, np.float64))
    np.testing.assert_allclose(traced, a.T @ np.asarray(u), rtol=1e-12, atol=1e-12)


def test_padding_duplicates_and_invalid_columns(x64):
    """A BCOO with padding entries and duplicates (summed when converted); blocks of an invalid-column entry skip
    it like the CSR kernels."""
    a = _blocked(40, 31, 2, 21)
    coo = a.tocoo()
    rows = np.concatenate([coo.row, [0, 1], [79, 79]])
    cols = np.concatenate([coo.col, [coo.col[0], coo.col[0]], [31, 31]])  # a duplicate pair; padding
    vals = np.concatenate([coo.data, [0.5, 0.5], [9.0, 9.0]])
    mat = jsparse.BCOO((jnp.asarray(vals), jnp.asarray(np.stack([rows, cols], 1), jnp.int32)), shape=a.shape)
    pair = ffi_pair(mat, blocks=True)
    ref = sp.csr_matrix((vals[:-2], (rows[:-2], cols[:-2])), shape=a.shape)
    x = np.random.default_rng(1).standard_normal(31)
    assert pair.blocks is not None
    np.testing.assert_allclose(pair.matvec(jnp.asarray(x)), ref @ x, rtol=1e-12, atol=1e-12)
    # a column index out of range in a blocks form contributes nothing
    bl = pair.blocks
    bad = dataclasses.replace(pair, blocks=dataclasses.replace(bl, indices=bl.indices.at[0].set(10_000)))
    want = np.array(pair.matvec(jnp.asarray(x)))
    c0 = int(bl.indices[0])
    want[:2] -= np.asarray(bl.values[:2]) * x[c0]
    np.testing.assert_allclose(bad.matvec(jnp.asarray(x)), want, rtol=1e-12, atol=1e-12)


def test_jit_grad_vmap_with_blocks(x64):
    a = _blocked(45, 23, 3, 4, empty_every=6)
    pair = ffi_pair(_bcsr(a, np.float64), blocks=True)
    plain = ffi_pair(_bcsr(a, np.float64), blocks=False)
    assert pair.blocks is not None and plain.blocks is None
    d = jnp.asarray(a.toarray())
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal(23))
    y = jnp.asarray(rng.standard_normal(135))
    f = jax.jit(lambda p, x, y: p.matvec(x, alpha=0.5, beta=2.0, y=y))
    np.testing.assert_allclose(f(pair, x, y), f(plain, x, y), rtol=1e-12)

    def loss(p, x, al, be, y):
        return jnp.sum(p.matvec(x, alpha=al, beta=be, y=y) ** 3)

    args = (x, jnp.float64(0.3), jnp.float64(-1.2), y)
    jax.test_util.check_grads(lambda *xs: loss(pair, *xs), args, order=1, modes=("rev",))
    g = jax.grad(lambda *xs: loss(pair, *xs), argnums=(0, 1, 2, 3))(*args)
    g_ref = jax.grad(lambda x, al, be, y: jnp.sum((al * (d @ x) + be * y) ** 3), argnums=(0, 1, 2, 3))(*args)
    for gi, ri in zip(g, g_ref):
        np.testing.assert_allclose(gi, ri, rtol=1e-10, atol=1e-12)
    # value gradients arrive on blocks.values (values gets none): d/d a_rc sum((Ax)²) = 2 (Ax)_r x_c
    gp = jax.grad(lambda p: jnp.sum(p.matvec(x) ** 2), allow_int=True)(pair)
    assert not np.any(np.asarray(gp.values))
    bl = pair.blocks
    bptr, bcol = np.asarray(bl.indptr), np.asarray(bl.indices)
    brow = np.searchsorted(bptr, np.arange(bcol.size), side="right") - 1
    ax = np.asarray(d @ x)
    expected = 2 * ax[brow[:, None] * 3 + np.arange(3)] * np.asarray(x)[bcol][:, None]
    np.testing.assert_allclose(gp.blocks.values, expected.reshape(-1), rtol=1e-10, atol=1e-12)

    def of_block_values(val):
        return jnp.sum(dataclasses.replace(pair, blocks=dataclasses.replace(bl, values=val)).matvec(x) ** 2)

    jax.test_util.check_grads(of_block_values, (bl.values,), order=1, modes=("rev",))
    # vmap folds into the CSR SpMM; a batch of one stays on blocks
    X = jnp.asarray(rng.standard_normal((3, 23)))
    np.testing.assert_allclose(jax.vmap(pair.matvec)(X), (d @ X.T).T, rtol=1e-10)
    np.testing.assert_allclose(jax.vmap(pair.matvec)(X[:1]), (d @ X[:1].T).T, rtol=1e-10)
    assert _runs_blocks(jax.vmap(pair.matvec), X[:1]) and not _runs_blocks(jax.vmap(pair.matvec), X)
    np.testing.assert_allclose(pair.matmat(X.T), d @ X.T, rtol=1e-10)
    # the XLA reference path ignores the form
    ref = dataclasses.replace(pair, implementation="xla")
    np.testing.assert_allclose(ref.matvec(x), d @ x, rtol=1e-12)
    assert not _runs_blocks(ref.matvec, x)


def test_pair_options_and_errors():
    a = _blocked(20, 15, 2, 2)
    pair = ffi_pair(_bcsr(a, np.float32), blocks=True)
    assert ffi_pair(pair) is pair
    with pytest.raises(ValueError, match="blocks=False for a CSRPair built with blocks"):
        ffi_pair(pair, blocks=False)
    # forcing a CSR algorithm on a pair keeps its blocks for N = 1
    x = jnp.asarray(np.random.default_rng(0).standard_normal(15), jnp.float32)
    out = ffi_matmul(pair, x, algorithm="cta")
    assert _rel(out, a @ np.asarray(x, np.float64)) < 1e-5


def _call_blocks(indptr, indices, values, m, k, table, seg_ptr, ctas, n=1):
    acc = np.float32
    return _ffi.ffi_call(
        "jax_ops_sparse_csr_spmm",
        (jax.ShapeDtypeStruct((m, n), np.float32), jax.ShapeDtypeStruct((1,), acc)),
        jnp.asarray(indptr, jnp.int32),
        jnp.asarray(indices, jnp.int32),
        jnp.asarray(values, jnp.float32),
        jnp.ones((k, n), jnp.float32),
        jnp.ones((n,), acc),
        jnp.ones((n,), acc),
        jnp.zeros((0,), jnp.float32),
        jnp.asarray(table, jnp.int32),
        jnp.asarray(seg_ptr, jnp.int32),
        algorithm=np.int32(6),
        group=np.int32(32),
        chunk=np.int64(ctas),
    )[0]


def test_native_handler_checks():
    table, seg_ptr = [0, 2, 1], [0, 1]
    ok = _call_blocks([0, 2, 3], [0, 1, 2], np.ones(6), 4, 3, table, seg_ptr, 1)
    np.testing.assert_allclose(ok[:, 0], [2, 2, 1, 1])
    with pytest.raises(Exception, match="block height"):
        _call_blocks([0, 2, 3], [0, 1, 2], np.ones(6), 5, 3, table, seg_ptr, 1)  # 5 rows over 2 block rows
    with pytest.raises(Exception, match="block height"):
        _call_blocks([0, 2, 3], [0, 1, 2], np.ones(10), 10, 3, table, seg_ptr, 1)  # R = 5 > MAX_BLOCK_ROWS
    with pytest.raises(Exception, match="values has 5 entries; expected 2 \\* len"):
        _call_blocks([0, 2, 3], [0, 1, 2], np.ones(5), 4, 3, table, seg_ptr, 1)
    with pytest.raises(Exception, match="N = 1"):
        _call_blocks([0, 2, 3], [0, 1, 2], np.ones(6), 4, 3, table, seg_ptr, 1, n=2)
    with pytest.raises(Exception, match="segment table"):
        _call_blocks([0, 2, 3], [0, 1, 2], np.ones(6), 4, 3, [0, 2], seg_ptr, 1)
    # a decreasing indptr and out-of-range positions stay in bounds (clamped ranges: block row 1 is empty)
    out = _call_blocks([0, 3, 1], [0, 1, 2], np.ones(6), 4, 3, table, seg_ptr, 1)
    np.testing.assert_allclose(out[:, 0], [3, 3, 0, 0])
