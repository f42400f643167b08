"""LSMR for sparse/dense least squares, matching ``scipy.sparse.linalg.lsmr`` (``jax_ops.lsmr``).

The implementation lives in ``jax_ops._src.lsmr``; this module re-exports the public names (docs/lsmr.md).
"""

from jax_ops._src.lsmr.api import lsmr
from jax_ops._src.lsmr.config import COMMAND_BUFFER_OPTIONS, ITERATIONS, LOOP_COMPILER_OPTIONS, overrides
from jax_ops._src.lsmr.heuristics import GPU_UNROLL
from jax_ops._src.lsmr.sharded import RowShardedMatrix, row_sharded
from jax_ops._src.lsmr.types import ISTOP_MESSAGES, LSMRResult

__all__ = [
    "COMMAND_BUFFER_OPTIONS",
    "GPU_UNROLL",
    "ISTOP_MESSAGES",
    "ITERATIONS",
    "LOOP_COMPILER_OPTIONS",
    "LSMRResult",
    "RowShardedMatrix",
    "lsmr",
    "overrides",
    "row_sharded",
]
