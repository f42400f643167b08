"""The gemm family's knobs: overrides for tests and experiments, read at trace time.

``plan`` forces one CUDA plan ("sm90", "skinny", "simt", "cublaslt"; "auto" takes the dispatch table's plan for
the problem's class where it has one (tuning.py), else ffi_cuda/gemm/heuristics.h's rules); it travels to the
handler as the ``plan`` attribute, and a forced plan that cannot run a problem fails with InvalidArgument. The CPU twin has one kernel and accepts every plan. Environment: ``JAX_OPS_GEMM_PLAN``. Override
for a block with ``jax_ops.gemm_ops.overrides(plan="skinny")``.
"""

from __future__ import annotations

from jax_ops import _ffi
from jax_ops._src.config import Knob, Knobs

KNOBS = Knobs(
    "gemm",
    plan=Knob(
        "auto",
        env="JAX_OPS_GEMM_PLAN",
        doc="force a CUDA plan: auto (the dispatch table, then the rules), sm90, skinny, simt or cublaslt",
    ),
)


def overrides(**values):
    """Context manager overriding gemm knobs (``plan``) for the calls traced inside it."""
    return KNOBS.override(**values)


def plan_id(plan: str) -> int:
    """A ``plan`` knob value as the kernel's id (its index in constants()["gemm_plans"])."""
    names = _ffi.constants()["gemm_plans"]
    if plan not in names:
        raise ValueError(f"gemm knob plan must be one of {names}, got {plan!r} (env JAX_OPS_GEMM_PLAN)")
    return names.index(plan)
