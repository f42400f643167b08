"""jax_ops: hand-tuned CUDA kernels for JAX as XLA FFI custom calls, with CPU twins.

Importing this package loads nothing native; targets are registered on the first op call.
"""

from jax_ops import attention, gemm_ops, kv_cache, lsmr_kernels, sparse
from jax_ops._ffi import has_cuda_build, runtime_info
from jax_ops.attention import dot_product_attention
from jax_ops.gemm_ops import gated_linear, gemm, linear
from jax_ops.lsmr_solver import LSMRResult, lsmr

__version__ = "0.1.0"

__all__ = [
    "LSMRResult",
    "attention",
    "dot_product_attention",
    "gated_linear",
    "gemm",
    "gemm_ops",
    "has_cuda_build",
    "kv_cache",
    "linear",
    "lsmr",
    "lsmr_kernels",
    "runtime_info",
    "sparse",
]
