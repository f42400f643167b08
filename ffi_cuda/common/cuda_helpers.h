// CUDA-side helpers: status-to-ffi::Error macros for CUDA, cuBLASLt and cuSPARSE, the launch check, and
// the per-device property cache. Included only by the CUDA module.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
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

// Defines the exported CUDA handler SYMBOL for FN: BINDING is the family's binding macro (its arguments after the
// stream, shared with the CPU twin), the stream comes first, and the handler only enqueues work, so XLA may put it
// in a command buffer (CUDA graph).
#define JAX_OPS_DEFINE_CUDA_HANDLER(SYMBOL, FN, BINDING)                                                          \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(SYMBOL, FN,                                                                       \
                                BINDING(::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<cudaStream_t>>()), \
                                {::xla::ffi::Traits::kCmdBufferCompatible})

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

// Opts `kernel` into at least `bytes` of dynamic shared memory on the current device. The attribute belongs to the
// device's context: a process that drives several GPUs (one JAX process per host) must set it on each, so a
// process-wide "once" would fail the launches on every device but the first. It is one value per kernel, so the
// largest size asked for so far on each device is kept: a smaller request after a larger one changes nothing (a
// kernel whose size varies per call, like the slab SpMV, must never lower it under another call's launch).
// Thread-safe; inline (function-local statics are shared across translation units) so the standalone tools in
// ffi_cuda/tools link without the CUDA module. `max_shared_carveout` also asks for the largest shared-memory
// carveout (for kernels that need several CTAs' large shared memory on one SM; a hint, set with the size).
inline cudaError_t SetDynamicSmemOnce(const void* kernel, int bytes, bool max_shared_carveout = false) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, int> largest;  // (device, kernel) -> bytes set
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(device, kernel);
  const auto it = largest.find(key);
  if (it != largest.end() && it->second >= bytes) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess && max_shared_carveout)
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  if (err == cudaSuccess) largest[key] = bytes;
  return err;
}

// The architecture of the machine code the current device runs for `kernel` (90 for sm_90a), 0 when the query
// fails. A build without a target's code gives the kernel an empty body there, so sm_90a-only kernels ask first.
inline int KernelBinaryVersion(const void* kernel) {
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky; clear it
    return 0;
  }
  return attr.binaryVersion;
}

// A launch configuration with thread-block clusters of (cluster_x, 1, 1) for cudaLaunchKernelEx and the occupancy
// queries. `config` points at `attr`, so the object is neither copied nor moved.
struct ClusterLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t config{};
  ClusterLaunch(dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream, unsigned cluster_x) {
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster_x;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem_bytes;
    config.stream = stream;
    config.attrs = &attr;
    config.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

}  // namespace jax_ops
