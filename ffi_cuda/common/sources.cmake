# Shared native code: CUDA-only sources of the common layer (the FFI helpers are header-only).
list(APPEND JAX_OPS_CUDA_SOURCES
  "${CMAKE_CURRENT_LIST_DIR}/device_cuda.cu"
  "${CMAKE_CURRENT_LIST_DIR}/runtime_info_cuda.cu")
