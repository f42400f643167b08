// One cuBLASLt and one cuSPARSE handle per device, created on first use (also when that use is inside a CUDA-graph
// capture) and kept for the life of the process, so no handler creates one per call.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include <mutex>

#include "common/cuda_helpers.h"

namespace jax_ops {

ffi::Error CublasLtError(cublasStatus_t status, const char* expr, const char* where);
ffi::Error CusparseError(cusparseStatus_t status, const char* expr, const char* where);

#define JAX_OPS_RETURN_IF_CUBLAS_ERROR(expr)                                  \
  do {                                                                        \
    cublasStatus_t jax_ops_status_ = (expr);                                  \
    if (jax_ops_status_ != CUBLAS_STATUS_SUCCESS)                             \
      return ::jax_ops::CublasLtError(jax_ops_status_, #expr, JAX_OPS_WHERE); \
  } while (0)

#define JAX_OPS_RETURN_IF_CUSPARSE_ERROR(expr)                                \
  do {                                                                        \
    cusparseStatus_t jax_ops_status_ = (expr);                                \
    if (jax_ops_status_ != CUSPARSE_STATUS_SUCCESS)                           \
      return ::jax_ops::CusparseError(jax_ops_status_, #expr, JAX_OPS_WHERE); \
  } while (0)

// The cuBLASLt handle for the current device (the stream is passed to each cublasLtMatmul call).
ffi::ErrorOr<cublasLtHandle_t> CublasLtHandleFor(cudaStream_t stream);

// The current device's cuSPARSE handle, bound to `stream` for as long as the lease lives (the lease holds the
// handle's lock: handlers on other streams wait, so a handle never switches streams under a running call).
struct CusparseLease {
  std::unique_lock<std::mutex> lock;
  cusparseHandle_t handle;
};
ffi::ErrorOr<CusparseLease> CusparseHandleFor(cudaStream_t stream);

}  // namespace jax_ops
