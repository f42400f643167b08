// The LSMR vector recurrences (the Foundation's vertical slice), shared by the CPU twin and the CUDA handler.
//
//   hbar_x:  hbar' = h - c_h * hbar;   x' = x + c_x * hbar'      (one pass: read h, hbar, x; write hbar, x)
//   h:       h'    = v - c_v * h
//   step:    the solver's whole update after its products (LsmrStepUpdate below): v's normalisation, both of
//            the above and partial norms of x'. One pass instead of XLA's v fusion, the two kernels, two
//            copies of h (h_update overwrites the h that hbar_x reads, with no order between the two calls) and
//            XLA's reduction for ||x||.
//
// Vectors have shape [..., n]; each coefficient has the leading shape [...] (one scalar per row), which is what
// vmap with "broadcast_all" produces and what a block LSMR (one column per right-hand side) needs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/ffi_helpers.h"

namespace jax_ops::lsmr {

// rows = product of the leading dims, n = length of the last dim.
struct RowShape {
  int64_t rows = 0;
  int64_t n = 0;
};

// Checks the vectors (same shape and dtype, rank >= 1) and coefficients (shape = the vectors' leading dims,
// same dtype). `vectors` are the inputs and results that must all match.
template <size_t NV, size_t NC>
ffi::ErrorOr<RowShape> CheckRecurrenceArgs(const ffi::AnyBuffer* const (&vectors)[NV],
                                           const char* const (&vector_names)[NV],
                                           const ffi::AnyBuffer* const (&coefs)[NC],
                                           const char* const (&coef_names)[NC]) {
  const ffi::AnyBuffer& ref = *vectors[0];
  auto dims = ref.dimensions();
  if (dims.size() < 1)
    return ffi::Unexpected(ffi::Error::InvalidArgument(std::string(vector_names[0]) + " must have rank >= 1"));
  for (size_t i = 1; i < NV; ++i) {
    ffi::Error e = CheckSameShape(*vectors[i], vector_names[i], ref, vector_names[0]);
    if (!e.success()) return ffi::Unexpected(std::move(e));
  }
  for (size_t i = 0; i < NC; ++i) {
    auto cd = coefs[i]->dimensions();
    bool ok = cd.size() + 1 == dims.size() && coefs[i]->element_type() == ref.element_type();
    for (size_t d = 0; ok && d < cd.size(); ++d) ok = cd[d] == dims[d];
    if (!ok)
      return ffi::Unexpected(ffi::Error::InvalidArgument(
          std::string(coef_names[i]) + " must be " + DTypeName(ref.element_type()) + " with shape " +
          ShapeString(std::vector<int64_t>(dims.begin(), dims.end() - 1)) + " (the vectors' leading dims); got " +
          DTypeName(coefs[i]->element_type()) + " " + ShapeString(cd)));
  }
  RowShape shape;
  shape.n = dims[dims.size() - 1];
  shape.rows = 1;
  for (size_t d = 0; d + 1 < dims.size(); ++d) shape.rows *= dims[d];
  return shape;
}

// Length of a row of LsmrStepUpdate's `partials`: the CUDA kernel's CTAs per row (one 16-byte vector per thread,
// 256 threads; the launcher's grid is exactly this wide). Mirrored by jax_ops/lsmr_kernels.py.
constexpr int64_t NormPartials(int64_t n, int64_t itemsize) {
  const int64_t elems_per_cta = 256 * (16 / itemsize);
  return n == 0 ? 1 : (n + elems_per_cta - 1) / elems_per_cta;
}

inline int64_t NormPartialsFor(ffi::DataType dtype, int64_t n) {
  return NormPartials(n, dtype == ffi::DataType::F64 ? 8 : 4);
}

// partials must have the vectors' dtype and shape [leading dims..., count].
inline ffi::Error CheckPartials(const ffi::AnyBuffer& partials, const ffi::AnyBuffer& vector, int64_t count) {
  auto dims = vector.dimensions();
  std::vector<int64_t> want(dims.begin(), dims.end() - 1);
  want.push_back(count);
  auto got = partials.dimensions();
  if (partials.element_type() != vector.element_type() || std::vector<int64_t>(got.begin(), got.end()) != want)
    return ffi::Error::InvalidArgument(std::string("partials must be ") + DTypeName(vector.element_type()) +
                                       " with shape " + ShapeString(want) + "; got " +
                                       DTypeName(partials.element_type()) + " " + ShapeString(got));
  return ffi::Error::Success();
}

// a * b rounded to T, never contracted into a neighbouring fma (the CPU twin's build does not contract).
template <typename T>
#ifdef __CUDACC__
__host__ __device__
#endif
    inline T MulRn(T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) == 4)
    return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Per-element updates, written once for the CPU twin and the CUDA kernels. `c` holds the row's coefficients,
// `in` the element of each input, `out` receives each result.
struct HbarXUpdate {
  static constexpr int kIn = 3;        // h, hbar, x
  static constexpr int kOut = 2;       // hbar', x'
  static constexpr int kCoef = 2;      // c_h, c_x
  static constexpr int kNormOut = -1;  // no partial norms
  template <typename T>
#ifdef __CUDACC__
  __host__ __device__
#endif
      static void Apply(const T* c, const T* in, T* out) {
    const T hbar_new = in[0] - c[0] * in[1];
    out[0] = hbar_new;
    out[1] = in[2] + c[1] * hbar_new;
  }
};

struct HUpdate {
  static constexpr int kIn = 2;    // v, h
  static constexpr int kOut = 1;   // h'
  static constexpr int kCoef = 1;  // c_v
  static constexpr int kNormOut = -1;
  template <typename T>
#ifdef __CUDACC__
  __host__ __device__
#endif
      static void Apply(const T* c, const T* in, T* out) {
    out[0] = in[0] - c[0] * in[1];
  }
};

// One LSMR iteration's vector work after the two products, in one pass (what the solver runs):
//   v'    = keep_v ? v : vb * s_v          (SciPy: v = A^T u - beta v, then v *= 1/alpha unless beta = 0)
//   hbar' = h - c_h * hbar;   x' = x + c_x * hbar';   h' = v' - c_v * h
// plus each CTA's norm of its elements of x' (the `partials` output: ||x'|| is the norm of a row of partials; a
// norm, not a sum of squares, so float32 partials do not overflow before the caller's float64 sum). The same
// expressions as XLA's v update followed by HbarXUpdate and HUpdate, so v', h', hbar', x' are bitwise theirs: the
// product vb * s_v is rounded on its own (MulRn), as XLA's separate fusion rounded it.
struct LsmrStepUpdate {
  static constexpr int kIn = 5;       // vb, v, h, hbar, x
  static constexpr int kOut = 4;      // v', h', hbar', x'
  static constexpr int kCoef = 5;     // s_v, keep_v (0 or 1), c_h, c_x, c_v
  static constexpr int kNormOut = 3;  // x': one partial norm per CTA
  template <typename T>
#ifdef __CUDACC__
  __host__ __device__
#endif
      static void Apply(const T* c, const T* in, T* out) {
    const T v_new = c[1] != T(0) ? in[1] : MulRn(in[0], c[0]);
    const T hbar_new = in[2] - c[2] * in[3];
    out[0] = v_new;
    out[1] = v_new - c[4] * in[2];
    out[2] = hbar_new;
    out[3] = in[4] + c[3] * hbar_new;
  }
};

}  // namespace jax_ops::lsmr
