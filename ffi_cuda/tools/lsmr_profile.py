"""Where an LSMR iteration's time goes on the GPU: the while body's kernels and their isolated durations.

    python3 ffi_cuda/tools/lsmr_profile.py PROBLEM MAXITER OUT_DIR            # HLO counts + wall time per iteration
    ncu --clock-control none --profile-from-start off --csv --metrics gpu__time_duration.sum \
        python3 ffi_cuda/tools/lsmr_profile.py PROBLEM MAXITER OUT_DIR --ncu > kernels.csv
    python3 ffi_cuda/tools/lsmr_profile.py --summarise kernels.csv ITERATIONS

PROBLEM is a prefix of a ``jax_ops.bench.lsmr`` problem name (``8kv``, ``11kv``, ``ba``). The solve runs with the
library's GPU defaults (``lsmr_solver.LOOP_COMPILER_OPTIONS``); with ``--ncu`` only the second solve (after the
warm-up) is inside the profiler's range (cupy's cudaProfilerStart/Stop). ``--summarise`` groups the kernels by
name: launches and microseconds per LSMR iteration (ncu serialises kernels: the sum is kernel time without the
gaps between launches, so wall time per iteration minus that sum is what launches and gaps cost).
"""

from __future__ import annotations

import collections
import csv
import json
import os
import sys
import time


def profile(prefix: str, maxiter: int, out_dir: str, under_ncu: bool) -> None:
    import jax
    import jax.numpy as jnp

    import jax_ops
    from jax_ops import lsmr_solver
    from jax_ops.bench import lsmr as lsmr_bench
    from jax_ops.bench.hlo_count import while_body_counts

    p = next(p for p in lsmr_bench._problems(False, True) if p.name.startswith(prefix))
    a, b = lsmr_bench._build(p)
    op, _ = lsmr_bench._operator(a)
    bj = jnp.asarray(b)
    solve = jax.jit(
        lambda op_, b_: jax_ops.lsmr(op_, b_, maxiter=maxiter, **lsmr_bench._TOL),
        # Under ncu the loop runs without command buffers (kernels launched one by one; their durations are the
        # same, and ncu need not look inside a graph's conditional nodes).
        compiler_options=lsmr_solver.COMMAND_BUFFER_OPTIONS["off" if under_ncu else "while"],
    )
    compiled = solve.lower(op, bj).compile()
    tag = p.name.split()[0]
    if not under_ncu:
        text = compiled.as_text()
        with open(os.path.join(out_dir, f"hlo_{tag}.txt"), "w") as f:
            f.write(text)
        counts = while_body_counts(text)
    res = jax.block_until_ready(compiled(op, bj))
    if under_ncu:
        import cupy

        cupy.cuda.runtime.profilerStart()
        jax.block_until_ready(compiled(op, bj))
        cupy.cuda.runtime.profilerStop()
        return
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(op, bj))
        times.append(time.perf_counter() - t0)
    itn = int(res.itn)
    t = sorted(times)[2]
    summary = {"problem": p.name, "itn": itn, "us_per_iter": t / itn * 1e6, "counts": counts}
    print(json.dumps(summary, indent=1, default=str))
    with open(os.path.join(out_dir, f"profile_{tag}.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)


def summarise(csv_path: str, iterations: int) -> None:
    per_name: dict[str, list[float]] = collections.defaultdict(list)
    with open(csv_path) as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        per_name[row["Kernel Name"][:90]].append(
            value / (1000.0 if unit == "nsecond" or unit == "ns" else 1.0)
        )
    total = 0.0
    print(f"{'kernel':92s} {'launch/it':>9s} {'us/it':>8s} {'us/launch':>9s}")
    for name, vals in sorted(per_name.items(), key=lambda kv: -sum(kv[1])):
        s = sum(vals)
        total += s
        print(f"{name:92s} {len(vals) / iterations:9.2f} {s / iterations:8.2f} {s / len(vals):9.2f}")
    launches = sum(len(v) for v in per_name.values())
    print(
        f"total: {launches / iterations:.2f} launches and {total / iterations:.2f} us of kernel time per iteration"
    )


if __name__ == "__main__":
    if sys.argv[1] == "--summarise":
        summarise(sys.argv[2], int(sys.argv[3]))
    else:
        profile(sys.argv[1], int(sys.argv[2]), sys.argv[3], "--ncu" in sys.argv[4:])
