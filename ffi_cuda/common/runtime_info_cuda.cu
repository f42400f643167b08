// jax_ops_runtime_info (CUDA only): reports the device and the linked library versions, creating the
// cuBLASLt and cuSPARSE handles through the pools. Used by tests and `python -m jax_ops.bench` headers to prove
// the CUDA module, its libraries and the handle pools work on this machine.
#include "common/cuda_helpers.h"
#include "common/handle_pool.h"

namespace jax_ops {
namespace {

// Output int32[8]: device, SM count, cc major, cc minor, cuBLASLt version, cuSPARSE version, cudart version,
// driver version.
constexpr int kInfoFields = 8;
using InfoBuffer = ffi::Buffer<ffi::DataType::S32, 1>;

ffi::Error RuntimeInfoCuda(cudaStream_t stream, ffi::Result<InfoBuffer> out) {
  JAX_OPS_CHECK_ARG(out->element_count() == kInfoFields,
                    "runtime_info output must have " << kInfoFields << " elements");
  auto props = CurrentDeviceProps();
  if (props.has_error()) return props.error();
  auto lt = CublasLtHandleFor(stream);
  if (lt.has_error()) return lt.error();
  auto sp = CusparseHandleFor(stream);
  if (sp.has_error()) return sp.error();
  int cusparse_version = 0;
  JAX_OPS_RETURN_IF_CUSPARSE_ERROR(cusparseGetVersion(sp->handle, &cusparse_version));
  int runtime_version = 0, driver_version = 0;
  JAX_OPS_RETURN_IF_CUDA_ERROR(cudaRuntimeGetVersion(&runtime_version));
  JAX_OPS_RETURN_IF_CUDA_ERROR(cudaDriverGetVersion(&driver_version));
  // Static so the asynchronous copy reads valid host memory after this handler returns.
  static thread_local int32_t info[kInfoFields];
  info[0] = (*props)->device;
  info[1] = (*props)->sm_count;
  info[2] = (*props)->cc_major;
  info[3] = (*props)->cc_minor;
  info[4] = static_cast<int32_t>(cublasLtGetVersion());
  info[5] = cusparse_version;
  info[6] = runtime_version;
  info[7] = driver_version;
  JAX_OPS_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(out->typed_data(), info, sizeof(info), cudaMemcpyHostToDevice, stream));
  // The copy from pageable memory is staged before cudaMemcpyAsync returns, so `info` may be reused.
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_ops

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxOpsRuntimeInfoCuda, jax_ops::RuntimeInfoCuda,
    xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>().Ret<jax_ops::InfoBuffer>());
