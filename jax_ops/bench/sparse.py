"""Suite ``sparse``: CSR SpMV / Aᵀu / SpMM (N = 8, 32, 128) of jax_ops.sparse (through a CSRPair) against
CuPy/cuSPARSE (``cupyx.scipy.sparse``, timed with CUDA events), ``jax.experimental.sparse`` BCSR and BCOO
(default lowering, and with ``jax_bcoo_cusparse_lowering``). Missing anchors are reported as skipped.

Matrices (seeded, generated with vectorised numpy): uniform random 2M x 2M 16/row; power-law rows 1M x 1M
(Pareto lengths, max 200k); 2-D 5-point Poisson 2048^2; 3-D 7-point Poisson 128^3; tall least-squares
306136 x 6177 (~18/row) and 936063 x 23394 (~21/row); a bundle-adjustment Jacobian (2 rows per observation,
9 camera + 3 point columns; 1M observations, and 2M x 1.38M as in issue 22); R-MAT scale 20; a 27-point
stencil 96^3; banded random 4M x 4M. ``--quick`` uses small versions (CPU-friendly).

Bytes counted (effective GB/s): values + column indices + indptr + one read of the dense operand + one write of
the output: nnz*(sizeof(T)+4) + (M+1)*4 + K*N*sizeof(T) + M*N*sizeof(T). ``frac_copy`` divides by the measured
copy bandwidth. ``speedup`` = the row's time / the CSRPair product's time for the same case (an anchor > 1:
jax_ops faster). Rows besides the CSRPair product: ``sparse.matmul`` on the plain BCSR and on a BCOO with
``indices_sorted`` (the profile-free plans), cuSPARSE on an explicit CSR(Aᵀ) built once (the Aᵀu anchor) and
CuPy's implicit ``A.T @ u``, and the build times (host-profiled pair, pair under jit, CuPy ``A.T.tocsr()`` + one
SpMV).
"""

from __future__ import annotations

import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from jax_ops import sparse
from jax_ops._src.sparse import formats as sparse_formats
from jax_ops.bench.harness import compiled_temp_bytes, time_call, time_loop


# --------------------------------------------------------------------------------------------- generators
def _csr(indptr, cols, rng, m, k):
    vals = rng.uniform(-1.0, 1.0, cols.size).astype(np.float32)
    return np.asarray(indptr, np.int32), np.asarray(cols, np.int32), vals, (m, k)


def gen_uniform(m, k, per_row, seed=0):
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.integers(0, k, (m, per_row), dtype=np.int32), axis=1).ravel()
    return _csr(np.arange(m + 1, dtype=np.int64) * per_row, cols, rng, m, k)


def gen_power_law(m, k, seed=1, scale=4.0, shape=1.2, max_len=200_000):
    rng = np.random.default_rng(seed)
    lens = np.minimum((rng.pareto(shape, m) + 1.0) * scale, max_len).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = rng.integers(0, k, int(indptr[-1]), dtype=np.int32)
    return _csr(indptr, cols, rng, m, k)


def gen_poisson(shape):
    """5-point (2-D) or 7-point (3-D) Laplacian on a grid, rows in grid order, columns sorted."""
    rng = np.random.default_rng(2)
    dims = np.asarray(shape)
    n = int(np.prod(dims))
    idx = np.arange(n, dtype=np.int64)
    coords = np.stack(np.unravel_index(idx, shape), 1)
    strides = np.array([int(np.prod(dims[i + 1 :])) for i in range(len(dims))], np.int64)
    offsets = []
    for axis in range(len(dims)):
        for d in (-1, 1):
            offsets.append((axis, d))
    cols_all, valid_all = [], []
    stencil = sorted(offsets, key=lambda o: o[1] * strides[o[0]])
    neg = [o for o in stencil if o[1] * strides[o[0]] < 0]
    pos = [o for o in stencil if o[1] * strides[o[0]] > 0]
    for axis, d in neg:
        c = coords[:, axis] + d
        valid_all.append((c >= 0) & (c < dims[axis]))
        cols_all.append(idx + d * strides[axis])
    valid_all.append(np.ones(n, bool))
    cols_all.append(idx)
    for axis, d in pos:
        c = coords[:, axis] + d
        valid_all.append((c >= 0) & (c < dims[axis]))
        cols_all.append(idx + d * strides[axis])
    valid = np.stack(valid_all, 1)
    cols = np.stack(cols_all, 1)[valid]
    indptr = np.concatenate([[0], np.cumsum(valid.sum(1))])
    return _csr(indptr, cols, rng, n, n)


def gen_lsq(m, k, avg, seed=3):
    rng = np.random.default_rng(seed)
    lens = np.clip(rng.poisson(avg, m), 1, k).astype(np.int64)
    indptr = np.concatenate([[0], np.cumsum(lens)])
    cols = rng.integers(0, k, int(indptr[-1]), dtype=np.int32)
    return _csr(indptr, cols, rng, m, k)


def gen_bundle_adjustment(n_obs, n_cams, n_pts, seed=4):
    """2 residual rows per observation; each row touches 9 camera and 3 point columns."""
    rng = np.random.default_rng(seed)
    cam = rng.integers(0, n_cams, n_obs)
    pt = rng.integers(0, n_pts, n_obs)
    cols_obs = np.concatenate(
        [cam[:, None] * 9 + np.arange(9), n_cams * 9 + pt[:, None] * 3 + np.arange(3)], 1
    )
    cols = np.repeat(cols_obs, 2, axis=0).ravel()
    m = 2 * n_obs
    return _csr(np.arange(m + 1, dtype=np.int64) * 12, cols, rng, m, n_cams * 9 + n_pts * 3)


def gen_rmat(scale, edge_factor=16, probs=(0.57, 0.19, 0.19), seed=5):
    """R-MAT (Graph500 Kronecker) graph with 2^scale vertices and edge_factor * 2^scale edges: each edge picks a
    quadrant per bit with probabilities a, b, c (d the rest); vertices relabelled by a random permutation;
    duplicate edges dropped. Scale 20: 16.1M nnz, longest row ~40k, ~0.5M empty rows."""
    rng = np.random.default_rng(seed)
    n = 1 << scale
    e = n * edge_factor
    a, b, c = probs
    row = np.zeros(e, np.int64)
    col = np.zeros(e, np.int64)
    for bit in range(scale):
        u = rng.random(e, np.float32)
        row |= (u >= a + b).astype(np.int64) << bit  # quadrants c, d
        col |= (((u >= a) & (u < a + b)) | (u >= a + b + c)).astype(np.int64) << bit  # quadrants b, d
    perm = rng.permutation(n)
    key = np.unique(perm[row] * n + perm[col])
    row, col = key // n, key % n
    indptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=n))])
    return _csr(indptr, col, rng, n, n)


def gen_stencil27(side):
    """27-point stencil on a side^3 grid (every neighbour within one step along each axis), columns sorted."""
    rng = np.random.default_rng(6)
    n = side**3
    idx = np.arange(n, dtype=np.int64)
    z, y, x = np.unravel_index(idx, (side, side, side))
    cols, valid = [], []
    for dz in (-1, 0, 1):
        for dy in (-1, 0, 1):
            for dx in (-1, 0, 1):  # in this order the column index increases
                ok = (z + dz >= 0) & (z + dz < side) & (y + dy >= 0) & (y + dy < side) & (x + dx >= 0)
                valid.append(ok & (x + dx < side))
                cols.append(idx + (dz * side + dy) * side + dx)
    valid = np.stack(valid, 1)
    indptr = np.concatenate([[0], np.cumsum(valid.sum(1))])
    return _csr(indptr, np.stack(cols, 1)[valid], rng, n, n)


def gen_banded(n, per_row=8, half_width=64, seed=7):
    """Banded random: row r holds per_row random columns within [r - half_width, r + half_width] (clipped to the
    matrix), duplicates dropped (~7.8 per row at the defaults; 4M rows: ~31M nnz)."""
    rng = np.random.default_rng(seed)
    r = np.arange(n, dtype=np.int64)[:, None]
    cols = np.clip(r + rng.integers(-half_width, half_width + 1, (n, per_row)), 0, n - 1)
    cols.sort(axis=1)
    keep = np.ones(cols.shape, bool)
    keep[:, 1:] = cols[:, 1:] != cols[:, :-1]
    indptr = np.concatenate([[0], np.cumsum(keep.sum(1))])
    return _csr(indptr, cols[keep], rng, n, n)


def cases(quick: bool):
    if quick:
        return [
            ("uniform 20k 16/row", lambda: gen_uniform(20_000, 20_000, 16), True),
            ("power-law 20k", lambda: gen_power_law(20_000, 20_000, max_len=5_000), False),
            ("poisson2d 128^2", lambda: gen_poisson((128, 128)), True),
            ("poisson3d 24^3", lambda: gen_poisson((24, 24, 24)), False),
            ("lsq 30613x617", lambda: gen_lsq(30_613, 617, 18), False),
            ("bundle-adj 5k obs", lambda: gen_bundle_adjustment(5_000, 50, 1_500), False),
            ("rmat scale 12", lambda: gen_rmat(12), False),
            ("stencil27 16^3", lambda: gen_stencil27(16), False),
            ("banded 40k", lambda: gen_banded(40_000), False),
        ]
    return [
        ("uniform 2M 16/row", lambda: gen_uniform(2_000_000, 2_000_000, 16), True),
        ("power-law 1M", lambda: gen_power_law(1_000_000, 1_000_000), False),
        ("poisson2d 2048^2", lambda: gen_poisson((2048, 2048)), True),
        ("poisson3d 128^3", lambda: gen_poisson((128, 128, 128)), False),
        ("lsq 306136x6177", lambda: gen_lsq(306_136, 6_177, 18), False),
        ("lsq 936063x23394", lambda: gen_lsq(936_063, 23_394, 21), False),
        ("bundle-adj 1M obs", lambda: gen_bundle_adjustment(1_000_000, 20_000, 250_000), False),
        ("rmat scale 20", lambda: gen_rmat(20), False),
        ("stencil27 96^3", lambda: gen_stencil27(96), False),
        ("bundle-adj 2Mx1.38M", lambda: gen_bundle_adjustment(1_000_000, 20_000, 400_000), False),
        ("banded 4M", lambda: gen_banded(4_000_000), False),
    ]


# ------------------------------------------------------------------------------------------------ timing
def _bytes(nnz, m, k, n, itemsize):
    return nnz * (itemsize + 4) + (m + 1) * 4 + (k + m) * n * itemsize


def _kick(carry, out):
    """Feeds one element of the result back into the carry (a data dependency XLA cannot hoist)."""
    val = jnp.tanh(out.reshape(-1)[0].astype(jnp.float32)).astype(carry.dtype)
    return carry.at[(0,) * carry.ndim].set(val)


def _time_jax(product, carry, operand, *, quick):
    def step(c, op):
        return _kick(c, product(op, c))

    return time_loop(step, carry, operand, min_seconds=0.02 if quick else 0.05, repeats=3 if quick else 5)


def _cupy_anchor():
    try:
        import cupy  # noqa: F401
        import cupyx.scipy.sparse  # noqa: F401

        return True
    except Exception:  # noqa: BLE001 - missing or broken CuPy: anchor skipped
        return False


def _time_cupy(fn, reps):
    import cupy

    for _ in range(3):
        fn()
    times = []
    for _ in range(3):
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) * 1e-3 / reps)
    return statistics.median(times)


_BUILD_JIT = jax.jit(sparse.csr_pair)


def _cupy_build_row(indptr, indices, vals, m, k, np_dtype) -> dict:
    """What a CuPy user pays for the pair: A.T.tocsr() on the device plus one SpMV (wall clock, synchronised)."""
    try:
        import cupy
        import cupyx.scipy.sparse as csp

        ac = csp.csr_matrix(
            (cupy.asarray(vals.astype(np_dtype)), cupy.asarray(indices), cupy.asarray(indptr)), shape=(m, k)
        )
        xc = cupy.ones((k,), np_dtype)
        dev = cupy.cuda.Device()

        def build():
            at = ac.T.tocsr()
            y = ac @ xc
            dev.synchronize()
            del at, y

        t = time_call(build, min_seconds=0.0, repeats=3)
        return {"op": "build", "N": 0, "impl": "CuPy A.T.tocsr() + one SpMV", "time_us": t * 1e6}
    except Exception as e:  # noqa: BLE001
        note = f"skipped: {type(e).__name__}: {str(e)[:80]}"
        return {"op": "build", "N": 0, "impl": "CuPy A.T.tocsr() + one SpMV", "time_us": None, "note": note}


# ---------------------------------------------------------------------------------------------------- run
def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    quick = ctx.quick
    have_cupy = on_gpu and _cupy_anchor()
    ns = [8, 32, 128]
    rows: list[dict] = []
    all_cases = [c for c in cases(quick) if ctx.selected(c[0])]
    progress = ctx.progress(len(all_cases), "sparse", rows)
    for name, gen, extra_dtypes in all_cases:
        t0 = time.perf_counter()
        indptr, indices, vals, (m, k) = gen()
        gen_s = time.perf_counter() - t0
        nnz = int(indices.size)
        dtypes = [jnp.float32]
        if extra_dtypes:
            dtypes += [jnp.bfloat16] + ([jnp.float64] if jax.config.jax_enable_x64 else [])
        for dtype in dtypes:
            itemsize = jnp.dtype(dtype).itemsize
            dname = jnp.dtype(dtype).name
            A = jsparse.BCSR(
                (jnp.asarray(vals, dtype), jnp.asarray(indices), jnp.asarray(indptr)), shape=(m, k)
            )
            # the whole pair: CSR(Aᵀ), the host profiles and, where the predicate says so, the column slabs
            t_build = time_call(lambda A=A: sparse.csr_pair(A), min_seconds=0.0, repeats=3)
            t_transpose = time_call(
                lambda A=A, m=m, k=k: sparse_formats._transpose_csr(A.indptr, A.indices, A.data, m, k),
                min_seconds=0.0,
                repeats=3,
            )
            # the same build inside jit: no host profile (the profile-free plans), no slabs or blocks
            t_build_jit = time_call(lambda A=A: _BUILD_JIT(A), min_seconds=0.0, repeats=3)
            pair = sparse.csr_pair(A)
            prof = pair.profile
            base = {"case": name, "dtype": dname, "M": m, "K": k, "nnz": nnz}
            rows.append(
                {
                    **base,
                    "op": "build",
                    "N": 0,
                    "impl": "jax_ops CSRPair build (incl. host profile, column slabs, row blocks)",
                    "time_us": t_build * 1e6,
                    "note": f"transpose sort alone {t_transpose * 1e6:.0f} us; "
                    f"generation {gen_s:.1f} s; profile avg={prof.avg:.1f} p95={prof.p95:.0f} "
                    f"max={prof.max} cv={prof.cv:.2f}; plan {pair.plan.algorithm}/{pair.plan.group}, "
                    f"plan_t {pair.plan_t.algorithm}/{pair.plan_t.group}; "
                    + (
                        f"ATu by column slabs J={pair.slabs_t.plan.slabs} W={pair.slabs_t.plan.width} "
                        f"G={pair.slabs_t.plan.group}"
                        if pair.slabs_t is not None
                        else "no column slabs"
                    )
                    + "".join(
                        f"; {op} by row blocks R={b.plan.rows}"
                        for op, b in (("Ax", pair.blocks), ("ATu", pair.blocks_t))
                        if b is not None
                    ),
                }
            )
            rows.append(
                {
                    **base,
                    "op": "build",
                    "N": 0,
                    "impl": "jax_ops CSRPair build under jit (no profile)",
                    "time_us": t_build_jit * 1e6,
                    "note": "compiled once; the device transpose sort and the long-row lists",
                }
            )
            if have_cupy and dtype != jnp.bfloat16:
                rows.append({**base, **_cupy_build_row(indptr, indices, vals, m, k, np.dtype(dtype))})
            ops = [("Ax", None), ("ATu", None)] + ([("AB", n) for n in ns] if dtype == jnp.float32 else [])
            for op, n in ops:
                rows.extend(
                    _bench_op(
                        ctx,
                        base,
                        op,
                        n,
                        dtype,
                        itemsize,
                        A,
                        pair,
                        indptr,
                        indices,
                        vals,
                        m,
                        k,
                        nnz,
                        have_cupy,
                        quick,
                    )
                )
            del A, pair
        progress.step(name)
    rows.extend(_summary(rows))
    return rows


def _bench_op(ctx, base, op, n, dtype, itemsize, A, pair, indptr, indices, vals, m, k, nnz, have_cupy, quick):
    transpose = op == "ATu"
    rows_out, cols_in = (k, m) if transpose else (m, k)
    shape = (cols_in,) if n is None else (cols_in, n)
    x = jax.random.normal(jax.random.key(1), shape, jnp.float32).astype(dtype)
    nbytes = _bytes(nnz, rows_out, cols_in, 1 if n is None else n, itemsize)
    times: dict[str, float | None] = {}
    notes: dict[str, str] = {}

    # jax_ops through the CSRPair
    if transpose:
        prod = lambda p, v: p.rmatvec(v)
    else:
        prod = (lambda p, v: p.matvec(v)) if n is None else (lambda p, v: p.matmat(v))
    times["jax_ops"] = _time_jax(prod, x, pair, quick=quick)
    temp = compiled_temp_bytes(prod, pair, x)
    plan = (pair.plan_t if transpose else pair.plan).algorithm
    blocks = pair.blocks_t if transpose else pair.blocks
    if n is None and blocks is not None:
        plan = f"row blocks R={blocks.plan.rows}"
    elif transpose and n is None and pair.slabs_t is not None:
        plan = f"column slabs G={pair.slabs_t.plan.group}"
    notes["jax_ops"] = f"plan {plan}; temp {temp} B"

    # jax_ops.sparse.matmul on the plain matrices (no profile: the profile-free plans), A x and A B only (a plain
    # Aᵀ u sorts a transpose per call); the BCOO with indices_sorted, so no sort per call either
    if not transpose:
        plain = {"jax_ops matmul(BCSR)": A}
        if n is None:
            plain["jax_ops matmul(BCOO sorted)"] = jsparse.BCOO(
                (A.data, A.to_bcoo().indices), shape=A.shape, indices_sorted=True, unique_indices=True
            )
        for impl, mat in plain.items():
            times[impl] = _time_jax(lambda a, v: sparse.matmul(a, v), x, mat, quick=quick)
            notes[impl] = f"vs the CSRPair {times[impl] / times['jax_ops']:.2f}x its time (target <= 1.25)"
    # jax.experimental.sparse BCSR (default lowering)
    if not transpose:
        try:
            times["jax BCSR"] = _time_jax(lambda a, v: a @ v, x, A, quick=quick)
        except Exception as e:  # noqa: BLE001
            times["jax BCSR"], notes["jax BCSR"] = None, f"skipped: {type(e).__name__}: {str(e)[:80]}"
    # BCOO default and with the cuSPARSE lowering: only SpMV/Aᵀu (the default lowering materialises nnz x N)
    if n is None:
        coo = A.to_bcoo()
        coo_op = (lambda a, v: v @ a) if transpose else (lambda a, v: a @ v)
        try:
            times["jax BCOO"] = _time_jax(coo_op, x, coo, quick=quick)
        except Exception as e:  # noqa: BLE001
            times["jax BCOO"], notes["jax BCOO"] = None, f"skipped: {type(e).__name__}: {str(e)[:80]}"
        if jax.default_backend() == "gpu":
            try:
                old = jax.config.jax_bcoo_cusparse_lowering
                jax.config.update("jax_bcoo_cusparse_lowering", True)
                try:
                    times["jax BCOO cusparse"] = _time_jax(coo_op, x, coo, quick=quick)
                finally:
                    jax.config.update("jax_bcoo_cusparse_lowering", old)
            except Exception as e:  # noqa: BLE001
                times["jax BCOO cusparse"] = None
                notes["jax BCOO cusparse"] = f"skipped: {type(e).__name__}: {str(e)[:80]}"
        else:
            times["jax BCOO cusparse"], notes["jax BCOO cusparse"] = None, "skipped: no GPU"
    # CuPy / cuSPARSE
    if have_cupy and dtype != jnp.bfloat16:
        try:
            import cupy
            import cupyx.scipy.sparse as csp

            np_dtype = np.dtype(dtype)
            ac = csp.csr_matrix(
                (cupy.asarray(vals.astype(np_dtype)), cupy.asarray(indices), cupy.asarray(indptr)),
                shape=(m, k),
            )
            xc = cupy.asarray(np.asarray(x.astype(jnp.float32)).astype(np_dtype))
            reps = 20 if nbytes > 2e9 else 100
            if transpose:
                # the anchor that counts: cuSPARSE on an explicit CSR(Aᵀ), built once (what CSRPair does too);
                # CuPy's A.T @ u (a transposed product on CSR(A)) is reported beside it
                at = ac.T.tocsr()
                times["cuSPARSE (CuPy)"] = _time_cupy(lambda: at @ xc, reps)
                notes["cuSPARSE (CuPy)"] = "explicit CSR(A^T) built once (A.T.tocsr())"
                act = ac.T
                times["cuSPARSE (CuPy) implicit A.T"] = _time_cupy(lambda: act @ xc, reps)
                notes["cuSPARSE (CuPy) implicit A.T"] = "A.T @ u on CSR(A) (a transposed product)"
                del at, act
            else:
                times["cuSPARSE (CuPy)"] = _time_cupy(lambda: ac @ xc, reps)
            del ac, xc
        except Exception as e:  # noqa: BLE001
            times["cuSPARSE (CuPy)"], notes["cuSPARSE (CuPy)"] = (
                None,
                f"skipped: {type(e).__name__}: {str(e)[:80]}",
            )
    else:
        times["cuSPARSE (CuPy)"] = None
        notes["cuSPARSE (CuPy)"] = "skipped: " + (
            "no bf16 in cuSPARSE via CuPy"
            if dtype == jnp.bfloat16 and have_cupy
            else "CuPy not installed or no GPU"
        )
    out = []
    ours = times["jax_ops"]
    for impl, t in times.items():
        row = {
            **base,
            "op": op,
            "N": 1 if n is None else n,
            "impl": impl,
            "time_us": None if t is None else t * 1e6,
        }
        if t is not None:
            gbps = nbytes / t / 1e9
            row.update({"GB/s": gbps, "frac_copy": gbps / ctx.ceilings.copy_gbps, "speedup": t / ours})
        if impl in notes:
            row["note"] = notes[impl]
        out.append(row)
    return out


def _summary(rows):
    """Geomean of jax_ops' speedup over each anchor per op kind (f32), and the Aᵀu / Ax time ratio."""
    out = []
    anchors = sorted({r["impl"] for r in rows if r.get("op") != "build" and r["impl"] != "jax_ops"})
    for op in ("Ax", "ATu", "AB"):
        for anchor in anchors:
            s = [
                r["speedup"]
                for r in rows
                if r.get("op") == op
                and r["impl"] == anchor
                and r.get("speedup")
                and r.get("dtype") == "float32"
            ]
            if s:
                out.append(
                    {
                        "case": "summary",
                        "op": op,
                        "impl": anchor,
                        "time_us": None,
                        "speedup": math.exp(sum(math.log(v) for v in s) / len(s)),
                        "note": f"geomean over {len(s)} cases, min {min(s):.2f}",
                    }
                )
    ratios = []
    for r in rows:
        if r.get("op") == "ATu" and r["impl"] == "jax_ops" and r.get("time_us"):
            ax = next(
                (
                    q
                    for q in rows
                    if q.get("op") == "Ax"
                    and q["impl"] == "jax_ops"
                    and q["case"] == r["case"]
                    and q["dtype"] == r["dtype"]
                ),
                None,
            )
            if ax and ax.get("time_us"):
                ratios.append(r["time_us"] / ax["time_us"])
    if ratios:
        out.append(
            {
                "case": "summary",
                "op": "ATu/Ax",
                "impl": "jax_ops",
                "time_us": None,
                "note": f"time ratio max {max(ratios):.2f}, geomean "
                f"{math.exp(sum(math.log(v) for v in ratios) / len(ratios)):.2f}",
            }
        )
    return out
