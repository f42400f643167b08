// Warpgroup-level sm_90a pieces around the wgmma wrappers (wgmma.cuh): shared-memory matrix descriptors, the
// fence / commit / wait protocol, accumulator register fences and setmaxnreg register reallocation.
#pragma once

#include <cstdint>

#include "arch/sm80/smem.cuh"
#include "arch/sm90/target.cuh"

namespace jax_ops::sm90 {

// wgmma shared-memory matrix descriptor for a 128-byte-swizzled tile (the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes, 8-row (1024-byte) swizzle atoms. `sbo` is the byte step between
// 8-row groups along the strided dimension; `lbo` the byte step between 64-element column panels for MN-major
// operands (unused for K-major ones, which never cross a panel within one k16 step).
__device__ __forceinline__ uint64_t SmemDesc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t addr = sm80::SmemAddr(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t{(lbo >> 4) & 0x3FFF} << 16) | (uint64_t{(sbo >> 4) & 0x3FFF} << 32) |
         (uint64_t{1} << 62);
}

__device__ __forceinline__ void WgmmaFence() {
#if JAX_OPS_SM90
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void WgmmaCommit() {
#if JAX_OPS_SM90
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if JAX_OPS_SM90
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#endif
}

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int kN>
__device__ __forceinline__ void FenceRegs(float (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void FenceRegs(int32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// Warpgroup register reallocation (all threads of the warpgroup execute it).
template <int kRegs>
__device__ __forceinline__ void RegAlloc() {
#if JAX_OPS_SM90
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}
template <int kRegs>
__device__ __forceinline__ void RegDealloc() {
#if JAX_OPS_SM90
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace jax_ops::sm90
