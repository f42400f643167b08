"""Sparse SpMV/SpMM over CSR (``jax.experimental.sparse`` BCSR/BCOO, scipy.sparse) with row-profile dispatch.

Public API:
  * ``matmul(A, B)`` / ``spmv(A, x)`` / ``spmm(A, B)`` for ``A`` a 2-D BCSR, BCOO (n_batch=0, n_dense=0) or
    :class:`CSRPair`, ``B`` dense ``[K]`` or ``[K, N]``; ``matmul(B, A)`` for dense ``B`` ``[M]`` / ``[N, M]``.
  * :class:`CSRPair`: CSR(A) and CSR(Aᵀ) built once (the transpose on device, with ``jax.lax.sort``) plus the
    row profiles of both, which pick the kernel statically. ``.matvec``, ``.rmatvec`` (a row-major sweep of
    CSR(Aᵀ), no atomics), ``.matmat``, ``.rmatmat``, ``.T``, ``.shape``, ``.dtype``. Every product takes the fused
    epilogue ``out = alpha * (A @ B) + beta * y`` (alpha/beta run-time 0-d or per-column arrays), which is what
    LSMR's ``u <- A v - alpha u`` needs in one pass. ``pair @ x`` and ``u @ pair`` (= ``pair.T @ u``).

Dtypes: values f16, bf16, f32, f64 (the dense operand has the same dtype; half types accumulate in f32, f64 in
f64), int32 indices. nnz and dims must be < 2^31.

  * ``to_csr(A)``: a BCOO/scipy matrix as a BCSR, the conversion ``matmul`` makes per call, made once.

Semantics: BCOO indices as in jax.experimental.sparse: [-dim, -1] wraps numpy-style, any other index outside the
matrix is padding and contributes nothing; duplicates are summed. A BCOO with ``indices_sorted`` converts to CSR
by counting its rows (no sort); any other BCOO is sorted per call (docs/sparse.md: the cost model). Invalid BCSR never reads or writes out of bounds: the default plan, a CSRPair and
the "split" algorithm first make indptr monotone (running maximum of the indptr clamped to [0, nnz]); a forced
vector/warp/cta plan uses per row [clamp(indptr[r], 0, nnz), clamp(indptr[r+1], that, nnz)) (a decreasing
indptr gives an empty row), so on invalid input the two may differ; both are finite and write every output.
Entries whose column is outside [0, K) contribute nothing.

Dispatch: a CSRPair built outside jit picks its plans from host row profiles; everything else (BCSR, BCOO,
scipy, a pair built under jit, the transpose of a backward pass) takes the profile-free split plan, whose cost
is bounded for any row-length distribution (docs/design/sparse.md).

Gradients: ``custom_vjp`` w.r.t. the values (the sampled product g[row]·B[col]), the dense operand (Aᵀ g through
the pair's transpose, or a transpose built in the backward pass for plain BCSR/BCOO), and alpha, beta, y.

Batching: ``vmap`` over the dense operand (and y/alpha/beta) folds the batch into SpMM columns — one kernel call,
never a loop. Batched matrices (values under vmap) fall back to ``lax.map``; BCOO/BCSR with n_batch > 0 are
rejected.

Partitioning: row-independent. Under ``jax.shard_map`` shard the dense operand over N (columns) and replicate
the matrix: each shard runs SpMM on its local columns with no communication. Rows sharded:
:func:`row_sharded` (``A`` split over a mesh axis as :class:`RowShardedCSR`, one CSR(A_s) + CSR(A_sᵀ) block per
shard): ``A @ x`` (x replicated, the result row-sharded, no communication), ``A.T @ u`` / ``u @ A`` (u
row-sharded, a local product and one psum), and ``A_blk.local_matmul`` / ``local_rmatmul`` inside a hand-written
``shard_map``.

Knobs (``with overrides(...)``): ``slab_smem_bytes`` (the slab width budget; docs/sparse.md).
"""

from __future__ import annotations

from jax_ops._src.sparse.api import matmul, profile_of, spmm, spmv, to_csr
from jax_ops._src.sparse.blocks import BlockPlan, Blocks, block_rows
from jax_ops._src.sparse.config import overrides
from jax_ops._src.sparse.csr_pair import CSRPair, csr_pair
from jax_ops._src.sparse.formats import RowProfile
from jax_ops._src.sparse.plan import (
    ALGORITHMS,
    DEFAULT_SEGMENT_ROWS,
    DEFAULT_SPLIT_CHUNK,
    Plan,
    choose_algorithm,
    cusparse_applicable,
    segmented_applies,
    segments_host,
    spmm_takes_split,
)
from jax_ops._src.sparse.sharded import SHARDED_ALGORITHMS, RowShardedCSR, row_sharded
from jax_ops._src.sparse.slabs import SlabModel, SlabPlan, Slabs, slab_group, slab_model, slab_shape

__all__ = [
    "ALGORITHMS",
    "BlockPlan",
    "Blocks",
    "CSRPair",
    "DEFAULT_SEGMENT_ROWS",
    "DEFAULT_SPLIT_CHUNK",
    "MAX_BLOCK_ROWS",  # noqa: F822 (module __getattr__)
    "Plan",
    "RowProfile",
    "RowShardedCSR",
    "SHARDED_ALGORITHMS",
    "SLAB_CTAS_PER_SM",  # noqa: F822
    "STREAM_CAP",  # noqa: F822
    "SlabModel",
    "SlabPlan",
    "Slabs",
    "block_rows",
    "choose_algorithm",
    "csr_pair",
    "cusparse_applicable",
    "matmul",
    "overrides",
    "profile_of",
    "row_sharded",
    "segmented_applies",
    "segments_host",
    "slab_group",
    "slab_model",
    "slab_shape",
    "spmm",
    "spmm_takes_split",
    "spmv",
    "to_csr",
]

# Native constants, read from the compiled module on first use (jax_ops._ffi.constants()).
_NATIVE = {
    "MAX_BLOCK_ROWS": "max_block_rows",
    "STREAM_CAP": "stream_cap",
    "SLAB_CTAS_PER_SM": "slab_ctas_per_sm",
}


def __getattr__(name: str):
    if name in _NATIVE:
        from jax_ops._src.sparse.config import native

        return getattr(native(), _NATIVE[name])
    if name == "SLAB_SMEM_BYTES":
        from jax_ops._src.sparse.config import slab_smem_bytes

        return slab_smem_bytes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
