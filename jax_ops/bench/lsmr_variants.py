"""Suite ``lsmr_variants`` (not part of ``all``): one LSMR solve under a matrix of loop / XLA settings.

    python -m jax_ops.bench lsmr_variants [--only 8kv --only ba] [--json out.json]
    JAX_OPS_LSMR_VARIANTS="u4-default,u1-while" python -m jax_ops.bench lsmr_variants   # a subset

For 8kv-like and ba-like (``jax_ops.bench.lsmr``'s own generators; ``--quick`` or a CPU run uses the small
versions) it times ``jax_ops.lsmr`` (float32, atol = btol = 1e-6, median of 3, compile excluded and reported)
for every variant

  * ``unroll`` in {1, 4, 8} (guarded LSMR iterations per ``while_loop`` trip)
  * x XLA command buffers (``lsmr_solver.COMMAND_BUFFER_OPTIONS``, passed as ``compiler_options`` of the jit
    that wraps the solve, so they apply to this executable only, not to the process' XLA_FLAGS):
      ``default`` (XLA's: FUSION, CUBLAS, CUBLASLT, CUSTOM_CALL, CUDNN; min graph size 5),
      ``off`` (``xla_gpu_enable_command_buffer=""``),
      ``while`` (defaults + WHILE, CONDITIONAL, ``xla_gpu_graph_min_graph_size=1``: the whole loop one graph
      with a device-side condition)
  * plus ``u4-default-nopack`` (scalars carried as separate arrays instead of stacked),
    ``u4-default-dbuf`` (``xla_gpu_enable_while_loop_double_buffering``), ``u2-while-step`` (the shipped
    unroll and graph settings with the "step" iteration: XLA's norms and scalar recurrence around the step
    kernel, lsmr_solver.ITERATIONS) and ``u2-while-unfused`` ("unfused": also the step's vector update as
    XLA's v fusion, two kernels and XLA's ||x||). Every other row runs the shipped fused iteration ("kernels").
    A name may repeat in JAX_OPS_LSMR_VARIANTS (interleaved A/B runs).

Each row: ``itn``/``istop`` (must be identical across variants: ``same`` says so, ``dx`` = max |x - x of the
first variant|), ``us_per_iter``, ``x_pair`` = µs/iter / (A v + Aᵀu time, measured once per problem as in the
``lsmr`` suite), ``compile_s``, and the while-body kernel counts from the optimised HLO (``launches`` per
trip / ``unroll`` = ``launch_per_it``, ``cb_calls`` = command-buffer calls in the body; on XLA versions that
form command buffers on thunks instead of HLO these stay 0). A variant that fails to compile or run is a row
with ``note``, not a crash. Expected GPU wall time: ~3 min for both problems (22 compiles of 2-5 s).
"""

from __future__ import annotations

import os
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops.bench import lsmr as lsmr_bench
from jax_ops.bench.harness import time_call
from jax_ops.bench.hlo_count import while_body_counts

# name -> (unroll, command-buffer preset, extra compiler options, lsmr_solver.overrides knobs)
VARIANTS: dict[str, tuple[int, str, dict, dict]] = {}
for _u in (1, 2, 4, 8):
    for _cb in ("default", "off", "while"):
        VARIANTS[f"u{_u}-{_cb}"] = (_u, _cb, {}, {})
VARIANTS["u4-default-nopack"] = (4, "default", {}, {"pack_scalars": False})
VARIANTS["u4-default-dbuf"] = (4, "default", {"xla_gpu_enable_while_loop_double_buffering": True}, {})
VARIANTS["u2-while-step"] = (2, "while", {}, {"iteration": "step"})  # XLA's norms and scalar recurrence
VARIANTS["u2-while-unfused"] = (2, "while", {}, {"iteration": "unfused"})  # and the step's vector kernels


def _selected_variants() -> list[str]:
    env = os.environ.get("JAX_OPS_LSMR_VARIANTS", "").strip()
    if not env:
        return list(VARIANTS)
    names = [v.strip() for v in env.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown JAX_OPS_LSMR_VARIANTS {unknown}; known: {list(VARIANTS)}")
    return names


def _run_variant(name, p, op, bj, on_gpu):
    from jax_ops import lsmr_solver

    unroll, cb, extra, tuning = VARIANTS[name]
    options = {**lsmr_solver.COMMAND_BUFFER_OPTIONS[cb], **extra} if on_gpu else {}
    maxiter = p.maxiter

    def solve(op_, b_):
        return jax_ops_lsmr(op_, b_, maxiter=maxiter, unroll=unroll, **lsmr_bench._TOL)

    with lsmr_solver.overrides(**tuning):
        t0 = time.perf_counter()
        lowered = jax.jit(solve).lower(op, bj)  # traced here: the knobs are read now
        compiled = lowered.compile(compiler_options=options or None)
        compile_s = time.perf_counter() - t0
    try:
        counts = while_body_counts(compiled.as_text())
    except Exception:  # noqa: BLE001 - counts are informative only
        counts = {}
    out = jax.block_until_ready(compiled(op, bj))
    t = time_call(lambda: compiled(op, bj), min_seconds=0.0, repeats=3)
    return out, t, compile_s, counts, options


def jax_ops_lsmr(*args, **kw):
    import jax_ops

    return jax_ops.lsmr(*args, implementation="ffi", **kw)  # the variants are the FFI path's


def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    problems = [
        p
        for p in lsmr_bench._problems(ctx.quick, on_gpu)
        if not p.name.startswith("11kv") and ctx.selected(p.name)
    ]
    names = _selected_variants()
    rows: list[dict] = []
    progress = ctx.progress(len(problems) * (len(names) + 1), "lsmr_variants", rows)
    for p in problems:
        a, b = lsmr_bench._build(p)
        op, op_kind = lsmr_bench._operator(a)
        case = f"{p.name} nnz={a.nnz / 1e6:.2f}M"
        bj = jnp.asarray(b)
        pair = lsmr_bench._spmv_pair_seconds(op)
        progress.step(f"{p.name}: SpMV pair {pair * 1e6:.1f} us ({op_kind})")
        ref = None
        for name in names:
            unroll = VARIANTS[name][0]
            row = {"case": case, "impl": name, "time_us": None}
            try:
                out, t, compile_s, counts, _ = _run_variant(name, p, op, bj, on_gpu)
                itn, istop = int(out.itn), int(out.istop)
                x = np.asarray(out.x)
                if ref is None:
                    ref = (itn, istop, x)
                same = (itn, istop) == ref[:2]
                per_iter = t / max(itn, 1)
                launches = counts.get("launches")
                row.update(
                    time_us=t * 1e6, itn=itn, istop=istop, same=same,
                    dx=float(np.max(np.abs(x - ref[2]))) if x.shape == ref[2].shape else None,
                    us_per_iter=per_iter * 1e6, spmv_pair_us=pair * 1e6, x_pair=per_iter / pair,
                    compile_s=compile_s, launches=launches,
                    launch_per_it=None if launches is None else launches / unroll,
                    scalar_fus=counts.get("scalar_fusions"), custom_calls=counts.get("custom_calls"),
                    cb_calls=counts.get("command_buffer_calls"),
                    note="" if same else f"itn/istop differ from {names[0]}: {ref[:2]}",
                )  # fmt: skip
            except Exception as e:  # noqa: BLE001 - a failing variant is a result, not a crash
                row["note"] = f"failed: {type(e).__name__}: {e}"[:300]
                traceback.print_exc()
            rows.append(row)
            progress.step(f"{p.name} {name}")
    rows.append(_summary(rows))
    return rows


def _summary(rows: list[dict]) -> dict:
    """A last row naming the fastest variant per problem (by µs/iter) and whether every variant agreed."""
    best = {}
    for r in rows:
        if r.get("us_per_iter") is None:
            continue
        if r["case"] not in best or r["us_per_iter"] < best[r["case"]]["us_per_iter"]:
            best[r["case"]] = r
    agree = all(r.get("same", True) for r in rows)
    text = "; ".join(f"{c.split()[0]}: {r['impl']} {r['x_pair']:.2f}x pair" for c, r in best.items())
    return {"case": "-", "impl": "best", "time_us": None, "note": f"{text}; itn/istop identical: {agree}"}
