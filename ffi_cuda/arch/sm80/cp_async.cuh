// cp.async (sm_80+): 16- and 4-byte asynchronous global -> shared copies, commit groups and waits.
#pragma once

#include <cstdint>

#include "arch/sm80/smem.cuh"

namespace jax_ops::sm80 {

// Copies 16 bytes, or zero-fills the 16 shared-memory bytes without reading `gmem` when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
// Copies 4 bytes (through L1), or zero-fills them without reading `gmem` when !valid.
__device__ __forceinline__ void CpAsync4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace jax_ops::sm80
