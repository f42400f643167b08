// CPU twin of jax_ops_sparse_csr_spmm (contract in spmm_params.h): plain loops, the same clamping and
// split-algorithm workspace protocol as the CUDA kernels (so the Python plan is exercised on CPU too).
#include <algorithm>
#include <vector>

#include "common/dtype_traits.h"
#include "sparse/bindings.h"
#include "sparse/spmm_params.h"

namespace jax_ops::sparse {
namespace {

template <typename C>
void RowRange(const SpmmArgs<typename C::T, typename C::Acc>& a, int64_t r, int64_t* s, int64_t* e) {
  const int64_t lo = std::clamp<int64_t>(a.indptr[r], 0, a.nnz);
  *s = lo;
  *e = std::clamp<int64_t>(a.indptr[r + 1], lo, a.nnz);
}

// acc[0..n) += sum over [s, e) of values[p] * b[col[p], :]
template <typename C>
void Accumulate(const SpmmArgs<typename C::T, typename C::Acc>& a, int64_t s, int64_t e, typename C::Acc* acc) {
  for (int64_t p = s; p < e; ++p) {
    const int64_t c = a.indices[p];
    if (c < 0 || c >= a.k) continue;
    const typename C::Acc v = C::Load(a.values[p]);
    const typename C::T* brow = a.b + c * a.n;
    for (int64_t j = 0; j < a.n; ++j) acc[j] += v * C::Load(brow[j]);
  }
}

template <typename C>
void Epilogue(const SpmmArgs<typename C::T, typename C::Acc>& a, int64_t r, const typename C::Acc* acc) {
  for (int64_t j = 0; j < a.n; ++j) {
    typename C::Acc v = a.alpha[j] * acc[j];
    if (a.y != nullptr) v += a.beta[j] * C::Load(a.y[r * a.n + j]);
    a.out[r * a.n + j] = C::Store(v);
  }
}

template <typename C>
void Run(const SpmmArgs<typename C::T, typename C::Acc>& a) {
  using Acc = typename C::Acc;
  std::vector<Acc> acc(static_cast<size_t>(a.n));
  if ((a.algorithm == kSegmented || a.algorithm == kBlocks) && a.n == 1) {
    // The rows the CUDA grid writes: segment s runs when its CTA range [ptr[s], min(ptr[s+1], chunk)) is
    // non-empty (the kernel's lookup on a non-decreasing prefix); its rows [begin, end) clamped to [0, M) (block
    // rows clamped to [0, M / R) for blocks, each writing its R rows).
    const int64_t rows = a.m / a.r;
    std::vector<Acc> racc(static_cast<size_t>(a.r));
    for (int64_t sg = 0; sg < a.num_long; ++sg) {
      const int64_t c0 = a.long_ptr[sg], c1 = std::min<int64_t>(a.long_ptr[sg + 1], a.chunk);
      if (c0 < 0 || c1 <= c0) continue;
      const int64_t r0 = std::clamp<int64_t>(a.long_rows[3 * sg], 0, rows);
      const int64_t r1 = std::clamp<int64_t>(a.long_rows[3 * sg + 1], r0, rows);
      for (int64_t r = r0; r < r1; ++r) {
        int64_t s, e;
        RowRange<C>(a, r, &s, &e);
        std::fill(racc.begin(), racc.end(), Acc(0));
        for (int64_t p = s; p < e; ++p) {  // segmented: R = 1
          const int64_t c = a.indices[p];
          if (c < 0 || c >= a.k) continue;
          const Acc x = C::Load(a.b[c]);
          for (int64_t i = 0; i < a.r; ++i) racc[i] += C::Load(a.values[p * a.r + i]) * x;
        }
        for (int64_t i = 0; i < a.r; ++i) Epilogue<C>(a, r * a.r + i, &racc[i]);
      }
    }
    return;
  }
  const bool split = a.algorithm == kSplit;
  for (int64_t r = 0; r < a.m; ++r) {
    int64_t s, e;
    RowRange<C>(a, r, &s, &e);
    if (split && e - s > a.chunk) continue;  // long row: passes 2 and 3
    std::fill(acc.begin(), acc.end(), Acc(0));
    Accumulate<C>(a, s, e, acc.data());
    Epilogue<C>(a, r, acc.data());
  }
  if (!split || a.num_long == 0) return;
  const int64_t total = std::clamp<int64_t>(a.long_ptr[a.num_long], 0, a.units);
  // Pass 2: one partial per unit.
  for (int64_t u = 0; u < total; ++u) {
    // largest i with long_ptr[i] <= u
    const int32_t* it = std::upper_bound(a.long_ptr, a.long_ptr + a.num_long + 1, static_cast<int32_t>(u));
    const int64_t i = (it - a.long_ptr) - 1;
    if (i < 0 || i >= a.num_long) continue;
    const int64_t r = a.long_rows[i];
    if (r < 0 || r >= a.m) continue;
    int64_t s, e;
    RowRange<C>(a, r, &s, &e);
    const int64_t k = u - a.long_ptr[i];
    const int64_t cs = std::min(e, s + k * a.chunk), ce = std::min(e, cs + a.chunk);
    Acc* part = a.ws + u * a.n;
    std::fill(part, part + a.n, Acc(0));
    Accumulate<C>(a, cs, ce, part);
  }
  // Pass 3: sum the partials of each long row in unit order.
  for (int64_t i = 0; i < a.num_long; ++i) {
    const int64_t r = a.long_rows[i];
    const int64_t u0 = std::clamp<int64_t>(a.long_ptr[i], 0, total);
    const int64_t u1 = std::clamp<int64_t>(a.long_ptr[i + 1], u0, total);
    if (r < 0 || r >= a.m || u1 <= u0) continue;
    std::fill(acc.begin(), acc.end(), Acc(0));
    for (int64_t u = u0; u < u1; ++u)
      for (int64_t j = 0; j < a.n; ++j) acc[j] += a.ws[u * a.n + j];
    Epilogue<C>(a, r, acc.data());
  }
}

ffi::Error CsrSpmmCpu(ffi::AnyBuffer indptr, ffi::AnyBuffer indices, ffi::AnyBuffer values, ffi::AnyBuffer b,
                      ffi::AnyBuffer alpha, ffi::AnyBuffer beta, ffi::AnyBuffer y, ffi::AnyBuffer long_rows,
                      ffi::AnyBuffer long_ptr, ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> ws,
                      int32_t algorithm, int32_t group, int64_t chunk) {
  auto shape = CheckSpmmArgs(indptr, indices, values, b, alpha, beta, y, long_rows, long_ptr, *out, *ws, algorithm,
                             group, chunk);
  if (shape.has_error()) return shape.error();
  if (shape->m == 0 || shape->n == 0) return ffi::Error::Success();
  return DispatchDType<JAX_OPS_SPARSE_SPMM_DTYPES>(shape->dtype, "values", [&](auto tag) -> ffi::Error {
    using C = CpuDType<decltype(tag)::value>;
    auto a = MakeSpmmArgs<typename C::T, typename C::Acc>(*shape, indptr, indices, values, b, alpha, beta, y, long_rows,
                                                          long_ptr, *out, *ws);
    Run<C>(a);
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_ops::sparse

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsSparseCsrSpmmCpu, jax_ops::sparse::CsrSpmmCpu,
                              JAX_OPS_CSR_SPMM_BINDING(xla::ffi::Ffi::Bind()));
