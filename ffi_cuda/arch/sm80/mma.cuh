// Tensor-core and shared-memory helpers shared by the attention kernels (forward and backward): swizzled tile
// indexing, cp.async, ldmatrix, mma.sync m16n8k16 per dtype, quad reductions. Device code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "attention/attention_kernels.h"

namespace jax_ops::attention {
namespace {

// Element index of (row, 16-byte chunk) in a swizzled tile.
template <int kPitch>
__device__ __forceinline__ int Swz(int row, int chunk) {
  return row * kPitch + (((chunk & ~7) | ((chunk ^ row) & 7)) << 3);
}

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

template <typename T>
struct Mma;
template <>
struct Mma<__half> {
  __device__ __forceinline__ static void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};
template <>
struct Mma<__nv_bfloat16> {
  __device__ __forceinline__ static void Run(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  __device__ __forceinline__ static uint32_t Pack(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
};

// Valid query / key lengths of batch b: q_seqlen[b] / kv_seqlen[b] clamped to [0, T] / [0, S], or T / S.
struct SeqLens {
  int64_t q, kv;
};
__device__ __forceinline__ SeqLens SeqLensOf(const AttentionParams& p, const FwdPointers& ptr, int64_t b) {
  return {p.has_q_seqlen ? Min64(Max64(ptr.q_seqlen[b], 0), p.seqlen_q) : p.seqlen_q,
          p.has_kv_seqlen ? Min64(Max64(ptr.kv_seqlen[b], 0), p.seqlen_k) : p.seqlen_k};
}

// The A operand (16x16) of an m16n8k16 mma from two adjacent 16x8 fp32 accumulator tiles: the accumulator
// layout of C is the A layout, so P (or dS) feeds the next mma from registers, packed pairwise to T.
template <typename T>
__device__ __forceinline__ void PackAFrag(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = Mma<T>::Pack(lo[0], lo[1]);
  a[1] = Mma<T>::Pack(lo[2], lo[3]);
  a[2] = Mma<T>::Pack(hi[0], hi[1]);
  a[3] = Mma<T>::Pack(hi[2], hi[3]);
}

// Copies `rows` x kHeadDim elements (row stride `stride` elements) into a swizzled tile; rows >= `valid` are
// zero-filled (never read from global memory).
template <typename Tr, typename T>
__device__ __forceinline__ void LoadTile(T* smem, const T* g, int64_t stride, int rows, int valid) {
  for (int i = threadIdx.x; i < rows * Tr::kChunks; i += Tr::kThreads) {
    const int r = i / Tr::kChunks, c = i - r * Tr::kChunks;
    const bool ok = r < valid;
    CpAsync16(smem + Swz<Tr::kPitch>(r, c), ok ? g + r * stride + c * 8 : g, ok);
  }
}

__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

template <typename T>
__device__ __forceinline__ float ToFloat(T v);
template <>
__device__ __forceinline__ float ToFloat<__half>(__half v) {
  return __half2float(v);
}
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

}  // namespace
}  // namespace jax_ops::attention
