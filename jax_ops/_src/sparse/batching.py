"""The custom_vmap'd kernel cores: vmap over the dense operand (and y/alpha/beta) folds the batch into SpMM
columns (one kernel call); a batched matrix falls back to ``lax.map``."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_ops._src.batching import fold_columns, lead, unfold_columns
from jax_ops._src.sparse.ffi import _ffi_blocks, _ffi_slab, _ffi_spmm
from jax_ops._src.sparse.plan import Plan, plan_columns
from jax_ops._src.sparse.reference import _xla_spmm
from jax_ops._src.sparse.slabs import SlabPlan, Slabs


def _map_batch(core, axis_size, args, in_batched):
    """vmap with a batched matrix: one kernel call per batch element (not a hot path, documented)."""
    full = tuple(a if bt else jnp.broadcast_to(a, (axis_size, *a.shape)) for a, bt in zip(args, in_batched))
    return lax.map(lambda xs: core(*xs), full)


def _fold_batch(v, b2, alpha, beta, y, batched):
    """vmap over (b2 [k, n], alpha [n], beta [n], y [m, n] or [0]) folded into v·n SpMM columns."""
    af = lead(alpha, batched[1], v).reshape(-1)
    betaf = lead(beta, batched[2], v).reshape(-1)
    yf = jnp.zeros((0,), y.dtype) if y.size == 0 else fold_columns(y, batched[3], v)
    return fold_columns(b2, batched[0], v), af, betaf, yf


@functools.cache
def _core(plan: Plan, implementation: str | None):
    """``out[M, N] = alpha * (A @ b2) + beta * y`` as a custom_vmap'd kernel call (vmap folds into N)."""

    @jax.custom_batching.custom_vmap
    def core(indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr):
        if implementation == "xla":
            return _xla_spmm(indptr, indices, values, b2, alpha, beta, y)
        p, ip, lr, lp = plan_columns(plan, indptr, indices, values, long_rows, long_ptr, b2.shape[1])
        return _ffi_spmm(ip, indices, values, b2, alpha, beta, y, lr, lp, plan=p)

    @core.def_vmap
    def _rule(axis_size, in_batched, indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr):
        args = (indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr)
        if any(in_batched[i] for i in (0, 1, 2, 7, 8)):
            return _map_batch(core, axis_size, args, in_batched), True
        bf, af, betaf, yf = _fold_batch(axis_size, b2, alpha, beta, y, in_batched[3:7])
        out = core(indptr, indices, values, bf, af, betaf, yf, long_rows, long_ptr)
        return unfold_columns(out, axis_size), True

    return core


def _alt_leaves(alt) -> tuple:
    """The array leaves of an N = 1 form (Slabs or Blocks), in the order its kernel call takes them."""
    if isinstance(alt, Slabs):
        return (alt.ptr, alt.col, alt.val, alt.work)
    return (alt.indptr, alt.indices, alt.values, alt.seg_table, alt.seg_ptr)


@functools.cache
def _alt_core(alt_plan, plan: Plan, implementation: str | None):
    """N = 1 product through another form of the matrix (column slabs for SlabPlan, row blocks for BlockPlan);
    vmap folds the batch into the columns of a CSR SpMM (``_core``), or stays on the form when the folded width is
    still 1. ``args``: the CSR arrays (indptr, indices, values, long_rows, long_ptr), the form's leaves
    (_alt_leaves), then b2, alpha, beta, y."""
    ffi_alt = _ffi_slab if isinstance(alt_plan, SlabPlan) else _ffi_blocks

    @jax.custom_batching.custom_vmap
    def core(*args):
        indptr, indices, values, long_rows, long_ptr = args[:5]
        b2, alpha, beta, y = args[-4:]
        if b2.shape[1] != 1:
            return _core(plan, implementation)(
                indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr
            )
        return ffi_alt(*args[5:-4], b2, alpha, beta, y, plan=alt_plan)

    @core.def_vmap
    def _rule(axis_size, in_batched, *args):
        if any(in_batched[:-4]):
            return _map_batch(core, axis_size, args, in_batched), True
        b2, alpha, beta, y = args[-4:]
        bf, af, betaf, yf = _fold_batch(axis_size, b2, alpha, beta, y, in_batched[-4:])
        out = core(*args[:-4], bf, af, betaf, yf)
        return unfold_columns(out, axis_size), True

    return core
