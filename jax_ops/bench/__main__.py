"""CLI for the benchmark suites (see jax_ops.bench)."""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import jax

from jax_ops.bench import EXTRA_SUITES, SUITES, Context, measure_ceilings, run_suite


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e5:
            return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return f"{v:.2e}"
    return str(v)


def format_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    cols: list[str] = []
    for row in rows:
        for key in row:
            if key not in cols and key not in ("suite",):
                cols.append(key)
    cells = [[_fmt(row.get(c)) for c in cols] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(cols)]
    line = "  ".join(c.ljust(w) for c, w in zip(cols, widths))
    out = [line, "-" * len(line)]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def _plot(rows: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
        return
    suites = sorted({r["suite"] for r in rows})
    fig, axes = plt.subplots(len(suites), 1, figsize=(10, 3.5 * len(suites)), squeeze=False)
    for ax, suite in zip(axes[:, 0], suites):
        srows = [r for r in rows if r["suite"] == suite and r.get("time_us")]
        cases = list(dict.fromkeys(r["case"] for r in srows))
        impls = list(dict.fromkeys(r["impl"] for r in srows))
        width = 0.8 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            ys = [
                next((r["time_us"] for r in srows if r["case"] == c and r["impl"] == impl), 0) for c in cases
            ]
            ax.bar([i + j * width for i in range(len(cases))], ys, width, label=impl)
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=30, ha="right", fontsize=7
        )
        ax.set_yscale("log")
        ax.set_ylabel("µs")
        ax.set_title(suite)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_ops.bench", description=__doc__)
    parser.add_argument("suite", choices=[*SUITES, *EXTRA_SUITES, "all"])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer cases")
    parser.add_argument(
        "--only", action="append", default=[], help="keep the cases whose name contains this (repeatable)"
    )
    parser.add_argument("--json", help="write results (rows, ceilings, device) to this file")
    parser.add_argument("--plot", help="write a PNG plot to this file (needs matplotlib)")
    args = parser.parse_args(argv)

    import jax_ops

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}", file=sys.stderr)
    ceilings = measure_ceilings(args.quick)
    print(
        f"ceilings: copy {ceilings.copy_gbps:.0f} GB/s, bf16 dot {ceilings.bf16_tflops:.1f} TFLOP/s",
        file=sys.stderr,
    )
    ctx = Context(quick=args.quick, ceilings=ceilings, only=tuple(args.only))
    names = list(SUITES) if args.suite == "all" else [args.suite]
    rows: list[dict] = []
    for name in names:
        t0 = time.perf_counter()
        suite_rows = run_suite(name, ctx)
        rows += suite_rows
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s)\n{format_table(suite_rows)}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": device.device_kind,
                    "backend": jax.default_backend(),
                    "jax": jax.__version__,
                    "python": platform.python_version(),
                    "runtime_info": jax_ops.runtime_info(),
                    "ceilings": ceilings.as_dict(),
                    "quick": args.quick,
                    "rows": rows,
                },
                f,
                indent=1,
            )
    if args.plot:
        _plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
