// Hopper (sm_90a) building blocks of the attention kernels: mbarriers, TMA tensor loads, wgmma shared-memory
// descriptors and fences, warpgroup register reallocation. Device code compiles to real instructions only for
// sm_90a (JAX_OPS_SM90 below); other targets get empty bodies and the launcher never selects those kernels there.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_mma.cuh"
#include "attention/attention_wgmma.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define JAX_OPS_SM90 1
#else
#define JAX_OPS_SM90 0
#endif

namespace jax_ops::attention::sm90 {

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
#if JAX_OPS_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(count));
#endif
}

// Makes the barrier inits visible to the async proxy (TMA) and the other threads; follow with __syncthreads().
__device__ __forceinline__ void FenceBarrierInit() {
#if JAX_OPS_SM90
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival that also announces `bytes` of TMA transactions the phase must see before it completes.
__device__ __forceinline__ void MbarArriveExpectTx(uint64_t* bar, uint32_t bytes) {
#if JAX_OPS_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(SmemAddr(bar)), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
#if JAX_OPS_SM90
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SmemAddr(bar)) : "memory");
#endif
}

// Spins until the barrier's phase with the given parity has completed.
__device__ __forceinline__ void MbarWait(uint64_t* bar, uint32_t parity) {
#if JAX_OPS_SM90
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(SmemAddr(bar)),
      "r"(parity)
      : "memory");
#endif
}

// TMA: one box of a 4-D tensor map into shared memory; completion is counted on `bar` in bytes.
__device__ __forceinline__ void TmaLoad4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                          int c3) {
#if JAX_OPS_SM90
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(SmemAddr(bar))
      : "memory");
#endif
}

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
#if JAX_OPS_SM90
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// wgmma shared-memory matrix descriptor for a 128-byte-swizzled tile (the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes, 8-row (1024-byte) swizzle atoms. `sbo` is the byte step between
// 8-row groups along the strided dimension; `lbo` the byte step between 64-element column panels for MN-major
// operands (unused for K-major ones, which never cross a panel within one k16 step).
__device__ __forceinline__ uint64_t SmemDesc(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t addr = SmemAddr(p);
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

// Barrier over the `threads` threads of one warpgroup set (ids 1..15; 0 is __syncthreads()).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on a named barrier without waiting (the producer side of a NamedBarrier handshake).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace jax_ops::attention::sm90
