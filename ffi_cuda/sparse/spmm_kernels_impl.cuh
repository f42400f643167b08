// CSR SpMV/SpMM kernels (contract in spmm_params.h). Included once per dtype by spmm_kernels_<dtype>.cu.
//
// Thread mappings (the plan is chosen in Python from the row profile, see jax_ops/sparse.py):
//   SpmvRowsKernel<G,U,S>  N == 1 (vector/warp and split's short rows): a warp owns U * 32/G consecutive rows,
//                       G lanes (1..32) per row, U rows per lane, S steps of loads per iteration (U * S products
//                       in flight per lane), next block's indptr prefetched. Config per G: RowsConfig.
//   SpmvGroupKernel<G>  N == 1, one row per group of G lanes, 2 in flight: the baseline of
//                       ffi_cuda/tools/sparse_spmv_bench.cu, not launched by LaunchCsrSpmm.
//   SpmvCtaKernel       N == 1: one 256-thread CTA per row, warp shuffles + fixed-order smem reduction.
//   SpmvBlocksKernel<R>  N == 1, blocks plan (R rows share a column list): the segmented lookup over block rows,
//                       the row-block mapping per block row, one b[col] gather per position for R rows.
//   SpmmSlotsKernel<G,VEC,S>  N > 1 with 16-byte rows (N a multiple of 16/sizeof(T), aligned): G * S lanes own
//                       (row, column tile of G*VEC columns), G column lanes with VEC register accumulators each
//                       by S slots that split the row's entries (4 gathers in flight per lane); S by row length.
//   SpmmSegmentedSlotsKernel<G,VEC>  N > 1, 16-byte rows, segmented plan: CTA b runs its segment (the N == 1
//                       table) with the slots of the segment's average row.
//   SpmmGroupKernel<G,1>  other N > 1: a group of G lanes owns (row, column tile of G columns). The group loads
//                       G (col, value) pairs at once, one per lane, and broadcasts them with shuffles, so
//                       index/value reads are coalesced and amortised over the tile.
//   split               rows longer than `chunk` are skipped by the kernels above (pass 1), cut into units of
//                       `chunk` nnz (pass 2: SpmvUnitKernel for N == 1, the N > 1 kernel in unit mode,
//                       partials into the workspace) and summed by SpmvFixupKernel (N == 1: lane l sums units
//                       l, l+32, ... then a fixed xor tree) or SplitFixupKernel (N > 1: unit order). No atomics.
// x/B, values and indices are read through the read-only path (__ldg). Positions and output offsets are 64-bit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/dtype_traits.h"
#include "sparse/heuristics.h"
#include "sparse/spmm_kernels.h"

namespace jax_ops::sparse {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ T Ld(const T* p) {
  return __ldg(p);
}

template <int G>
__device__ __forceinline__ unsigned GroupMask() {
  if constexpr (G == 32) {
    return 0xffffffffu;
  } else {
    const unsigned lane = threadIdx.x & 31u;
    return ((1u << G) - 1u) << (lane & ~static_cast<unsigned>(G - 1));
  }
}

template <int G, typename Acc>
__device__ __forceinline__ Acc GroupSum(Acc v, unsigned mask) {
#pragma unroll
  for (int off = G / 2; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off, G);
  return v;
}

template <typename T, typename Acc>
__device__ __forceinline__ void RowRange(const SpmmArgs<T, Acc>& a, int64_t r, int64_t* s, int64_t* e) {
  const int64_t lo = min(max(static_cast<int64_t>(__ldg(a.indptr + r)), int64_t{0}), a.nnz);
  *s = lo;
  *e = min(max(static_cast<int64_t>(__ldg(a.indptr + r + 1)), lo), a.nnz);
}

// Largest i in [0, n) with ptr[i] <= x (0 when none is): the owner of x in an ascending prefix array (the split
// plan's long-row unit offsets, the segmented plan's CTA prefix).
__device__ __forceinline__ int64_t LastAtMost(const int32_t* ptr, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (__ldg(ptr + mid) <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

// This CTA's segment in the segmented plan's table (contract in spmm_params.h): the entry, its rows [r0, r1)
// clamped to [0, rows) (M, or the block rows of the blocks plan), and its CTAs [c0, c1) (blockIdx.x among them).
// False: no segment owns this CTA.
struct SegmentCta {
  int64_t entry, r0, r1, c0, c1;
};
template <typename T, typename Acc>
__device__ __forceinline__ bool FindSegment(const SpmmArgs<T, Acc>& a, int64_t rows, SegmentCta* sc) {
  const int64_t b = blockIdx.x;
  const int64_t lo = LastAtMost(a.long_ptr, a.num_long, b);
  const int64_t c0 = __ldg(a.long_ptr + lo);
  const int64_t c1 = min(static_cast<int64_t>(__ldg(a.long_ptr + lo + 1)), static_cast<int64_t>(gridDim.x));
  if (b < c0 || b >= c1) return false;
  sc->entry = lo;
  sc->r0 = min(max(static_cast<int64_t>(__ldg(a.long_rows + 3 * lo)), int64_t{0}), rows);
  sc->r1 = min(max(static_cast<int64_t>(__ldg(a.long_rows + 3 * lo + 1)), sc->r0), rows);
  sc->c0 = c0;
  sc->c1 = c1;
  return true;
}

// Work units of the split algorithm that actually exist (<= the workspace's capacity).
template <typename T, typename Acc>
__device__ __forceinline__ int64_t UnitsTotal(const SpmmArgs<T, Acc>& a) {
  if (a.num_long <= 0) return 0;
  return min(max(static_cast<int64_t>(__ldg(a.long_ptr + a.num_long)), int64_t{0}), a.units);
}

// The nnz range of work item `idx`: a row (row mode; long rows skipped under split) or a unit of a long row.
// Returns false when the item has nothing to do. Every lane of a group gets the same answer.
template <typename T, typename Acc>
__device__ __forceinline__ bool ItemRange(const SpmmArgs<T, Acc>& a, int64_t idx, bool unit_mode, int64_t* r,
                                          int64_t* s, int64_t* e) {
  if (!unit_mode) {
    *r = idx;
    RowRange(a, idx, s, e);
    return !(a.algorithm == kSplit && *e - *s > a.chunk);
  }
  const int64_t lo = LastAtMost(a.long_ptr, a.num_long, idx);
  const int64_t first = __ldg(a.long_ptr + lo);
  if (idx < first) return false;
  const int64_t row = __ldg(a.long_rows + lo);
  if (row < 0 || row >= a.m) return false;
  *r = row;
  int64_t rs, re;
  RowRange(a, row, &rs, &re);
  const int64_t cs = min(re, rs + (idx - first) * a.chunk);
  *s = cs;
  *e = min(re, cs + a.chunk);
  return true;
}

template <typename T, typename Acc>
__device__ __forceinline__ void StoreOut(const SpmmArgs<T, Acc>& a, int64_t r, int64_t col, Acc acc) {
  Acc v = __ldg(a.alpha + col) * acc;
  const int64_t off = r * a.n + col;
  if (a.y != nullptr) v += __ldg(a.beta + col) * ToAcc(a.y[off]);
  a.out[off] = FromAcc<T>(v);
}

template <typename T, typename Acc, int G>
__global__ void __launch_bounds__(kThreads) SpmvGroupKernel(SpmmArgs<T, Acc> a, bool unit_mode) {
  const unsigned mask = GroupMask<G>();
  const int lane = threadIdx.x & (G - 1);
  const int64_t gid = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  const int64_t ngroups = static_cast<int64_t>(gridDim.x) * blockDim.x / G;
  const int64_t items = unit_mode ? UnitsTotal(a) : a.m;
  const uint32_t k = static_cast<uint32_t>(a.k);
  for (int64_t item = gid; item < items; item += ngroups) {
    int64_t r, s, e;
    if (!ItemRange(a, item, unit_mode, &r, &s, &e)) continue;
    Acc acc0 = 0, acc1 = 0;  // two independent chains: two gathers in flight per lane
    int64_t p = s + lane;
    for (; p + G < e; p += 2 * G) {
      const int c0 = __ldg(a.indices + p), c1 = __ldg(a.indices + p + G);
      const Acc v0 = ToAcc(Ld(a.values + p)), v1 = ToAcc(Ld(a.values + p + G));
      if (static_cast<uint32_t>(c0) < k) acc0 += v0 * ToAcc(Ld(a.b + c0));
      if (static_cast<uint32_t>(c1) < k) acc1 += v1 * ToAcc(Ld(a.b + c1));
    }
    if (p < e) {
      const int c0 = __ldg(a.indices + p);
      if (static_cast<uint32_t>(c0) < k) acc0 += ToAcc(Ld(a.values + p)) * ToAcc(Ld(a.b + c0));
    }
    const Acc acc = GroupSum<G>(acc0 + acc1, mask);
    if (lane == 0) {
      if (unit_mode)
        a.ws[item] = acc;
      else
        StoreOut(a, r, 0, acc);
    }
  }
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads) SpmvCtaKernel(SpmmArgs<T, Acc> a) {
  __shared__ Acc partial[kThreads / 32];
  const uint32_t k = static_cast<uint32_t>(a.k);
  for (int64_t r = blockIdx.x; r < a.m; r += gridDim.x) {
    int64_t s, e;
    RowRange(a, r, &s, &e);
    Acc acc = 0;
    for (int64_t p = s + threadIdx.x; p < e; p += blockDim.x) {
      const int c = __ldg(a.indices + p);
      if (static_cast<uint32_t>(c) < k) acc += ToAcc(Ld(a.values + p)) * ToAcc(Ld(a.b + c));
    }
    acc = GroupSum<32>(acc, 0xffffffffu);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
      Acc total = 0;
      for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
      StoreOut(a, r, 0, total);
    }
    __syncthreads();
  }
}

// CSR-stream SpMV (N == 1): the CTA's rows [r0, r0 + R) own a contiguous nnz range; all 256 threads stream
// it with coalesced loads (4 independent products in flight per thread) into shared memory, then L = 256 / R
// lanes reduce each row from there. Short rows get full-width memory transactions instead of a few lanes each.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads) SpmvStreamKernel(SpmmArgs<T, Acc> a) {
  __shared__ Acc prod[kStreamCap];
  const int64_t rows_per_block = a.chunk;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = min(r0 + rows_per_block, a.m);
  const int64_t p0 = min(max(static_cast<int64_t>(__ldg(a.indptr + r0)), int64_t{0}), a.nnz);
  const int64_t p1 = min(max(static_cast<int64_t>(__ldg(a.indptr + r1)), p0), a.nnz);
  const uint32_t k = static_cast<uint32_t>(a.k);
  const int lanes = static_cast<int>(kThreads / rows_per_block);  // 1..32, a power of two
  if (p1 - p0 > kStreamCap) {
    // More nnz than the plan promised (traced or invalid indptr): one warp per row, still in bounds.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int64_t r = r0 + warp; r < r1; r += kThreads / 32) {
      int64_t s, e;
      RowRange(a, r, &s, &e);
      Acc acc = 0;
      for (int64_t p = s + lane; p < e; p += 32) {
        const int c = __ldg(a.indices + p);
        if (static_cast<uint32_t>(c) < k) acc += ToAcc(Ld(a.values + p)) * ToAcc(Ld(a.b + c));
      }
      acc = GroupSum<32>(acc, 0xffffffffu);
      if (lane == 0) StoreOut(a, r, 0, acc);
    }
    return;
  }
  const int count = static_cast<int>(p1 - p0);
  constexpr int kIlp = 4;
  for (int base = threadIdx.x; base < count; base += kThreads * kIlp) {
    int c[kIlp];
    Acc v[kIlp];
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      const int i = base + u * kThreads;
      c[u] = i < count ? __ldg(a.indices + p0 + i) : -1;
      v[u] = i < count ? ToAcc(Ld(a.values + p0 + i)) : Acc(0);
    }
#pragma unroll
    for (int u = 0; u < kIlp; ++u) {
      const int i = base + u * kThreads;
      if (i < count) prod[i] = static_cast<uint32_t>(c[u]) < k ? v[u] * ToAcc(Ld(a.b + c[u])) : Acc(0);
    }
  }
  __syncthreads();
  const int64_t r = r0 + threadIdx.x / lanes;
  const int lane = threadIdx.x & (lanes - 1);
  Acc acc = 0;
  if (r < r1) {
    int64_t s, e;
    RowRange(a, r, &s, &e);
    // Clamp to the staged range (a non-monotone indptr could point outside it).
    s = max(s, p0) - p0;
    e = min(max(e, p0), p1) - p0;
    for (int64_t i = s + lane; i < e; i += lanes) acc += prod[i];
  }
  // Reduce within each row's lanes (all 32 lanes of the warp take part: rows tile the warp evenly).
  for (int off = lanes / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (r < r1 && lane == 0) StoreOut(a, r, 0, acc);
}

// Row-block SpMV (N == 1), the short/medium-row workhorse: a warp owns kRows = U * 32/G consecutive rows; group
// g (G lanes) of it owns rows base + u * 32/G + g for u < U, so each lane has U independent rows and 2 * U
// (column, value, x) loads in flight per step instead of 2, and every load instruction of the warp reads
// 32/G adjacent rows (coalesced). The block's indptr is read with one coalesced load per 32 rows and the next
// block's indptr is prefetched while the current block runs (grid-stride over blocks). Under split, rows longer
// than `chunk` are skipped here (SpmvUnitKernel + SpmvFixupKernel own them). kHint: read indices/values with the
// streaming (evict-first) hint so the gathered x stays in L2.
template <bool kHint, typename T>
__device__ __forceinline__ T LdStream(const T* p) {
  if constexpr (kHint)
    return __ldcs(p);
  else
    return __ldg(p);
}

// Rows [row0, row1) (row1 <= M) in warp-blocks of kRows starting at row0; `warp` of `nwarps` (grid-stride).
// The whole warp calls it (shuffles over all 32 lanes).
template <typename T, typename Acc, int G, int U, int S, bool kHint>
__device__ __forceinline__ void SpmvRowsBody(const SpmmArgs<T, Acc>& a, int64_t row0, int64_t row1, int64_t warp,
                                             int64_t nwarps) {
  constexpr int kGroups = 32 / G;
  constexpr int kRows = U * kGroups;
  constexpr int kRounds = (kRows + 31) / 32;
  const int lane = threadIdx.x & 31;
  const int grp = lane / G, lg = lane & (G - 1);
  const int64_t blocks = (row1 - row0 + kRows - 1) / kRows;
  const uint32_t k = static_cast<uint32_t>(a.k);
  const bool split = a.algorithm == kSplit;
  // raw indptr of rows base + 32 t + lane and the next one (clamped to row1 so the loads stay in bounds)
  int32_t lo[kRounds], hi[kRounds];
  auto load_ptr = [&](int64_t blk) {
#pragma unroll
    for (int t = 0; t < kRounds; ++t) {
      const int64_t r = min(row0 + blk * kRows + 32 * t + lane, row1);
      lo[t] = __ldg(a.indptr + r);
      hi[t] = __ldg(a.indptr + min(r + 1, row1));
    }
  };
  if (warp < blocks) load_ptr(warp);
  for (int64_t blk = warp; blk < blocks; blk += nwarps) {
    const int64_t base = row0 + blk * kRows;
    // Clamped row ranges [s, e) (positions < 2^31 fit int32); e = -1 marks a row not written by this kernel.
    int32_t rs[kRounds], re[kRounds];
#pragma unroll
    for (int t = 0; t < kRounds; ++t) {
      const int64_t r = base + 32 * t + lane;
      const int64_t s = min(max(static_cast<int64_t>(lo[t]), int64_t{0}), a.nnz);
      const int64_t e = min(max(static_cast<int64_t>(hi[t]), s), a.nnz);
      const bool own = r < row1 && !(split && e - s > a.chunk);
      rs[t] = static_cast<int32_t>(s);
      re[t] = own ? static_cast<int32_t>(e) : -1;
    }
    if (blk + nwarps < blocks) load_ptr(blk + nwarps);  // prefetch: in flight while this block runs
    int32_t s[U], e[U];
    int64_t len_max = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j0 = u * kGroups;  // row index of group 0's slot u in the block; j0 / 32 is compile-time
      s[u] = __shfl_sync(0xffffffffu, rs[j0 / 32], (j0 & 31) + grp);
      e[u] = __shfl_sync(0xffffffffu, re[j0 / 32], (j0 & 31) + grp);
      len_max = max(len_max, static_cast<int64_t>(e[u]) - s[u]);
    }
    Acc acc[U];
#pragma unroll
    for (int u = 0; u < U; ++u) acc[u] = 0;
    for (int64_t off = lg; off < len_max; off += S * G) {
      int c[U][S];
      Acc v[U][S];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int h = 0; h < S; ++h) {
          const int64_t o = off + h * G;
          const bool in = o < static_cast<int64_t>(e[u]) - s[u];
          const int64_t p = s[u] + o;
          c[u][h] = in ? LdStream<kHint>(a.indices + p) : -1;
          v[u][h] = in ? ToAcc(LdStream<kHint>(a.values + p)) : Acc(0);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int h = 0; h < S; ++h)
          if (static_cast<uint32_t>(c[u][h]) < k) acc[u] += v[u][h] * ToAcc(Ld(a.b + c[u][h]));
      }
    }
    const unsigned mask = GroupMask<G>();
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const Acc total = GroupSum<G>(acc[u], mask);
      if (lg == u % G && e[u] >= 0) StoreOut(a, base + u * kGroups + grp, 0, total);
    }
  }
}

template <typename T, typename Acc, int G, int U, int S, bool kHint, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) SpmvRowsKernel(SpmmArgs<T, Acc> a) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  SpmvRowsBody<T, Acc, G, U, S, kHint>(a, 0, a.m, warp, nwarps);
}

// Split pass 2 for N == 1: one warp per work unit (`chunk` nnz of a long row), 4 products in flight per lane.
template <typename T, typename Acc, bool kHint>
__global__ void __launch_bounds__(kThreads) SpmvUnitKernel(SpmmArgs<T, Acc> a) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t items = UnitsTotal(a);
  const uint32_t k = static_cast<uint32_t>(a.k);
  for (int64_t item = warp; item < items; item += nwarps) {
    int64_t r, s, e;
    if (!ItemRange(a, item, true, &r, &s, &e)) continue;
    Acc acc[4] = {0, 0, 0, 0};
    for (int64_t p = s + lane; p < e; p += 4 * 32) {
      int c[4];
      Acc v[4];
#pragma unroll
      for (int h = 0; h < 4; ++h) {
        const int64_t q = p + h * 32;
        c[h] = q < e ? LdStream<kHint>(a.indices + q) : -1;
        v[h] = q < e ? ToAcc(LdStream<kHint>(a.values + q)) : Acc(0);
      }
#pragma unroll
      for (int h = 0; h < 4; ++h)
        if (static_cast<uint32_t>(c[h]) < k) acc[h] += v[h] * ToAcc(Ld(a.b + c[h]));
    }
    const Acc total = GroupSum<32>((acc[0] + acc[1]) + (acc[2] + acc[3]), 0xffffffffu);
    if (lane == 0) a.ws[item] = total;
  }
}

// Long row i of the split plan: its row and its units [u0, u1) clamped to the workspace (`total` units).
struct LongRow {
  int64_t r, u0, u1;
};
template <typename T, typename Acc>
__device__ __forceinline__ LongRow LongRowAt(const SpmmArgs<T, Acc>& a, int64_t i, int64_t total) {
  const int64_t r = __ldg(a.long_rows + i);
  const int64_t u0 = min(max(static_cast<int64_t>(__ldg(a.long_ptr + i)), int64_t{0}), total);
  const int64_t u1 = min(max(static_cast<int64_t>(__ldg(a.long_ptr + i + 1)), u0), total);
  return {r, u0, u1};
}

// Split pass 3 for N == 1: one warp per long row; lane l sums units l, l + 32, ... in order, then a fixed xor
// tree (deterministic; a different rounding order than the CPU twin's sequential unit sum).
template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads) SpmvFixupKernel(SpmmArgs<T, Acc> a) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t total = UnitsTotal(a);
  for (int64_t i = warp; i < a.num_long; i += nwarps) {
    const auto [r, u0, u1] = LongRowAt(a, i, total);
    if (r < 0 || r >= a.m || u1 <= u0) continue;
    Acc acc = 0;
    for (int64_t u = u0 + lane; u < u1; u += 32) acc += a.ws[u];
    acc = GroupSum<32>(acc, 0xffffffffu);
    if (lane == 0) StoreOut(a, r, 0, acc);
  }
}

// VEC adjacent elements of a row of B (16-byte load when VEC > 1; the caller guarantees alignment).
template <typename T, typename Acc, int VEC>
__device__ __forceinline__ void LoadVec(const T* p, Acc (&v)[VEC]) {
  if constexpr (VEC == 1) {
    v[0] = ToAcc(Ld(p));
  } else {
    static_assert(VEC * sizeof(T) == 16, "VEC must fill 16 bytes");
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* t = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) v[i] = ToAcc(t[i]);
  }
}

// Writes one lane's VEC columns of an SpMM item: the unit's partials (unit mode) or the epilogue
// alpha * acc + beta * y into out (16-byte accesses when VEC > 1).
template <typename T, typename Acc, int VEC>
__device__ __forceinline__ void StoreTile(const SpmmArgs<T, Acc>& a, bool unit_mode, int64_t idx, int64_t r,
                                          int64_t col0, const Acc (&acc)[VEC]) {
  if (unit_mode) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) a.ws[idx * a.n + col0 + i] = acc[i];
  } else if constexpr (VEC == 1) {
    StoreOut(a, r, col0, acc[0]);
  } else {
    const int64_t off = r * a.n + col0;
    Acc yv[VEC];
    if (a.y != nullptr) LoadVec<T, Acc, VEC>(a.y + off, yv);
    uint4 raw;
    T* t = reinterpret_cast<T*>(&raw);
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      Acc o = __ldg(a.alpha + col0 + i) * acc[i];
      if (a.y != nullptr) o += __ldg(a.beta + col0 + i) * yv[i];
      t[i] = FromAcc<T>(o);
    }
    *reinterpret_cast<uint4*>(a.out + off) = raw;
  }
}

template <typename T, typename Acc, int G, int VEC>
__global__ void __launch_bounds__(kThreads) SpmmGroupKernel(SpmmArgs<T, Acc> a, bool unit_mode) {
  const unsigned mask = GroupMask<G>();
  const int lane = threadIdx.x & (G - 1);
  const int64_t gid = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / G;
  const int64_t ngroups = static_cast<int64_t>(gridDim.x) * blockDim.x / G;
  constexpr int64_t kTileW = int64_t{G} * VEC;
  const int64_t tiles = (a.n + kTileW - 1) / kTileW;
  const int64_t items = (unit_mode ? UnitsTotal(a) : a.m) * tiles;
  const uint32_t k = static_cast<uint32_t>(a.k);
  for (int64_t item = gid; item < items; item += ngroups) {
    const int64_t idx = item / tiles;
    const int64_t col0 = (item - idx * tiles) * kTileW + int64_t{lane} * VEC;
    int64_t r, s, e;
    if (!ItemRange(a, idx, unit_mode, &r, &s, &e)) continue;
    const bool active = col0 < a.n;  // VEC > 1 only when N % VEC == 0, so the whole vector is in range
    Acc acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0;
    auto fma_pair = [&](int c, Acc v) {
      if (c >= 0 && active) {
        Acc bv[VEC];
        LoadVec<T, Acc, VEC>(a.b + static_cast<int64_t>(c) * a.n + col0, bv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] += v * bv[i];
      }
    };
    for (int64_t base = s; base < e; base += G) {
      const int64_t p = base + lane;
      int c = -1;
      Acc v = 0;
      if (p < e) {
        c = __ldg(a.indices + p);
        if (static_cast<uint32_t>(c) < k)
          v = ToAcc(Ld(a.values + p));
        else
          c = -1;
      }
      const int cnt = static_cast<int>(min(int64_t{G}, e - base));
      if (cnt == G) {
#pragma unroll
        for (int j = 0; j < G; ++j) fma_pair(__shfl_sync(mask, c, j, G), __shfl_sync(mask, v, j, G));
      } else {
        for (int j = 0; j < cnt; ++j) fma_pair(__shfl_sync(mask, c, j, G), __shfl_sync(mask, v, j, G));
      }
    }
    if (active) StoreTile<T, Acc, VEC>(a, unit_mode, idx, r, col0, acc);
  }
}

// Launch bound of the slots kernel (CTAs of 256 per SM): 8 (<= 32 registers, full occupancy for the
// latency-bound gathers) for f32 with one column tile, else 6 (<= 40; at 8 those spill). Unbounded, the kernel
// loses its occupancy and its edge over the group kernel (docs/design/sparse.md).
template <typename T, int G>
constexpr int SlotsMinBlocks() {
  return sizeof(T) == 4 && G < 32 ? 8 : 6;
}

// SpmmSlotsKernel<G, VEC, S> (N > 1, 16-byte rows: VEC = 16 / sizeof(T)): a team of G * S lanes owns (work item,
// column tile of G * VEC columns), G column lanes by S slots. Slot j walks the item's entries j, j + S, ... four
// at a time, so every lane has four B-row gathers in flight; the slots' partial sums meet in a fixed xor tree
// (deterministic). S grows with the nnz per item (SlotsFor), so long rows (CSR(Aᵀ) of a tall least-squares
// matrix) get up to 32 lanes. Its times against the group kernel and the split plan: docs/design/sparse.md.
// Items [i0, i1) (rows, or split units in unit mode) by the teams of CTAs [0, ctas) of a grid-stride, `cta` this
// one's index in that range.
template <typename T, typename Acc, int G, int VEC, int S, bool kUnitMode>
__device__ __forceinline__ void SpmmSlotsBody(const SpmmArgs<T, Acc>& a, int64_t i0, int64_t i1, int64_t cta,
                                              int64_t ctas) {
  constexpr bool unit_mode = kUnitMode;
  constexpr int kTeam = G * S;
  static_assert(kTeam <= 32, "a team must fit in a warp");
  const unsigned mask = GroupMask<kTeam>();
  const int lane = threadIdx.x & (kTeam - 1), slot = lane / G, cl = lane % G;
  constexpr int64_t kTileW = int64_t{G} * VEC;
  // G = nextpow2(N / VEC) < 32 means one column tile: no per-item 64-bit division (and fewer registers).
  constexpr bool kOneTile = G < 32;
  const int64_t tiles = kOneTile ? 1 : (a.n + kTileW - 1) / kTileW;
  // (item, column tile) pairs of [i0, i1) numbered from i0 * tiles, so only the loop bounds depend on i0
  const int64_t end = i1 * tiles;
  const int64_t teams = ctas * (kThreads / kTeam);
  const uint32_t k = static_cast<uint32_t>(a.k);
  for (int64_t item = i0 * tiles + cta * (kThreads / kTeam) + threadIdx.x / kTeam; item < end; item += teams) {
    const int64_t idx = kOneTile ? item : item / tiles;
    const int64_t col0 = (item - idx * tiles) * kTileW + int64_t{cl} * VEC;
    int64_t r, s, e;
    if (!ItemRange(a, idx, unit_mode, &r, &s, &e)) continue;  // the same answer for the whole team
    const bool active = col0 < a.n;
    Acc acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0;
    auto fma = [&](int c, Acc v) {
      if (static_cast<uint32_t>(c) < k && active) {
        Acc bv[VEC];
        LoadVec<T, Acc, VEC>(a.b + static_cast<int64_t>(c) * a.n + col0, bv);
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] += v * bv[i];
      }
    };
    int64_t p = s + slot;
    for (; p + 3 * S < e; p += 4 * S) {
      int c[4];
      Acc v[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) c[j] = __ldg(a.indices + p + j * S), v[j] = ToAcc(Ld(a.values + p + j * S));
#pragma unroll
      for (int j = 0; j < 4; ++j) fma(c[j], v[j]);
    }
    for (; p < e; p += S) fma(__ldg(a.indices + p), ToAcc(Ld(a.values + p)));
#pragma unroll
    for (int off = G; off < kTeam; off <<= 1)
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += __shfl_xor_sync(mask, acc[i], off, kTeam);
    if (slot == 0 && active) StoreTile<T, Acc, VEC>(a, unit_mode, idx, r, col0, acc);
  }
}

template <typename T, typename Acc, int G, int VEC, int S, bool kUnitMode>
__global__ void __launch_bounds__(kThreads, (SlotsMinBlocks<T, G>())) SpmmSlotsKernel(SpmmArgs<T, Acc> a) {
  SpmmSlotsBody<T, Acc, G, VEC, S, kUnitMode>(a, 0, kUnitMode ? UnitsTotal(a) : a.m, blockIdx.x, gridDim.x);
}

// Segmented SpMM (N > 1, 16-byte rows) over the N == 1 segment table (spmm_params.h): CTA b runs its segment's
// rows with the slots of that segment's average row (SlotsFor), so a long-row class (CSR(Aᵀ) of bundle
// adjustment: camera rows of ~500) gets up to 8 slots per team while the short rows next to it keep one.
template <typename T, typename Acc, int G, int VEC>
__global__ void __launch_bounds__(kThreads, (SlotsMinBlocks<T, G>())) SpmmSegmentedSlotsKernel(SpmmArgs<T, Acc> a) {
  SegmentCta g;
  if (!FindSegment(a, a.m, &g)) return;
  const int64_t p0 = min(max(static_cast<int64_t>(__ldg(a.indptr + g.r0)), int64_t{0}), a.nnz);
  const int64_t p1 = min(max(static_cast<int64_t>(__ldg(a.indptr + g.r1)), p0), a.nnz);
  const int s = SlotsFor(g.r1 > g.r0 ? static_cast<double>(p1 - p0) / static_cast<double>(g.r1 - g.r0) : 0.0, G);
  if constexpr (G * 8 <= 32)
    if (s >= 8) return SpmmSlotsBody<T, Acc, G, VEC, 8, false>(a, g.r0, g.r1, blockIdx.x - g.c0, g.c1 - g.c0);
  if constexpr (G * 4 <= 32)
    if (s >= 4) return SpmmSlotsBody<T, Acc, G, VEC, 4, false>(a, g.r0, g.r1, blockIdx.x - g.c0, g.c1 - g.c0);
  if constexpr (G * 2 <= 32)
    if (s >= 2) return SpmmSlotsBody<T, Acc, G, VEC, 2, false>(a, g.r0, g.r1, blockIdx.x - g.c0, g.c1 - g.c0);
  SpmmSlotsBody<T, Acc, G, VEC, 1, false>(a, g.r0, g.r1, blockIdx.x - g.c0, g.c1 - g.c0);
}

// Pass 3 of split: one warp per long row, lanes over columns, partials summed in unit order.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads) SplitFixupKernel(SpmmArgs<T, Acc> a) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / 32;
  const int64_t total = UnitsTotal(a);
  for (int64_t i = warp; i < a.num_long; i += nwarps) {
    const auto [r, u0, u1] = LongRowAt(a, i, total);
    if (r < 0 || r >= a.m || u1 <= u0) continue;
    for (int64_t col = lane; col < a.n; col += 32) {
      Acc acc = 0;
      for (int64_t u = u0; u < u1; ++u) acc += a.ws[u * a.n + col];
      StoreOut(a, r, col, acc);
    }
  }
}

// Production configuration of SpmvRowsKernel per G (lanes per row), the best of sparse_spmv_bench's sweep
// (docs/design/sparse.md): U rows per lane, S steps per iteration, streaming hint, min CTAs per SM.
// G = 1 (rows of < 10): U = 1, S = 8 with 6 CTAs/SM; otherwise U = 2, S = 4 with the streaming hint.
template <int G>
struct RowsConfig {
  static constexpr int kU = G == 1 ? 1 : 2;
  static constexpr int kS = G == 1 ? 8 : 4;
  static constexpr bool kHint = G != 1;
  static constexpr int kMinBlocks = G == 1 ? 6 : 1;
};

template <typename T, typename Acc, int G>
__device__ __forceinline__ void SegmentRows(const SpmmArgs<T, Acc>& a, int64_t r0, int64_t r1, int64_t warp,
                                            int64_t nwarps) {
  using C = RowsConfig<G>;
  static_assert(SegmentRowsPerCta(G) == (kThreads / 32) * C::kU * (32 / G), "SegmentRowsPerCta != RowsConfig");
  SpmvRowsBody<T, Acc, G, C::kU, C::kS, C::kHint>(a, r0, r1, warp, nwarps);
}

// Segmented (row-class) SpMV (N == 1; contract in spmm_params.h): CTA b finds its segment in the CTA prefix
// (long_ptr) and runs the row-block body with that segment's G over the segment's rows. Launch bound: at least
// kSegmentedMinBlocks CTAs per SM, i.e. <= 64 registers (all dtypes fit without spills; the bound is faster than
// none, docs/design/sparse.md).
constexpr int kSegmentedMinBlocks = 4;
template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads, kSegmentedMinBlocks) SpmvSegmentedKernel(SpmmArgs<T, Acc> a) {
  SegmentCta g;
  if (!FindSegment(a, a.m, &g)) return;
  const int64_t warp = (blockIdx.x - g.c0) * (kThreads / 32) + (threadIdx.x >> 5);
  const int64_t nwarps = (g.c1 - g.c0) * (kThreads / 32);
  switch (SegmentGroup(__ldg(a.long_rows + 3 * g.entry + 2))) {
    case 1:
      return SegmentRows<T, Acc, 1>(a, g.r0, g.r1, warp, nwarps);
    case 2:
      return SegmentRows<T, Acc, 2>(a, g.r0, g.r1, warp, nwarps);
    case 4:
      return SegmentRows<T, Acc, 4>(a, g.r0, g.r1, warp, nwarps);
    case 8:
      return SegmentRows<T, Acc, 8>(a, g.r0, g.r1, warp, nwarps);
    case 16:
      return SegmentRows<T, Acc, 16>(a, g.r0, g.r1, warp, nwarps);
    default:
      return SegmentRows<T, Acc, 32>(a, g.r0, g.r1, warp, nwarps);
  }
}

// The R values of one block-row position (values + p * R) into accumulators: one vector load when R is 2 or 4 and
// `vec` (the caller checked the alignment), else R scalar loads of one sector.
template <int R, typename T, typename Acc>
__device__ __forceinline__ void LoadBlockValues(const T* q, bool vec, Acc (&v)[R]) {
  constexpr int kBytes = R * static_cast<int>(sizeof(T));
  if constexpr ((R == 2 || R == 4) && (kBytes == 4 || kBytes == 8 || kBytes == 16)) {
    if (vec) {
      using V = std::conditional_t<kBytes == 4, unsigned, std::conditional_t<kBytes == 8, uint2, uint4>>;
      const V raw = __ldg(reinterpret_cast<const V*>(q));
      const T* t = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < R; ++i) v[i] = ToAcc(t[i]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) v[i] = ToAcc(Ld(q + i));
}

// Blocks plan (N == 1; contract in spmm_params.h): block rows [b0, b1) of R rows that share a column list, in
// the row-block mapping of SpmvRowsBody over block rows (L lanes per block row, U block rows per lane, S steps of
// loads in flight; the next step's ranges are loaded while the current one runs). Per position a lane loads the
// column once, the R adjacent values and b[col] once, and updates R accumulators; the group's R sums meet in the
// fixed xor tree. Whole warps call it.
template <typename T, typename Acc, int R, int L, int U, int S>
__device__ __forceinline__ void BlocksBody(const SpmmArgs<T, Acc>& a, int64_t b0, int64_t b1, int64_t warp,
                                           int64_t nwarps) {
  constexpr int kGroups = 32 / L;
  constexpr int kRows = U * kGroups;  // block rows per warp step
  const int lane = threadIdx.x & 31;
  const int grp = lane / L, lg = lane & (L - 1);
  const int64_t steps = (b1 - b0 + kRows - 1) / kRows;
  const uint32_t k = static_cast<uint32_t>(a.k);
  const unsigned mask = GroupMask<L>();
  const bool vec = reinterpret_cast<uintptr_t>(a.values) % (R * sizeof(T)) == 0;
  int32_t ns[U], ne[U];  // the next step's clamped ranges (positions < 2^31)
  auto load_ranges = [&](int64_t blk) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t br = b0 + blk * kRows + u * kGroups + grp;
      int64_t rs = 0, re = 0;
      if (br < b1) RowRange(a, br, &rs, &re);
      ns[u] = static_cast<int32_t>(rs), ne[u] = static_cast<int32_t>(re);
    }
  };
  if (warp < steps) load_ranges(warp);
  for (int64_t blk = warp; blk < steps; blk += nwarps) {
    const int64_t base = b0 + blk * kRows;
    int32_t s[U], e[U], len_max = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      s[u] = ns[u], e[u] = ne[u];
      len_max = max(len_max, e[u] - s[u]);
    }
    if (blk + nwarps < steps) load_ranges(blk + nwarps);
    Acc acc[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int i = 0; i < R; ++i) acc[u][i] = Acc(0);
    for (int64_t off = lg; off < len_max; off += S * L) {
      int c[U][S];
      Acc v[U][S][R];
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int h = 0; h < S; ++h) {
          const int64_t o = off + h * L;
          const bool in = o < e[u] - s[u];
          const int64_t p = s[u] + o;
          c[u][h] = in ? __ldcs(a.indices + p) : -1;
          if (in) {
            LoadBlockValues<R>(a.values + p * R, vec, v[u][h]);
          } else {
#pragma unroll
            for (int i = 0; i < R; ++i) v[u][h][i] = Acc(0);
          }
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int h = 0; h < S; ++h) {
          if (static_cast<uint32_t>(c[u][h]) < k) {
            const Acc xv = ToAcc(Ld(a.b + c[u][h]));
#pragma unroll
            for (int i = 0; i < R; ++i) acc[u][i] += v[u][h][i] * xv;
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t br = base + u * kGroups + grp;
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const Acc total = GroupSum<L>(acc[u][i], mask);
        if (lg == (u * R + i) % L && br < b1) StoreOut(a, br * R + i, 0, total);
      }
    }
  }
}

// Block rows per lane of BlocksBody: as RowsConfig (so SegmentRowsPerCta counts its CTAs). Steps: 4, or 2 where
// the in-flight values would pass 48 bytes per lane (R = 4, or f64 with R = 3: ptxas spilled at the 64-register
// bound).
template <typename T, typename Acc, int R, int L>
__device__ __forceinline__ void SegmentBlocks(const SpmmArgs<T, Acc>& a, int64_t b0, int64_t b1, int64_t warp,
                                              int64_t nwarps) {
  constexpr int kU = RowsConfig<L>::kU;
  constexpr int kS = R * sizeof(Acc) * 4 <= 48 ? 4 : 2;
  static_assert(SegmentRowsPerCta(L) == (kThreads / 32) * kU * (32 / L), "SegmentRowsPerCta != BlocksBody");
  BlocksBody<T, Acc, R, L, kU, kS>(a, b0, b1, warp, nwarps);
}

// Blocks plan kernel for block height R: CTA b runs its segment of block rows (the segmented plan's lookup,
// clamped to the m / R block rows) with that segment's lanes per block row.
template <typename T, typename Acc, int R>
__global__ void __launch_bounds__(kThreads, kSegmentedMinBlocks) SpmvBlocksKernel(SpmmArgs<T, Acc> a) {
  SegmentCta g;
  if (!FindSegment(a, a.m / R, &g)) return;
  const int64_t warp = (blockIdx.x - g.c0) * (kThreads / 32) + (threadIdx.x >> 5);
  const int64_t nwarps = (g.c1 - g.c0) * (kThreads / 32);
  switch (SegmentGroup(__ldg(a.long_rows + 3 * g.entry + 2))) {
    case 1:
      return SegmentBlocks<T, Acc, R, 1>(a, g.r0, g.r1, warp, nwarps);
    case 2:
      return SegmentBlocks<T, Acc, R, 2>(a, g.r0, g.r1, warp, nwarps);
    case 4:
      return SegmentBlocks<T, Acc, R, 4>(a, g.r0, g.r1, warp, nwarps);
    case 8:
      return SegmentBlocks<T, Acc, R, 8>(a, g.r0, g.r1, warp, nwarps);
    case 16:
      return SegmentBlocks<T, Acc, R, 16>(a, g.r0, g.r1, warp, nwarps);
    default:
      return SegmentBlocks<T, Acc, R, 32>(a, g.r0, g.r1, warp, nwarps);
  }
}

// A segmented kernel (SpMV or SpMM) on its grid: one CTA per entry of the table's CTA prefix (chunk CTAs).
template <typename T, typename Acc>
cudaError_t LaunchOnSegments(void (*kernel)(SpmmArgs<T, Acc>), cudaStream_t stream, const SpmmArgs<T, Acc>& a) {
  if (a.chunk < 1 || a.chunk > 0x7fffffff || a.num_long < 1) return cudaErrorInvalidConfiguration;
  kernel<<<static_cast<unsigned>(a.chunk), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// Warp-blocks of SpmvRowsKernel<G, U> over the rows; `max_ctas` caps the grid (grid-stride beyond it).
template <typename T, typename Acc, int G, int U, int S, bool kHint, int kMinBlocks = 1>
cudaError_t LaunchSpmvRows(cudaStream_t stream, const SpmmArgs<T, Acc>& a, int64_t max_ctas) {
  constexpr int64_t kRows = int64_t{U} * (32 / G);
  const int64_t warps = (a.m + kRows - 1) / kRows;
  const int64_t ctas = std::max<int64_t>(1, std::min<int64_t>(max_ctas, (warps * 32 + kThreads - 1) / kThreads));
  SpmvRowsKernel<T, Acc, G, U, S, kHint, kMinBlocks><<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename F>
cudaError_t WithGroup(int g, F&& f) {
  switch (g) {
    case 1:
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    case 16:
      return f(std::integral_constant<int, 16>{});
    default:
      return f(std::integral_constant<int, 32>{});
  }
}

// f(integral_constant<S>) for slots s in {1, 2, 4, 8}; only teams of G * S <= 32 lanes are instantiated.
template <int G, typename F>
cudaError_t WithSlots(int s, F&& f) {
  if constexpr (G * 8 <= 32)
    if (s >= 8) return f(std::integral_constant<int, 8>{});
  if constexpr (G * 4 <= 32)
    if (s >= 4) return f(std::integral_constant<int, 4>{});
  if constexpr (G * 2 <= 32)
    if (s >= 2) return f(std::integral_constant<int, 2>{});
  return f(std::integral_constant<int, 1>{});
}

inline int NextPow2(int64_t v) {
  int p = 1;
  while (p < v && p < 32) p *= 2;
  return p;
}

}  // namespace

template <typename T, typename Acc>
cudaError_t LaunchCsrSpmm(cudaStream_t stream, const SpmmArgs<T, Acc>& a, bool vec16, int sm_count) {
  if (a.m == 0 || a.n == 0) return cudaSuccess;
  const int64_t max_blocks = std::max<int64_t>(1, int64_t{sm_count} * 64);
  auto blocks_for = [&](int64_t threads) {
    return static_cast<unsigned>(
        std::max<int64_t>(1, std::min<int64_t>(max_blocks, (threads + kThreads - 1) / kThreads)));
  };
  const bool split = a.algorithm == kSplit && a.num_long > 0 && a.units > 0;
  cudaError_t err = cudaSuccess;
  if (a.n == 1) {
    if (a.algorithm == kSegmented) return LaunchOnSegments<T, Acc>(&SpmvSegmentedKernel<T, Acc>, stream, a);
    if (a.algorithm == kBlocks) {
      switch (a.r) {
        case 2:
          return LaunchOnSegments<T, Acc>(&SpmvBlocksKernel<T, Acc, 2>, stream, a);
        case 3:
          return LaunchOnSegments<T, Acc>(&SpmvBlocksKernel<T, Acc, 3>, stream, a);
        case 4:
          return LaunchOnSegments<T, Acc>(&SpmvBlocksKernel<T, Acc, 4>, stream, a);
        default:
          return cudaErrorInvalidValue;
      }
    }
    if (a.algorithm == kStream) {
      const int64_t blocks = (a.m + a.chunk - 1) / a.chunk;
      if (blocks > 0x7fffffff) return cudaErrorInvalidConfiguration;
      SpmvStreamKernel<T, Acc><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
    } else if (a.algorithm == kCta) {
      SpmvCtaKernel<T, Acc><<<static_cast<unsigned>(std::min<int64_t>(a.m, max_blocks)), kThreads, 0, stream>>>(a);
    } else {
      auto rows = [&](auto g) {
        constexpr int G = decltype(g)::value;
        using C = RowsConfig<G>;
        return LaunchSpmvRows<T, Acc, G, C::kU, C::kS, C::kHint, C::kMinBlocks>(stream, a, max_blocks);
      };
      err = a.group == 1 ? rows(std::integral_constant<int, 1>{}) : WithGroup(a.group, rows);
      if (err != cudaSuccess) return err;
    }
    if (split) {
      SpmvUnitKernel<T, Acc, false><<<blocks_for(a.units * 32), kThreads, 0, stream>>>(a);
      err = cudaGetLastError();
      if (err != cudaSuccess) return err;
      SpmvFixupKernel<T, Acc><<<blocks_for(a.num_long * 32), kThreads, 0, stream>>>(a);
    }
    return cudaGetLastError();
  } else {
    constexpr int kVec16 = static_cast<int>(16 / sizeof(T));
    const int vec = vec16 ? kVec16 : 1;
    const int g = std::max(2, NextPow2((a.n + vec - 1) / vec));
    err = WithGroup(g, [&](auto gc) {
      constexpr int G = decltype(gc)::value;
      const int64_t tiles_1 = (a.n + G - 1) / G;
      const int64_t tiles_v = (a.n + int64_t{G} * kVec16 - 1) / (int64_t{G} * kVec16);
      if (vec16) {
        // Slots for the average row (under split, nnz / m over-counts the short rows: speed only) and, in unit
        // mode, for units of `chunk` nnz.
        auto slots = [&](int s, int64_t items, auto unit_mode) {
          return WithSlots<G>(s, [&](auto sc) {
            constexpr int S = decltype(sc)::value;
            SpmmSlotsKernel<T, Acc, G, kVec16, S, decltype(unit_mode)::value>
                <<<blocks_for(items * tiles_v * G * S), kThreads, 0, stream>>>(a);
            return cudaGetLastError();
          });
        };
        if (a.algorithm == kSegmented)
          return LaunchOnSegments<T, Acc>(&SpmmSegmentedSlotsKernel<T, Acc, G, kVec16>, stream, a);
        cudaError_t e = slots(SlotsFor(static_cast<double>(a.nnz) / a.m, G), a.m, std::false_type{});
        if (e == cudaSuccess && split) e = slots(SlotsFor(static_cast<double>(a.chunk), G), a.units, std::true_type{});
        if (e != cudaSuccess) return e;
      } else {
        SpmmGroupKernel<T, Acc, G, 1><<<blocks_for(a.m * tiles_1 * G), kThreads, 0, stream>>>(a, false);
        if (split) SpmmGroupKernel<T, Acc, G, 1><<<blocks_for(a.units * tiles_1 * G), kThreads, 0, stream>>>(a, true);
      }
      return cudaGetLastError();
    });
    if (err != cudaSuccess) return err;
  }
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (split) SplitFixupKernel<T, Acc><<<blocks_for(a.num_long * 32), kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace jax_ops::sparse

#define JAX_OPS_INSTANTIATE_CSR_SPMM(T, ACC)                                                                          \
  template cudaError_t jax_ops::sparse::LaunchCsrSpmm<T, ACC>(cudaStream_t, const jax_ops::sparse::SpmmArgs<T, ACC>&, \
                                                              bool, int);
