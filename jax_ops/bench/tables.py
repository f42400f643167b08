"""Tables from benchmark rows: the terminal table, the CSV, and the markdown tables of ``docs/<family>.md``.

The terminal table fits ``TABLE_WIDTH`` columns: rows skipped for a missing anchor collapse into one line per
suite, columns constant over the table move to one ``all rows:`` line, long cells are cut, and columns that only
describe the case (``M``, ``K``, ``nnz``, ...) are dropped first when it is still too wide. The JSON and the CSV
keep every column (``write_csv``). A fraction column (``frac*``) above 1 is marked ``!``.

Regenerate a doc table from a ``--json`` file::

    python -m jax_ops.bench.tables bench_sparse.json [--suite sparse] [--only SUBSTR] [--columns case,impl,time_us]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import textwrap
from collections import Counter

TABLE_WIDTH = 120
KEEP = ("case", "impl", "time_us")  # never dropped from the terminal table
CELL_MAX = 22  # longest cell before it is cut (the note column gets the width that is left)
NOTE_MIN = 16
ABOVE_ONE = "!"


def fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v == 0 or 1e-3 <= abs(v) < 1e5:
            return f"{v:.3g}" if abs(v) < 10 else f"{v:.1f}"
        return f"{v:.2e}"
    return str(v)


def _cell(col: str, v) -> str:
    s = fmt(v)
    if col.startswith("frac") and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1:
        s += ABOVE_ONE
    return s


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: max(n - 1, 0)] + "…"


def is_skipped(row: dict) -> bool:
    """A row that measured nothing because an anchor or device is missing (not a failure)."""
    return row.get("time_us") is None and "skip" in str(row.get("note", "")).lower()


def columns(rows: list[dict]) -> list[str]:
    cols: list[str] = []
    for row in rows:
        for key in row:
            if key not in cols and key != "suite":
                cols.append(key)
    return cols


def skipped_line(rows: list[dict], width: int = TABLE_WIDTH) -> str:
    """One line (wrapped to ``width``) counting the skipped rows by implementation and reason."""
    groups = Counter((str(r.get("impl")), str(r.get("note", "")).removeprefix("skipped: ")) for r in rows)
    text = f"skipped ({len(rows)} rows): " + "; ".join(
        f"{impl} ×{n}: {why}" if n > 1 else f"{impl}: {why}" for (impl, why), n in groups.items()
    )
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="  "))


def _case_attributes(rows: list[dict], cols: list[str]) -> list[str]:
    """Columns with one value per case (they describe the case, e.g. its sizes): dropped first."""
    out = []
    for c in cols:
        if c in KEEP or c == "note":
            continue
        seen: dict = {}
        if all(seen.setdefault(r.get("case"), fmt(r.get(c))) == fmt(r.get(c)) for r in rows) and len(
            seen
        ) < len(rows):
            out.append(c)
    return out


def format_table(rows: list[dict], width: int | None = TABLE_WIDTH) -> str:
    """The rows as an aligned text table at most ``width`` characters wide (``None``: every column, uncut)."""
    if not rows:
        return "(no rows)"
    wide = width is None
    shown = rows if wide else [r for r in rows if not is_skipped(r)]
    skipped = [] if wide else [r for r in rows if is_skipped(r)]
    out: list[str] = []
    if shown:
        cols = columns(shown)
        if "note" in cols and not wide:  # last: it takes the width the other columns leave
            cols = [c for c in cols if c != "note"] + ["note"]
        const: list[str] = []
        if not wide and len(shown) > 1:
            const = [c for c in cols if c not in KEEP and len({fmt(r.get(c)) for r in shown}) == 1]
            cols = [c for c in cols if c not in const]
        cells = {c: [_cell(c, r.get(c)) for r in shown] for c in cols}
        if not wide:
            cells = {c: [_cut(v, CELL_MAX) if c != "note" else v for v in vs] for c, vs in cells.items()}
        widths = {c: max(len(c), *(len(v) for v in cells[c])) for c in cols}
        dropped: list[str] = []
        if not wide:
            fixed = lambda: sum(widths[c] + 2 for c in cols if c != "note")
            droppable = _case_attributes(shown, cols)[::-1] + [
                c for c in cols[::-1] if c not in KEEP and c != "note"
            ]
            for c in droppable:
                if fixed() + (NOTE_MIN if "note" in cols else 0) <= width:
                    break
                if c in cols:
                    cols.remove(c)
                    dropped.append(c)
            if "note" in cols:
                room = width - fixed()
                if room < NOTE_MIN:
                    cols.remove("note")
                    dropped.append("note")
                else:
                    cells["note"] = [_cut(v, room) for v in cells["note"]]
                    widths["note"] = max(len("note"), *(len(v) for v in cells["note"]))
        line = "  ".join(c.ljust(widths[c]) for c in cols).rstrip()
        out += [line, "-" * len(line)]
        out += ["  ".join(cells[c][i].ljust(widths[c]) for c in cols).rstrip() for i in range(len(shown))]
        if const:
            out.append(_cut("all rows: " + ", ".join(f"{c}={fmt(shown[0].get(c))}" for c in const), width))
        if dropped:
            out.append(_cut(f"not shown: {', '.join(dropped)} (every column is in the JSON and CSV)", width))
        if any(v.endswith(ABOVE_ONE) for c in cols if c.startswith("frac") for v in cells[c]):
            out.append(
                f"{ABOVE_ONE} fraction above 1: the ceiling read low (see its spread) or the data fit in cache"
            )
    if skipped:
        out.append(skipped_line(skipped, width))
    return "\n".join(out)


def write_csv(rows: list[dict], path: str) -> None:
    """Every row and every column (the suite first), for spreadsheets and plots."""
    cols = ["suite", *columns(rows)] if any("suite" in r for r in rows) else columns(rows)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=cols, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c) for c in cols})


def markdown_table(rows: list[dict], cols: list[str] | None = None) -> str:
    """A GitHub markdown table of ``rows`` (every column unless ``cols``); numbers right-aligned."""
    rows = [r for r in rows if not is_skipped(r)]
    if not rows:
        return "(no rows)"
    cols = cols or columns(rows)
    numeric = {c: all(isinstance(r.get(c), (int, float)) or r.get(c) is None for r in rows) for c in cols}
    out = [
        "| " + " | ".join(cols) + " |",
        "|" + "|".join("---:" if numeric[c] else "---" for c in cols) + "|",
    ]
    out += ["| " + " | ".join(fmt(r.get(c)).replace("|", "\\|") for c in cols) + " |" for r in rows]
    return "\n".join(out)


def _as_of(result: dict) -> str:
    when = result.get("date", "unknown date")
    return (
        f"As of {when}: {result.get('device', '?')} ({result.get('backend', '?')}), jax {result.get('jax', '?')}"
        + (", --quick" if result.get("quick") else "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m jax_ops.bench.tables", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("json", help="a file written by `python -m jax_ops.bench ... --json`")
    parser.add_argument("--suite", help="only this suite (default: one table per suite)")
    parser.add_argument("--only", action="append", default=[], help="keep cases containing this (repeatable)")
    parser.add_argument("--columns", help="comma-separated columns, in order (default: all)")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        result = json.load(f)
    rows = result["rows"]
    suites = list(dict.fromkeys(r.get("suite", "") for r in rows))
    if args.suite:
        suites = [s for s in suites if s == args.suite]
    cols = args.columns.split(",") if args.columns else None
    print(_as_of(result) + ".\n")
    for suite in suites:
        srows = [
            r
            for r in rows
            if r.get("suite", "") == suite
            and (not args.only or any(s in str(r.get("case")) for s in args.only))
        ]
        if len(suites) > 1:
            print(f"**{suite}**\n")
        print(markdown_table(srows, cols) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
