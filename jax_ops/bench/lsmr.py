"""Suite ``lsmr``: whole LSMR solves (float32) on generated problems shaped like the 8kv/11kv reconstruction
inputs and like a bundle-adjustment Jacobian, against CuPy, lineax and SciPy.

Rows per problem (``case``):
  * ``jax_ops``: one right-hand side. ``time_us`` is the median solve (compile excluded; ``compile_s`` reported
    apart), with ``itn``, ``istop``, ``us_per_iter`` and ``x_floor`` = time per iteration / (A v + A^T u time),
    the pair's matvec+rmatvec timed with ``time_loop`` (``spmv_pair_us``).
  * ``jax_ops x16``: 16 right-hand sides through ``jax.vmap`` (one block solve, SpMM per half-step);
    ``vs_one`` = its time / the single solve.
  * ``cupy`` (``cupyx.scipy.sparse.linalg.lsmr``, float32 throughout), ``lineax`` (``lineax.LSMR`` on a
    ``FunctionLinearOperator`` whose matvec is a BCSR product, the matrix passed as a jit argument; its
    ``compile_s`` apart; tolerances mapped so its tests 1-2 are SciPy's), ``scipy`` (every problem, iterations
    capped by a time budget: compare ``us_per_iter``; ``note`` says when capped).
    Their rows carry ``ours_vs`` = our solve time / theirs (time per iteration for a capped SciPy run) and
    ``x_floor`` = their time per iteration / our (A v + A^T u) time, the same floor as ours.
Targets (docs/lsmr.md): ours_vs <= 0.15 (CuPy), <= 0.3 (lineax); x_floor <= 1.5; compile_s < 5; vs_one <= 4.

Problems: rows with a fixed number of random nonzeros (~ the 8kv/11kv row density), values N(0, 1), columns
scaled by a permuted logspace and a right-hand side consistent with the unscaled unknowns plus 10 % noise (see
``_build``), so that LSMR needs ~3000 iterations (float32, atol = btol = 1e-6) like the design notes' anchor.
"""

from __future__ import annotations

import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops.bench.harness import time_call, time_loop

_TOL = dict(atol=1e-6, btol=1e-6)


@dataclasses.dataclass
class Problem:
    name: str
    m: int
    n: int
    nnz_per_row: int
    colscale: float  # log10 of the column-scale spread
    maxiter: int
    kind: str = "random"  # or "ba" (bundle adjustment)
    cameras: int = 0
    points: int = 0
    noise: float = 0.1  # relative size of the inconsistent part of b (see _build)


def _problems(quick: bool, on_gpu: bool) -> list[Problem]:
    if quick or not on_gpu:
        return [
            Problem("8kv-like/100", 30_614, 618, 18, 2.0, 3000),
            Problem("ba-like small", 0, 0, 12, 1.0, 5000, kind="ba", cameras=50, points=2_000),
        ]
    # Spreads chosen so SciPy's lsmr (float32, atol = btol = 1e-6) needs 3022 / 3042 / 2797 iterations on these
    # exact matrices (seed 0), like the design notes' anchor problem (3275); see docs/lsmr.md.
    return [
        Problem("8kv-like 306136x6177", 306_136, 6_177, 18, 3.0, 10_000),
        Problem("11kv-like 936063x23394", 936_063, 23_394, 21, 3.0, 10_000),
        Problem("ba-like 1Mx618k", 0, 0, 12, 1.5, 10_000, kind="ba", cameras=2_000, points=200_000),
    ]


def _build(p: Problem, seed: int = 0):
    """(scipy.sparse CSR float32, b float32) for the problem (seeded, vectorised).

    ``A = A0 diag(s)``: ``A0`` has N(0, 1) values on the problem's sparsity pattern, ``s`` is a permuted
    ``logspace(0, colscale)`` (a column-scaling spread like badly chosen units). ``b = A0 x0 + e`` with
    ``x0 ~ N(0, I)`` and noise ``e`` of relative size ``noise``: the data are consistent with the *unscaled*
    unknowns, so in terms of A's singular vectors b has comparable components everywhere, the small singular
    values included, and LSMR must resolve all of them (thousands of iterations, as the design notes' anchor
    problem needed). With a plain random b instead, the components along small singular values hardly enter
    ``||A^T r|| / (||A|| ||r||)`` and the count saturates near 1300 whatever the spread.
    """
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    if p.kind == "ba":
        obs = p.points * 5 // 2  # each point seen by ~2.5 cameras
        n = 9 * p.cameras + 3 * p.points
        cam = rng.integers(0, p.cameras, obs)
        pt = rng.integers(0, p.points, obs)
        rows = np.repeat(np.arange(2 * obs), 12)
        cols_obs = np.concatenate(
            [9 * cam[:, None] + np.arange(9), 9 * p.cameras + 3 * pt[:, None] + np.arange(3)], axis=1
        )  # [obs, 12]
        cols = np.repeat(cols_obs, 2, axis=0).reshape(-1)
        m = 2 * obs
    else:
        m, n = p.m, p.n
        rows = np.repeat(np.arange(m), p.nnz_per_row)
        cols = rng.integers(0, n, m * p.nnz_per_row)
    vals = rng.standard_normal(rows.shape[0])
    a0 = sp.csr_matrix((vals, (rows, cols)), shape=(m, n))  # duplicates summed
    b = a0 @ rng.standard_normal(n)
    b += p.noise * np.linalg.norm(b) / np.sqrt(m) * rng.standard_normal(m)
    scale = np.logspace(0, p.colscale, n)[rng.permutation(n)]
    a = sp.csr_matrix(a0 @ sp.diags(scale), dtype=np.float32)
    return a, b.astype(np.float32)


def _operator(a):
    """Our operator: jax_ops.sparse.CSRPair when the sparse family is present, else BCSR (XLA products)."""
    from jax.experimental import sparse

    try:
        from jax_ops.sparse import CSRPair
    except ImportError:
        return sparse.BCOO.from_scipy_sparse(a), "BCOO (no jax_ops.sparse)"
    return CSRPair.from_matrix(sparse.BCSR.from_scipy_sparse(a)), "CSRPair"


def _spmv_pair_seconds(op) -> float:
    """Seconds for one A v followed by one A^T u (the two products of an LSMR iteration)."""
    n = op.shape[1]

    def step(v, op_):
        if hasattr(op_, "rmatvec"):
            return op_.rmatvec(op_.matvec(v)) * jnp.float32(1e-3)
        return (op_.T @ (op_ @ v)) * jnp.float32(1e-3)

    return time_loop(step, jnp.ones((n,), jnp.float32), op, min_seconds=0.05, repeats=3)


def _ours(p, op, b, rows, case, ctx):
    import jax_ops
    from jax_ops import lsmr_solver

    maxiter = p.maxiter

    def solve(op_, b_):
        return jax_ops.lsmr(op_, b_, maxiter=maxiter, **_TOL)

    # The bench jits around lsmr, so it passes the options a top-level lsmr call compiles with (the loop as one
    # CUDA graph on a GPU; docs/lsmr.md).
    options = lsmr_solver.LOOP_COMPILER_OPTIONS if jax.default_backend() == "gpu" else None
    bj = jnp.asarray(b)
    t0 = time.perf_counter()
    compiled = jax.jit(solve).lower(op, bj).compile(compiler_options=options)
    compile_s = time.perf_counter() - t0
    out = jax.block_until_ready(compiled(op, bj))
    t = time_call(lambda: compiled(op, bj), min_seconds=0.0, repeats=3)
    itn, istop = int(out.itn), int(out.istop)
    pair = _spmv_pair_seconds(op)
    per_iter = t / max(itn, 1)
    row = {
        "case": case, "impl": "jax_ops", "time_us": t * 1e6, "itn": itn, "istop": istop,
        "us_per_iter": per_iter * 1e6, "spmv_pair_us": pair * 1e6, "x_floor": per_iter / pair,
        "compile_s": compile_s,
    }  # fmt: skip
    rows.append(row)

    k = 16
    bs = jnp.asarray(np.random.default_rng(1).standard_normal((k, b.shape[0])).astype(np.float32))
    bs = bs.at[0].set(bj)
    t0 = time.perf_counter()
    compiled16 = jax.jit(jax.vmap(solve, in_axes=(None, 0))).lower(op, bs).compile(compiler_options=options)
    compile16 = time.perf_counter() - t0
    out16 = jax.block_until_ready(compiled16(op, bs))
    t16 = time_call(lambda: compiled16(op, bs), min_seconds=0.0, repeats=3)
    itn16 = int(np.max(np.asarray(out16.itn)))
    rows.append(
        {
            "case": case, "impl": f"jax_ops x{k}", "time_us": t16 * 1e6, "itn": itn16,
            "istop": int(np.asarray(out16.istop)[0]), "us_per_iter": t16 / max(itn16, 1) * 1e6,
            "vs_one": t16 / t, "compile_s": compile16,
        }
    )  # fmt: skip
    return t, itn, pair


def _floor(per_iter_s: float, pair_s: float) -> float | None:
    return per_iter_s / pair_s if pair_s > 0 else None


def _unavailable(case: str, impl: str, what: str, e: Exception) -> dict:
    """The row of an anchor that could not run: ``what`` is "skipped" (not importable) or "failed"."""
    return {"case": case, "impl": impl, "time_us": None, "note": f"{what}: {type(e).__name__}: {e}"[:120]}


def _cupy_row(p, a, b, case, t_ours, pair):
    try:
        import cupy
        import cupyx.scipy.sparse as csp
        from cupyx.scipy.sparse.linalg import lsmr as cupy_lsmr
    except Exception as e:  # noqa: BLE001 - any import failure means the anchor is unavailable
        return _unavailable(case, "cupy", "skipped", e)
    try:
        a_gpu = csp.csr_matrix(a)
        b_gpu = cupy.asarray(b)
        x0 = cupy.zeros(a.shape[1], cupy.float32)  # keeps CuPy in float32

        def run():
            out = cupy_lsmr(a_gpu, b_gpu, x0=x0, maxiter=p.maxiter, **_TOL)
            cupy.cuda.get_current_stream().synchronize()
            return out

        out = run()
        t = time_call(run, min_seconds=0.0, repeats=3)
        itn = int(out[2])
        return {
            "case": case, "impl": "cupy", "time_us": t * 1e6, "itn": itn, "istop": int(out[1]),
            "us_per_iter": t / max(itn, 1) * 1e6, "x_floor": _floor(t / max(itn, 1), pair), "ours_vs": t_ours / t,
        }  # fmt: skip
    except Exception as e:  # noqa: BLE001
        return _unavailable(case, "cupy", "failed", e)


def _lineax_row(p, a, b, case, t_ours, pair):
    try:
        import lineax as lx
        from jax.experimental import sparse
    except Exception as e:  # noqa: BLE001
        return _unavailable(case, "lineax", "skipped", e)
    try:
        bcsr = sparse.BCSR.from_scipy_sparse(a)
        m, n = a.shape
        # lineax stops when ||r|| < atol + rtol (||A|| ||x|| + ||b||) (istop 1) or ||A^T r|| < atol +
        # rtol ||A|| ||r|| (istop 2): with atol = 0 and rtol = SciPy's atol = btol these are SciPy's tests 1-2.
        assert _TOL["atol"] == _TOL["btol"]
        try:
            solver = lx.LSMR(rtol=_TOL["atol"], atol=0.0, max_steps=p.maxiter)
        except TypeError:  # older lineax spelling
            solver = lx.LSMR(atol=_TOL["atol"], btol=_TOL["btol"], max_steps=p.maxiter)

        def solve(data, indices, indptr, b_):
            mat = sparse.BCSR((data, indices, indptr), shape=(m, n))
            op = lx.FunctionLinearOperator(lambda v: mat @ v, jax.ShapeDtypeStruct((n,), jnp.float32))
            sol = lx.linear_solve(op, b_, solver=solver, throw=False)
            minus1 = jnp.int32(-1)
            return sol.value, sol.stats.get("num_steps", minus1), sol.stats.get("istop", minus1)

        args = (bcsr.data, bcsr.indices, bcsr.indptr, jnp.asarray(b))
        t0 = time.perf_counter()
        fn = jax.jit(solve).lower(*args).compile()
        compile_s = time.perf_counter() - t0
        out = jax.block_until_ready(fn(*args))
        t = time_call(lambda: fn(*args), min_seconds=0.0, repeats=3)
        itn = int(out[1])
        istop = int(out[2])
        return {
            "case": case, "impl": "lineax", "time_us": t * 1e6, "itn": itn,
            "istop": 7 if istop == 4 else istop,  # lineax's 4 is the iteration limit (SciPy's 7)
            "us_per_iter": t / max(itn, 1) * 1e6, "x_floor": _floor(t / max(itn, 1), pair), "ours_vs": t_ours / t,
            "compile_s": compile_s,
        }  # fmt: skip
    except Exception as e:  # noqa: BLE001
        return _unavailable(case, "lineax", "failed", e)


def _scipy_row(p, a, b, case, t_ours, itn_ours, pair, budget_s: float):
    try:
        from scipy.sparse.linalg import lsmr as scipy_lsmr
    except Exception as e:  # noqa: BLE001
        return {"case": case, "impl": "scipy", "time_us": None, "note": f"skipped: {e}"[:120]}
    t0 = time.perf_counter()
    scipy_lsmr(a, b, maxiter=5, **_TOL)  # probe the per-iteration cost
    probe = (time.perf_counter() - t0) / 5
    cap = int(max(5, min(p.maxiter, budget_s / max(probe, 1e-9))))
    t0 = time.perf_counter()
    out = scipy_lsmr(a, b, maxiter=cap, **_TOL)
    t = time.perf_counter() - t0
    itn = int(out[2])
    per_iter = t / max(itn, 1)
    return {
        "case": case, "impl": "scipy", "time_us": t * 1e6, "itn": itn, "istop": int(out[1]),
        "us_per_iter": per_iter * 1e6, "x_floor": _floor(per_iter, pair),
        "ours_vs": (t_ours / max(itn_ours, 1)) / per_iter,
        "note": f"iterations capped at {cap} ({budget_s:.0f} s budget)" if itn == cap and itn < p.maxiter else "",
    }  # fmt: skip


def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    problems = _problems(ctx.quick, on_gpu)
    problems = [p for p in problems if ctx.selected(p.name)]
    # Knob for a short GPU check: JAX_OPS_BENCH_SCIPY_BUDGET_S (SciPy's time cap per problem; its row compares
    # time per iteration anyway).
    scipy_budget = float(os.environ.get("JAX_OPS_BENCH_SCIPY_BUDGET_S", 5.0 if ctx.quick else 20.0))
    rows: list[dict] = []
    progress = ctx.progress(len(problems) * 4, "lsmr", rows)
    for p in problems:
        a, b = _build(p)
        op, op_kind = _operator(a)
        case = f"{p.name} nnz={a.nnz / 1e6:.2f}M"
        t, itn, pair = _ours(p, op, b, rows, case, ctx)
        rows[-2]["note"] = op_kind
        progress.step(f"jax_ops {p.name}")
        rows.append(_cupy_row(p, a, b, case, t, pair))
        progress.step(f"cupy {p.name}")
        rows.append(_lineax_row(p, a, b, case, t, pair))
        progress.step(f"lineax {p.name}")
        # SciPy on every problem, iterations capped by a budget (a full solve would take 40-150 s per problem).
        rows.append(_scipy_row(p, a, b, case, t, itn, pair, budget_s=scipy_budget))
        progress.step(f"scipy {p.name}")
    return rows
