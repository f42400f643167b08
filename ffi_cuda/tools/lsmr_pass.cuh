// EXPERIMENT (standalone, spmv_bench --lsmr-pass): one LSMR bidiagonalisation step that reads CSR(A) once.
//
// Today an LSMR iteration streams the matrix twice: u' = A v - c u over CSR(A), then A^T u' over CSR(A^T). For a
// tall matrix whose n columns fit in shared memory (n <= ~48k floats next to the kernel's other needs), one pass
// over CSR(A) can do both: a group of G lanes computes row i's u'_i = A_i . v - c u_i, then scatters A_ij u'_i into
// a per-CTA shared-memory copy of A^T u' (shared atomics); each CTA writes its copy to a workspace row and a
// second kernel sums the rows in a fixed order. It also returns per-CTA partial sums of u'^2 (for beta = ||u'||).
// Bytes per step: the matrix once (8 B/nnz) + grid x n partials, instead of 16 B/nnz.
// Not deterministic: the shared atomics add each CTA's contributions to a column in run-dependent order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jax_ops::lsmr_pass {

// Streaming loads of the matrix (read once per pass; keep L1 for v).
__device__ __forceinline__ float LdStream(const float* p) { return __ldcs(p); }
__device__ __forceinline__ int32_t LdStream(const int32_t* p) { return __ldcs(p); }

// G lanes per row, up to kR of a lane's entries kept in registers between the dot and the scatter (longer rows
// re-read the rest). kVSmem: v staged in shared memory (else gathered through L1).
template <int G, int kR, bool kVSmem>
__global__ void __launch_bounds__(1024)
    PassKernel(const int32_t* __restrict__ indptr, const int32_t* __restrict__ cols, const float* __restrict__ vals,
               int64_t m, int64_t n, const float* __restrict__ v, const float* __restrict__ u,
               const float* __restrict__ c_u, float* __restrict__ u_out, float* __restrict__ partial,
               double* __restrict__ ss_partial) {
  extern __shared__ float smem[];
  float* acc = smem;                        // n: this CTA's share of A^T u'
  float* sv = kVSmem ? smem + n : nullptr;  // n: v
  __shared__ double ss_warp[32];
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    acc[j] = 0.f;
    if constexpr (kVSmem) sv[j] = v[j];
  }
  __syncthreads();
  const float cu = *c_u;
  const int lane_g = threadIdx.x % G;
  const int groups = blockDim.x / G;
  const int64_t r0 = m * blockIdx.x / gridDim.x, r1 = m * (blockIdx.x + 1) / gridDim.x;
  double ss = 0;
  // Warp-uniform trip count (the group shuffles need every lane of the warp): a warp runs while its first group
  // has a row; groups past r1 run masked.
  const int64_t warp_first = r0 + (threadIdx.x / 32) * (32 / G);
  for (int64_t it = 0; warp_first + it * groups < r1; ++it) {
    const int64_t row = r0 + threadIdx.x / G + it * groups;
    const bool live = row < r1;
    const int64_t lo = live ? indptr[row] : 0, hi = live ? indptr[row + 1] : 0;
    int32_t c[kR];
    float a[kR];
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < kR; ++k) {
      const int64_t p = lo + lane_g + int64_t{k} * G;
      c[k] = 0, a[k] = 0.f;
      if (p < hi) {
        c[k] = LdStream(cols + p);
        a[k] = LdStream(vals + p);
      }
    }
#pragma unroll
    for (int k = 0; k < kR; ++k) s += a[k] * (kVSmem ? sv[c[k]] : __ldg(v + c[k]));
    for (int64_t p = lo + lane_g + int64_t{kR} * G; p < hi; p += G) {
      const int32_t cc = cols[p];
      s += vals[p] * (kVSmem ? sv[cc] : __ldg(v + cc));
    }
#pragma unroll
    for (int off = G / 2; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off, G);
    const float ub = live ? s - cu * u[row] : 0.f;
    if (live && lane_g == 0) {
      u_out[row] = ub;
      ss += double(ub) * ub;
    }
#pragma unroll
    for (int k = 0; k < kR; ++k)
      if (lo + lane_g + int64_t{k} * G < hi) atomicAdd(acc + c[k], a[k] * ub);
    for (int64_t p = lo + lane_g + int64_t{kR} * G; p < hi; p += G) atomicAdd(acc + cols[p], vals[p] * ub);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  if (threadIdx.x % 32 == 0) ss_warp[threadIdx.x / 32] = ss;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) partial[blockIdx.x * n + j] = acc[j];
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) t += ss_warp[w];  // fixed order
    ss_partial[blockIdx.x] = t;
  }
}

// w[j] = sum over parts p (fixed order) of partial[p][j]. Block (32, 8): 32 columns, 8 slices of the parts.
__global__ void __launch_bounds__(256)
    ReduceKernel(const float* __restrict__ partial, int parts, int64_t n, float* __restrict__ w) {
  __shared__ float s[8][33];
  const int64_t j = blockIdx.x * int64_t{32} + threadIdx.x;
  float t = 0.f;
  if (j < n)
    for (int p = threadIdx.y; p < parts; p += 8) t += partial[int64_t{p} * n + j];
  s[threadIdx.y][threadIdx.x] = t;
  __syncthreads();
  if (threadIdx.y == 0 && j < n) {
    float r = 0.f;
#pragma unroll
    for (int y = 0; y < 8; ++y) r += s[y][threadIdx.x];
    w[j] = r;
  }
}

struct PassArgs {
  const int32_t *indptr, *cols;
  const float *vals, *v, *u, *c_u;
  float *u_out, *partial, *w;
  double* ss_partial;
  int64_t m, n;
  int grid;  // CTAs (= partial rows)
};

template <int G, int kR, bool kVSmem>
cudaError_t LaunchPass(const PassArgs& a, cudaStream_t stream, int threads = 1024) {
  const size_t smem = size_t(a.n) * 4 * (kVSmem ? 2 : 1);
  cudaError_t e = cudaFuncSetAttribute(PassKernel<G, kR, kVSmem>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(smem));
  if (e != cudaSuccess) return e;
  PassKernel<G, kR, kVSmem><<<a.grid, threads, smem, stream>>>(a.indptr, a.cols, a.vals, a.m, a.n, a.v, a.u, a.c_u,
                                                               a.u_out, a.partial, a.ss_partial);
  ReduceKernel<<<static_cast<unsigned>((a.n + 31) / 32), dim3(32, 8), 0, stream>>>(a.partial, a.grid, a.n, a.w);
  return cudaGetLastError();
}

}  // namespace jax_ops::lsmr_pass
