"""The differentiable product: ``custom_vjp`` w.r.t. the values (the sampled product on the leaf the forward
read), the dense operand (Aᵀ g through the pair's transpose, or one built here), and alpha, beta, y."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.sparse.batching import _alt_core, _alt_leaves, _core
from jax_ops._src.sparse.blocks import BlockPlan, Blocks
from jax_ops._src.sparse.formats import _acc_dtype, _row_ids, _sanitize_indptr, _transpose_csr
from jax_ops._src.sparse.plan import Plan, plan_transpose
from jax_ops._src.sparse.slabs import SlabPlan, Slabs
from jax_ops._src.vma import vary_like


@dataclasses.dataclass(frozen=True)
class _Static:
    m: int
    k: int
    plan: Plan
    plan_t: Plan | None  # None: no transposed CSR given (built in the backward pass)
    implementation: str  # the resolved backend: "ffi" or "xla"
    alt: SlabPlan | BlockPlan | None = None  # the N = 1 form the forward product runs on (slabs or blocks)


def _sampled(indptr, indices, g, b2, k):
    """d/d values: sum_n g[row_p, n] * b2[col_p, n] for valid positions, 0 elsewhere."""
    nnz = indices.shape[0]
    acc = _acc_dtype(g.dtype)
    row, inside = _row_ids(indptr, nnz)
    valid = inside & (indices >= 0) & (indices < k)
    col = jnp.clip(indices, 0, max(k - 1, 0))
    if nnz == 0 or k == 0 or g.shape[0] == 0:
        return jnp.zeros((nnz,), acc)
    s = jnp.sum(g[row].astype(acc) * b2[col].astype(acc), axis=-1)
    return jnp.where(valid, s, 0)


def _uses_alt(st: _Static, alt, b2) -> bool:
    """Whether the product runs on the N = 1 form ``alt`` (column slabs or blocks; N = 1, not the XLA path)."""
    return st.alt is not None and alt is not None and b2.shape[1] == 1 and st.implementation != "xla"


def _product(st: _Static, a_arrays, values, alt, b2, alpha, beta, y):
    indptr, indices, long_rows, long_ptr = a_arrays
    if _uses_alt(st, alt, b2):
        return _alt_core(st.alt, st.plan, st.implementation)(
            indptr, indices, values, long_rows, long_ptr, *_alt_leaves(alt), b2, alpha, beta, y
        )
    return _core(st.plan, st.implementation)(indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr)


def _slab_sampled(slabs: Slabs, plan: SlabPlan, ga, b2):
    """d/d slabs.val of ``ga · (Aᵀ b2)``: entry p of cell (slab s, row r) with local column c gets
    ga[r] * b2[s·W + c] (0 for the padding past ptr[-1])."""
    nnz = slabs.val.shape[0]
    acc = _acc_dtype(ga.dtype)
    if nnz == 0 or plan.rows == 0 or plan.cols == 0:
        return jnp.zeros((nnz,), slabs.val.dtype)
    cell, inside = _row_ids(slabs.ptr, nnz)
    i = (cell // plan.rows) * plan.width + slabs.col.astype(jnp.int32)
    valid = inside & (i < plan.cols)
    g = ga[cell % plan.rows, 0].astype(acc) * b2[jnp.clip(i, 0, plan.cols - 1), 0].astype(acc)
    return jnp.where(valid, g, 0).astype(slabs.val.dtype)


def _blocks_sampled(bl: Blocks, ga, b2):
    """d/d bl.values of ``ga · (A b2)``: value R p + i (row R b + i, position p of block row b, column c) gets
    ga[R b + i] * b2[c] (0 for an invalid column or a position outside every block row)."""
    r = bl.plan.rows
    npos = bl.indices.shape[0]
    k = b2.shape[0]
    acc = _acc_dtype(ga.dtype)
    if npos == 0 or k == 0 or bl.plan.block_rows == 0:
        return jnp.zeros((r * npos,), bl.values.dtype)
    brow, inside = _row_ids(bl.indptr, npos)
    valid = inside & (bl.indices >= 0) & (bl.indices < k)
    xc = b2[jnp.clip(bl.indices, 0, k - 1), 0].astype(acc)
    rows = brow[:, None] * r + jnp.arange(r, dtype=jnp.int32)[None, :]
    g = ga[rows, 0].astype(acc) * xc[:, None]
    return jnp.where(valid[:, None], g, 0).reshape(-1).astype(bl.values.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _apply(st: _Static, a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y):
    out = _product(st, a_arrays, values, alt, b2, alpha, beta, y)
    # inside shard_map: the kernel's result varies where its operands do
    return vary_like(
        (out,), jax.tree_util.tree_leaves((a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y))
    )[0]


def _apply_fwd(st, a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y):
    out = _apply(st, a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y)
    return out, (a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y)


def _zero_cotangent(x):
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


def _apply_bwd(st, res, g):
    a_arrays, t_arrays, values, t_values, alt, b2, alpha, beta, y = res
    indptr, indices, long_rows, long_ptr = a_arrays
    acc = _acc_dtype(values.dtype)
    n = b2.shape[1]
    ga = (g.astype(acc) * alpha[None, :]).astype(values.dtype)
    ones = jnp.ones((n,), acc)
    empty = jnp.zeros((0,), values.dtype)
    # dB = Aᵀ (alpha * g): a row-major sweep of CSR(Aᵀ)
    if st.plan_t is not None:
        t_indptr, t_indices, t_long_rows, t_long_ptr = t_arrays
        gb = _core(st.plan_t, st.implementation)(
            t_indptr, t_indices, t_values, ga, ones, ones, empty, t_long_rows, t_long_ptr
        )
    else:
        mono = _sanitize_indptr(indptr, indices.shape[0])
        t_indptr, t_indices, tv = _transpose_csr(mono, indices, values, st.m, st.k)
        plan_t, t_lr, t_lp = plan_transpose(t_indptr, indices.shape[0], st.k)
        gb = _core(plan_t, st.implementation)(t_indptr, t_indices, tv, ga, ones, ones, empty, t_lr, t_lp)
    # d values: on the leaf the product read: slabs.val or blocks.values when it ran on that form, else values.
    g_alt = jax.tree_util.tree_map(_zero_cotangent, alt)
    if _uses_alt(st, alt, b2):
        gv = jnp.zeros_like(values)
        if isinstance(alt, Slabs):
            g_alt = dataclasses.replace(g_alt, val=_slab_sampled(alt, st.alt, ga, b2))
        else:
            g_alt = dataclasses.replace(g_alt, values=_blocks_sampled(alt, ga, b2))
    else:
        mono = _sanitize_indptr(indptr, indices.shape[0])
        gv = _sampled(mono, indices, ga, b2, st.k).astype(values.dtype)
    # d alpha = sum_rows g * (A b2) (recomputed; dead code under jit when alpha is a constant)
    ab = _product(st, a_arrays, values, alt, b2, ones, ones, empty)
    galpha = jnp.sum(g.astype(acc) * ab.astype(acc), axis=0)
    if y.size:
        gbeta = jnp.sum(g.astype(acc) * y.astype(acc), axis=0)
        gy = (g.astype(acc) * beta[None, :]).astype(y.dtype)
    else:
        gbeta = jnp.zeros_like(beta)
        gy = jnp.zeros_like(y)
    zero_like = lambda t: jax.tree_util.tree_map(lambda x: np.zeros(x.shape, jax.dtypes.float0), t)
    grads = (
        zero_like(a_arrays),
        zero_like(t_arrays),
        gv,
        jnp.zeros_like(t_values),
        g_alt,
        gb.astype(b2.dtype),
        galpha,
        gbeta,
        gy,
    )
    return _typed_like(grads, res, g)


def _typed_like(grads, primals, g):
    """Inside shard_map: each float cotangent summed over the axes its primal is invariant along (a replicated
    operand's gradient is the sum of the shards' partials) and typed like its primal."""
    flat, tree = jax.tree_util.tree_flatten(grads)
    prim = jax.tree_util.tree_leaves(primals)
    floats = [i for i, x in enumerate(flat) if jnp.issubdtype(x.dtype, jnp.inexact)]
    typed = vary_like([flat[i] for i in floats], (*prim, g), targets=[prim[i] for i in floats])
    for i, x in zip(floats, typed):
        flat[i] = x
    return jax.tree_util.tree_unflatten(tree, flat)


_apply.defvjp(_apply_fwd, _apply_bwd)
