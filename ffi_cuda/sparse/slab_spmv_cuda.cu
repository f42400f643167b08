// CUDA FFI handler for jax_ops_sparse_slab_spmv (contract in slab_spmv_params.h): decode, re-validate, one dtype
// dispatch, launch. The partials' workspace comes from Python (an extra result): CUDA-graph compatible.
#include <string>

#include "common/cuda_helpers.h"
#include "sparse/bindings.h"
#include "sparse/slab_spmv_kernels.h"
#include "sparse/slab_spmv_params.h"

namespace jax_ops::sparse {
namespace {

ffi::Error SlabSpmvCuda(cudaStream_t stream, ffi::AnyBuffer ptr, ffi::AnyBuffer col, ffi::AnyBuffer val,
                        ffi::AnyBuffer work, ffi::AnyBuffer u, ffi::AnyBuffer alpha, ffi::AnyBuffer beta,
                        ffi::AnyBuffer y, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> ws,
                        int64_t width, int32_t group) {
  auto shape = CheckSlabArgs(ptr, col, val, work, u, alpha, beta, y, *out, *ws, width, group);
  if (shape.has_error()) return shape.error();
  if (shape->n == 0) return ffi::Error::Success();
  auto props = CurrentDeviceProps();
  if (props.has_error()) return props.error();
  const size_t smem = static_cast<size_t>(shape->w) * ffi::ByteWidth(shape->dtype);
  if (smem > (*props)->smem_per_block_optin)
    return ffi::Error::InvalidArgument("slab_spmv: a slab of width " + std::to_string(shape->w) + " needs " +
                                       std::to_string(smem) + " bytes of shared memory; this device allows " +
                                       std::to_string((*props)->smem_per_block_optin) +
                                       " per block (build the CSRPair with slabs=False)");
  return DispatchDType<JAX_OPS_SPARSE_SLAB_SPMV_DTYPES>(shape->dtype, "val", [&](auto tag) -> ffi::Error {
    using T = std::conditional_t<decltype(tag)::value == ffi::DataType::F64, double, float>;
    auto a = MakeSlabArgs<T, T>(*shape, ptr, col, val, work, u, alpha, beta, y, *out, *ws);
    a.prefetch_nnz = SlabPrefetchNnz(a.w, (*props)->sm_count);
    JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchSlabSpmv<T, T>(stream, a, (*props)->sm_count)));
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_ops::sparse

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsSparseSlabSpmvCuda, jax_ops::sparse::SlabSpmvCuda, JAX_OPS_SLAB_SPMV_BINDING);
