"""jax_ops.sparse.row_sharded (RowShardedCSR) on the 8 fake CPU devices of tests/conftest.py: A x and Aᵀ u for
vectors and SpMM against float64 NumPy, uneven row counts, empty rows and long rows, both balances, mesh shapes
1x8, 2x4 and 8x1, gradients w.r.t. the dense operand and the values (vs the single-device product), the compiled
collectives (A x none, Aᵀ u one all-reduce or one reduce-scatter), the per-shard functions inside a hand-written
shard_map, and the errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from csr_helpers import bcsr
from helpers import rel_err
from jax.experimental import sparse as jsparse
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops import sparse

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
# (mesh shape, the axis the rows split over)
MESHES = [((1, 8), "y"), ((2, 4), "y"), ((2, 4), ("x", "y")), ((2, 4), "x"), ((8, 1), "x")]


def mesh_of(shape) -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(shape), ("x", "y"))


def matrix(m=45, k=24, seed=0, long_row=None, density=0.2) -> sp.csr_matrix:
    """Random CSR with a band of empty rows, an empty last row and empty columns (float64 values)."""
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, random_state=rng, format="lil", dtype=np.float64)
    a[5:14, :] = 0
    a[m - 1, :] = 0
    a[:, 3] = 0
    if long_row is not None:
        a[long_row, :] = rng.standard_normal(k)
    a = a.tocsr()
    a.eliminate_zeros()
    a.data = rng.standard_normal(a.nnz)
    a.sort_indices()
    return a


def dense(rng, shape, dtype=np.float32):
    return jnp.asarray(rng.standard_normal(shape), dtype)


def f64(x) -> np.ndarray:
    return (
        np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64) if x.dtype != np.float64 else np.asarray(x)
    )


def collectives(f, *args) -> dict[str, int]:
    hlo = jax.jit(f).lower(*args).compile().as_text()
    lines = [line.split("=", 1)[1] for line in hlo.splitlines() if "=" in line]
    return {op: sum(line.lstrip().count(f" {op}(") for line in lines) for op in COLLECTIVES}


def only(**counts) -> dict[str, int]:
    return {op: counts.get(op.replace("-", "_"), 0) for op in COLLECTIVES}


@pytest.mark.parametrize("mesh_axis", MESHES, ids=lambda v: str(v))
@pytest.mark.parametrize("balance", ["rows", "nnz"])
@pytest.mark.parametrize("n", [None, 1, 3, 32])
def test_products_match_float64(mesh_axis, balance, n):
    shape, axis = mesh_axis
    a = matrix()
    A = sparse.row_sharded(bcsr(a, np.float32), mesh_of(shape), axis, balance=balance, implementation="ffi")
    d = f64(bcsr(a, np.float32).todense())
    rng = np.random.default_rng(1)
    x = dense(rng, (24,) if n is None else (24, n))
    u = dense(rng, (45,) if n is None else (45, n))
    y = jax.jit(lambda A, x: A @ x)(A, x)
    assert y.shape == (A.padded_rows,) + (() if n is None else (n,))
    assert rel_err(A.unpad_rows(y), d @ f64(x)) < 1e-5
    padding = np.asarray(y)[np.asarray(A.pad_rows(jnp.ones(45))) == 0]
    assert not padding.any()  # the shard layout's padding rows are zero
    z = jax.jit(lambda A, u: A.T @ A.pad_rows(u))(A, u)
    assert z.shape == (24,) + (() if n is None else (n,))
    assert rel_err(z, d.T @ f64(u)) < 1e-5
    if n is not None:  # dense @ sparse: U [N, M] @ A
        assert rel_err(jax.jit(lambda A, u: u.T @ A)(A, u), f64(u).T @ d) < 1e-5


@pytest.mark.parametrize("algorithm", [None, "split", "warp"])
def test_long_rows_and_plans(algorithm):
    """A row longer than the split threshold on one shard only: every shard's long-row list padded to one length
    (the auto rule picks split for a 2100-entry row among ~20-entry ones)."""
    k = 2100
    a = matrix(m=70, k=k, seed=2, long_row=3, density=0.01)
    A = sparse.row_sharded(
        bcsr(a, np.float32), mesh_of((2, 4)), "y", algorithm=algorithm, transpose_algorithm=algorithm,
        split_chunk=16 if algorithm == "split" else None, implementation="ffi",
    )  # fmt: skip
    assert A.plan.algorithm == (algorithm or "split")
    if A.plan.algorithm == "split":
        assert A.plan.units > 0 and A.long_rows.shape == (4, A.long_ptr.shape[1] - 1)
    d = f64(bcsr(a, np.float32).todense())
    rng = np.random.default_rng(3)
    for n in (None, 5):
        x, u = dense(rng, (k,) if n is None else (k, n)), dense(rng, (70,) if n is None else (70, n))
        assert rel_err(A.unpad_rows(A @ x), d @ f64(x)) < 1e-5
        assert rel_err(A.T @ u, d.T @ f64(u)) < 1e-5


@pytest.mark.parametrize("dtype", [jnp.bfloat16, np.float16])
def test_half_types(dtype):
    a = matrix(seed=4)
    A = sparse.row_sharded(bcsr(a, dtype), mesh_of((2, 4)), ("x", "y"), implementation="ffi")
    d = f64(bcsr(a, dtype).todense())
    rng = np.random.default_rng(5)
    x, u = dense(rng, (24, 3), dtype), dense(rng, (45, 3), dtype)
    bound = 1e-2 if dtype == jnp.bfloat16 else 2e-3
    assert rel_err(A.unpad_rows(A @ x), d @ f64(x)) < bound
    assert rel_err(A.T @ u, d.T @ f64(u)) < bound


def test_float64(x64):
    a = matrix(seed=6)
    A = sparse.row_sharded(bcsr(a, np.float64), mesh_of((8, 1)), "x", balance="nnz", implementation="ffi")
    rng = np.random.default_rng(7)
    x, u = dense(rng, (24, 3), np.float64), dense(rng, (45,), np.float64)
    assert rel_err(A.unpad_rows(A @ x), a.toarray() @ np.asarray(x)) < 1e-12
    assert rel_err(A.T @ u, a.toarray().T @ np.asarray(u)) < 1e-12


def test_inputs_bcoo_scipy_pair_and_the_xla_path():
    a = matrix(seed=8)
    rng = np.random.default_rng(9)
    x, u = dense(rng, (24,)), dense(rng, (45,))
    d = a.astype(np.float32).toarray().astype(np.float64)
    mesh = mesh_of((2, 4))
    sources = [
        jsparse.BCOO.from_scipy_sparse(a.astype(np.float32)),
        a.astype(np.float32),
        sparse.csr_pair(bcsr(a, np.float32)),
    ]
    for source in sources:
        for impl in ("ffi", "xla"):
            A = sparse.row_sharded(source, mesh, "y", implementation=impl)
            assert rel_err(A.unpad_rows(A @ x), d @ f64(x)) < 1e-5
            assert rel_err(u @ A, d.T @ f64(u)) < 1e-5


@pytest.mark.parametrize("mesh_axis", MESHES[1:3], ids=lambda v: str(v))
def test_grads_match_single_device(mesh_axis):
    """d/dx of A x, d/du of Aᵀ u, and d/d values of both (through the build) against the single-device CSRPair."""
    shape, axis = mesh_axis
    a = matrix(seed=10)
    B = bcsr(a, np.float32)
    mesh = mesh_of(shape)
    rng = np.random.default_rng(11)
    x, u = dense(rng, (24, 3)), dense(rng, (45, 3))

    def loss(build, data, x, u):
        M = build(jsparse.BCSR((data, B.indices, B.indptr), shape=B.shape))
        y = M @ x
        y = M.unpad_rows(y) if isinstance(M, sparse.RowShardedCSR) else y
        z = M.T @ (M.pad_rows(u) if isinstance(M, sparse.RowShardedCSR) else u)
        return jnp.sum(jnp.sin(y)) + jnp.sum(jnp.cos(z) * z)

    def sharded(M):
        return sparse.row_sharded(M, mesh, axis, balance="nnz", implementation="ffi")

    def single(M):
        return sparse.csr_pair(M, implementation="ffi")

    g = jax.grad(lambda *xs: loss(sharded, *xs), argnums=(0, 1, 2))(B.data, x, u)
    g_ref = jax.grad(lambda *xs: loss(single, *xs), argnums=(0, 1, 2))(B.data, x, u)
    for gs, gr in zip(g, g_ref):
        assert rel_err(gs, gr) < 1e-5
    # under jit, the matrix built outside: gradients w.r.t. the dense operands and the stacked value leaves
    A, pair = sharded(B), single(B)

    def dense_loss(M, pad):
        return lambda x, u: jnp.sum(jnp.sin(M @ x)) + jnp.sum(jnp.sin(M.T @ pad(u)))

    g = jax.jit(jax.grad(dense_loss(A, A.pad_rows), (0, 1)))(x, u)
    g_ref = jax.grad(dense_loss(pair, lambda u: u), (0, 1))(x, u)
    for gs, gr in zip(g, g_ref):
        assert rel_err(gs, gr) < 1e-5
    gA = jax.jit(jax.grad(lambda A: jnp.sum(jnp.sin(A @ x)), allow_int=True))(A)
    gv = np.asarray(gA.values)
    gv_ref = np.asarray(
        jax.grad(lambda d: jnp.sum(jnp.sin(jsparse.BCSR((d, B.indices, B.indptr), shape=B.shape) @ x)))(
            B.data
        )
    )
    ip, starts = np.asarray(B.indptr), A.row_starts
    for s in range(A.shards):  # shard s stores A's entries indptr[starts[s]] .. indptr[starts[s+1]] in order
        lo, hi = ip[starts[s]], ip[starts[s + 1]]
        if hi > lo:
            assert rel_err(gv[s, : hi - lo], gv_ref[lo:hi]) < 1e-5
        assert not gv[s, hi - lo :].any()


@pytest.mark.parametrize("mesh_axis", MESHES, ids=lambda v: str(v))
def test_compiled_collectives(mesh_axis):
    """A x: no collective, forward; Aᵀ u: one all-reduce (scatter=True: one reduce-scatter); no all-gather."""
    shape, axis = mesh_axis
    mesh = mesh_of(shape)
    a = matrix(m=48, seed=12)
    A = sparse.row_sharded(bcsr(a, np.float32), mesh, axis, implementation="ffi")
    rng = np.random.default_rng(13)
    x = dense(rng, (24, 32))
    u = jax.device_put(A.pad_rows(dense(rng, (48, 32))), NamedSharding(mesh, A.spec))
    one = A.shards > 1
    assert collectives(lambda A, x: A @ x, A, x) == only()
    assert collectives(lambda A, u: A.T @ u, A, u) == (only(all_reduce=1) if one else only())
    assert collectives(lambda A, u: A.rmatmat(u, scatter=True), A, u) == (
        only(reduce_scatter=1) if one else only()
    )
    z = A.rmatmat(u, scatter=True)
    assert z.sharding.is_equivalent_to(NamedSharding(mesh, A.spec), 2)
    assert rel_err(z, f64(bcsr(a, np.float32).todense()).T @ f64(u[:48])) < 1e-5
    # backward of A x w.r.t. the replicated x: the shards' Aᵀ g partials summed once
    grad_x = jax.grad(lambda x: jnp.sum(jnp.sin(A @ x)))
    assert collectives(grad_x, x) == (only(all_reduce=1) if one else only())
    # backward of Aᵀ u w.r.t. the row-sharded u: local
    assert collectives(jax.grad(lambda u: jnp.sum(jnp.sin(A.T @ u))), u) == (
        only(all_reduce=1) if one else only()
    )  # the forward's psum; its transpose is local


def test_inside_a_hand_written_shard_map():
    """local_matmul / local_rmatmul on each shard's block: rows over x, SpMM columns over y (2x4), an LSMR-like
    step u = A v - u, v = Aᵀ u, and its gradient."""
    mesh = mesh_of((2, 4))
    a = matrix(m=46, seed=14)
    A = sparse.row_sharded(bcsr(a, np.float32), mesh, "x", implementation="ffi")
    d = f64(bcsr(a, np.float32).todense())
    rng = np.random.default_rng(15)
    V, U = dense(rng, (24, 8)), A.pad_rows(dense(rng, (46, 8)))

    def step(A_blk, v, u):
        assert A_blk.local().shape == (A.rows_per_shard, 24)
        u = A_blk.local_matmul(v) - u  # this shard's rows, no communication
        return u, A_blk.local_rmatmul(u)  # Aᵀ u: local product + psum over x

    f = jax.jit(
        jax.shard_map(
            step,
            mesh=mesh,
            in_specs=(A.spec, P(None, "y"), P("x", "y")),
            out_specs=(P("x", "y"), P(None, "y")),
        )
    )
    u2, v2 = f(A, V, U)
    u_ref = f64(A.pad_rows(jnp.asarray(d @ f64(V), jnp.float32))) - f64(U)  # padding rows: 0 - U's zeros
    assert rel_err(u2, u_ref) < 1e-5
    assert rel_err(v2, d.T @ f64(A.unpad_rows(u_ref))) < 1e-5
    hlo = collectives(f, A, V, U)
    assert hlo == only(all_reduce=1)
    g = jax.jit(jax.grad(lambda v: jnp.sum(jnp.sin(f(A, v, U)[1]))))(V)
    ref = jax.grad(lambda v: jnp.sum(jnp.sin(d.T @ (d @ v - f64(A.unpad_rows(U))))))(f64(V))
    assert rel_err(g, ref) < 1e-5


def test_pad_and_unpad_rows():
    a = matrix(seed=16)
    for balance in ("rows", "nnz"):
        A = sparse.row_sharded(bcsr(a, np.float32), mesh_of((2, 4)), ("x", "y"), balance=balance)
        u = dense(np.random.default_rng(17), (45, 2))
        padded = A.pad_rows(u)
        assert padded.shape == (A.padded_rows, 2)
        assert np.array_equal(A.unpad_rows(padded), u)
        assert float(jnp.abs(padded).sum()) == pytest.approx(float(jnp.abs(u).sum()), rel=1e-6)
    assert "RowShardedCSR(shape=(45, 24)" in repr(A) and A.T.shape == (24, 45)


def test_bad_inputs():
    a = matrix(seed=18)
    B = bcsr(a, np.float32)
    mesh = mesh_of((2, 4))
    with pytest.raises(ValueError, match="axis must name axes"):
        sparse.row_sharded(B, mesh, "z")
    with pytest.raises(TypeError, match="mesh must be"):
        sparse.row_sharded(B, None, "x")
    with pytest.raises(ValueError, match="balance"):
        sparse.row_sharded(B, mesh, "x", balance="cols")
    with pytest.raises(ValueError, match="algorithm must be one of"):
        sparse.row_sharded(B, mesh, "x", algorithm="segmented")
    with pytest.raises(ValueError, match="implementation"):
        sparse.row_sharded(B, mesh, "x", implementation="cuda")
    with pytest.raises(ValueError, match="concrete index arrays"):
        jax.jit(
            lambda ip: sparse.row_sharded(jsparse.BCSR((B.data, B.indices, ip), shape=B.shape), mesh, "x")
        )(B.indptr)
    with pytest.raises(ValueError, match="2-D BCOO"):
        sparse.row_sharded(jsparse.BCOO.fromdense(jnp.ones((2, 3, 3)), n_batch=1), mesh, "x")
    A = sparse.row_sharded(B, mesh, "y")
    with pytest.raises(ValueError, match="x has shape"):
        A @ jnp.ones((23,))
    with pytest.raises(TypeError, match="dtype float16"):
        A @ jnp.ones((24,), jnp.float16)
    with pytest.raises(TypeError, match="x must be an array"):
        A.matvec([1.0] * 24)
    with pytest.raises(ValueError, match="x must be a vector"):
        A.matvec(jnp.ones((24, 2)))
    with pytest.raises(ValueError, match="Aᵀ needs M = 45 rows or the shard layout's 48"):
        A.T @ jnp.ones((46,))
    with pytest.raises(ValueError, match="divisible"):
        sparse.row_sharded(bcsr(matrix(k=25, seed=18), np.float32), mesh, "y").rmatvec(
            jnp.ones((45,)), scatter=True
        )
    with pytest.raises(ValueError, match="scatter applies to Aᵀ u"):
        A.matvec(jnp.ones((24,)), scatter=True)
    with pytest.raises(ValueError, match="inside jax.shard_map"):
        A.local()
    with pytest.raises(ValueError, match="u has 44 rows"):
        A.pad_rows(jnp.ones((44,)))
