"""vmap folding shared by the families' ``custom_vmap`` rules: a mapped axis of size ``v`` is moved to the front
(broadcasting operands that are not mapped) and folded into the kernel's leading dimension or its columns, so a
vmapped call is one kernel launch, never a sequential loop."""

from __future__ import annotations

import jax.numpy as jnp


def lead(x, batched: bool, v: int):
    """``x`` with the mapped axis in front: ``[v, ...]`` (an unmapped ``x`` is broadcast)."""
    return x if batched else jnp.broadcast_to(x, (v, *x.shape))


def fold_leading(x, batched: bool, v: int):
    """``[v, B, ...]`` -> ``[v*B, ...]`` (an unmapped ``x`` is broadcast first)."""
    x = lead(x, batched, v)
    return x.reshape(v * x.shape[1], *x.shape[2:])


def unfold_leading(x, v: int):
    """``[v*B, ...]`` -> ``[v, B, ...]``."""
    return x.reshape(v, x.shape[0] // v, *x.shape[1:])


def fold_columns(x, batched: bool, v: int):
    """``[v, m, n]`` -> ``[m, v*n]`` (batch-major columns; an unmapped ``x`` is broadcast first)."""
    x = lead(x, batched, v)
    m, n = x.shape[1], x.shape[2]
    return jnp.moveaxis(x, 0, 1).reshape(m, v * n)


def unfold_columns(x, v: int):
    """``[m, v*n]`` -> ``[v, m, n]``."""
    m, vn = x.shape
    return jnp.moveaxis(x.reshape(m, v, vn // v), 1, 0)
