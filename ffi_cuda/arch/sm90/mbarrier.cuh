// Shared-memory mbarriers (sm_90a): init, arrive (with an expected TMA transaction count) and parity wait.
#pragma once

#include <cstdint>

#include "arch/sm80/smem.cuh"
#include "arch/sm90/target.cuh"

namespace jax_ops::sm90 {

__device__ __forceinline__ void MbarInit(uint64_t* bar, uint32_t count) {
#if JAX_OPS_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sm80::SmemAddr(bar)), "r"(count));
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
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sm80::SmemAddr(bar)), "r"(bytes)
               : "memory");
#endif
}

__device__ __forceinline__ void MbarArrive(uint64_t* bar) {
#if JAX_OPS_SM90
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sm80::SmemAddr(bar)) : "memory");
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
      "}\n" ::"r"(sm80::SmemAddr(bar)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace jax_ops::sm90
