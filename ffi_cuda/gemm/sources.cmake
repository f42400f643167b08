# The gemm family's sources: the CPU twin goes into _jax_ops_cpu, the CUDA handler and kernels into _jax_ops_cuda.
# The kernels (without the handler) also build into the standalone harness ffi_cuda/tools/gemm_bench.cu.
list(APPEND JAX_OPS_CPU_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/gemm_cpu.cc"
)
set(JAX_OPS_GEMM_KERNEL_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/gemm_cublaslt.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_simt.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_skinny.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_skinny_fp8.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_sm90.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_sm90_f16.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_sm90_bf16.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_sm90_fp8.cu"
  "${CMAKE_CURRENT_LIST_DIR}/gemm_sm90_s8.cu"
)
list(APPEND JAX_OPS_CUDA_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/gemm_cuda.cu"
  ${JAX_OPS_GEMM_KERNEL_SOURCES}
)
