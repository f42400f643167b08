// Approximate special-function instructions (every sm_80+ target).
#pragma once

namespace jax_ops::sm80 {

// 2^x by ex2.approx.ftz.f32 (subnormal results flush to zero).
__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace jax_ops::sm80
