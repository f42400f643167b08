"""Row blocks: a matrix whose rows come in blocks of R sharing a column list, stored once per block ("R x 1 BSR",
the csr_spmm contract's blocks plan in ffi_cuda/sparse/spmm_params.h), found on the host and built for N = 1
products."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.sparse.config import KNOBS, native
from jax_ops._src.sparse.plan import DEFAULT_SEGMENT_ROWS, _segment_table, segments_host

# Rows that share a column list: in a bundle-adjustment Jacobian the 2 rows of an observation (A), a camera's 9
# rows and a point's 3 (Aᵀ); in a PDE system with R unknowns per node, the node's R rows. The blocks form ("R x 1
# BSR", the csr_spmm contract's blocks plan in ffi_cuda/sparse/spmm_params.h) stores the column list once per
# block of R consecutive rows and the R values of a position side by side, so an N = 1 product reads 4 + 4/R index
# bytes per entry instead of 8 and gathers the dense operand once per R entries. Found on the host (O(nnz) per R)
# when a CSRPair is built from concrete arrays; N = 1 products use it, others the CSR arrays.


def _block_positions(ip: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray]:
    """(block indptr int64[M/R + 1], positions int64[P, R]): the CSR position of entry p of every block's row i,
    for a monotone indptr whose rows come in blocks of R equal lengths."""
    m = ip.shape[0] - 1
    blen = np.diff(ip)[::r]
    bptr = np.concatenate([[0], np.cumsum(blen)])
    within = np.arange(int(bptr[-1])) - np.repeat(bptr[:-1], blen)
    pos = np.stack([np.repeat(ip[i:m:r], blen) + within for i in range(r)], axis=1)
    return bptr, pos


def block_rows_host(indptr, indices, min_rows: int = 2) -> int:
    """The largest R in [max(2, min_rows), the native max_block_rows (4)] such that rows R·b .. R·b + R - 1 hold the same column
    list (same length, same columns in the same order) for every block b; 1 when no R does. Host (concrete
    arrays)."""
    ip = np.asarray(indptr, np.int64)
    m = ip.shape[0] - 1
    lens = np.diff(ip)
    idx = None

    def same_columns(ptr, r):
        cols = idx[_block_positions(ptr, r)[1]]
        return bool((cols == cols[:, :1]).all())

    for r in range(native().max_block_rows, max(2, min_rows) - 1, -1):
        if m <= 0 or m % r:
            continue
        lr = lens.reshape(-1, r)
        if not (lr == lr[:, :1]).all():
            continue
        idx = np.asarray(indices) if idx is None else idx
        # the first blocks' column lists first: a matrix whose row lengths repeat but whose columns do not is rejected
        # without a pass over all its entries
        probe = min(m // r, KNOBS.block_probe) * r
        if same_columns(ip[: probe + 1], r) and (probe == m or same_columns(ip, r)):
            return r
    return 1


# The auto rule: the blocks form serves N = 1 products when R >= 3 (at R = 2 the CSR kernels are faster;
# docs/design/sparse.md). blocks=True builds the form for any R.
_BLOCKS_MIN_ROWS = 3


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """Static shape of a blocks form: R rows per block, M / R block rows, CTAs of its segment table."""

    rows: int
    block_rows: int
    ctas: int


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A matrix in the blocks form (arrays as in spmm_params.h) with its static plan; a registered pytree.
    ``values[R p + i]`` is the entry of row R b + i at position p of block row b."""

    indptr: jax.Array
    indices: jax.Array
    values: jax.Array
    seg_table: jax.Array
    seg_ptr: jax.Array
    plan: BlockPlan


jax.tree_util.register_dataclass(
    Blocks, data_fields=["indptr", "indices", "values", "seg_table", "seg_ptr"], meta_fields=["plan"]
)


def _build_blocks(indptr, indices, values, r: int) -> Blocks:
    """The blocks form with R rows per block of a concrete CSR (monotone indptr) whose rows come in such blocks
    (block_rows_host). The values are gathered on the device from ``values`` (gradients flow through the build)."""
    ip = np.asarray(indptr, np.int64)
    bptr, pos = _block_positions(ip, r)
    cols = np.asarray(indices)[pos[:, 0]]
    vals = jnp.asarray(values)[jnp.asarray(pos.reshape(-1).astype(np.int32))]
    table, seg_ptr, ctas = _segment_table(segments_host(bptr, DEFAULT_SEGMENT_ROWS))
    plan = BlockPlan(r, (ip.shape[0] - 1) // r, ctas)
    return Blocks(
        jnp.asarray(bptr.astype(np.int32)),
        jnp.asarray(cols),
        vals,
        jnp.asarray(table),
        jnp.asarray(seg_ptr),
        plan,
    )
