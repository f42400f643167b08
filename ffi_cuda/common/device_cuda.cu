// Device-property cache and the cuBLASLt / cuSPARSE handle pools.
#include <map>
#include <mutex>
#include <utility>

#include "common/cuda_helpers.h"
#include "common/handle_pool.h"

namespace jax_ops {

ffi::ErrorOr<const DeviceProps*> CurrentDeviceProps() {
  static std::mutex mu;
  static std::map<int, DeviceProps> cache;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return ffi::Unexpected(CudaError(err, "cudaGetDevice", JAX_OPS_WHERE));
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(device);
  if (it != cache.end()) return &it->second;
  cudaDeviceProp p;
  err = cudaGetDeviceProperties(&p, device);
  if (err != cudaSuccess) return ffi::Unexpected(CudaError(err, "cudaGetDeviceProperties", JAX_OPS_WHERE));
  DeviceProps props;
  props.device = device;
  props.sm_count = p.multiProcessorCount;
  props.cc_major = p.major;
  props.cc_minor = p.minor;
  props.max_threads_per_sm = p.maxThreadsPerMultiProcessor;
  props.smem_per_block_optin = p.sharedMemPerBlockOptin;
  props.l2_bytes = static_cast<size_t>(p.l2CacheSize);
  return &cache.emplace(device, props).first->second;
}

ffi::Error CublasLtError(cublasStatus_t status, const char* expr, const char* where) {
  return ffi::Error::Internal(std::string("cuBLASLt error ") + cublasLtGetStatusName(status) + " (" +
                              cublasLtGetStatusString(status) + ") from `" + expr + "` at " + where);
}

ffi::Error CusparseError(cusparseStatus_t status, const char* expr, const char* where) {
  return ffi::Error::Internal(std::string("cuSPARSE error ") + cusparseGetErrorName(status) + " (" +
                              cusparseGetErrorString(status) + ") from `" + expr + "` at " + where);
}

ffi::ErrorOr<cublasLtHandle_t> CublasLtHandleFor(cudaStream_t /*stream*/) {
  static std::mutex mu;
  static std::map<int, cublasLtHandle_t> pool;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return ffi::Unexpected(CudaError(err, "cudaGetDevice", JAX_OPS_WHERE));
  std::lock_guard<std::mutex> lock(mu);
  auto it = pool.find(device);
  if (it != pool.end()) return it->second;
  cublasLtHandle_t handle = nullptr;
  cublasStatus_t status = cublasLtCreate(&handle);
  if (status != CUBLAS_STATUS_SUCCESS) return ffi::Unexpected(CublasLtError(status, "cublasLtCreate", JAX_OPS_WHERE));
  pool.emplace(device, handle);
  return handle;
}

ffi::ErrorOr<cusparseHandle_t> CusparseHandleFor(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, cusparseHandle_t> pool;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return ffi::Unexpected(CudaError(err, "cudaGetDevice", JAX_OPS_WHERE));
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(device, stream);
  auto it = pool.find(key);
  if (it != pool.end()) return it->second;
  cusparseHandle_t handle = nullptr;
  cusparseStatus_t status = cusparseCreate(&handle);
  if (status != CUSPARSE_STATUS_SUCCESS) return ffi::Unexpected(CusparseError(status, "cusparseCreate", JAX_OPS_WHERE));
  status = cusparseSetStream(handle, stream);
  if (status != CUSPARSE_STATUS_SUCCESS) {
    cusparseDestroy(handle);
    return ffi::Unexpected(CusparseError(status, "cusparseSetStream", JAX_OPS_WHERE));
  }
  pool.emplace(key, handle);
  return handle;
}

}  // namespace jax_ops
