// Host side of the column-slab bench (sparse_spmv_bench.cu --slab): the slab format and work list of
// ffi_cuda/sparse/slab_spmv_params.h built in C++ from a CSR(A), because the bench has no Python. The library
// builds the same arrays in jax_ops.sparse (_slab_arrays on device, _slab_work_host from the concrete ptr); the
// kernels are the library's (sparse/slab_spmv_kernels_impl.cuh).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "sparse/heuristics.h"

namespace jax_ops::sparse::slab_host {

using jax_ops::sparse::kSlabSmemBytes;  // the library's default slab shared memory (sparse/heuristics.h)

struct SlabHost {
  int64_t rows = 0, cols = 0, nnz = 0;  // operator rows (A's columns), gathered length (A's rows), kept entries
  int64_t w = 4, j = 1;
  std::vector<int32_t> ptr;   // [j*rows + 1]
  std::vector<uint16_t> col;  // [nnz]
  std::vector<float> val;     // [nnz]
};

// (W, J) as jax_ops.sparse.slab_shape: the fewest slabs of at most w_max entries, widths rounded up to 4.
inline void SlabShape(int64_t cols, int64_t w_max, int64_t* w, int64_t* j) {
  w_max = std::max<int64_t>(4, std::min<int64_t>(w_max, 65536) & ~int64_t{3});
  const int64_t jj = std::max<int64_t>(1, (cols + w_max - 1) / w_max);
  *w = std::max<int64_t>(4, ((cols + jj - 1) / jj + 3) & ~int64_t{3});
  *j = std::max<int64_t>(1, (cols + *w - 1) / *w);
}

// Lanes per (slab, row) as jax_ops.sparse.slab_group (the vector plan's thresholds, at least 4).
inline int SlabGroup(double per_slab_row) {
  if (per_slab_row < 64) return 4;
  if (per_slab_row < 128) return 8;
  if (per_slab_row < 256) return 16;
  return 32;
}

// Slabs of Aᵀ straight from CSR(A) (A: a_rows x a_cols): entry (i, c, v) of A is entry (c, i) of Aᵀ, slab i / w.
// Entries whose column is outside [0, a_cols) are dropped; row ranges are clamped like the library's kernels.
inline SlabHost BuildSlabsFromA(int64_t a_rows, int64_t a_cols, const int32_t* indptr, const int32_t* indices,
                                const float* values, int64_t nnz_in, int64_t w_max) {
  SlabHost h;
  h.rows = a_cols, h.cols = a_rows;
  SlabShape(a_rows, w_max, &h.w, &h.j);
  const int64_t cells = h.j * h.rows;
  std::vector<int64_t> pos(cells + 1, 0);
  auto range = [&](int64_t i, int64_t* s, int64_t* e) {
    *s = std::clamp<int64_t>(indptr[i], 0, nnz_in);
    *e = std::clamp<int64_t>(indptr[i + 1], *s, nnz_in);
  };
  for (int64_t i = 0; i < a_rows; ++i) {
    int64_t s, e;
    range(i, &s, &e);
    const int64_t base = (i / h.w) * h.rows;
    for (int64_t p = s; p < e; ++p)
      if (indices[p] >= 0 && indices[p] < a_cols) ++pos[base + indices[p] + 1];
  }
  for (int64_t c = 0; c < cells; ++c) pos[c + 1] += pos[c];
  h.nnz = pos[cells];
  h.ptr.assign(pos.begin(), pos.end());  // < 2^31 (nnz of A)
  h.col.resize(h.nnz);
  h.val.resize(h.nnz);
  for (int64_t i = 0; i < a_rows; ++i) {  // ascending i: each (s, r) ends up in ascending u order
    int64_t s, e;
    range(i, &s, &e);
    const int64_t base = (i / h.w) * h.rows;
    const uint16_t local = static_cast<uint16_t>(i % h.w);
    for (int64_t p = s; p < e; ++p) {
      const int32_t c = indices[p];
      if (c < 0 || c >= a_cols) continue;
      const int64_t q = pos[base + c]++;
      h.col[q] = local;
      h.val[q] = values[p];
    }
  }
  return h;
}

// Work list for about `items` CTAs, as jax_ops.sparse._slab_work_host: slab s gets max(1, round(items * nnz_s /
// nnz)) ranges (at most `rows`), cut at equal nnz by the slab's ptr prefix; empty ranges are dropped (an empty
// slab still gets one range: its partials must be written).
inline std::vector<int32_t> SlabWork(const SlabHost& h, int64_t items) {
  std::vector<int32_t> work;
  for (int64_t s = 0; s < h.j; ++s) {
    const int32_t* p = h.ptr.data() + s * h.rows;
    const int64_t nnz_s = p[h.rows] - p[0];
    int64_t c = h.nnz > 0 ? std::llround(double(items) * nnz_s / double(h.nnz)) : 1;
    c = std::clamp<int64_t>(c, 1, std::max<int64_t>(1, h.rows));
    int64_t r0 = 0;
    for (int64_t k = 1; k <= c; ++k) {
      int64_t r1 = h.rows;
      if (k < c) {  // first row whose prefix reaches k/c of the slab's nnz
        const int64_t target = p[0] + (nnz_s * k + c - 1) / c;
        r1 = std::lower_bound(p, p + h.rows + 1, target) - p;
        r1 = std::clamp<int64_t>(r1, r0, h.rows);
      }
      if (r1 > r0) {
        work.push_back(static_cast<int32_t>(s));
        work.push_back(static_cast<int32_t>(r0));
        work.push_back(static_cast<int32_t>(r1));
      }
      r0 = r1;
    }
  }
  return work;
}

}  // namespace jax_ops::sparse::slab_host
