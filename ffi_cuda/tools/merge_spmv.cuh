// Merge-path (nnz-balanced) CSR SpMV: an experiment of spmv_bench (--merge, and its --small checks), not part of
// the library (no dispatch, no FFI plan): docs/sparse.md says what it is for and what result would promote it
// into ffi_cuda/sparse/. It builds on the library's kernel header (SpmmArgs, load helpers, kThreads).
#pragma once

#include "sparse/spmm_kernels_impl.cuh"

namespace jax_ops::sparse {

// Merge-path SpMV (N == 1; LaunchSpmvMerge). The merged path of the M row ends and the nnz
// entries (length M + nnz; item r + p is entry p of row r, item r + e_r the end of row r) is cut into tiles of
// `tile` items. Workspace (Acc elements): carry[T] (each tile's partial of the row it ends inside), head[T]
// (the tile's part of its first row when that row began in an earlier tile), then int32 row0[T + 1] (tile
// start rows) packed into the remaining Acc slots. The indptr must be non-decreasing (Python passes the running
// maximum of the clamped indptr, as for split); on any other indptr nothing is read or written out of bounds.
inline constexpr int64_t MergeTiles(int64_t m, int64_t nnz, int64_t tile) { return (m + nnz + tile - 1) / tile; }
inline constexpr int64_t MergeWorkspaceElems(int64_t m, int64_t nnz, int64_t tile, int64_t acc_bytes) {
  return 2 * MergeTiles(m, nnz, tile) + ((MergeTiles(m, nnz, tile) + 1) * 4 + acc_bytes - 1) / acc_bytes;
}

// ------------------------------------------------------------------------------------------ merge-path SpMV
// Merge-path (nnz-balanced) SpMV, N == 1 (workspace layout: MergeWorkspaceElems in spmm_params.h). The merged
// path of row ends and entries (item r + p = entry p of row r, item r + e_r = end of row r) is cut into tiles of
// kTile = 32 * TW * IPT items; a tile is one warp (TW = 1, 8 tiles per CTA) or one CTA (TW = 8). Per tile:
//   1. its start/end coordinates (row, entry) by a warp-cooperative search of indptr (32 probes per step);
//   2. its row ends (relative to the tile's first entry) and its products val * x[col] staged in shared memory
//      with coalesced loads, IPT products in flight per thread (indices/values with the streaming hint);
//   3. each thread takes IPT consecutive path items (merge-path search in shared memory) and walks them in
//      order: rows that start and end inside the thread are written directly; the thread's first finished row
//      and its trailing partial are combined across threads by a segmented shuffle scan over row keys (fixed
//      order; across the warps of a CTA tile through a fixed chain in shared memory);
//   4. the tile's trailing partial goes to carry[t]; its first row, when that row began in an earlier tile, to
//      head[t]; SpmvMergeFixupKernel sums such a row's carries (lanes stride, fixed xor tree) + head and writes it.
// Every row has one writer (the tile holding its end item, or the fix-up); no atomics: bitwise reproducible.

// Smallest i in [max(d - nnz, 0), min(d, M)] whose row end (clamped indptr[i + 1]) satisfies end + i >= d: the
// number of row ends among the first d path items. The whole warp calls it with the same d.
template <typename T, typename Acc>
__device__ __forceinline__ int64_t MergeSearchWarp(const SpmmArgs<T, Acc>& a, int64_t d) {
  const int lane = threadIdx.x & 31;
  int64_t lo = max(d - a.nnz, int64_t{0}), hi = min(d, a.m);
  while (lo < hi) {
    const int64_t step = (hi - lo + 31) / 32;
    const int64_t q = lo + lane * step;
    bool pred = false;
    if (q < hi) {
      const int64_t end = min(max(static_cast<int64_t>(__ldg(a.indptr + q + 1)), int64_t{0}), a.nnz);
      pred = end + q < d;
    }
    const unsigned bal = __ballot_sync(0xffffffffu, pred);
    const int c = bal == 0xffffffffu ? 32 : __ffs(~bal) - 1;  // leading lanes with pred true
    if (c == 0) {
      hi = lo;
    } else {
      const int64_t nlo = lo + (c - 1) * step + 1;
      hi = min(lo + c * step, hi);
      lo = min(nlo, hi);
    }
  }
  return lo;
}

// Tile of the path: first row of the tile, and whether that row began in an earlier tile (its first entry's item
// lies before the tile) -- then its value is completed by the fix-up. Both kernels use this one definition.
template <typename T, typename Acc>
__device__ __forceinline__ int64_t MergeRowStartTile(const SpmmArgs<T, Acc>& a, int64_t r, int64_t tile_items) {
  const int64_t rs = min(max(static_cast<int64_t>(__ldg(a.indptr + r)), int64_t{0}), a.nnz);
  return (r + rs) / tile_items;
}

template <typename T, typename Acc, int IPT, int TW, bool kHint>
__global__ void __launch_bounds__(kThreads)
    SpmvMergeKernel(SpmmArgs<T, Acc> a, int64_t num_tiles, const int32_t* __restrict__ tile_row) {
  constexpr int kTileThreads = 32 * TW;
  constexpr int kTile = kTileThreads * IPT;
  constexpr int kTilesPerCta = kThreads / kTileThreads;
  static_assert(kThreads % kTileThreads == 0, "tile threads must divide the CTA");
  static_assert(kTilesPerCta * kTile * sizeof(Acc) <= 40 * 1024, "tile staging exceeds static shared memory");
  // Per tile: row ends (int32, front) and products (Acc, back); nr + nz <= kTile keeps them apart.
  __shared__ Acc stage[kTilesPerCta][kTile];
  __shared__ int64_t coord[kTilesPerCta][2];
  __shared__ int32_t wkey_head[TW], wkey_tail[TW];
  __shared__ Acc wsum_tail[TW], wchain[TW];
  const int slot = threadIdx.x / kTileThreads;
  const int tid = threadIdx.x % kTileThreads;
  const int warp = tid >> 5, lane = threadIdx.x & 31;
  const int64_t tile = static_cast<int64_t>(blockIdx.x) * kTilesPerCta + slot;
  if (tile >= num_tiles) return;  // uniform per tile (TW = 8: the whole CTA)
  auto tile_sync = [] {
    if constexpr (TW == 1)
      __syncwarp();
    else
      __syncthreads();
  };
  const int64_t total = a.m + a.nnz;
  const int64_t d0 = tile * kTile, d1 = min(d0 + kTile, total);
  int64_t i0, i1;
  if (tile_row != nullptr) {  // coordinates precomputed on the host (the row count before each tile's first item)
    i0 = __ldg(tile_row + tile), i1 = __ldg(tile_row + tile + 1);
  } else if constexpr (TW == 1) {
    i0 = MergeSearchWarp(a, d0);
    i1 = MergeSearchWarp(a, d1);
  } else {
    if (warp < 2) {
      const int64_t v = MergeSearchWarp(a, warp == 0 ? d0 : d1);
      if (lane == 0) coord[slot][warp] = v;
    }
    __syncthreads();
    i0 = coord[slot][0], i1 = coord[slot][1];
  }
  const int64_t j0 = d0 - i0;
  const int nr = static_cast<int>(min(max(i1 - i0, int64_t{0}), int64_t{kTile}));
  const int nz = static_cast<int>(min(max((d1 - i1) - j0, int64_t{0}), int64_t{kTile - nr}));
  Acc* ws_carry = a.ws;
  Acc* ws_head = a.ws + num_tiles;
  int32_t* ws_row0 = reinterpret_cast<int32_t*>(a.ws + 2 * num_tiles);
  if (tid == 0) {
    ws_row0[tile] = static_cast<int32_t>(i0);
    if (tile == num_tiles - 1) ws_row0[num_tiles] = static_cast<int32_t>(i0 + nr);
  }
  int32_t* E = reinterpret_cast<int32_t*>(&stage[slot][0]);
  Acc* P = &stage[slot][kTile - nz];
  for (int q = tid; q < nr; q += kTileThreads) {
    const int64_t e = min(max(static_cast<int64_t>(__ldg(a.indptr + i0 + q + 1)), int64_t{0}), a.nnz) - j0;
    E[q] = static_cast<int32_t>(min(max(e, int64_t{0}), int64_t{nz}));
  }
  {
    const uint32_t k = static_cast<uint32_t>(a.k);
    int c[IPT];
    Acc v[IPT];
#pragma unroll
    for (int h = 0; h < IPT; ++h) {
      const int q = tid + h * kTileThreads;
      c[h] = q < nz ? LdStream<kHint>(a.indices + j0 + q) : -1;
      v[h] = q < nz ? ToAcc(LdStream<kHint>(a.values + j0 + q)) : Acc(0);
    }
#pragma unroll
    for (int h = 0; h < IPT; ++h) {
      const int q = tid + h * kTileThreads;
      if (q < nz) P[q] = static_cast<uint32_t>(c[h]) < k ? v[h] * ToAcc(Ld(a.b + c[h])) : Acc(0);
    }
  }
  tile_sync();
  // This thread's path items [tid * IPT, (tid + 1) * IPT) of the tile: start and end coordinates.
  auto search = [&](int dl) {
    int lo = max(dl - nz, 0), hi = min(dl, nr);
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (E[mid] + mid < dl)
        lo = mid + 1;
      else
        hi = mid;
    }
    return lo;
  };
  const int dl0 = min(tid * IPT, nr + nz), dl1 = min(dl0 + IPT, nr + nz);
  const int li = search(dl0), ie = max(search(dl1), li);
  const int lj = dl0 - li, je = max(dl1 - ie, lj);
  int i = li, j = lj;
  Acc sum = 0, first = 0;
  bool has_first = false;
  while (i < ie || j < je) {
    if (i < ie && (j >= je || E[i] <= j)) {  // end of local row i
      if (has_first)
        StoreOut(a, i0 + i, 0, sum);  // began inside this thread: complete
      else
        first = sum, has_first = true;
      sum = 0;
      ++i;
    } else {
      sum += P[min(j, nz - 1)];
      ++j;
    }
  }
  // Segmented inclusive scan of the trailing partials by row key (keys non-decreasing over the tile's threads).
  const int key = ie;
  Acc s = sum;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const Acc o = __shfl_up_sync(0xffffffffu, s, off);
    const int ko = __shfl_up_sync(0xffffffffu, key, off);
    if (lane >= off && ko == key) s = o + s;
  }
  const Acc s_prev = __shfl_up_sync(0xffffffffu, s, 1);
  const int k_prev = __shfl_up_sync(0xffffffffu, key, 1);
  const int k_head = __shfl_sync(0xffffffffu, key, 0);
  Acc tile_tail = __shfl_sync(0xffffffffu, s, 31);
  // incoming partial of this thread's start row li from earlier threads
  bool has_in = lane > 0 && k_prev == li;
  Acc in = has_in ? s_prev : Acc(0);
  if constexpr (TW > 1) {
    if (lane == 31) wkey_tail[warp] = key, wsum_tail[warp] = s;
    if (lane == 0) wkey_head[warp] = key;
    __syncthreads();
    if (tid == 0) {  // inclusive scan value at each warp's last thread, chained in warp order
      Acc chain = wsum_tail[0];
      wchain[0] = chain;
      for (int w = 1; w < TW; ++w) {
        const bool link = wkey_head[w] == wkey_tail[w] && wkey_tail[w - 1] == wkey_tail[w];
        chain = link ? chain + wsum_tail[w] : wsum_tail[w];
        wchain[w] = chain;
      }
    }
    __syncthreads();
    if (warp > 0 && wkey_tail[warp - 1] == li && (lane == 0 || (k_head == li && k_prev == li))) {
      in = has_in ? wchain[warp - 1] + in : wchain[warp - 1];
      has_in = true;
    }
    tile_tail = wchain[TW - 1];
  }
  if (has_first) {
    const Acc v = has_in ? in + first : first;
    const int64_t r = i0 + li;
    if (li == 0 && MergeRowStartTile(a, r, kTile) < tile)
      ws_head[tile] = v;  // the row began in an earlier tile: the fix-up completes it
    else
      StoreOut(a, r, 0, v);
  }
  if (tid == kTileThreads - 1) ws_carry[tile] = tile_tail;
}

// Fix-up of the merge-path SpMV: a warp looks at 32 tiles; for each tile whose first row ends in it and began in
// an earlier tile t_a, the warp sums carry[t_a .. t) (lane l: t_a + l, t_a + l + 32, ...; fixed xor tree), adds
// head[t] and writes the row.
template <typename T, typename Acc>
__global__ void __launch_bounds__(kThreads)
    SpmvMergeFixupKernel(SpmmArgs<T, Acc> a, int64_t num_tiles, int64_t tile_items) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const Acc* ws_carry = a.ws;
  const Acc* ws_head = a.ws + num_tiles;
  const int32_t* ws_row0 = reinterpret_cast<const int32_t*>(a.ws + 2 * num_tiles);
  const int64_t t = warp * 32 + lane;
  bool need = false;
  int64_t r = 0, ta = 0;
  if (t > 0 && t < num_tiles) {
    r = min(max(static_cast<int64_t>(ws_row0[t]), int64_t{0}), a.m);
    const int64_t r1 = min(max(static_cast<int64_t>(ws_row0[t + 1]), int64_t{0}), a.m);
    if (r1 > r && r < a.m) {
      ta = max(MergeRowStartTile(a, r, tile_items), int64_t{0});
      need = ta < t;
    }
  }
  unsigned todo = __ballot_sync(0xffffffffu, need);
  while (todo) {
    const int src = __ffs(todo) - 1;
    todo &= todo - 1;
    const int64_t tt = warp * 32 + src;
    const int64_t rr = __shfl_sync(0xffffffffu, r, src), t0 = __shfl_sync(0xffffffffu, ta, src);
    Acc acc = 0;
    for (int64_t u = t0 + lane; u < tt; u += 32) acc += ws_carry[u];
    acc = GroupSum<32>(acc, 0xffffffffu);
    if (lane == 0) StoreOut(a, rr, 0, acc + ws_head[tt]);
  }
}

template <typename T, typename Acc, int IPT, int TW>
cudaError_t LaunchSpmvMergeT(cudaStream_t stream, const SpmmArgs<T, Acc>& a, const int32_t* tile_row) {
  constexpr int64_t kTile = int64_t{32} * TW * IPT;
  constexpr int64_t kTilesPerCta = kThreads / (32 * TW);
  const int64_t tiles = MergeTiles(a.m, a.nnz, kTile);
  if (tiles == 0) return cudaSuccess;
  if (a.units < MergeWorkspaceElems(a.m, a.nnz, kTile, sizeof(Acc)) || a.ws == nullptr) return cudaErrorInvalidValue;
  const int64_t ctas = (tiles + kTilesPerCta - 1) / kTilesPerCta;
  if (ctas > 0x7fffffff) return cudaErrorInvalidConfiguration;
  SpmvMergeKernel<T, Acc, IPT, TW, true><<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(a, tiles, tile_row);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess || tiles == 1) return err;
  const int64_t fix_ctas = (tiles + kThreads - 1) / kThreads;  // 32 tiles per warp, 8 warps per CTA
  SpmvMergeFixupKernel<T, Acc><<<static_cast<unsigned>(fix_ctas), kThreads, 0, stream>>>(a, tiles, kTile);
  return cudaGetLastError();
}

template <typename T, typename Acc>
cudaError_t LaunchSpmvMerge(cudaStream_t stream, const SpmmArgs<T, Acc>& a, int ipt, int tile_warps,
                            const int32_t* tile_row = nullptr) {
  if (a.m == 0 || a.n != 1) return a.m == 0 ? cudaSuccess : cudaErrorInvalidValue;
  const bool cta = tile_warps > 1;
  switch (ipt) {
    case 4:
      return cta ? LaunchSpmvMergeT<T, Acc, 4, 8>(stream, a, tile_row) : LaunchSpmvMergeT<T, Acc, 4, 1>(stream, a, tile_row);
    case 16:
      return cta ? LaunchSpmvMergeT<T, Acc, 16, 8>(stream, a, tile_row) : LaunchSpmvMergeT<T, Acc, 16, 1>(stream, a, tile_row);
    default:
      return cta ? LaunchSpmvMergeT<T, Acc, 8, 8>(stream, a, tile_row) : LaunchSpmvMergeT<T, Acc, 8, 1>(stream, a, tile_row);
  }
}

}  // namespace jax_ops::sparse
