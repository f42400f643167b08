// CUDA-side helpers: status-to-ffi::Error macros for CUDA, cuBLASLt and cuSPARSE, the launch check, and
// the per-device property cache. Included only by the CUDA module.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <string>
#include <utility>

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

// Opts `kernel` into `bytes` of dynamic shared memory on the current device, once per (device, kernel, bytes).
// The attribute belongs to the device's context: a process that drives several GPUs (one JAX process per host)
// must set it on each, so a process-wide "once" would fail the launches on every device but the first.
// Thread-safe; inline (function-local statics are shared across translation units) so the standalone tools in
// ffi_cuda/tools link without the CUDA module. `max_shared_carveout` also asks for the largest shared-memory
// carveout (for kernels that need several CTAs' large shared memory on one SM; a hint, set once with the rest).
inline cudaError_t SetDynamicSmemOnce(const void* kernel, int bytes, bool max_shared_carveout = false) {
  static std::mutex mu;
  static std::set<std::pair<std::pair<int, const void*>, int>> done;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(std::make_pair(device, kernel), bytes);
  if (done.count(key)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && max_shared_carveout)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess) done.insert(key);
  return err;
}

}  // namespace jax_ops
