// Named CTA barriers (bar.sync / bar.arrive with an id and a thread count): warpgroup handshakes.
#pragma once

namespace jax_ops::sm90 {

// Barrier over the `threads` threads of one warpgroup set (ids 1..15; 0 is __syncthreads()).
__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Arrives on a named barrier without waiting (the producer side of a NamedBarrier handshake).
__device__ __forceinline__ void NamedBarrierArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace jax_ops::sm90
