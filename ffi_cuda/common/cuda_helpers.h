// CUDA-side helpers: status-to-ffi::Error macros for CUDA, cuBLASLt and cuSPARSE, the launch check, and
// the per-device property cache. Included only by the CUDA module.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/ffi_helpers.h"

namespace jax_ops {

inline ffi::Error CudaError(cudaError_t err, const char* expr, const char* where) {
  return ffi::Error::Internal(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                              ") from `" + expr + "` at " + where);
}

#define JAX_OPS_RETURN_IF_CUDA_ERROR(expr)                                                                      \
  do {                                                                                                          \
    cudaError_t jax_ops_cuda_err_ = (expr);                                                                     \
    if (jax_ops_cuda_err_ != cudaSuccess) return ::jax_ops::CudaError(jax_ops_cuda_err_, #expr, JAX_OPS_WHERE); \
  } while (0)

// After every kernel launch: configuration errors surface here (never synchronises).
#define JAX_OPS_RETURN_IF_LAUNCH_ERROR() JAX_OPS_RETURN_IF_CUDA_ERROR(cudaGetLastError())

struct DeviceProps {
  int device = -1;
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int max_threads_per_sm = 0;
  size_t smem_per_block_optin = 0;
  size_t l2_bytes = 0;
};

// Properties of the current device, read once per device (thread-safe).
ffi::ErrorOr<const DeviceProps*> CurrentDeviceProps();

}  // namespace jax_ops
