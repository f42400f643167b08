// CUDA FFI handler for jax_ops_sparse_csr_spmm (contract in spmm_params.h): decode, re-validate, one dtype
// dispatch, launch. Workspace comes from Python (an extra result), so the handler is CUDA-graph compatible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cusparse.h>

#include <type_traits>

#include "common/cuda_helpers.h"
#include "common/dtype_traits.h"
#include "common/handle_pool.h"
#include "sparse/bindings.h"
#include "sparse/spmm_kernels.h"
#include "sparse/spmm_params.h"

namespace jax_ops::sparse {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The cuSPARSE descriptors of one call (host objects; destroyed once the SpMV is enqueued).
struct CusparseDescrs {
  cusparseSpMatDescr_t a = nullptr;
  cusparseDnVecDescr_t x = nullptr, y = nullptr;
  ~CusparseDescrs() {
    if (a) cusparseDestroySpMat(a);
    if (x) cusparseDestroyDnVec(x);
    if (y) cusparseDestroyDnVec(y);
  }
};

// The cusparse plan (contract in spmm_params.h): out = alpha * A x + beta * y as cuSPARSE's in-place form
// Y = alpha A X + beta Y on out, which first gets y (copied unless XLA aliased them) or zeros (no y: beta is the
// workspace's zero). alpha/beta are device scalars (pointer mode device). Enqueues only: CUDA-graph safe.
template <typename T>
ffi::Error CusparseSpmv(cudaStream_t stream, const SpmmArgs<T, T>& a, ffi::AnyBuffer& ws) {
  auto lease = CusparseHandleFor(stream);
  if (lease.has_error()) return lease.error();
  const cusparseHandle_t handle = lease->handle;
  constexpr cudaDataType kType = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_64F;
  char* zero = static_cast<char*>(ws.untyped_data());
  const size_t bytes = static_cast<size_t>(a.m) * sizeof(T);
  if (a.y == nullptr) {
    JAX_OPS_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(a.out, 0, bytes, stream));
    JAX_OPS_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(zero, 0, sizeof(T), stream));
  } else if (static_cast<const void*>(a.y) != static_cast<const void*>(a.out)) {
    JAX_OPS_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(a.out, a.y, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  const T* beta = a.y != nullptr ? a.beta : reinterpret_cast<const T*>(zero);
  CusparseDescrs d;
  JAX_OPS_RETURN_IF_CUSPARSE_ERROR(cusparseCreateCsr(
      &d.a, a.m, a.k, a.nnz, const_cast<int32_t*>(a.indptr), const_cast<int32_t*>(a.indices), const_cast<T*>(a.values),
      CUSPARSE_INDEX_32I, CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, kType));
  JAX_OPS_RETURN_IF_CUSPARSE_ERROR(cusparseCreateDnVec(&d.x, a.k, const_cast<T*>(a.b), kType));
  JAX_OPS_RETURN_IF_CUSPARSE_ERROR(cusparseCreateDnVec(&d.y, a.m, a.out, kType));
  JAX_OPS_RETURN_IF_CUSPARSE_ERROR(cusparseSetPointerMode(handle, CUSPARSE_POINTER_MODE_DEVICE));
  constexpr auto kOp = CUSPARSE_OPERATION_NON_TRANSPOSE;
  constexpr auto kAlg = CUSPARSE_SPMV_CSR_ALG2;
  size_t need = 0;
  JAX_OPS_RETURN_IF_CUSPARSE_ERROR(
      cusparseSpMV_bufferSize(handle, kOp, a.alpha, d.a, d.x, beta, d.y, kType, kAlg, &need));
  const size_t have = ws.size_bytes() - static_cast<size_t>(kCusparseZeroBytes);
  if (need > have)
    return ffi::Error::InvalidArgument("csr_spmm: the cusparse plan's workspace has " + std::to_string(have) +
                                       " bytes for cuSPARSE, which asks for " + std::to_string(need) +
                                       " (jax_ops.sparse._cusparse_ws_bytes is too small for this matrix)");
  JAX_OPS_RETURN_IF_CUSPARSE_ERROR(
      cusparseSpMV(handle, kOp, a.alpha, d.a, d.x, beta, d.y, kType, kAlg, zero + kCusparseZeroBytes));
  return ffi::Error::Success();
}

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
  return DispatchDType<JAX_OPS_SPARSE_SPMM_DTYPES>(shape->dtype, "values", [&](auto tag) -> ffi::Error {
    using T = typename CudaDType<decltype(tag)::value>::T;
    using Acc = typename CudaDType<decltype(tag)::value>::Acc;
    auto a = MakeSpmmArgs<T, Acc>(*shape, indptr, indices, values, b, alpha, beta, y, long_rows, long_ptr, *out, *ws);
    if constexpr (std::is_same_v<T, Acc>)  // f32, f64 (CheckSpmmArgs allows the cusparse plan only there)
      if (shape->algorithm == kCusparse) return CusparseSpmv<T>(stream, a, *ws);
    constexpr int64_t kVec = 16 / sizeof(T);
    const bool vec16 = shape->n > 1 && shape->n % kVec == 0 && Aligned16(a.b) && Aligned16(a.out) &&
                       (a.y == nullptr || Aligned16(a.y));
    JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchCsrSpmm<T, Acc>(stream, a, vec16, (*props)->sm_count)));
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_ops::sparse

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsSparseCsrSpmmCuda, jax_ops::sparse::CsrSpmmCuda, JAX_OPS_CSR_SPMM_BINDING);
