// The LSMR vector recurrences (the Foundation's vertical slice), shared by the CPU twin and the CUDA handler.
//
//   hbar_x:  hbar' = h - c_h * hbar;   x' = x + c_x * hbar'      (one pass: read h, hbar, x; write hbar, x)
//   h:       h'    = v - c_v * h
//   h_hbar_x: both in one pass (hbar' and x' from the old h, then h'): read v, h, hbar, x; write h, hbar, x.
//             The LSMR loop runs this one: with the two separate kernels XLA also copies h twice per
//             iteration (h_update overwrites the h that hbar_x reads, with no order between the two calls).
//
// Vectors have shape [..., n]; each coefficient has the leading shape [...] (one scalar per row), which is what
// vmap with "broadcast_all" produces and what a block LSMR (one column per right-hand side) needs.
#pragma once

#include <cstdint>

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

// Per-element updates, written once for the CPU twin and the CUDA kernels. `c` holds the row's coefficients,
// `in` the element of each input, `out` receives each result.
struct HbarXUpdate {
  static constexpr int kIn = 3;    // h, hbar, x
  static constexpr int kOut = 2;   // hbar', x'
  static constexpr int kCoef = 2;  // c_h, c_x
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
  template <typename T>
#ifdef __CUDACC__
  __host__ __device__
#endif
      static void Apply(const T* c, const T* in, T* out) {
    out[0] = in[0] - c[0] * in[1];
  }
};

// The fused iteration: the same expressions as HbarXUpdate then HUpdate, so results are bitwise those of the
// two separate kernels.
struct HHbarXUpdate {
  static constexpr int kIn = 4;    // v, h, hbar, x
  static constexpr int kOut = 3;   // h', hbar', x'
  static constexpr int kCoef = 3;  // c_h, c_x, c_v
  template <typename T>
#ifdef __CUDACC__
  __host__ __device__
#endif
      static void Apply(const T* c, const T* in, T* out) {
    const T hbar_new = in[1] - c[0] * in[2];
    out[1] = hbar_new;
    out[2] = in[3] + c[1] * hbar_new;
    out[0] = in[0] - c[2] * in[1];
  }
};

}  // namespace jax_ops::lsmr
