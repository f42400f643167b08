// mma.sync m16n8k16 (sm_80+) per 16-bit dtype, fp32 accumulate, and the packing of fp32 pairs into its operands.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace jax_ops::sm80 {

// Mma<T>::Run: d += a (16x16, row) * b (16x8, col); Pack: two floats rounded to T in one 32-bit register.
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

// The A operand (16x16) of an m16n8k16 mma from two adjacent 16x8 fp32 accumulator tiles: the accumulator
// layout of C is the A layout, so P (or dS) feeds the next mma from registers, packed pairwise to T.
template <typename T>
__device__ __forceinline__ void PackAFrag(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = Mma<T>::Pack(lo[0], lo[1]);
  a[1] = Mma<T>::Pack(lo[2], lo[3]);
  a[2] = Mma<T>::Pack(hi[0], hi[1]);
  a[3] = Mma<T>::Pack(hi[2], hi[3]);
}

// The A operands of kSteps k16 steps from a flat fp32 accumulator of 2 * kSteps adjacent n8 tiles, 4 floats a
// tile (a thread's part of consecutive m16n8 mma accumulators, and of a wgmma m64nN one alike): step ks packs
// x[ks * 8 .. ks * 8 + 7] as PackAFrag does, so a register-A wgmma takes P (or dS) straight from S (or dP).
template <typename T, int kSteps>
__device__ __forceinline__ void PackAFrags(uint32_t (&a)[kSteps][4], const float (&x)[kSteps * 8]) {
#pragma unroll
  for (int ks = 0; ks < kSteps; ++ks) {
    a[ks][0] = Mma<T>::Pack(x[ks * 8 + 0], x[ks * 8 + 1]);
    a[ks][1] = Mma<T>::Pack(x[ks * 8 + 2], x[ks * 8 + 3]);
    a[ks][2] = Mma<T>::Pack(x[ks * 8 + 4], x[ks * 8 + 5]);
    a[ks][3] = Mma<T>::Pack(x[ks * 8 + 6], x[ks * 8 + 7]);
  }
}

}  // namespace jax_ops::sm80
