// Column-slab Aᵀu kernels (contract in slab_spmv_params.h). Included by slab_spmv_kernels_{f32,f64}.cu and by the
// standalone bench (ffi_cuda/tools/sparse_spmv_bench.cu --slab).
//
// Why: for tall A (m x n, m >> n) Aᵀu through CSR(Aᵀ) gathers u (MBs) at random from L2, one 32-byte sector per
// 4-byte read. Here each CTA stages one slab of u (W entries) in shared memory and gathers from there.
// Pass 1 (SlabSpmvKernel): CTA b takes work item b (slab s, rows [r0, r1)), stages u[s*W, s*W + width) with
// 16-byte cp.async (scalar tail; scalar copies when u is not 16-byte aligned), L2-prefetches the first
// prefetch_nnz entries of its range meanwhile, then its warps sweep the rows, G lanes per row with S loads of
// (col, val) in flight per lane, gather u from shared memory, reduce with a fixed xor tree, and one lane per row
// writes part[s*n + r]. Pass 2 (SlabFixupKernel): a thread per row sums part[0..J-1, r] in slab order (loads
// batched by 8, adds in order) and writes out[r] = alpha * sum + beta * y[r]. No atomics: deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_helpers.h"
#include "sparse/slab_spmv_kernels.h"

namespace jax_ops::sparse {
namespace slab_detail {

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}

__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

template <typename T, typename Acc, int G>
__global__ void __launch_bounds__(kSlabThreads, kSlabCtasPerSm) SlabSpmvKernel(SlabArgs<T, Acc> a) {
  constexpr int S = kSlabSteps;
  constexpr int kThreads = kSlabThreads;
  extern __shared__ __align__(16) unsigned char slab_smem[];
  T* su = reinterpret_cast<T*>(slab_smem);
  const int64_t b = blockIdx.x;
  const int32_t s = __ldg(a.work + 3 * b);
  if (s < 0 || s >= a.j) return;  // whole CTA, before any barrier
  const int64_t r0 = min(max(static_cast<int64_t>(__ldg(a.work + 3 * b + 1)), int64_t{0}), a.n);
  const int64_t r1 = min(max(static_cast<int64_t>(__ldg(a.work + 3 * b + 2)), r0), a.n);
  const int64_t c0 = static_cast<int64_t>(s) * a.w;
  const int width = static_cast<int>(min(a.w, a.m - c0));  // > 0 since s < J
  // Stage u[c0, c0 + width): 16-byte copies when u is 16-byte aligned (c0 * sizeof(T) is, W being a multiple of 4).
  constexpr int kPer16 = 16 / sizeof(T);
  const bool aligned = (reinterpret_cast<uintptr_t>(a.u) & 15) == 0;
  const int vec = aligned ? width / kPer16 : 0;
  for (int i = threadIdx.x; i < vec; i += kThreads) CpAsync16(su + kPer16 * i, a.u + c0 + kPer16 * i);
  for (int i = kPer16 * vec + threadIdx.x; i < width; i += kThreads) su[i] = __ldg(a.u + c0 + i);
  const int32_t* ptr = a.ptr + static_cast<int64_t>(s) * a.n;
  const int64_t nnz = a.nnz;
  if (a.prefetch_nnz > 0 && r1 > r0) {  // DRAM streams the first entries into L2 while the staging runs
    const int64_t q0 = min(max(static_cast<int64_t>(__ldg(ptr + r0)), int64_t{0}), nnz);
    const int64_t q1 = min(min(max(static_cast<int64_t>(__ldg(ptr + r1)), q0), nnz), q0 + a.prefetch_nnz);
    const char* vb = reinterpret_cast<const char*>(a.val + q0);
    const char* cb = reinterpret_cast<const char*>(a.col + q0);
    for (int64_t off = int64_t{threadIdx.x} * 128; off < (q1 - q0) * int64_t{sizeof(T)}; off += kThreads * 128)
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(vb + off));
    for (int64_t off = int64_t{threadIdx.x} * 128; off < (q1 - q0) * 2; off += kThreads * 128)
      asm volatile("prefetch.global.L2 [%0];\n" ::"l"(cb + off));
  }
  CpAsyncWaitAll();
  __syncthreads();

  constexpr int kGroups = 32 / G;
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x & 31, grp = lane / G, lg = lane & (G - 1);
  Acc* part = a.part + static_cast<int64_t>(s) * a.n;
  const unsigned short* col = a.col;
  for (int64_t rb = r0 + static_cast<int64_t>(threadIdx.x >> 5) * kGroups; rb < r1; rb += kWarps * kGroups) {
    const int64_t r = rb + grp;
    const bool own = r < r1;
    int64_t p0 = 0, p1 = 0;
    if (own) {
      p0 = min(max(static_cast<int64_t>(__ldg(ptr + r)), int64_t{0}), nnz);
      p1 = min(max(static_cast<int64_t>(__ldg(ptr + r + 1)), p0), nnz);
    }
    Acc acc = Acc(0);
    for (int64_t p = p0 + lg; p < p1; p += S * G) {
      unsigned c[S];
      T v[S];
#pragma unroll
      for (int h = 0; h < S; ++h) {
        const int64_t q = p + h * G;
        const bool in = q < p1;
        c[h] = in ? static_cast<unsigned>(__ldcs(col + q)) : 0u;
        v[h] = in ? __ldcs(a.val + q) : T(0);
      }
#pragma unroll
      for (int h = 0; h < S; ++h)
        if (c[h] < static_cast<unsigned>(width)) acc += static_cast<Acc>(v[h]) * static_cast<Acc>(su[c[h]]);
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off, G);
    if (own && lg == 0) part[r] = acc;
  }
}

template <typename T, typename Acc>
__global__ void __launch_bounds__(128) SlabFixupKernel(SlabArgs<T, Acc> a) {
  const Acc alpha = __ldg(a.alpha);
  const Acc beta = a.y != nullptr ? __ldg(a.beta) : Acc(0);
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < a.n;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const Acc* p = a.part + r;
    Acc acc = Acc(0);
    int64_t s = 0;
    for (; s + 8 <= a.j; s += 8) {
      Acc v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) v[k] = __ldcg(p + (s + k) * a.n);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc += v[k];
    }
    for (; s < a.j; ++s) acc += __ldcg(p + s * a.n);
    Acc o = alpha * acc;
    if (a.y != nullptr) o += beta * static_cast<Acc>(a.y[r]);
    a.out[r] = static_cast<T>(o);
  }
}

template <typename T, typename Acc, int G>
cudaError_t LaunchPass1(cudaStream_t stream, const SlabArgs<T, Acc>& a) {
  const void* k = reinterpret_cast<const void*>(&SlabSpmvKernel<T, Acc, G>);
  const int bytes = static_cast<int>(a.w * static_cast<int64_t>(sizeof(T)));
  cudaError_t err = SetDynamicSmemOnce(k, bytes, /*max_shared_carveout=*/true);
  if (err != cudaSuccess) return err;
  SlabSpmvKernel<T, Acc, G><<<static_cast<unsigned>(a.items), kSlabThreads, bytes, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace slab_detail

template <typename T, typename Acc>
cudaError_t LaunchSlabSpmv(cudaStream_t stream, const SlabArgs<T, Acc>& a, int sm_count) {
  if (a.n == 0) return cudaSuccess;
  if (a.items > 0 && a.j > 0) {
    cudaError_t err = cudaSuccess;
    switch (a.group) {
      case 4:
        err = slab_detail::LaunchPass1<T, Acc, 4>(stream, a);
        break;
      case 8:
        err = slab_detail::LaunchPass1<T, Acc, 8>(stream, a);
        break;
      case 16:
        err = slab_detail::LaunchPass1<T, Acc, 16>(stream, a);
        break;
      case 32:
        err = slab_detail::LaunchPass1<T, Acc, 32>(stream, a);
        break;
      default:
        return cudaErrorInvalidValue;
    }
    if (err != cudaSuccess) return err;
  }
  const int64_t want = (a.n + 127) / 128, cap = int64_t{sm_count > 0 ? sm_count : 1} * 16;
  const unsigned blocks = static_cast<unsigned>(want < cap ? want : cap);
  slab_detail::SlabFixupKernel<T, Acc><<<blocks, 128, 0, stream>>>(a);
  return cudaGetLastError();
}

#define JAX_OPS_INSTANTIATE_SLAB_SPMV(T, ACC)                                                                          \
  template cudaError_t jax_ops::sparse::LaunchSlabSpmv<T, ACC>(cudaStream_t, const jax_ops::sparse::SlabArgs<T, ACC>&, \
                                                               int);

}  // namespace jax_ops::sparse
