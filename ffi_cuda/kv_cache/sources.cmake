# The kv_cache family's sources: the CPU twin goes into _jax_ops_cpu, the CUDA handlers and kernels into _jax_ops_cuda.
list(APPEND JAX_OPS_CPU_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/kv_cache_cpu.cc"
)
list(APPEND JAX_OPS_CUDA_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/kv_cache_cuda.cu"
  "${CMAKE_CURRENT_LIST_DIR}/kernels.cu"
)
