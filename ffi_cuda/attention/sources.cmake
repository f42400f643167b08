# The attention family's sources: the CPU twin goes into _jax_ops_cpu, the CUDA handlers and kernels into _jax_ops_cuda.
list(APPEND JAX_OPS_CPU_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/attention_cpu.cc"
)
list(APPEND JAX_OPS_CUDA_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/attention_cuda.cu"
)
# The kernel instantiations, one per file (written by generate_instantiations.py with this list).
include("${CMAKE_CURRENT_LIST_DIR}/instantiations/sources.cmake")
