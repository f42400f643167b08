# The lsmr family's sources: the CPU twin goes into _jax_ops_cpu, the CUDA handlers and kernels into _jax_ops_cuda.
list(APPEND JAX_OPS_CPU_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/lsmr_cpu.cc"
)
list(APPEND JAX_OPS_CUDA_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/lsmr_cuda.cu"
  "${CMAKE_CURRENT_LIST_DIR}/kernels.cu"
)
# The scalar recurrence runs in two kernels of this file that must round alike (and like the CPU twin): no fma
# contraction there (the vector updates in it are memory-bound; mul + add costs nothing).
set_source_files_properties("${CMAKE_CURRENT_LIST_DIR}/kernels.cu" PROPERTIES COMPILE_OPTIONS
                            "--fmad=false")
