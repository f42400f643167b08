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

namespace {

// Runs `create` with this thread's stream-capture mode relaxed: XLA may trace a command buffer (stream capture in
// global mode) around the first call that needs a handle, and cusparseCreate / cublasLtCreate make calls that
// global mode forbids during a capture (measured: cusparseCreate fails with NOT_INITIALIZED). The handle itself
// is not part of the capture.
template <typename F>
auto OutsideCapture(F&& create) {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&mode);
  auto status = create();
  cudaThreadExchangeStreamCaptureMode(&mode);
  return status;
}

}  // namespace

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
  cublasStatus_t status = OutsideCapture([&] { return cublasLtCreate(&handle); });
  if (status != CUBLAS_STATUS_SUCCESS) return ffi::Unexpected(CublasLtError(status, "cublasLtCreate", JAX_OPS_WHERE));
  pool.emplace(device, handle);
  return handle;
}

ffi::ErrorOr<CusparseLease> CusparseHandleFor(cudaStream_t stream) {
  struct Slot {
    std::mutex mu;  // held by a lease: one handler at a time binds the device's handle to its stream
    cusparseHandle_t handle = nullptr;
  };
  static std::mutex pool_mu;
  static std::map<int, Slot> pool;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return ffi::Unexpected(CudaError(err, "cudaGetDevice", JAX_OPS_WHERE));
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(pool_mu);
    slot = &pool[device];  // std::map: the slot's address is stable
  }
  CusparseLease lease{std::unique_lock<std::mutex>(slot->mu), nullptr};
  if (slot->handle == nullptr) {
    cusparseStatus_t status = OutsideCapture([&] { return cusparseCreate(&slot->handle); });
    if (status != CUSPARSE_STATUS_SUCCESS) {
      slot->handle = nullptr;
      return ffi::Unexpected(CusparseError(status, "cusparseCreate", JAX_OPS_WHERE));
    }
  }
  cusparseStatus_t status = cusparseSetStream(slot->handle, stream);
  if (status != CUSPARSE_STATUS_SUCCESS)
    return ffi::Unexpected(CusparseError(status, "cusparseSetStream", JAX_OPS_WHERE));
  lease.handle = slot->handle;
  return std::move(lease);
}

}  // namespace jax_ops
