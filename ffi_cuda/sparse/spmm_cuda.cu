// CUDA FFI handler for jax_ops_sparse_csr_spmm (contract in spmm_params.h): decode, re-validate, one dtype
// dispatch, launch. Workspace comes from Python (an extra result), so the handler is CUDA-graph compatible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/cuda_helpers.h"
#include "sparse/spmm_kernels.h"
#include "sparse/spmm_params.h"

namespace jax_ops::sparse {
namespace {

template <ffi::DataType DT>
struct DeviceType;
template <>
struct DeviceType<ffi::DataType::F32> {
  using T = float;
  using Acc = float;
};
template <>
struct DeviceType<ffi::DataType::F64> {
  using T = double;
  using Acc = double;
};
template <>
struct DeviceType<ffi::DataType::F16> {
  using T = __half;
  using Acc = float;
};
template <>
struct DeviceType<ffi::DataType::BF16> {
  using T = __nv_bfloat16;
  using Acc = float;
};

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

ffi::Error CsrSpmmCuda(cudaStream_t stream, ffi::AnyBuffer indptr, ffi::AnyBuffer indices, ffi::AnyBuffer values,
                       ffi::AnyBuffer b, ffi::AnyBuffer alpha, ffi::AnyBuffer beta, ffi::AnyBuffer y,
                       ffi::AnyBuffer long_rows, ffi::AnyBuffer long_ptr, ffi::Result<ffi::AnyBuffer> out,
                       ffi::Result<ffi::AnyBuffer> ws, int32_t algorithm, int32_t group, int64_t chunk) {
  auto shape = CheckSpmmArgs(indptr, indices, values, b, alpha, beta, y, long_rows, long_ptr, *out, *ws, algorithm,
                             group, chunk);
  if (shape.has_error()) return shape.error();
  if (shape->m == 0 || shape->n == 0) return ffi::Error::Success();
  auto props = CurrentDeviceProps();
  if (props.has_error()) return props.error();
  return DispatchDType<ffi::DataType::F16, ffi::DataType::BF16, ffi::DataType::F32, ffi::DataType::F64>(
      shape->dtype, "values", [&](auto tag) -> ffi::Error {
        using T = typename DeviceType<decltype(tag)::value>::T;
        using Acc = typename DeviceType<decltype(tag)::value>::Acc;
        auto a =
            MakeSpmmArgs<T, Acc>(*shape, indptr, indices, values, b, alpha, beta, y, long_rows, long_ptr, *out, *ws);
        constexpr int64_t kVec = 16 / sizeof(T);
        const bool vec16 = shape->n > 1 && shape->n % kVec == 0 && Aligned16(a.b) && Aligned16(a.out) &&
                           (a.y == nullptr || Aligned16(a.y));
        JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchCsrSpmm<T, Acc>(stream, a, vec16, (*props)->sm_count)));
        return ffi::Error::Success();
      });
}

}  // namespace
}  // namespace jax_ops::sparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    JaxOpsSparseCsrSpmmCuda, jax_ops::sparse::CsrSpmmCuda,
    JAX_OPS_CSR_SPMM_BINDING(xla::ffi::Ffi::Bind().Ctx<xla::ffi::PlatformStream<cudaStream_t>>()),
    {xla::ffi::Traits::kCmdBufferCompatible});
