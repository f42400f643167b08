"""jax_ops.sparse on the GPU: CUDA kernels vs the CPU twin vs a float64 reference, every dispatch path, a
power-law matrix, outputs past 2^31 bytes, and poisoned (NaN-filled, aliased) outputs.

Tests whose name contains `small` are the quick cases.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from helpers import rel_err as _rel
from jax.experimental import sparse as jsparse

import jax_ops
from jax_ops import sparse
from jax_ops._src.sparse import plan as splan

pytestmark = pytest.mark.gpu
TOL = {np.float32: 1e-5, np.float64: 1e-12, np.float16: 2e-3, jnp.bfloat16: 1e-2}


def _gpu():
    return jax.devices("cuda")[0]


def _cpu():
    return jax.devices("cpu")[0]


def _power_law(m, k, seed=0, avg=8, max_len=20000):
    rng = np.random.default_rng(seed)
    lens = np.minimum((rng.pareto(1.3, m) + 1) * avg / 4, max_len).astype(np.int64)
    lens[m // 3] = max_len  # at least one very long row
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = rng.integers(0, k, indptr[-1])
    vals = rng.standard_normal(indptr[-1])
    return sp.csr_matrix((vals, cols, indptr), shape=(m, k))


def _uniform(m, k, per_row, seed=0):
    rng = np.random.default_rng(seed)
    indptr = np.arange(m + 1, dtype=np.int64) * per_row
    cols = np.sort(rng.integers(0, k, (m, per_row)), axis=1).ravel()
    return sp.csr_matrix((rng.standard_normal(m * per_row), cols, indptr), shape=(m, k))


def _bcsr(a, dtype, device):
    a = a.tocsr()
    put = lambda x: jax.device_put(x, device)
    return jsparse.BCSR(
        (
            put(jnp.asarray(a.data, dtype)),
            put(jnp.asarray(a.indices, jnp.int32)),
            put(jnp.asarray(a.indptr, jnp.int32)),
        ),
        shape=a.shape,
    )


def _rounded(a, dtype):
    """float64 matrix of a's values rounded to dtype."""
    a = a.tocsr().copy()
    a.data = np.asarray(
        jnp.asarray(a.data, dtype).astype(jnp.float32) if dtype != np.float64 else a.data, np.float64
    )
    return a


def _dense_in(shape, dtype, device, seed=1):
    x = jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)
    return jax.device_put(x, device), np.asarray(
        x.astype(jnp.float32) if dtype != np.float64 else x, np.float64
    )


def _check_both(a, dtype, algorithm, n, split_chunk=None):
    ref_a = _rounded(a, dtype)
    m, k = a.shape
    results = {}
    for dev in (_gpu(), _cpu()):
        A = _bcsr(a, dtype, dev)
        x, x64 = _dense_in((k,) if n is None else (k, n), dtype, dev)
        u, u64 = _dense_in((m,) if n is None else (m, n), dtype, dev, seed=2)
        pair = sparse.csr_pair(A, algorithm=algorithm, transpose_algorithm=algorithm, split_chunk=split_chunk)
        fwd = jax.jit(lambda p, x: p.matvec(x) if x.ndim == 1 else p.matmat(x))(pair, x)
        bwd = jax.jit(lambda p, u: p.rmatvec(u) if u.ndim == 1 else p.rmatmat(u))(pair, u)
        raw = jax.jit(lambda A, x: sparse.matmul(A, x, algorithm=algorithm, split_chunk=split_chunk))(A, x)
        assert list(fwd.devices())[0] == dev
        results[dev.platform] = (fwd, bwd, raw)
        for out, ref in ((fwd, ref_a @ x64), (bwd, ref_a.T @ u64), (raw, ref_a @ x64)):
            assert _rel(out, ref) < TOL[dtype], (dev.platform, algorithm, n)
    for g, c in zip(results["gpu"], results["cpu"]):
        assert _rel(g, np.asarray(c.astype(jnp.float32) if c.dtype != np.float64 else c)) < 2 * TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, jnp.bfloat16])
@pytest.mark.parametrize("algorithm", sparse.ALGORITHMS)
@pytest.mark.parametrize("n", [None, 3, 8, 32, 130])
def test_small_every_path(dtype, algorithm, n):
    a = _power_law(300, 257, seed=3, max_len=600)
    _check_both(a, dtype, algorithm, n, split_chunk=64)


@pytest.mark.parametrize("algorithm", [None, *sparse.ALGORITHMS])
def test_small_float64(algorithm):
    with jax.enable_x64(True):
        a = _power_law(200, 190, seed=4, max_len=500)
        for n in (None, 4, 33):
            _check_both(a, np.float64, algorithm, n, split_chunk=32)


@pytest.mark.parametrize("n", [None, 8, 32, 128])
def test_power_law_auto_dispatch(n):
    a = _power_law(200_000, 150_000, seed=5, avg=8, max_len=120_000)
    pair = sparse.csr_pair(_bcsr(a, np.float32, _gpu()))
    assert pair.plan.algorithm == "cusparse", pair.profile  # split's rows; N = 1 on cuSPARSE CSR_ALG2
    x, x64 = _dense_in((150_000,) if n is None else (150_000, n), np.float32, _gpu())
    out = jax.jit(lambda p, x: p @ x)(pair, x)
    assert _rel(out, a @ x64) < 1e-5
    u, u64 = _dense_in((200_000,) if n is None else (200_000, n), np.float32, _gpu(), seed=2)
    out = jax.jit(lambda p, u: p.rmatvec(u) if u.ndim == 1 else p.rmatmat(u))(pair, u)
    assert _rel(out, a.T @ u64) < 1e-5


_FIRST_CUSPARSE_USE_IN_GRAPH = """
import jax, jax.numpy as jnp, numpy as np, scipy.sparse as sp
from jax.experimental import sparse as jsparse
from jax_ops import sparse
rng = np.random.default_rng(5)
lens = np.full(3000, 6)
lens[7] = 4000  # a straggler row: the split rule, so the cusparse plan
indptr = np.concatenate([[0], np.cumsum(lens)])
a = sp.csr_matrix((rng.standard_normal(indptr[-1]), rng.integers(0, 2500, indptr[-1]), indptr), shape=(3000, 2500))
f32 = lambda v: jnp.asarray(v, jnp.float32)
pair = sparse.csr_pair(jsparse.BCSR((f32(a.data), jnp.asarray(a.indices), jnp.asarray(a.indptr)), shape=a.shape))
assert pair.plan.algorithm == "cusparse", pair.plan
x = f32(rng.standard_normal(2500))
# 16 dependent products, 8 per loop trip: XLA captures the trip as one CUDA graph, so the first cuSPARSE call of
# this process runs inside a stream capture
step = lambda i, y: pair.matvec(x, alpha=0.5, beta=0.25, y=y)
y = jax.jit(lambda y: jax.lax.fori_loop(0, 16, step, y, unroll=8))(jnp.zeros(3000, jnp.float32))
want = np.zeros(3000)
ref = a.astype(np.float32).astype(np.float64) @ np.asarray(x, np.float64)
for _ in range(16):
    want = 0.5 * ref + 0.25 * want
err = np.linalg.norm(np.asarray(y, np.float64) - want) / np.linalg.norm(want)
assert err < 1e-5, err
print("ok", err)
"""


def test_cusparse_plan_first_call_inside_cuda_graph():
    """Regression: the first cuSPARSE call of a process inside a CUDA-graph capture (XLA command buffer) used to
    fail in cusparseCreate (NOT_INITIALIZED); the handle is now created with the capture mode relaxed. A fresh
    process, so no earlier test has created the handle."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _FIRST_CUSPARSE_USE_IN_GRAPH], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout[-2000:] + run.stderr[-4000:]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_cusparse_plan(dtype):
    """The cusparse plan (N = 1 on cuSPARSE's CSR_ALG2) on a ragged power-law matrix with empty rows: vs float64
    and the CPU twin, alpha/beta/y into the donated output and without y (alpha only), bitwise repeatable, inside
    a jitted fori_loop, and through jax_ops.lsmr (its loop compiled as one CUDA graph with a device-side
    condition) against the CPU twin's solve."""
    with jax.enable_x64(dtype == np.float64):
        a = _power_law(4000, 9000, seed=11, max_len=5000).tolil()
        a[100:140, :] = (
            0  # empty rows (lil sums the duplicate columns: the long row keeps ~3800 > 2048 entries)
        )
        a = a.tocsr()
        ref_a = _rounded(a, dtype)
        pair = sparse.csr_pair(_bcsr(a, dtype, _gpu()))
        assert pair.plan.algorithm == "cusparse"
        x, x64 = _dense_in((9000,), dtype, _gpu())
        y, y64 = _dense_in((4000,), dtype, _gpu(), seed=3)
        f = jax.jit(lambda p, x, y: p.matvec(x, alpha=0.75, beta=-0.5, y=y), donate_argnums=(2,))
        out = f(pair, x, y)
        assert _rel(out, 0.75 * (ref_a @ x64) - 0.5 * y64) < TOL[dtype]
        g = jax.jit(lambda p, x: p.matvec(x, alpha=-2.0))
        first = g(pair, x)
        assert _rel(first, -2.0 * (ref_a @ x64)) < TOL[dtype]
        for _ in range(3):
            assert np.array_equal(np.asarray(g(pair, x)), np.asarray(first))
        cpu = sparse.csr_pair(_bcsr(a, dtype, _cpu()))
        x_cpu = jax.device_put(x, _cpu())
        assert (
            _rel(first, np.asarray(jax.jit(lambda p, x: p.matvec(x, alpha=-2.0))(cpu, x_cpu)))
            < 2 * TOL[dtype]
        )
        # y <- A x / 4 - y / 2, ten times in one while loop
        loop = jax.jit(
            lambda p, x, y: jax.lax.fori_loop(0, 10, lambda i, y: p.matvec(x, alpha=0.25, beta=-0.5, y=y), y)
        )
        want = y64.copy()
        for _ in range(10):
            want = 0.25 * (ref_a @ x64) - 0.5 * want
        assert _rel(loop(pair, x, _dense_in((4000,), dtype, _gpu(), seed=3)[0]), want) < 4 * TOL[dtype]
        b = jax.device_put(jnp.asarray(ref_a @ np.ones(9000), dtype), _gpu())
        sol = jax_ops.lsmr(pair, b, atol=1e-5, btol=1e-5, maxiter=300)
        sol_cpu = jax_ops.lsmr(cpu, jax.device_put(b, _cpu()), atol=1e-5, btol=1e-5, maxiter=300)
        assert int(sol.istop) == int(sol_cpu.istop) and abs(int(sol.itn) - int(sol_cpu.itn)) <= max(
            2, int(sol_cpu.itn) // 50
        )
        b64 = np.asarray(b, np.float64)

        def residual(s):
            return np.linalg.norm(ref_a @ np.asarray(s.x, np.float64) - b64) / np.linalg.norm(b64)

        # This matrix loses orthogonality within the first 40 iterations, after which the iterates follow the
        # rounding of the products and norms: on the CPU twin alone, the fused loop and the "step" loop (other
        # summation orders) give x 9e-4 apart after 40 iterations in float64 and residuals 1.68e-3 vs 1.66e-3 at
        # the end. H200 vs the CPU twin (the fused loop's fixed trees vs compensated sums): float32 2.43e-3 vs
        # 2.63e-3, float64 1.64e-3 vs 1.68e-3. A wrong product would not stay within these bounds.
        r_gpu, r_cpu = residual(sol), residual(sol_cpu)
        assert r_gpu < 1e-2 and abs(r_gpu - r_cpu) <= (0.2 if dtype == np.float32 else 0.1) * r_cpu


def test_small_poisoned_aliased_output():
    # The output buffer is y itself (donated and aliased to the kernel's result), so an element the kernel
    # failed to write would keep y's value instead of the fused result: the reference check catches it.
    a = _power_law(3000, 2000, seed=6, max_len=3000)
    for alg in sparse.ALGORITHMS:
        pair = sparse.csr_pair(
            _bcsr(a, np.float32, _gpu()), algorithm=alg, transpose_algorithm=alg, split_chunk=256
        )
        for n in (None, 16):
            x, x64 = _dense_in((2000,) if n is None else (2000, n), np.float32, _gpu())
            y, y64 = _dense_in((3000,) if n is None else (3000, n), np.float32, _gpu(), seed=9)
            f = jax.jit(
                lambda p, x, y: p.matvec(x, beta=-0.5, y=y) if x.ndim == 1 else p.matmat(x, beta=-0.5, y=y),
                donate_argnums=(2,),
            )
            out = f(pair, x, y)
            assert _rel(out, a @ x64 - 0.5 * y64) < 1e-5, alg
            # NaN in a column of B that no entry references must not leak; NaN where referenced must show up
            # only in the rows referencing it.
            if n is None:
                xb = np.array(x64, np.float32)
                unused = np.setdiff1d(np.arange(2000), a.indices)
                if unused.size:
                    xb[unused] = np.nan
                    out = jax.jit(lambda p, x: p.matvec(x))(pair, jax.device_put(jnp.asarray(xb), _gpu()))
                    assert np.all(np.isfinite(np.asarray(out)))


def test_output_past_2_31_bytes():
    # SpMM whose dense output exceeds 2^31 bytes: M * N * 4 = 2^21 * 300 * 4 > 2^31.
    m, k, n = 1 << 21, 4096, 300
    a = _uniform(m, k, 2, seed=7)
    A = _bcsr(a, np.float32, _gpu())
    B, B64 = _dense_in((k, n), np.float32, _gpu())
    out = jax.jit(sparse.matmul)(A, B)
    assert out.shape == (m, n) and out.size * 4 > 2**31
    # check the last rows (64-bit output offsets) and a sample of rows exactly
    rows = np.concatenate([np.arange(16), np.arange(m - 16, m), np.random.default_rng(0).integers(0, m, 64)])
    got = np.asarray(out[jnp.asarray(rows)], np.float64)
    ref = a[rows] @ B64
    assert np.all(np.isfinite(got)) and np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-5
    assert np.all(np.isfinite(np.asarray(jnp.sum(out, axis=1))))


def test_vmap_matvec_runs_spmm_on_gpu():
    a = _uniform(5000, 4000, 9, seed=8)
    pair = sparse.csr_pair(_bcsr(a, np.float32, _gpu()))
    X, X64 = _dense_in((16, 4000), np.float32, _gpu())
    f = jax.jit(jax.vmap(pair.matvec))
    assert "f32[5000,16]" in str(jax.make_jaxpr(jax.vmap(pair.matvec))(X))
    assert _rel(f(X), (a @ X64.T).T) < 1e-5
    U, U64 = _dense_in((16, 5000), np.float32, _gpu(), seed=3)
    assert _rel(jax.jit(jax.vmap(pair.rmatvec))(U), (a.T @ U64.T).T) < 1e-5


def test_small_spmm_of_few_long_rows():
    # CSR(Aᵀ) of a tall matrix (24 rows of ~1200 nnz): N > 1 products take the split plan (spmm_takes_split) on
    # the GPU too; with alpha/beta/y, without, and vmap of rmatvec, against float64.
    a = sp.random(
        3000, 24, density=0.4, format="csr", random_state=np.random.default_rng(4), dtype=np.float64
    )
    pair = sparse.csr_pair(_bcsr(a, np.float32, _gpu()))
    assert sparse.spmm_takes_split(pair.plan_t, 24, pair.nnz, 16, 4)
    U, U64 = _dense_in((3000, 16), np.float32, _gpu())
    Y, Y64 = _dense_in((24, 16), np.float32, _gpu(), seed=2)
    al, be = jnp.linspace(-1.0, 1.0, 16), jnp.linspace(2.0, 0.0, 16)
    out = jax.jit(lambda p, U, Y: p.rmatmat(U, alpha=al, beta=be, y=Y))(pair, U, Y)
    assert _rel(out, (a.T @ U64) * np.asarray(al) + Y64 * np.asarray(be)) < 1e-5
    assert _rel(jax.jit(lambda p, U: p.rmatmat(U))(pair, U), a.T @ U64) < 1e-5
    assert _rel(jax.jit(jax.vmap(pair.rmatvec))(U.T), (a.T @ U64).T) < 1e-5


@pytest.mark.parametrize("avg", [20, 80, 150, 400])
def test_small_spmm_slots(avg):
    """The 16-byte SpMM (slots) kernel at every slot count (rows averaging 20 / 80 / 150 / 400 nnz: S = 1, 2, 4,
    8 at G = 4), column tiles with an idle lane (N = 12 f32, 24 f16), two column tiles (N = 256 f32), every dtype,
    with alpha/beta/y, against float64 and the CPU twin; bitwise repeatable."""
    a = sp.random(
        97, 1000, density=avg / 1000, format="csr", random_state=np.random.default_rng(avg), dtype=np.float64
    )
    assert splan._spmm_slots(a.nnz / a.shape[0], 4) == {20: 1, 80: 2, 150: 4, 400: 8}[avg]
    for dtype, n in (
        (np.float32, 16),
        (np.float32, 12),
        (np.float32, 256),
        (np.float16, 24),
        (jnp.bfloat16, 16),
    ):
        _check_both(a, dtype, None, n)
    with jax.enable_x64(True):
        _check_both(a, np.float64, None, 16)
    pair = sparse.csr_pair(_bcsr(a, np.float32, _gpu()))
    B, B64 = _dense_in((1000, 16), np.float32, _gpu())
    Y, Y64 = _dense_in((97, 16), np.float32, _gpu(), seed=2)
    al, be = jnp.linspace(-1.0, 1.0, 16), jnp.linspace(2.0, 0.0, 16)
    f = jax.jit(lambda p, B, Y: p.matmat(B, alpha=al, beta=be, y=Y))
    out = f(pair, B, Y)
    assert _rel(out, (a @ B64) * np.asarray(al) + Y64 * np.asarray(be)) < 1e-5
    assert np.array_equal(np.asarray(f(pair, B, Y)), np.asarray(out))


def test_small_deterministic():
    a = _power_law(5000, 5000, seed=9, max_len=4000)
    pair = sparse.csr_pair(_bcsr(a, np.float32, _gpu()), split_chunk=256)
    x, _ = _dense_in((5000, 8), np.float32, _gpu())
    f = jax.jit(lambda p, x: p.matmat(x))
    first = np.asarray(f(pair, x))
    for _ in range(3):
        assert np.array_equal(np.asarray(f(pair, x)), first)


def test_grad_on_gpu():
    a = _uniform(300, 200, 5, seed=10)
    A = _bcsr(a, np.float32, _gpu())
    x, x64 = _dense_in((200, 4), np.float32, _gpu())
    gx = jax.jit(jax.grad(lambda x: jnp.sum(sparse.matmul(A, x) ** 2)))(x)
    assert _rel(gx, 2 * a.T @ (a @ x64)) < 1e-5


# ----------------------------------------------------------------------------- column-slab Aᵀu (CSRPair.rmatvec)
def _slab_ragged():
    """5003 x 37: m not a multiple of W = 836 or of 4, rows 836..1671 empty (an empty slab), columns 3 and 17
    unused (empty Aᵀ rows)."""
    rng = np.random.default_rng(11)
    lens = np.where((np.arange(5003) >= 836) & (np.arange(5003) < 1672), 0, 1 + rng.integers(0, 9, 5003))
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = rng.integers(0, 35, int(indptr[-1]))
    cols = np.where(cols >= 3, cols + 1, cols)
    cols = np.where(cols >= 17, cols + 1, cols)  # never 3 or 17
    a = sp.csr_matrix((rng.standard_normal(int(indptr[-1])), cols, indptr), shape=(5003, 37))
    a.sum_duplicates()
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_slabs_ragged(dtype):
    # Forced slabs of width 836 (J = 6) vs the CSR(Aᵀ) kernel, the CPU twin and float64; the output is y itself
    # (donated, aliased), so an unwritten element would keep y's value. NaN in u where no entry reads it (the empty
    # slab) must not leak.
    with (
        jax.enable_x64(dtype == np.float64),
        sparse.overrides(slab_smem_bytes=836 * np.dtype(dtype).itemsize),
    ):
        a = _slab_ragged()
        ref_a = _rounded(a, dtype)
        outs = {}
        for where, dev in (("gpu", _gpu()), ("cpu", _cpu())):
            for slabs in (True, False):
                pair = sparse.csr_pair(_bcsr(a, dtype, dev), slabs=slabs)
                assert (pair.slabs_t is not None) == slabs
                if slabs:
                    assert pair.slabs_t.plan.slabs == 6
                u, u64 = _dense_in((5003,), dtype, dev)
                y, y64 = _dense_in((37,), dtype, dev, seed=9)
                f = jax.jit(lambda p, u, y: p.rmatvec(u, alpha=0.75, beta=-0.5, y=y), donate_argnums=(2,))
                out = f(pair, u, y)
                assert _rel(out, 0.75 * (ref_a.T @ u64) - 0.5 * y64) < TOL[dtype], (dev, slabs)
                outs[where, slabs] = np.asarray(out)
                assert _rel(jax.jit(lambda p, u: p.rmatvec(u))(pair, u), ref_a.T @ u64) < TOL[dtype]
                ub = np.array(u64, dtype)
                ub[836:1672] = np.nan
                out = jax.jit(lambda p, u: p.rmatvec(u))(pair, jax.device_put(jnp.asarray(ub), dev))
                assert np.all(np.isfinite(np.asarray(out)))
        assert _rel(outs["gpu", True], outs["cpu", True]) < TOL[dtype]
        assert _rel(outs["gpu", True], outs["gpu", False]) < TOL[dtype]


def test_small_slab_width_shrinks_then_grows():
    # The slab kernel's shared memory follows W (one instantiation here: G = 32). A call with a smaller W after a
    # larger one must not lower the kernel's opt-in under the larger one's next launch (SetDynamicSmemOnce keeps
    # the largest size per device and kernel).
    for m in (28_000, 5_000, 28_000):
        a = sp.random(m, 40, density=0.1, format="csr", random_state=m, dtype=np.float64)
        pair = sparse.csr_pair(_bcsr(a, np.float32, _gpu()), slabs=True)
        assert pair.slabs_t.plan.group == 32 and pair.slabs_t.plan.slabs == 1, pair.slabs_t.plan
        u, u64 = _dense_in((m,), np.float32, _gpu())
        assert _rel(pair.rmatvec(u), _rounded(a, np.float32).T @ u64) < TOL[np.float32]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_slabs_vs_csr_lsq(dtype):
    # The 306136 x 6177 LSQ matrix of the bench (~18/row): the predicate picks slabs; slabs vs CSR(Aᵀ) vs float64,
    # with the fused epilogue into an aliased y, deterministic run to run, and vmap (folds into the CSR SpMM).
    from jax_ops.bench.sparse import gen_lsq

    with jax.enable_x64(dtype == np.float64):
        indptr, cols, vals, shape = gen_lsq(306_136, 6_177, 18)
        a = sp.csr_matrix((vals.astype(np.float64), cols, indptr), shape=shape)
        ref_a = _rounded(a, dtype)
        pair = sparse.csr_pair(_bcsr(a, dtype, _gpu()))
        assert pair.slabs_t is not None, sparse.slab_model(6_177, 306_136, a.nnz, np.dtype(dtype).itemsize)
        assert pair.slabs_t.plan.group == (8 if dtype == np.float32 else 4), pair.slabs_t.plan
        plain = sparse.csr_pair(_bcsr(a, dtype, _gpu()), slabs=False)
        u, u64 = _dense_in((306_136,), dtype, _gpu())
        f = jax.jit(lambda p, u: p.rmatvec(u))
        out = f(pair, u)
        assert _rel(out, ref_a.T @ u64) < TOL[dtype]
        assert _rel(out, f(plain, u)) < TOL[dtype]
        first = np.asarray(out)
        for _ in range(3):
            assert np.array_equal(np.asarray(f(pair, u)), first)
        y, y64 = _dense_in((6_177,), dtype, _gpu(), seed=9)
        g = jax.jit(lambda p, u, y: p.rmatvec_axpby(u, y, -2.0), donate_argnums=(2,))
        assert _rel(g(pair, u, y), ref_a.T @ u64 - 2.0 * y64) < TOL[dtype]
        U, U64 = _dense_in((2, 306_136), dtype, _gpu(), seed=3)
        assert _rel(jax.jit(jax.vmap(pair.rmatvec))(U), (ref_a.T @ U64.T).T) < TOL[dtype]


# ------------------------------------------------------------------------------------- the segmented plan
def _row_classes(seed=12):
    """Ragged CSR(Aᵀ)-like rows in contiguous classes: 2500 rows of ~300 (G = 32), 3000 of ~100 (G = 8), 9000
    short ones (0..11, empty rows included, G = 1) with one huge row, then 700 rows of ~40 (G = 4)."""
    rng = np.random.default_rng(seed)
    lens = np.concatenate(
        [
            250 + rng.integers(0, 101, 2500),
            90 + rng.integers(0, 21, 3000),
            rng.integers(0, 12, 9000),
            30 + rng.integers(0, 21, 700),
        ]
    )
    lens[8000] = 30000
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = rng.integers(0, 7000, indptr[-1])
    return sp.csr_matrix((rng.standard_normal(indptr[-1]), cols, indptr), shape=(lens.size, 7000))


def _check_matvec_poisoned(a, dtype, make_pair, lanes):
    """N = 1 products of make_pair(BCSR on each device) on ragged row classes: GPU vs the CPU twin and float64 with
    alpha/beta/y, then into the donated y (aliased: an unwritten row keeps y's value), vmap of one column, bitwise
    repeatable on the GPU. lanes(pair): the lane counts of the plan's segment table (must cover 1, 4, 8, 32)."""
    with jax.enable_x64(dtype == np.float64):
        ref_a = _rounded(a, dtype)
        m, k = a.shape
        outs = {}
        for dev in (_gpu(), _cpu()):
            pair = make_pair(_bcsr(a, dtype, dev))
            assert {int(g) for g in lanes(pair)} >= {1, 4, 8, 32}
            x, x64 = _dense_in((k,), dtype, dev)
            y, y64 = _dense_in((m,), dtype, dev, seed=3)
            f = jax.jit(lambda p, x, y: p.matvec(x, alpha=0.75, beta=-0.5, y=y))
            out = f(pair, x, y)
            assert _rel(out, 0.75 * (ref_a @ x64) - 0.5 * y64) < TOL[dtype]
            g = jax.jit(lambda p, x, y: p.matvec(x, beta=-0.5, y=y), donate_argnums=(2,))
            y2, _ = _dense_in((m,), dtype, dev, seed=3)
            assert _rel(g(pair, x, y2), ref_a @ x64 - 0.5 * y64) < TOL[dtype]
            assert _rel(jax.vmap(pair.matvec)(x[None])[0], ref_a @ x64) < TOL[dtype]
            outs[dev.platform] = np.asarray(out.astype(jnp.float32) if dtype != np.float64 else out)
            if dev.platform == "gpu":
                for _ in range(3):  # deterministic
                    assert np.array_equal(np.asarray(f(pair, x, y)), np.asarray(out))
        assert _rel(outs["gpu"], outs["cpu"]) < 2 * TOL[dtype]


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, jnp.bfloat16])
def test_small_segmented_poisoned(dtype):
    """segmented forced (1024-row chunks: several G per launch) on the ragged classes (_check_matvec_poisoned)."""

    def lanes(pair):
        assert pair.plan.algorithm == "segmented"
        return np.asarray(pair.long_rows)[2::3]

    make = lambda A: sparse.csr_pair(A, algorithm="segmented", split_chunk=1024)  # noqa: E731
    _check_matvec_poisoned(_row_classes(), dtype, make, lanes)


@pytest.mark.parametrize(
    "dtype, n",
    [
        (np.float32, 16),
        (np.float32, 12),
        (np.float32, 256),
        (np.float16, 8),
        (jnp.bfloat16, 32),
        (np.float64, 16),
    ],
)
def test_small_segmented_spmm(dtype, n):
    """N > 1 on the segmented plan (the per-segment slots kernel on the 16-byte path): the ragged classes at
    1024-row chunks give segments whose averages pick S = 8, 4, 2 and 1 (f32 N = 16: G = 4), with an idle column
    lane (N = 12), two column tiles (N = 256), every dtype; vs float64 and the CPU twin, then alpha/beta/y into
    the donated (aliased, poisoned-by-y) output, bitwise repeatable."""
    with jax.enable_x64(dtype == np.float64):
        a = _row_classes()
        _check_both(a, dtype, "segmented", n, split_chunk=1024)
        ref_a = _rounded(a, dtype)
        m, k = a.shape
        pair = sparse.csr_pair(_bcsr(a, dtype, _gpu()), algorithm="segmented", split_chunk=1024)
        assert pair.plan.algorithm == "segmented"
        B, B64 = _dense_in((k, n), dtype, _gpu())
        Y, Y64 = _dense_in((m, n), dtype, _gpu(), seed=3)
        al, be = jnp.linspace(-1.0, 1.0, n), jnp.linspace(2.0, 0.0, n)
        f = jax.jit(lambda p, B, Y: p.matmat(B, alpha=al, beta=be, y=Y), donate_argnums=(2,))
        out = f(pair, B, Y)
        assert _rel(out, (ref_a @ B64) * np.asarray(al) + Y64 * np.asarray(be)) < TOL[dtype]
        Y2, _ = _dense_in((m, n), dtype, _gpu(), seed=3)
        assert np.array_equal(np.asarray(f(pair, B, Y2)), np.asarray(out))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_segmented_auto(dtype):
    """The auto rule's case (one 4096-row chunk of rows of 300, then short rows): dispatched segmented; matvec and
    the transposed product vs float64 and the CPU twin."""
    with jax.enable_x64(dtype == np.float64):
        rng = np.random.default_rng(5)
        lens = np.concatenate([250 + rng.integers(0, 101, 4096), rng.integers(0, 11, 50_000)])
        indptr = np.concatenate([[0], np.cumsum(lens)])
        a = sp.csr_matrix(
            (rng.standard_normal(indptr[-1]), rng.integers(0, 3000, indptr[-1]), indptr),
            shape=(lens.size, 3000),
        )
        ref_a = _rounded(a, dtype)
        outs = {}
        for dev in (_gpu(), _cpu()):
            pair = sparse.csr_pair(_bcsr(a, dtype, dev))
            assert pair.plan.algorithm == "segmented"
            x, x64 = _dense_in((a.shape[1],), dtype, dev)
            out = jax.jit(lambda p, x: p.matvec(x))(pair, x)
            assert _rel(out, ref_a @ x64) < TOL[dtype]
            outs[dev.platform] = np.asarray(out)
        assert _rel(outs["gpu"], outs["cpu"]) < 2 * TOL[dtype]


@functools.cache
def _blocked_classes(r, seed=13):
    """Row blocks of r rows sharing a column list, in contiguous classes of block-row length, each filling the
    4096-block-row chunks of the segment table: ~300 positions (32 lanes), ~100 (8), 0..11 (1; empty ones
    included), ~40 (4), then a ragged tail of 777 short block rows."""
    rng = np.random.default_rng(seed)
    c = 4096
    blen = np.concatenate(
        [250 + rng.integers(0, 101, c), 90 + rng.integers(0, 21, c), rng.integers(0, 12, 2 * c)]
        + [30 + rng.integers(0, 21, c), rng.integers(0, 12, 777)]
    )
    k = 5000
    cols = [np.sort(rng.choice(k, size=n, replace=False)) for n in blen]
    rows = np.concatenate([np.full(c.size, b * r + i) for b, c in enumerate(cols) for i in range(r)])
    cc = np.concatenate([c for c in cols for _ in range(r)])
    return sp.csr_matrix((rng.standard_normal(rows.size), (rows, cc)), shape=(blen.size * r, k))


@pytest.mark.parametrize("r", [2, 3, 4])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, jnp.bfloat16])
def test_small_blocks_poisoned(dtype, r):
    """The blocks form (blocks=True) on ragged block-row classes, several lane counts in one launch
    (_check_matvec_poisoned)."""

    def lanes(pair):
        assert pair.blocks is not None and pair.blocks.plan.rows == r
        return np.asarray(pair.blocks.seg_table)[2::3]

    _check_matvec_poisoned(_blocked_classes(r), dtype, lambda A: sparse.csr_pair(A, blocks=True), lanes)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocks_bundle_auto(dtype):
    """The auto rule on a bundle-adjustment Jacobian (200k observations): Aᵀ in blocks of 3 rows (cameras and
    points), A on CSR; Aᵀu, its gradient (A x) and Aᵀ U with 16 columns (CSR) vs float64 and the CPU twin."""
    from jax_ops.bench.sparse import gen_bundle_adjustment

    with jax.enable_x64(dtype == np.float64):
        ip, ix, v, shape = gen_bundle_adjustment(200_000, 2_000, 60_000)
        a = sp.csr_matrix((v, ix, ip), shape=shape)
        ref_a = _rounded(a, dtype)
        outs = {}
        for dev in (_gpu(), _cpu()):
            pair = sparse.csr_pair(_bcsr(a, dtype, dev))
            assert pair.blocks is None and pair.blocks_t is not None and pair.blocks_t.plan.rows == 3
            u, u64 = _dense_in((shape[0],), dtype, dev, seed=4)
            x, x64 = _dense_in((shape[1],), dtype, dev, seed=5)
            atu = jax.jit(lambda p, u: p.rmatvec(u))(pair, u)
            assert _rel(atu, ref_a.T @ u64) < TOL[dtype]
            gu = jax.jit(jax.grad(lambda u, p, x: jnp.sum(p.rmatvec(u) * x)))(u, pair, x)  # A x
            assert _rel(gu, ref_a @ x64) < TOL[dtype]
            U, U64 = _dense_in((shape[0], 16), dtype, dev, seed=6)  # LSMR's 16-RHS Aᵀ U: the CSR SpMM
            atU = jax.jit(lambda p, U: p.rmatmat(U))(pair, U)
            assert _rel(atU, ref_a.T @ U64) < TOL[dtype]
            outs[dev.platform] = (np.asarray(atu), np.asarray(gu), np.asarray(atU))
        for g_, c_ in zip(outs["gpu"], outs["cpu"]):
            assert _rel(g_, c_) < 2 * TOL[dtype]
