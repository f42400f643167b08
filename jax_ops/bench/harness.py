"""Timing method shared by every suite (ARCHITECTURE.md "Benchmarks").

``time_loop`` jits a ``lax.fori_loop`` of K dependent calls, with the operands passed as jit *arguments* (never
captured constants, which XLA would constant-fold), picks K so one run lasts >= ``min_seconds``, warms up, and
returns the median over ``repeats`` runs of (run time / K).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def time_loop(
    step: Callable[..., Any],
    carry: Any,
    *operands: Any,
    min_seconds: float = 0.05,
    repeats: int = 5,
    max_iters: int = 1 << 16,
) -> float:
    """Median seconds per ``carry = step(carry, *operands)`` measured inside one jitted loop.

    ``step`` must make each call depend on the previous one through ``carry`` so XLA cannot hoist it. The trip
    count is static: XLA then runs the loop without reading the loop predicate back to the host every iteration
    (a dynamic ``fori_loop`` costs a device-to-host sync per iteration, which would swamp calls of a few µs).
    """

    @functools.partial(jax.jit, static_argnums=0)
    def run(k, carry, *ops):
        return jax.lax.fori_loop(0, k, lambda i, c: step(c, *ops), carry)

    def once(k: int) -> float:
        nonlocal carry
        t0 = time.perf_counter()
        carry = jax.block_until_ready(run(k, carry, *operands))
        return time.perf_counter() - t0

    k = 4
    once(k)  # compile + warm-up
    per_call = once(k) / k
    # Smallest power of two lasting >= min_seconds (one more compile).
    k = int(min(max_iters, max(4, 2 ** math.ceil(math.log2(max(1.0, min_seconds / max(per_call, 1e-9)))))))
    once(k)
    times = [once(k) / k for _ in range(repeats)]
    return statistics.median(times)


def time_call(fn: Callable[[], Any], *, min_seconds: float = 0.05, repeats: int = 5) -> float:
    """Median seconds of ``fn()`` (already jitted, blocking on its result) for work too long to loop on device
    (solvers, host-driven anchors such as CuPy or SciPy). Warm-up run excluded."""
    jax.block_until_ready(fn())
    times = []
    t_total = 0.0
    while len(times) < repeats or t_total < min_seconds:
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        dt = time.perf_counter() - t0
        times.append(dt)
        t_total += dt
        if len(times) >= 50 * repeats:
            break
    return statistics.median(times)


def compiled_temp_bytes(fn: Callable[..., Any], *args: Any) -> int | None:
    """Temp memory XLA reserves for ``jit(fn)(*args)`` (compiled memory analysis), None when unavailable."""
    try:
        analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
        return int(analysis.temp_size_in_bytes) if analysis is not None else None
    except Exception:  # noqa: BLE001 - some backends have no memory analysis
        return None


@dataclasses.dataclass
class Ceilings:
    copy_gbps: float  # device-to-device streaming bandwidth, bytes read + written
    bf16_tflops: float  # large bf16 jnp.dot rate on random data

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def measure_ceilings(quick: bool = False) -> Ceilings:
    """Copy bandwidth (x -> x*c+d over a buffer far larger than L2) and the bf16 matmul rate, measured now."""
    on_gpu = jax.default_backend() == "gpu"
    n = (1 << 28 if on_gpu else 1 << 22) // (4 if quick else 1)
    x = jax.random.normal(jax.random.key(0), (n,), jnp.float32)
    stream = lambda c: c * jnp.float32(0.999) + jnp.float32(1e-3)
    # An idle GPU starts at low clocks: run ~1 s of streaming first, or the first ceiling reads 15-20% low.
    time_loop(stream, x, min_seconds=0.25 if quick else 1.0, repeats=1)
    t = time_loop(stream, x)
    copy_gbps = 2 * n * 4 / t / 1e9
    m = (8192 if on_gpu else 512) // (2 if quick else 1)
    a = jax.random.normal(jax.random.key(1), (m, m), jnp.bfloat16)
    b = jax.random.normal(jax.random.key(2), (m, m), jnp.bfloat16)
    # Dependent chain: feed a scaled copy of the product back as the next left operand.
    t = time_loop(lambda c, b: (c @ b) * jnp.bfloat16(1.0 / m**0.5), a, b)
    return Ceilings(copy_gbps=copy_gbps, bf16_tflops=2 * m**3 / t / 1e12)


class Progress:
    """One-line progress display on stderr for long suites. Given the suite's ``rows`` list, each step also
    prints the rows added since the previous step as ``[row] {json}`` lines, so a run killed at a time limit
    still leaves its finished measurements in the log."""

    def __init__(self, total: int, label: str, rows: list[dict] | None = None):
        self.total, self.label, self.done = max(total, 1), label, 0
        self.tty = sys.stderr.isatty()
        self.rows, self.printed = rows, 0

    def step(self, what: str) -> None:
        self.done += 1
        if self.rows is not None:
            for row in self.rows[self.printed :]:
                sys.stderr.write(
                    ("\r\033[K" if self.tty else "") + "[row] " + json.dumps(row, default=str) + "\n"
                )
            self.printed = len(self.rows)
        msg = f"[{self.label} {self.done}/{self.total}] {what}"
        if self.tty:
            sys.stderr.write("\r\033[K" + msg)
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(msg + "\n")
        sys.stderr.flush()


def rel_l2(out: Any, ref: Any) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))
