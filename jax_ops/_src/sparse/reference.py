"""The sparse family's jnp reference (``implementation="xla"``): the csr_spmm contract's semantics in plain
jax.numpy."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_ops._src.sparse.formats import _acc_dtype, _row_ids


def _xla_spmm(indptr, indices, values, b2, alpha, beta, y):
    """Reference (implementation="xla"): same semantics for a monotone indptr, accumulating in Acc."""
    m = indptr.shape[0] - 1
    k = b2.shape[0]
    acc = _acc_dtype(values.dtype)
    nnz = indices.shape[0]
    row, inside = _row_ids(indptr, nnz)
    valid = inside & (indices >= 0) & (indices < k)
    col = jnp.clip(indices, 0, max(k - 1, 0))
    if k == 0 or nnz == 0:
        prod = jnp.zeros((m, b2.shape[1]), acc)
    else:
        contrib = jnp.where(valid, values.astype(acc), 0)[:, None] * b2[col].astype(acc)
        prod = jax.ops.segment_sum(contrib, row, num_segments=m)
    out = alpha[None, :] * prod
    if y.size:
        out = out + beta[None, :] * y.astype(acc)
    return out.astype(values.dtype)
