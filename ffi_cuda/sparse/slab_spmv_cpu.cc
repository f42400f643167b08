// CPU twin of jax_ops_sparse_slab_spmv (contract in slab_spmv_params.h): the same work list, clamping, per-(slab,
// row) partials in the workspace and slab-order summation as the CUDA kernels, in plain loops.
#include <algorithm>
#include <type_traits>

#include "sparse/bindings.h"
#include "sparse/slab_spmv_params.h"

namespace jax_ops::sparse {
namespace {

template <typename T>
void Run(const SlabArgs<T, T>& a) {
  // Pass 1: each work item writes the partials of its (slab, rows).
  for (int64_t b = 0; b < a.items; ++b) {
    const int64_t s = a.work[3 * b];
    if (s < 0 || s >= a.j) continue;
    const int64_t r0 = std::clamp<int64_t>(a.work[3 * b + 1], 0, a.n);
    const int64_t r1 = std::clamp<int64_t>(a.work[3 * b + 2], r0, a.n);
    const int64_t c0 = s * a.w;
    const int64_t width = std::min(a.w, a.m - c0);
    const int32_t* ptr = a.ptr + s * a.n;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t p0 = std::clamp<int64_t>(ptr[r], 0, a.nnz);
      const int64_t p1 = std::clamp<int64_t>(ptr[r + 1], p0, a.nnz);
      T acc = T(0);
      for (int64_t p = p0; p < p1; ++p)
        if (a.col[p] < width) acc += a.val[p] * a.u[c0 + a.col[p]];
      a.part[s * a.n + r] = acc;
    }
  }
  // Pass 2: slab order, then the epilogue.
  const T alpha = a.alpha[0];
  const T beta = a.y != nullptr ? a.beta[0] : T(0);
  for (int64_t r = 0; r < a.n; ++r) {
    T acc = T(0);
    for (int64_t s = 0; s < a.j; ++s) acc += a.part[s * a.n + r];
    T o = alpha * acc;
    if (a.y != nullptr) o += beta * a.y[r];
    a.out[r] = o;
  }
}

ffi::Error SlabSpmvCpu(ffi::AnyBuffer ptr, ffi::AnyBuffer col, ffi::AnyBuffer val, ffi::AnyBuffer work,
                       ffi::AnyBuffer u, ffi::AnyBuffer alpha, ffi::AnyBuffer beta, ffi::AnyBuffer y,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> ws, int64_t width, int32_t group) {
  auto shape = CheckSlabArgs(ptr, col, val, work, u, alpha, beta, y, *out, *ws, width, group);
  if (shape.has_error()) return shape.error();
  if (shape->n == 0) return ffi::Error::Success();
  return DispatchDType<JAX_OPS_SPARSE_SLAB_SPMV_DTYPES>(shape->dtype, "val", [&](auto tag) -> ffi::Error {
    using T = std::conditional_t<decltype(tag)::value == ffi::DataType::F64, double, float>;
    Run<T>(MakeSlabArgs<T, T>(*shape, ptr, col, val, work, u, alpha, beta, y, *out, *ws));
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_ops::sparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsSparseSlabSpmvCpu, jax_ops::sparse::SlabSpmvCpu,
                              JAX_OPS_SLAB_SPMV_BINDING(xla::ffi::Ffi::Bind()));
