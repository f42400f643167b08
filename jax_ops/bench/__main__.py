"""CLI for the benchmark suites (see jax_ops.bench)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import jax

from jax_ops.bench import EXTRA_SUITES, SUITES, Context, measure_ceilings, run_suite
from jax_ops.bench.tables import TABLE_WIDTH, columns, format_table, write_csv

__all__ = ["format_table", "main"]


def _plot_label_fields(rows: list[dict]) -> list[str]:
    """The fields besides ``case`` that tell a case's rows of one implementation apart (sparse: dtype, op, N)."""
    out = []
    for key in columns(rows):
        if key in ("case", "impl", "note") or not all(
            isinstance(r.get(key), (str, int)) or r.get(key) is None for r in rows
        ):
            continue
        per_case_impl: dict = {}
        for r in rows:
            per_case_impl.setdefault((r["case"], r["impl"]), set()).add(r.get(key))
        if any(len(v) > 1 for v in per_case_impl.values()):
            out.append(key)
    return out


def _require_matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise SystemExit(
            f"--plot needs matplotlib ({e}): pip install 'jax_ops[plot]' or pip install matplotlib"
        ) from None
    return plt


def _plot(rows: list[dict], path: str) -> None:
    """One bar chart per suite: a bar per (case + distinguishing fields, implementation), µs on a log scale;
    the rows the table shows (skipped rows have no time)."""
    plt = _require_matplotlib()
    suites = list(dict.fromkeys(r["suite"] for r in rows))
    fig, axes = plt.subplots(len(suites), 1, figsize=(12, 3.8 * len(suites)), squeeze=False)
    for ax, suite in zip(axes[:, 0], suites):
        srows = [r for r in rows if r["suite"] == suite and r.get("time_us")]
        fields = _plot_label_fields(srows)
        label = lambda r, fields=fields: " ".join(
            [str(r["case"]), *(f"{k}={r[k]}" for k in fields if r.get(k) is not None)]
        )
        cases = list(dict.fromkeys(label(r) for r in srows))
        impls = list(dict.fromkeys(r["impl"] for r in srows))
        times = {(label(r), r["impl"]): r["time_us"] for r in srows}
        width = 0.8 / max(len(impls), 1)
        for j, impl in enumerate(impls):
            ys = [times.get((c, impl), 0) for c in cases]
            ax.bar([i + j * width for i in range(len(cases))], ys, width, label=impl)
        ax.set_xticks(
            [i + 0.4 - width / 2 for i in range(len(cases))], cases, rotation=35, ha="right", fontsize=6
        )
        ax.set_yscale("log")
        ax.set_ylabel("µs")
        ax.set_title(suite)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _tune(ctx: Context) -> list[dict]:
    from jax_ops.bench import gemm

    rows = gemm.tune(ctx)
    for row in rows:
        row["suite"] = "gemm --tune"
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jax_ops.bench", description=__doc__)
    parser.add_argument("suite", choices=[*SUITES, *EXTRA_SUITES, "all"])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer cases")
    parser.add_argument(
        "--only", action="append", default=[], help="keep the cases whose name contains this (repeatable)"
    )
    parser.add_argument(
        "--json",
        help="write results (rows, ceilings, device) to this file, and every column to a .csv next to it",
    )
    parser.add_argument("--plot", help="write a PNG plot to this file (needs matplotlib: jax_ops[plot])")
    parser.add_argument(
        "--wide", action="store_true", help=f"print every row and column (default: fit {TABLE_WIDTH})"
    )
    parser.add_argument(
        "--tune",
        action="store_true",
        help="gemm only: time every candidate plan per problem class and rewrite the GEMM dispatch table",
    )
    args = parser.parse_args(argv)
    if args.tune and args.suite != "gemm":
        parser.error("--tune applies to the gemm suite only")
    if args.plot:
        _require_matplotlib()  # before the suites run, not after

    import jax_ops

    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}", file=sys.stderr)
    ceilings = measure_ceilings(args.quick)
    print(f"ceilings: {ceilings.describe()}", file=sys.stderr)
    ctx = Context(quick=args.quick, ceilings=ceilings, only=tuple(args.only))
    names = list(SUITES) if args.suite == "all" else [args.suite]
    rows: list[dict] = []
    for name in names:
        t0 = time.perf_counter()
        suite_rows = _tune(ctx) if args.tune else run_suite(name, ctx)
        rows += suite_rows
        table = format_table(suite_rows, None if args.wide else TABLE_WIDTH)
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s)\n{table}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
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
        write_csv(rows, os.path.splitext(args.json)[0] + ".csv")
    if args.plot:
        _plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
