"""Row blocks: a matrix whose rows come in blocks of R sharing a column list, stored once per block ("R x 1 BSR",
the csr_spmm contract's blocks plan in ffi_cuda/sparse/spmm_params.h), found and built on the device for N = 1
products."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_ops._src.sparse.config import native
from jax_ops._src.sparse.plan import DEFAULT_SEGMENT_ROWS, _segment_table, chunk_bounds, segments_from_bounds

# Rows that share a column list: in a bundle-adjustment Jacobian the 2 rows of an observation (A), a camera's 9
# rows and a point's 3 (Aᵀ); in a PDE system with R unknowns per node, the node's R rows. The blocks form ("R x 1
# BSR", the csr_spmm contract's blocks plan in ffi_cuda/sparse/spmm_params.h) stores the column list once per
# block of R consecutive rows and the R values of a position side by side, so an N = 1 product reads 4 + 4/R index
# bytes per entry instead of 8 and gathers the dense operand once per R entries. Detected and built by device
# passes over the entries (O(nnz) per candidate R) with one small read-back each, when a CSRPair is built from
# concrete arrays; N = 1 products use it, others the CSR arrays.


def _owner(starts, n: int):
    """For every position q in [0, n): the index of the last of the non-decreasing ``starts`` at or below q
    (searchsorted(starts, q, "right") - 1 for q >= starts[0], by a scatter and a prefix sum: O(n), no search)."""
    marks = jnp.zeros((n,), jnp.int32).at[starts[1:]].add(1, mode="drop")
    return jnp.cumsum(marks, dtype=jnp.int32)


@functools.partial(jax.jit, static_argnums=(2,))
def _blocks_match(indptr, indices, candidates: tuple[int, ...]):
    """bool[len(candidates)]: for each R (each dividing M), whether rows R·b .. R·b + R - 1 have equal lengths
    and the same columns in the same order for every block b (monotone indptr). The columns are compared only
    where the lengths agree (a lax.cond: a matrix rejected by its lengths costs O(M))."""
    ip = indptr.astype(jnp.int32)
    m = ip.shape[0] - 1
    nnz = indices.shape[0]
    lens = ip[1:] - ip[:-1]

    def same_columns(r):
        if nnz == 0:
            return jnp.bool_(True)
        pos = jnp.arange(nnz, dtype=jnp.int32)
        row = _owner(ip[:m], nnz)
        inside = (pos >= ip[0]) & (pos < ip[m])
        # the same position in the block's first row
        ref = jnp.clip(ip[row - row % r] + (pos - ip[row]), 0, nnz - 1)
        return jnp.all(~inside | (indices == indices[ref]))

    found = []
    for r in candidates:
        lr = lens.reshape(-1, r)
        found.append(
            lax.cond(jnp.all(lr == lr[:, :1]), lambda r=r: same_columns(r), lambda: jnp.bool_(False))
        )
    return jnp.stack(found)


def block_rows(indptr, indices, min_rows: int = 2) -> int:
    """The largest R in [max(2, min_rows), the native max_block_rows (4)] such that rows R·b .. R·b + R - 1 hold the
    same column list (same length, same columns in the same order) for every block b; 1 when no R does. One device
    pass per candidate R and one read-back of a few bytes; ``indptr`` monotone."""
    m = int(indptr.shape[0]) - 1
    candidates = tuple(
        r for r in range(native().max_block_rows, max(2, min_rows) - 1, -1) if m > 0 and m % r == 0
    )
    if not candidates:
        return 1
    found = jax.device_get(_blocks_match(jnp.asarray(indptr), jnp.asarray(indices), candidates))
    return next((r for r, ok in zip(candidates, found.tolist()) if ok), 1)


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


@functools.partial(jax.jit, static_argnums=(1,))
def _block_indptr(indptr, r: int, bounds):
    """The block indptr (block b's length is its first row's) and its values at ``bounds``."""
    ip = indptr.astype(jnp.int32)
    m = ip.shape[0] - 1
    lengths = ip[1 : m + 1 : r] - ip[0:m:r]
    bptr = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(lengths, dtype=jnp.int32)])
    return bptr, bptr[bounds]


@functools.partial(jax.jit, static_argnums=(4, 5))
def _block_gather(indptr, bptr, indices, values, r: int, entries: int):
    """The blocks form's columns and values: row R b + i's value at position p of block b lands at R p + i."""
    ip = indptr.astype(jnp.int32)
    m = ip.shape[0] - 1
    q = jnp.arange(entries, dtype=jnp.int32)
    block = _owner(bptr[:-1], entries)
    pos = ip[:-1].reshape(m // r, r)[block] + (q - bptr[block])[:, None]  # [entries, R] CSR positions
    return indices[pos[:, 0]], values[pos.reshape(-1)]


def _build_blocks(indptr, indices, values, r: int) -> Blocks:
    """The blocks form with R rows per block of a CSR (monotone indptr) whose rows come in such blocks
    (block_rows), built on the device; the values are gathered from ``values`` (gradients flow through the
    build). One read-back: the block indptr at the segment table's chunk bounds (the last is the entry count)."""
    ip = jnp.asarray(indptr)
    nb = (int(ip.shape[0]) - 1) // r
    bounds = chunk_bounds(nb, DEFAULT_SEGMENT_ROWS)
    bptr, bptr_at = _block_indptr(ip, r, jnp.asarray(bounds))
    bptr_at = np.asarray(bptr_at, np.int64)
    cols, vals = _block_gather(ip, bptr, jnp.asarray(indices), jnp.asarray(values), r, int(bptr_at[-1]))
    table, seg_ptr, ctas = _segment_table(segments_from_bounds(bounds, bptr_at))
    return Blocks(bptr, cols, vals, jnp.asarray(table), jnp.asarray(seg_ptr), BlockPlan(r, nb, ctas))
