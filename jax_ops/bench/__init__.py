"""Benchmarks: ``python -m jax_ops.bench <suite> [--quick] [--only SUBSTR ...] [--json F] [--plot F]``
(``--only`` keeps the cases whose name contains one of the substrings).

Every suite module exposes ``run(ctx: Context) -> list[dict]``: one dict per (case, implementation) with at
least ``case``, ``impl`` and ``time_us`` (None when skipped, with a ``note``); anchors are timed in the same
process. See ``harness.py`` for the timing method.
"""

from __future__ import annotations

import dataclasses
import importlib

from jax_ops.bench.harness import (
    Ceilings,
    Progress,
    compiled_temp_bytes,
    measure_ceilings,
    time_call,
    time_loop,
)

# suite name -> module with run(ctx)
SUITES = {
    "attention": "jax_ops.bench.attention",
    "decode": "jax_ops.bench.decode",
    "gemm": "jax_ops.bench.gemm",
    "lsmr": "jax_ops.bench.lsmr",
    "lsmr_kernels": "jax_ops.bench.lsmr_kernels",
    "sparse": "jax_ops.bench.sparse",
}
# Run only when named (not part of "all", so .ci/gpu's default run does not grow).
EXTRA_SUITES = {
    "lsmr_products": "jax_ops.bench.lsmr_products",
    "lsmr_variants": "jax_ops.bench.lsmr_variants",
}


@dataclasses.dataclass
class Context:
    quick: bool
    ceilings: Ceilings
    only: tuple[str, ...] = ()  # --only: keep the cases whose name contains one of these (all when empty)

    def selected(self, case_name: str) -> bool:
        return not self.only or any(s in case_name for s in self.only)

    def progress(self, total: int, label: str, rows: list[dict] | None = None) -> Progress:
        return Progress(total, label, rows)


def run_suite(name: str, ctx: Context) -> list[dict]:
    rows = importlib.import_module({**SUITES, **EXTRA_SUITES}[name]).run(ctx)
    for row in rows:
        row.setdefault("suite", name)
    return rows


__all__ = [
    "EXTRA_SUITES",
    "SUITES",
    "Context",
    "compiled_temp_bytes",
    "measure_ceilings",
    "run_suite",
    "time_call",
    "time_loop",
]
