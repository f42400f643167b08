// Column-slab Aᵀu experiment (standalone, used by spmv_bench.cu; not part of the library).
//
// Problem: for tall A (m x n, m >> n) the product Aᵀu through CSR(Aᵀ) gathers u[m] (MBs) at random: every 4-byte
// read is its own 32-byte L2 sector. Here the columns of Aᵀ (= the rows of A = the index into u) are cut into J
// slabs of W entries, W a multiple of 4 chosen so u[slab] fits in shared memory, and the product is done slab by
// slab with u[slab] staged in shared memory.
//
// Layout (SlabHost / SlabArgs), for the operator Aᵀ with `rows` = n output rows and `cols` = m (length of u):
//   w      slab width, a multiple of 4, <= 65536 (local column fits uint16); j = ceil(cols / w) slabs; slab s covers
//          u[s*w, min((s+1)*w, cols)) (the last one may be narrower, width not a multiple of 4).
//   ptr    int32 [j*rows + 1], slab-major: the entries of (slab s, row r) are [ptr[s*rows + r], ptr[s*rows + r + 1]).
//          All slabs live in one array: slab s is the contiguous range [ptr[s*rows], ptr[(s+1)*rows]).
//   col    uint16 [nnz]: column inside the slab (u index - s*w); within (s, r) in ascending u order.
//   val    float  [nnz]
//   work   int32 [3*items]: CTA b handles (slab work[3b], rows [work[3b+1], work[3b+2])). For each slab the rows are
//   cut
//          into ranges of equal nnz (by the slab's ptr prefix), the number of ranges per slab proportional to the
//          slab's nnz; together the ranges of a slab cover [0, rows) exactly once (empty ranges are dropped).
//   part   float [j*rows]: part[s*rows + r] = sum over (s, r) of val * u; every element written by pass 1.
// Pass 1 (SlabSpmvKernel): a CTA stages u[slab] into shared memory (16-byte cp.async.cg, scalar tail), then its
// warps sweep the CTA's rows (optionally after an L2 prefetch of the range's first prefetch_nnz entries, issued
// while the staging runs), G lanes per row, S loads in flight per lane, gathers from shared memory, and one lane
// per row writes part[s, r]. Pass 2 (SlabFixupKernel): a thread per row sums part[0..j-1, r] in slab order and
// writes out[r] = alpha * sum + beta * y[r] (y optional). No atomics: deterministic.
// Bytes per call: nnz*(4+2) + (j*rows+1)*4 (ptr) + 2*j*rows*4 (partials) + cols*4 (u) + rows*4 (out); plus u[slab]
// re-read from L2 by every CTA of a slab: items*w*4, about the GPU's total shared memory per wave (~30 MB on H200).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace jax_ops::sparse::slab {

// ------------------------------------------------------------------------------------------------ host side
struct SlabHost {
  int64_t rows = 0, cols = 0, nnz = 0;  // operator rows (A's columns), gathered length (A's rows), kept entries
  int32_t w = 4, j = 1;
  std::vector<int32_t> ptr;   // [j*rows + 1]
  std::vector<uint16_t> col;  // [nnz]
  std::vector<float> val;     // [nnz]
};

// Slab width for a shared-memory budget of `w_max` floats: the fewest slabs, equal widths rounded up to 4.
inline void SlabShape(int64_t cols, int64_t w_max, int32_t* w, int32_t* j) {
  w_max = std::max<int64_t>(4, std::min<int64_t>(w_max, 65536) & ~int64_t{3});
  const int64_t jj = std::max<int64_t>(1, (cols + w_max - 1) / w_max);
  int64_t ww = std::max<int64_t>(4, ((cols + jj - 1) / jj + 3) & ~int64_t{3});  // <= w_max
  *w = static_cast<int32_t>(ww);
  *j = static_cast<int32_t>(std::max<int64_t>(1, (cols + ww - 1) / ww));
}

// Slabs of Aᵀ straight from CSR(A) (A: a_rows x a_cols): entry (i, c, v) of A is entry (c, i) of Aᵀ, slab i / w.
// Entries whose column is outside [0, a_cols) are dropped; row ranges are clamped like the library's kernels.
inline SlabHost BuildSlabsFromA(int64_t a_rows, int64_t a_cols, const int32_t* indptr, const int32_t* indices,
                                const float* values, int64_t nnz_in, int64_t w_max) {
  SlabHost h;
  h.rows = a_cols, h.cols = a_rows;
  SlabShape(a_rows, w_max, &h.w, &h.j);
  const int64_t cells = int64_t{h.j} * h.rows;
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

// Work list for about `items` CTAs: slab s gets max(1, round(items * nnz_s / nnz)) ranges (at most `rows`), cut at
// equal nnz by the slab's ptr prefix; empty ranges are dropped (an empty slab still gets one range: its partials
// must be written).
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

// When to use slabs, from the shapes only (rows: output length, cols: gathered length, nnz, value bytes).
// Slabs pay when (1) the gathered vector does not already live in L1 (cols * val_bytes > 128 KB) and (2) the
// per-slab rows are long enough that ptr + partial traffic (12 bytes per (slab, row)) stays small against the
// matrix bytes (6 bytes per nnz): nnz >= 8 * rows * j, i.e. <= 25 % extra bytes. The time model behind it
// (printed by the bench): slab = bytes / bw + staged L2 bytes / l2_bw + 2 us (second launch), CSR(Aᵀ) = the larger
// of bytes / bw and nnz / sector_rate (every random gather a 32-byte L2 sector, ~140 G sectors/s measured).
struct SlabModel {
  int32_t w = 0, j = 0;
  double per_slab_row = 0;  // nnz / (rows * j)
  double bytes_slab = 0, bytes_staged = 0, bytes_csr = 0;
  double us_slab = 0, us_csr = 0;
  bool use = false;
};

inline SlabModel ModelSlabs(int64_t rows, int64_t cols, int64_t nnz, int64_t w_max, int64_t items,
                            int64_t val_bytes = 4, double bw = 3.5e12, double l2_bw = 8e12,
                            double sector_rate = 140e9) {
  SlabModel m;
  SlabShape(cols, w_max, &m.w, &m.j);
  const double cells = double(m.j) * rows;
  m.per_slab_row = rows > 0 ? double(nnz) / cells : 0;
  m.bytes_slab = double(nnz) * (val_bytes + 2) + (cells + 1) * 4 + 2 * cells * 4 + double(cols) * val_bytes +
                 double(rows) * val_bytes;
  m.bytes_staged = double(std::max<int64_t>(items, m.j)) * m.w * val_bytes;  // every CTA stages its slab from L2
  m.bytes_csr =
      double(nnz) * (val_bytes + 4) + double(rows + 1) * 4 + double(cols) * val_bytes + double(rows) * val_bytes;
  m.us_slab = (m.bytes_slab / bw + m.bytes_staged / l2_bw) * 1e6 + 2.0;
  const bool l1_resident = double(cols) * val_bytes <= 128 * 1024;
  m.us_csr = std::max(m.bytes_csr / bw, l1_resident ? 0.0 : double(nnz) / sector_rate) * 1e6;
  m.use = !l1_resident && m.j <= 65535 && nnz >= 8 * int64_t{m.j} * rows;
  return m;
}

// ---------------------------------------------------------------------------------------------- device side
struct SlabArgs {
  const int32_t* ptr = nullptr;
  const uint16_t* col = nullptr;
  const float* val = nullptr;
  const float* u = nullptr;  // [cols]
  const int32_t* work = nullptr;
  float* part = nullptr;  // [j * rows]
  const float* alpha = nullptr;
  const float* beta = nullptr;
  const float* y = nullptr;  // nullptr: no y term
  float* out = nullptr;      // [rows]
  int64_t rows = 0, cols = 0, nnz = 0;
  int32_t w = 4, j = 1, items = 0;
  int32_t prefetch_nnz = 0;  // > 0: L2-prefetch the first entries of the CTA's range while u[slab] is staged
};

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Pass 1. G lanes per row (power of two, <= 32), S loads of (col, val) in flight per lane, kThreads per CTA,
// kMinBlocks CTAs per SM (the slab width is chosen so that many fit). Dynamic shared memory: w floats.
template <int G, int S, int kThreads, int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks) SlabSpmvKernel(SlabArgs a) {
  extern __shared__ __align__(16) float su[];
  const int b = blockIdx.x;
  const int32_t s = __ldg(a.work + 3 * b);
  if (s < 0 || s >= a.j) return;  // whole CTA, before any barrier
  const int64_t r0 = min(max(static_cast<int64_t>(__ldg(a.work + 3 * b + 1)), int64_t{0}), a.rows);
  const int64_t r1 = min(max(static_cast<int64_t>(__ldg(a.work + 3 * b + 2)), r0), a.rows);
  const int64_t c0 = static_cast<int64_t>(s) * a.w;
  const int width = static_cast<int>(min(static_cast<int64_t>(a.w), a.cols - c0));
  // Stage u[c0, c0 + width): 16-byte copies when u is 16-byte aligned (c0 is a multiple of 4), scalar tail.
  const bool aligned = (reinterpret_cast<uintptr_t>(a.u) & 15) == 0;
  const int vec = aligned ? width >> 2 : 0;
  for (int i = threadIdx.x; i < vec; i += kThreads) CpAsync16(su + 4 * i, a.u + c0 + 4 * i);
  for (int i = 4 * vec + threadIdx.x; i < width; i += kThreads) su[i] = __ldg(a.u + c0 + i);
  const int32_t* ptr = a.ptr + static_cast<int64_t>(s) * a.rows;
  const int64_t nnz = a.nnz;
  if (a.prefetch_nnz > 0 && r1 > r0) {  // DRAM streams the first entries into L2 while the staging runs
    const int64_t q0 = min(max(static_cast<int64_t>(__ldg(ptr + r0)), int64_t{0}), nnz);
    const int64_t q1 = min(min(max(static_cast<int64_t>(__ldg(ptr + r1)), q0), nnz), q0 + a.prefetch_nnz);
    const char* vb = reinterpret_cast<const char*>(a.val + q0);
    const char* cb = reinterpret_cast<const char*>(a.col + q0);
    for (int64_t off = int64_t{threadIdx.x} * 128; off < (q1 - q0) * 4; off += kThreads * 128)
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vb + off));
    for (int64_t off = int64_t{threadIdx.x} * 128; off < (q1 - q0) * 2; off += kThreads * 128)
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(cb + off));
  }
  CpAsyncWaitAll();
  __syncthreads();
  // Let a programmatic dependent launch (the fix-up) get scheduled; it waits for this grid's completion itself.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");

  constexpr int kGroups = 32 / G;
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, grp = lane / G, lg = lane & (G - 1);
  float* part = a.part + static_cast<int64_t>(s) * a.rows;
  for (int64_t rb = r0 + static_cast<int64_t>(threadIdx.x >> 5) * kGroups; rb < r1; rb += kWarps * kGroups) {
    const int64_t r = rb + grp;
    const bool own = r < r1;
    int64_t p0 = 0, p1 = 0;
    if (own) {
      p0 = min(max(static_cast<int64_t>(__ldg(ptr + r)), int64_t{0}), nnz);
      p1 = min(max(static_cast<int64_t>(__ldg(ptr + r + 1)), p0), nnz);
    }
    float acc = 0.f;
    for (int64_t p = p0 + lg; p < p1; p += S * G) {
      unsigned c[S];
      float v[S];
#pragma unroll
      for (int h = 0; h < S; ++h) {
        const int64_t q = p + h * G;
        const bool in = q < p1;
        c[h] = in ? static_cast<unsigned>(__ldcs(reinterpret_cast<const unsigned short*>(a.col) + q)) : 0u;
        v[h] = in ? __ldcs(a.val + q) : 0.f;
      }
#pragma unroll
      for (int h = 0; h < S; ++h)
        if (c[h] < static_cast<unsigned>(width)) acc += v[h] * su[c[h]];
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off, G);
    if (own && lg == 0) part[r] = acc;
  }
}

// Pass 2: a thread per row sums its j partials in slab order (loads batched by 8, adds in order), then the
// epilogue. kPdl: launched as a programmatic dependent of pass 1 (waits for it before reading the partials).
template <bool kPdl>
__global__ void __launch_bounds__(128) SlabFixupKernel(SlabArgs a) {
  if constexpr (kPdl) asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const float alpha = __ldg(a.alpha);
  const float beta = a.y != nullptr ? __ldg(a.beta) : 0.f;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < a.rows;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* p = a.part + r;
    float acc = 0.f;
    int s = 0;
    for (; s + 8 <= a.j; s += 8) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __ldcg(p + static_cast<int64_t>(s + k) * a.rows);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc += v[k];
    }
    for (; s < a.j; ++s) acc += __ldcg(p + static_cast<int64_t>(s) * a.rows);
    float o = alpha * acc;
    if (a.y != nullptr) o += beta * a.y[r];
    a.out[r] = o;
  }
}

// Both passes on `stream`. The kernel's dynamic shared memory limit is raised once per instantiation.
template <int G, int S, int kThreads, int kMinBlocks>
cudaError_t LaunchSlabSpmv(cudaStream_t stream, const SlabArgs& a, bool pdl, int sms) {
  if (a.rows == 0) return cudaSuccess;
  auto* k1 = &SlabSpmvKernel<G, S, kThreads, kMinBlocks>;
  static const cudaError_t attr_err = [&] {
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e == cudaSuccess) e = cudaFuncSetAttribute(k1, cudaFuncAttributeMaxDynamicSharedMemorySize, optin);
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(k1, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    return e;
  }();
  if (attr_err != cudaSuccess) return attr_err;
  if (a.items > 0) k1<<<a.items, kThreads, static_cast<size_t>(a.w) * sizeof(float), stream>>>(a);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  const unsigned blocks =
      static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>((a.rows + 127) / 128, int64_t{sms} * 16)));
  if (!pdl) {
    SlabFixupKernel<false><<<blocks, 128, 0, stream>>>(a);
    return cudaGetLastError();
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(blocks);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  err = cudaLaunchKernelEx(&cfg, SlabFixupKernel<true>, a);
  if (err != cudaSuccess) return err;
  return cudaGetLastError();
}

}  // namespace jax_ops::sparse::slab
