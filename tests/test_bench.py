"""The benchmark CLI on the CPU: ``--only`` keeps the named cases, rows carry times, the JSON and CSV are written,
the printed table fits a terminal, ``--plot`` without matplotlib fails loudly, the doc tables regenerate."""

import csv
import json
import sys

import jax
import pytest

from jax_ops.bench import harness, tables
from jax_ops.bench.__main__ import _plot_label_fields, main


def test_bench_only_selects_cases(tmp_path, capsys):
    out = tmp_path / "attention.json"
    assert main(["attention", "--quick", "--only", "N=64 ", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = [r for r in result["rows"] if r["case"] != "-"]
    assert rows and all(r["case"].startswith("N=64 ") for r in rows)
    assert {r["impl"] for r in rows} == {"jax_ops", "xla"}
    assert all(r["time_us"] > 0 for r in rows)
    # The wide form: every row and column in the CSV next to the JSON.
    with open(tmp_path / "attention.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(result["rows"]) and "suite" in csv_rows[0]
    # The header's ceilings: f32 on the CPU (a bf16 dot there is emulated), with their spread.
    ceilings = result["ceilings"]
    if jax.default_backend() == "cpu":
        assert ceilings["dot_dtype"] == "float32" and ceilings["bf16_tflops"] is None
    assert ceilings["dot_tflops"] > 0 and ceilings["copy_gbps"] > 0 and "copy_noisy" in ceilings
    err = capsys.readouterr().err
    assert "ceilings: copy" in err and "bf16 dot 0.0" not in err
    # The doc tables come back from the JSON.
    assert tables.main([str(out), "--columns", "case,impl,time_us"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("As of ") and "| case | impl | time_us |" in md and "|---|---|---:|" in md


def test_bench_lsmr_products_rows(tmp_path):
    """The lsmr_products suite (extra, not in "all") times every product of the small 8kv-like problem."""
    out = tmp_path / "lsmr_products.json"
    assert main(["lsmr_products", "--quick", "--only", "8kv", "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["case"] != "-"]
    assert {r["impl"] for r in rows} == {"A V", "At U", "vmap A v", "vmap At u", "A v", "At u"}
    assert all(r["time_us"] > 0 and "plan_t" in r["note"] for r in rows)


def test_bench_decode_rows(tmp_path):
    """The decode suite on the CPU (tiny float32 cases): every paged and contiguous path timed and matching the
    fp32 reference, Pallas checked in interpret mode, cuDNN skipped, append bit-equal to the scatter pair."""
    out = tmp_path / "decode.json"
    assert main(["decode", "--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    decode = [r for r in rows if not r["case"].startswith("append")]
    append = [r for r in rows if r["case"].startswith("append")]
    cases = {r["case"] for r in decode}
    assert len(cases) == 2 and any(c.endswith("ragged") for c in cases)
    timed = {"jax_ops paged", "jax_ops paged xla", "xla contiguous", "jax_ops contiguous"}
    for case in cases:
        by_impl = {r["impl"]: r for r in decode if r["case"] == case}
        assert set(by_impl) == timed | {"pallas paged", "cudnn contiguous", "jax_ops paged fp8"}
        fp8 = by_impl["jax_ops paged fp8"]  # float8 pages: timed, within e4m3's quantisation error
        assert fp8["time_us"] > 0 and fp8["TBps"] > 0 and fp8["rel_l2_err"] < 0.1 and "note" not in fp8, fp8
        for impl in timed:
            r = by_impl[impl]
            assert r["time_us"] > 0 and r["TBps"] > 0 and r["frac_copy"] > 0, r
            assert r["rel_l2_err"] < 1e-5, r
            assert "note" not in r, r  # a paged row's note would say its temp holds a gathered cache
        pallas = by_impl["pallas paged"]
        assert pallas["time_us"] is None and "interpret" in pallas["note"] and pallas["rel_l2_err"] < 1e-5
        assert by_impl["cudnn contiguous"]["time_us"] is None
    assert {(r["case"].split()[1], r["impl"]) for r in append} == {
        (t, impl)
        for t in ("T=1", "T=16")
        for impl in ("jax_ops append", "xla scatter pair", "jax_ops append fp8")
    }
    for r in append:
        assert r["time_us"] > 0 and r["vs_xla"] > 0 and "note" not in r, r
        assert r["impl"] == "jax_ops append fp8" or r["max_abs_err"] == 0, (
            r
        )  # (float8 rows: no exact comparison)


def _sparse_like_rows():
    rows = []
    for case in ("uniform 20k 16/row", "power-law 20k", "bundle-adj 5k obs"):
        base = {"case": case, "dtype": "float32", "M": 20000, "K": 20000, "nnz": 320000}
        rows.append(
            {
                **base,
                "op": "build",
                "N": 0,
                "impl": "jax_ops CSRPair build (incl. host profile)",
                "time_us": 1.2e5,
                "note": "transpose sort alone 114888 us; generation 0.0 s; " * 3,
            }
        )
        for op, n in (("Ax", 1), ("ATu", 1), ("AB", 8), ("AB", 128)):
            for impl in ("jax_ops", "jax BCSR"):
                rows.append(
                    {
                        **base,
                        "op": op,
                        "N": n,
                        "impl": impl,
                        "time_us": 700.0,
                        "GB/s": 3.5,
                        "frac_copy": 1.07 if impl == "jax BCSR" else 0.5,
                        "speedup": 1.3,
                        "note": "plan vector; temp 68 B",
                    }
                )
            rows.append(
                {
                    **base,
                    "op": op,
                    "N": n,
                    "impl": "cuSPARSE (CuPy)",
                    "time_us": None,
                    "note": "skipped: CuPy not installed or no GPU",
                }
            )
            rows.append(
                {
                    **base,
                    "op": op,
                    "N": n,
                    "impl": "jax BCOO cusparse",
                    "time_us": None,
                    "note": "skipped: no GPU",
                }
            )
    rows.append(
        {"case": "x", "dtype": "float32", "impl": "jax_ops", "time_us": None, "note": "failed: RuntimeError"}
    )
    return rows  # fmt: skip


def test_table_fits_a_terminal():
    rows = _sparse_like_rows()
    table = tables.format_table(rows)
    lines = table.splitlines()
    assert max(map(len, lines)) <= tables.TABLE_WIDTH
    # The 24 skipped rows collapse into one line; a failure stays a row.
    skipped = [line for line in lines if line.startswith("skipped (")]
    assert len(skipped) == 1 and "24 rows" in skipped[0] and "no GPU" in skipped[0]
    assert not any("cuSPARSE (CuPy)" in line for line in lines if not line.startswith(("skipped", "  ")))
    assert any("failed: Runtime" in line for line in lines)
    # Constant columns go to one line; the metrics stay (case attributes such as M, K, nnz go first).
    assert any(line.startswith("all rows: dtype=float32") for line in lines)
    assert "speedup" in lines[0] and "frac_copy" in lines[0]
    # A fraction above 1 is marked.
    assert "1.07!" in table and "fraction above 1" in table
    # --wide (width None) keeps every column and row.
    wide = tables.format_table(rows, None)
    assert "skipped (" not in wide and "nnz" in wide.splitlines()[0]
    assert sum("CuPy not installed" in line for line in wide.splitlines()) == 12


def test_plot_labels_tell_rows_apart():
    """The plot keeps every row the table shows: sparse rows of one case differ by dtype, op and N."""
    rows = [r for r in _sparse_like_rows() if r.get("time_us")]
    assert _plot_label_fields(rows) == ["op", "N"]  # dtype is float32 throughout here


def test_plot_without_matplotlib_fails_loudly(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(SystemExit) as e:
        main(["lsmr_kernels", "--quick", "--plot", str(tmp_path / "p.png")])
    assert e.value.code != 0 and "jax_ops[plot]" in str(e.value.code)
    assert not (tmp_path / "p.png").exists()


def test_ceilings_mark_noise():
    c = harness.Ceilings(
        copy_gbps=100.0, bf16_tflops=None, dot_tflops=0.1, dot_dtype="float32", copy_spread=0.3
    )
    assert c.copy_noisy and not c.dot_noisy
    text = c.describe()
    assert "copy 100 GB/s (noisy" in text and "f32 dot 0.1 TFLOP/s" in text
    assert "n/a" in harness.Ceilings(copy_gbps=1.0, bf16_tflops=None, dot_dtype="float32").describe()
    assert harness.Ceilings(copy_gbps=1.0, bf16_tflops=600.0).dot_tflops == 600.0  # the old two-field form
