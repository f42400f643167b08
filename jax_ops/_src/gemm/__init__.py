"""The gemm family (GEMM with a fused epilogue): see jax_ops.gemm_ops and docs/gemm.md."""
