// Shared-memory addressing (sm_80+): the 32-bit shared-window address PTX shared-memory operands take.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace jax_ops::sm80 {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

}  // namespace jax_ops::sm80
