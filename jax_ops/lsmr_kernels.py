"""Fused LSMR vector recurrences (internal kernels of ``jax_ops.lsmr``; public for testing and benchmarks).

The implementation lives in ``jax_ops._src.lsmr.kernels``; this module re-exports it (docs/lsmr.md).
"""

from jax_ops._src.lsmr.kernels import (
    columns_partials,
    h_update,
    hbar_x_update,
    iteration_scalars,
    iteration_step,
    norm_partials,
    normalize,
    partial_norms,
    step_update,
)

__all__ = [
    "columns_partials",
    "h_update",
    "hbar_x_update",
    "iteration_scalars",
    "iteration_step",
    "norm_partials",
    "normalize",
    "partial_norms",
    "step_update",
]


def __getattr__(
    name: str,
):  # NUM_SCALARS, NUM_INTS, NUM_PARAMS, SCALARS, ...: native constants, read on first use
    from jax_ops._src.lsmr import kernels

    return getattr(kernels, name)
