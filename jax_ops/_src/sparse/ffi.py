"""The ``jax.ffi`` calls of the sparse family's two targets (contracts in ffi_cuda/sparse/spmm_params.h and
slab_spmv_params.h). Plans arrive made (plan.py); these only shape workspaces and attributes."""

from __future__ import annotations

import jax
import numpy as np

from jax_ops import _ffi
from jax_ops._src.sparse.blocks import BlockPlan
from jax_ops._src.sparse.formats import _acc_dtype
from jax_ops._src.sparse.plan import Plan, _cusparse_ws_bytes, alg_code
from jax_ops._src.sparse.slabs import SlabPlan


def _ffi_spmm(indptr, indices, values, b2, alpha, beta, y, long_rows, long_ptr, *, plan: Plan):
    """``alpha * (A @ b2) + beta * y`` through jax_ops_sparse_csr_spmm with ``plan`` (already plan_columns'd)."""
    m = indptr.shape[0] - 1
    n = b2.shape[1]
    acc = _acc_dtype(values.dtype)
    out = jax.ShapeDtypeStruct((m, n), values.dtype)
    if plan.algorithm == "cusparse":
        ws_len = -(-_cusparse_ws_bytes(m, int(indices.shape[0])) // acc.itemsize)
    else:
        ws_len = max(plan.units * n, 1)
    ws = jax.ShapeDtypeStruct((ws_len,), acc)
    aliases = {6: 0} if y.size else None
    res, _ = _ffi.ffi_call(
        "jax_ops_sparse_csr_spmm",
        (out, ws),
        indptr,
        indices,
        values,
        b2,
        alpha,
        beta,
        y,
        long_rows,
        long_ptr,
        input_output_aliases=aliases,
        algorithm=np.int32(alg_code(plan.algorithm)),
        group=np.int32(plan.group),
        chunk=np.int64(plan.chunk),
    )
    return res


def _ffi_slab(ptr, col, val, work, b2, alpha, beta, y, *, plan: SlabPlan):
    """``alpha * (Aᵀ u) + beta * y`` through jax_ops_sparse_slab_spmv (b2 = u as [m, 1], y [n, 1] or [0])."""
    n = plan.rows
    acc = _acc_dtype(val.dtype)
    out = jax.ShapeDtypeStruct((n,), val.dtype)
    ws = jax.ShapeDtypeStruct((max(plan.slabs * n, 1),), acc)
    y1 = y.reshape(-1)
    res, _ = _ffi.ffi_call(
        "jax_ops_sparse_slab_spmv",
        (out, ws),
        ptr,
        col,
        val,
        work,
        b2.reshape(-1),
        alpha,
        beta,
        y1,
        input_output_aliases={7: 0} if y1.size else None,
        width=np.int64(plan.width),
        group=np.int32(plan.group),
    )
    return res[:, None]


def _ffi_blocks(bptr, bcol, bval, seg_table, seg_ptr, b2, alpha, beta, y, *, plan: BlockPlan):
    """``alpha * (A x) + beta * y`` through the csr_spmm target's blocks plan (b2 = x as [K, 1], y [M, 1] or
    [0])."""
    m = plan.rows * plan.block_rows
    out = jax.ShapeDtypeStruct((m, 1), bval.dtype)
    ws = jax.ShapeDtypeStruct((1,), _acc_dtype(bval.dtype))
    res, _ = _ffi.ffi_call(
        "jax_ops_sparse_csr_spmm",
        (out, ws),
        bptr,
        bcol,
        bval,
        b2,
        alpha,
        beta,
        y,
        seg_table,
        seg_ptr,
        input_output_aliases={6: 0} if y.size else None,
        algorithm=np.int32(alg_code("blocks")),
        group=np.int32(32),  # not read: the segment table holds the lanes per block row
        chunk=np.int64(plan.ctas),
    )
    return res
