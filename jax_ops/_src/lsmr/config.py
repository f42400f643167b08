"""The lsmr family's knobs (``jax_ops.lsmr_solver.overrides``) and the loop's static configuration."""

from __future__ import annotations

import dataclasses

from jax_ops._src.config import Knob, Knobs

# How an iteration's work after the two products runs (the ``iteration`` knob):
#   "kernels": the fused iteration (``loop.step_kernels``): the norms of u's and v's updates as partial norms, u's
#     normalisation, the vector update and the whole scalar recurrence in five launches of our own kernels
#     (``kernels.partial_norms``/``normalize``/``iteration_step``/``iteration_scalars``) instead of XLA's two-pass
#     reductions and scalar fusions. The default with the FFI kernels. A block solve (k > 1, vmap) keeps its
#     vectors in the column layout [L, k] that the products' SpMM takes and gives (in the row layout the vmap
#     fold's transposes around each product become separate copies; docs/design/lsmr.md).
#   "step": XLA's norms and scalar recurrence (``recurrence.step``) with the vector update as
#     ``kernels.step_update``.
#   "unfused": ``recurrence.step`` with XLA's v update, ``hbar_x_update``, ``h_update`` and XLA's ``||x||``.
# "step" and "unfused" give bitwise the same iterates; "kernels" sums the norms in another order (float64 sums of
# float partial norms) and so agrees with them to rounding. ``implementation="xla"`` always runs
# ``recurrence.step`` with the jnp reference of each kernel.
ITERATIONS = ("kernels", "step", "unfused")

# XLA GPU command-buffer (CUDA graph) settings, as compiler_options. A repeated enum flag is given as a comma
# separated list that *replaces* XLA's default list (FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN; no "+WHILE"
# syntax there, that is XLA_FLAGS only); "" disables command buffers.
COMMAND_BUFFER_OPTIONS = {
    "default": {},
    "off": {"xla_gpu_enable_command_buffer": ""},
    # The whole while loop as one graph with a device-side conditional node (no host round trip per trip).
    "while": {
        "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL",
        "xla_gpu_graph_min_graph_size": 1,
    },
}

# What a top-level GPU solve compiles with: the loop as one CUDA graph (faster per iteration than XLA's default;
# docs/design/lsmr.md). A caller that jits a function around lsmr passes these to its own jit for the same loop.
LOOP_COMPILER_OPTIONS = COMMAND_BUFFER_OPTIONS["while"]


def _iteration(value: str) -> str:
    if value not in ITERATIONS:
        raise ValueError(f"iteration must be one of {ITERATIONS}, got {value!r}")
    return value


def _flag(value: str) -> bool:
    return value.strip().lower() not in ("0", "false", "no", "off")


KNOBS = Knobs(
    "lsmr",
    iteration=Knob(
        "kernels",
        env="JAX_OPS_LSMR_ITERATION",
        parse=_iteration,
        doc=f"how an iteration's work after the two products runs, one of {ITERATIONS} (FFI path only)",
    ),
    pack_scalars=Knob(
        True,
        env="JAX_OPS_LSMR_PACK_SCALARS",
        parse=_flag,
        doc="carry the jnp recurrence's scalars as one stacked array (bitwise the same results)",
    ),
    compiler_options=Knob(
        LOOP_COMPILER_OPTIONS,
        doc="XLA options for a GPU solve that is its own top-level executable (lsmr called outside any jit)",
    ),
)


def overrides(**values):
    """Overrides the lsmr knobs for a block: ``with jax_ops.lsmr_solver.overrides(iteration="step"): ...``.

    Knobs: ``iteration`` (one of ``ITERATIONS``), ``pack_scalars`` (bool), ``compiler_options`` (dict of XLA
    options; see ``COMMAND_BUFFER_OPTIONS``). Read when ``lsmr`` is called (at trace time under ``jit``).
    """
    return KNOBS.override(**values)


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Static loop structure: ``unroll`` guarded iterations per trip; ``pack_scalars`` carries the jnp
    recurrence's scalars as one stacked array (``recurrence.pack``); ``iteration`` (see ITERATIONS) picks the
    iteration's kernels."""

    unroll: int
    pack_scalars: bool = True
    iteration: str = "kernels"
