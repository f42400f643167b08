"""Timing method shared by every suite (the why: docs/design/benchmarks.md).

``time_loop`` jits a ``lax.fori_loop`` of K dependent calls, with the operands passed as jit *arguments* (never
captured constants, which XLA would constant-fold), picks K so one run lasts >= ``min_seconds``, warms up, and
returns the median over ``repeats`` runs of (run time / K).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import logging
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def import_peers():
    """The ../shared/peers wrappers (tokamax, FlashAttention-3) when they import (PYTHONPATH on the GPU machine),
    else None. tokamax logs one absl warning per autotuning-cache miss, which would bury the tables: quieted."""
    try:
        peers = importlib.import_module("peers")
    except Exception:  # noqa: BLE001 - every peer is optional
        return None
    logging.getLogger("absl").setLevel(logging.ERROR)
    return peers


def time_loop(
    step: Callable[..., Any],
    carry: Any,
    *operands: Any,
    min_seconds: float = 0.05,
    repeats: int = 5,
    max_iters: int = 1 << 16,
    donate_carry: bool = False,
) -> float:
    """Median seconds per ``carry = step(carry, *operands)`` measured inside one jitted loop.

    ``step`` must make each call depend on the previous one through ``carry`` so XLA cannot hoist it. The trip
    count is static: XLA then runs the loop without reading the loop predicate back to the host every iteration
    (a dynamic ``fori_loop`` costs a device-to-host sync per iteration, which would swamp calls of a few µs).
    ``donate_carry`` donates the carry to each run (an in-place update such as a cache append then copies nothing
    at the loop's entry); the ``carry`` passed in is consumed.
    """
    return statistics.median(
        time_loop_samples(
            step,
            carry,
            *operands,
            min_seconds=min_seconds,
            repeats=repeats,
            max_iters=max_iters,
            donate_carry=donate_carry,
        )
    )


def time_loop_samples(
    step: Callable[..., Any],
    carry: Any,
    *operands: Any,
    min_seconds: float = 0.05,
    repeats: int = 5,
    max_iters: int = 1 << 16,
    donate_carry: bool = False,
) -> list[float]:
    """``time_loop``'s ``repeats`` runs (seconds per call each), for a median and its spread."""

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=(1,) if donate_carry else ())
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
    return [once(k) / k for _ in range(repeats)]


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


def compiled_temp_bytes(
    fn: Callable[..., Any], *args: Any, donate_argnums: tuple[int, ...] = ()
) -> int | None:
    """Temp memory XLA reserves for ``jit(fn, donate_argnums=...)(*args)`` (compiled memory analysis), None when
    unavailable."""
    try:
        analysis = jax.jit(fn, donate_argnums=donate_argnums).lower(*args).compile().memory_analysis()
        return int(analysis.temp_size_in_bytes) if analysis is not None else None
    except Exception:  # noqa: BLE001 - some backends have no memory analysis
        return None


NOISY_SPREAD = 0.10  # (max - min) / median of a ceiling's runs above this: marked "(noisy)"


@dataclasses.dataclass
class Ceilings:
    copy_gbps: float  # streaming bandwidth, bytes read + written: the median of several runs
    bf16_tflops: float | None  # large bf16 jnp.dot rate (GPU); None where the dot ceiling is f32 (CPU)
    dot_tflops: float | None = None  # the dot ceiling in ``dot_dtype`` (bf16 on GPU, f32 on CPU)
    dot_dtype: str = "bfloat16"
    copy_spread: float = 0.0  # (max - min) / median over the runs
    dot_spread: float = 0.0

    def __post_init__(self):
        if self.dot_tflops is None:
            self.dot_tflops = self.bf16_tflops

    @property
    def copy_noisy(self) -> bool:
        return self.copy_spread > NOISY_SPREAD

    @property
    def dot_noisy(self) -> bool:
        return self.dot_spread > NOISY_SPREAD

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "copy_noisy": self.copy_noisy, "dot_noisy": self.dot_noisy}

    def describe(self) -> str:
        """One line for the header: ``copy 4170 GB/s, bf16 dot 680 TFLOP/s`` (``(noisy)`` after a spread one)."""
        noisy = lambda flag, spread: f" (noisy: runs spread {spread:.0%})" if flag else ""
        dot = "n/a" if self.dot_tflops is None else f"{self.dot_tflops:.3g} TFLOP/s"
        short = {"bfloat16": "bf16", "float32": "f32"}.get(self.dot_dtype, self.dot_dtype)
        return (
            f"copy {self.copy_gbps:.0f} GB/s{noisy(self.copy_noisy, self.copy_spread)}, "
            f"{short} dot {dot}{noisy(self.dot_noisy, self.dot_spread)}"
        )


def _spread(samples: list[float]) -> float:
    return (max(samples) - min(samples)) / statistics.median(samples)


def measure_ceilings(quick: bool = False, repeats: int = 7) -> Ceilings:
    """Copy bandwidth (x -> x*c+d over a buffer far larger than L2) and the dense matmul rate, measured now:
    the median of ``repeats`` runs each, with their spread. The dot is bf16 on a GPU and f32 on the CPU (where
    bf16 matmuls are emulated and say nothing about the machine)."""
    on_gpu = jax.default_backend() == "gpu"
    n = (1 << 28 if on_gpu else 1 << 22) // (4 if quick else 1)
    x = jax.random.normal(jax.random.key(0), (n,), jnp.float32)
    stream = lambda c: c * jnp.float32(0.999) + jnp.float32(1e-3)
    # An idle GPU starts at low clocks: run ~1 s of streaming first, or the first ceiling reads 15-20% low.
    time_loop(stream, x, min_seconds=0.25 if quick else 1.0, repeats=1)
    copy = [2 * n * 4 / t / 1e9 for t in time_loop_samples(stream, x, repeats=repeats)]
    m = (8192 if on_gpu else 512) // (2 if quick else 1)
    dtype = jnp.bfloat16 if on_gpu else jnp.float32
    a = jax.random.normal(jax.random.key(1), (m, m), dtype)
    b = jax.random.normal(jax.random.key(2), (m, m), dtype)
    # Dependent chain: feed a scaled copy of the product back as the next left operand.
    scale = dtype(1.0 / m**0.5)
    dot = [
        2 * m**3 / t / 1e12 for t in time_loop_samples(lambda c, b: (c @ b) * scale, a, b, repeats=repeats)
    ]
    dot_tflops = statistics.median(dot)
    return Ceilings(
        copy_gbps=statistics.median(copy),
        bf16_tflops=dot_tflops if on_gpu else None,
        dot_tflops=dot_tflops,
        dot_dtype=jnp.dtype(dtype).name,
        copy_spread=_spread(copy),
        dot_spread=_spread(dot),
    )


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
