# The sparse family's sources: the CPU twin goes into _jax_ops_cpu, the CUDA handlers and kernels into _jax_ops_cuda.
# The kernel instantiations are written by generate_instantiations.py (one per kernel kind and dtype).
list(APPEND JAX_OPS_CPU_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/slab_spmv_cpu.cc"
  "${CMAKE_CURRENT_LIST_DIR}/spmm_cpu.cc"
)
list(APPEND JAX_OPS_CUDA_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/slab_spmv_cuda.cu"
  "${CMAKE_CURRENT_LIST_DIR}/spmm_cuda.cu"
  "${CMAKE_CURRENT_LIST_DIR}/instantiations/slab_spmv_kernels_f32.cu"
  "${CMAKE_CURRENT_LIST_DIR}/instantiations/slab_spmv_kernels_f64.cu"
  "${CMAKE_CURRENT_LIST_DIR}/instantiations/spmm_kernels_bf16.cu"
  "${CMAKE_CURRENT_LIST_DIR}/instantiations/spmm_kernels_f16.cu"
  "${CMAKE_CURRENT_LIST_DIR}/instantiations/spmm_kernels_f32.cu"
  "${CMAKE_CURRENT_LIST_DIR}/instantiations/spmm_kernels_f64.cu"
)
