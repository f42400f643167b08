"""The lsmr family's Python dispatch rules, each with its reason (the numbers behind them: docs/design/lsmr.md;
the native launch rules are in ffi_cuda/lsmr/heuristics.h)."""

from __future__ import annotations

# implementation=None on the CPU runs the XLA path: faster per iteration than the single-threaded CPU twin
# (docs/lsmr.md, "Implementations").
DEFAULT_ON_CPU = "xla"

# Iterations per while-loop trip on a GPU: with the loop as one CUDA graph, unroll 2 costs about what unroll 4 does
# per iteration at half the compile time.
GPU_UNROLL = 2


def default_unroll(backend: str) -> int:
    """``unroll=None``: GPU_UNROLL on a GPU; 1 elsewhere (no host round trip per trip to amortise)."""
    return GPU_UNROLL if backend == "gpu" else 1


def use_columns(k: int) -> bool:
    """The fused iteration's vector layout for k right-hand sides: a block solve (k > 1) keeps its vectors in the
    column layout [L, k] that the products' SpMM takes and gives, so no transposes run around each product."""
    return k > 1
