// Column-slab SpMV contract shared by the CPU twin (slab_spmv_cpu.cc) and the CUDA handler (slab_spmv_cuda.cu).
//
// The operator is Aᵀ of a tall A (m x n): out[n] = alpha * (Aᵀ u) + beta * y, u of length m. u's index range is
// cut into J = ceil(m / W) slabs of W entries (W a multiple of 4 in [4, 65536]; the last slab may be narrower),
// and Aᵀ is stored slab by slab ("column slabs", built in Python by jax_ops.sparse._build_slabs):
//   ptr   s32[J*n + 1], slab-major: the entries of (slab s, row r) are [ptr[s*n + r], ptr[s*n + r + 1]);
//   col   u16[nnz]: the entry's index into u minus s*W (its column inside the slab), ascending within (s, r);
//   val   T[nnz];
//   work  s32[3*items]: item b covers slab work[3b], rows [work[3b+1], work[3b+2]); together the items of a slab
//         cover [0, n) once (Python cuts each slab at equal nnz; an empty slab still has an item).
// Pass 1 writes part[s*n + r] = sum of (s, r)'s entries (val * u) into the workspace (Acc[>= J*n]); pass 2 sums
// part[0..J-1, r] in slab order and applies the epilogue. No atomics: deterministic run to run.
//
// FFI target "jax_ops_sparse_slab_spmv":
//   args:  ptr s32[J*n+1], col u16[nnz], val T[nnz], work s32[3*items], u T[m], alpha Acc[1], beta Acc[1],
//          y T[n] or T[0] (no y: beta ignored)
//   rets:  out T[n], workspace Acc[>= J*n]
//   attrs: width (s64: W), group (s32: lanes per (slab, row) of pass 1, one of 4, 8, 16, 32)
// T is f32 or f64 (Acc = T). Half types keep the CSR(Aᵀ) path (jax_ops_sparse_csr_spmm).
//
// Bad data never reads or writes out of bounds: (s, r)'s range is clamped like the CSR kernels' rows
// (s = clamp(ptr[i], 0, nnz), e = clamp(ptr[i+1], s, nnz)), local columns at or past the slab's width are
// skipped, and items with a slab outside [0, J) or rows outside [0, n) are skipped or clamped. A work list that
// does not cover every (slab, row) leaves those partials unset (their value is whatever the workspace held);
// every output element is still written.
#pragma once

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"
#include "sparse/instantiations/support.h"

namespace jax_ops::sparse {

constexpr int64_t kSlabMaxWidth = 65536;  // local columns are uint16
constexpr int64_t kSlabMaxDim = (int64_t{1} << 31) - 1;

struct SlabShape {
  int64_t n = 0;      // output rows (A's columns)
  int64_t m = 0;      // length of u (A's rows)
  int64_t nnz = 0;    // entries stored (col/val length)
  int64_t w = 4;      // slab width
  int64_t j = 0;      // slabs
  int64_t items = 0;  // work items
  int32_t group = 4;
  bool has_y = false;
  ffi::DataType dtype = ffi::DataType::F32;
};

// Plain pointers for one call (T: value type, Acc: accumulator).
template <typename T, typename Acc>
struct SlabArgs {
  const int32_t* ptr = nullptr;
  const uint16_t* col = nullptr;
  const T* val = nullptr;
  const int32_t* work = nullptr;
  const T* u = nullptr;
  const Acc* alpha = nullptr;
  const Acc* beta = nullptr;
  const T* y = nullptr;  // nullptr: no y term
  T* out = nullptr;
  Acc* part = nullptr;  // [j * n]
  int64_t n = 0, m = 0, nnz = 0, w = 4, j = 0, items = 0;
  int32_t group = 4;
  int32_t prefetch_nnz = 0;  // CUDA: > 0 L2-prefetches the first entries of an item while u[slab] is staged
};

inline ffi::ErrorOr<SlabShape> CheckSlabArgs(const ffi::AnyBuffer& ptr, const ffi::AnyBuffer& col,
                                             const ffi::AnyBuffer& val, const ffi::AnyBuffer& work,
                                             const ffi::AnyBuffer& u, const ffi::AnyBuffer& alpha,
                                             const ffi::AnyBuffer& beta, const ffi::AnyBuffer& y,
                                             const ffi::AnyBuffer& out, const ffi::AnyBuffer& ws, int64_t width,
                                             int32_t group) {
  auto fail = [](std::string msg) { return ffi::Unexpected(ffi::Error::InvalidArgument("slab_spmv: " + msg)); };
  SlabShape s;
  s.dtype = val.element_type();
  if (!Contains(kSlabSpmvDTypes, s.dtype))
    return fail(std::string("val has dtype ") + DTypeName(s.dtype) +
                "; expected f32 or f64 (half types use the CSR path)");
  const ffi::DataType acc = s.dtype;
  auto rank1 = [](const ffi::AnyBuffer& b) { return b.dimensions().size() == 1; };
  if (!rank1(ptr) || ptr.element_type() != ffi::DataType::S32) return fail("ptr must be a rank-1 int32 array");
  if (!rank1(work) || work.element_type() != ffi::DataType::S32) return fail("work must be a rank-1 int32 array");
  if (!rank1(col) || col.element_type() != ffi::DataType::U16) return fail("col must be a rank-1 uint16 array");
  if (!rank1(val)) return fail("val must have rank 1");
  if (!rank1(u) || !rank1(out) || !rank1(y))
    return fail("u, y and out must have rank 1, got " + ShapeString(u.dimensions()) + ", " +
                ShapeString(y.dimensions()) + " and " + ShapeString(out.dimensions()));
  if (u.element_type() != s.dtype || y.element_type() != s.dtype || out.element_type() != s.dtype)
    return fail("u, y and out must have the values' dtype " + std::string(DTypeName(s.dtype)));
  s.nnz = val.dimensions()[0];
  if (col.dimensions()[0] != s.nnz)
    return fail("col has " + std::to_string(col.dimensions()[0]) + " entries but val has " + std::to_string(s.nnz));
  s.m = u.dimensions()[0];
  s.n = out.dimensions()[0];
  if (s.m > kSlabMaxDim || s.n > kSlabMaxDim || s.nnz > kSlabMaxDim) return fail("m, n and nnz must be < 2^31");
  if (width < 4 || width > kSlabMaxWidth || width % 4 != 0)
    return fail("width must be a multiple of 4 in [4, 65536], got " + std::to_string(width));
  s.w = width;
  s.j = (s.m + width - 1) / width;
  if (s.j * s.n + 1 > kSlabMaxDim) return fail("J * n must be < 2^31 - 1");
  if (ptr.dimensions()[0] != s.j * s.n + 1)
    return fail("ptr has " + std::to_string(ptr.dimensions()[0]) + " entries; expected J*n + 1 = " +
                std::to_string(s.j * s.n + 1) + " (J = ceil(m / width) = " + std::to_string(s.j) + ")");
  if (work.dimensions()[0] % 3 != 0)
    return fail("work must hold (slab, row begin, row end) triples, got " + std::to_string(work.dimensions()[0]) +
                " entries");
  s.items = work.dimensions()[0] / 3;
  if (s.items > kSlabMaxDim) return fail("too many work items");
  for (const ffi::AnyBuffer* c : {&alpha, &beta}) {
    if (c->element_type() != acc || !rank1(*c) || c->dimensions()[0] != 1)
      return fail("alpha and beta must be " + std::string(DTypeName(acc)) + "[1]");
  }
  if (y.element_count() != 0) {
    if (y.dimensions()[0] != s.n)
      return fail("y must be empty or have the shape of out " + ShapeString(out.dimensions()) + "; got " +
                  ShapeString(y.dimensions()));
    s.has_y = true;
  }
  if (ws.element_type() != acc || !rank1(ws) || static_cast<int64_t>(ws.element_count()) < s.j * s.n)
    return fail("workspace must be a rank-1 " + std::string(DTypeName(acc)) + " array of at least J*n = " +
                std::to_string(s.j * s.n) + " elements, got " + ShapeString(ws.dimensions()));
  if (group != 4 && group != 8 && group != 16 && group != 32)
    return fail("group must be 4, 8, 16 or 32, got " + std::to_string(group));
  s.group = group;
  return s;
}

template <typename T, typename Acc>
SlabArgs<T, Acc> MakeSlabArgs(const SlabShape& s, const ffi::AnyBuffer& ptr, const ffi::AnyBuffer& col,
                              const ffi::AnyBuffer& val, const ffi::AnyBuffer& work, const ffi::AnyBuffer& u,
                              const ffi::AnyBuffer& alpha, const ffi::AnyBuffer& beta, const ffi::AnyBuffer& y,
                              ffi::AnyBuffer& out, ffi::AnyBuffer& ws) {
  SlabArgs<T, Acc> a;
  a.ptr = static_cast<const int32_t*>(ptr.untyped_data());
  a.col = static_cast<const uint16_t*>(col.untyped_data());
  a.val = static_cast<const T*>(val.untyped_data());
  a.work = static_cast<const int32_t*>(work.untyped_data());
  a.u = static_cast<const T*>(u.untyped_data());
  a.alpha = static_cast<const Acc*>(alpha.untyped_data());
  a.beta = static_cast<const Acc*>(beta.untyped_data());
  a.y = s.has_y ? static_cast<const T*>(y.untyped_data()) : nullptr;
  a.out = static_cast<T*>(out.untyped_data());
  a.part = static_cast<Acc*>(ws.untyped_data());
  a.n = s.n, a.m = s.m, a.nnz = s.nnz, a.w = s.w, a.j = s.j, a.items = s.items;
  a.group = s.group;
  return a;
}

}  // namespace jax_ops::sparse
