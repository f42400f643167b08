"""The benchmark CLI on the CPU: ``--only`` keeps the named cases, rows carry times, the JSON is written."""

import json

from jax_ops.bench.__main__ import main


def test_bench_only_selects_cases(tmp_path):
    out = tmp_path / "attention.json"
    assert main(["attention", "--quick", "--only", "N=64 ", "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["case"] != "-"]
    assert rows and all(r["case"].startswith("N=64 ") for r in rows)
    assert {r["impl"] for r in rows} == {"jax_ops", "xla"}
    assert all(r["time_us"] > 0 for r in rows)


def test_bench_lsmr_products_rows(tmp_path):
    """The lsmr_products suite (extra, not in "all") times every product of the small 8kv-like problem."""
    out = tmp_path / "lsmr_products.json"
    assert main(["lsmr_products", "--quick", "--only", "8kv", "--json", str(out)]) == 0
    rows = [r for r in json.loads(out.read_text())["rows"] if r["case"] != "-"]
    assert {r["impl"] for r in rows} == {"A V", "At U", "vmap A v", "vmap At u", "A v", "At u"}
    assert all(r["time_us"] > 0 and "plan_t" in r["note"] for r in rows)
