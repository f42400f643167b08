"""Varying-manual-axes typing of FFI results inside ``jax.shard_map``: a custom call's results come back typed as
invariant, so each family marks them varying where its inputs vary, and sums a cotangent over the axes its primal
is invariant along (a replicated operand's gradient is the sum of the shards' partial gradients)."""

from __future__ import annotations

import jax


def varying_axes(x) -> frozenset:
    """The mesh axes ``x`` varies over inside ``shard_map`` (empty outside one)."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)  # jax >= 0.10
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", frozenset()))


def _cast(x, axes: frozenset):
    return jax.lax.pcast(x, tuple(sorted(axes)), to="varying") if axes else x


def vary_like(outs, ins, targets=None) -> tuple:
    """``outs`` marked varying over every axis any of ``ins`` varies over. With ``targets`` (one primal per
    cotangent in ``outs``), each cotangent is then summed over the axes its target is invariant along and typed
    exactly like its target. None entries pass through."""
    union = frozenset().union(*(varying_axes(x) for x in ins if x is not None))
    result = []
    for i, x in enumerate(outs):
        if x is not None:
            x = _cast(x, union - varying_axes(x))
            if targets is not None:
                want = varying_axes(targets[i])
                extra = varying_axes(x) - want
                x = jax.lax.psum(x, tuple(sorted(extra))) if extra else x
                x = _cast(x, want - varying_axes(x))
        result.append(x)
    return tuple(result)
