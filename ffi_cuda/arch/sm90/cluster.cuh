// Thread-block clusters (sm_90a): the cluster barrier and distributed shared memory (mapa, st.shared::cluster),
// plus the 16-byte local shared-memory load that reads what a peer CTA stored.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "arch/sm90/target.cuh"

namespace jax_ops::sm90 {

// ClusterArrive (release) + ClusterWait (acquire) is a barrier over every thread of every CTA of the cluster:
// shared-memory stores before it, local or remote, are visible to the loads after it. ClusterArriveRelaxed: the
// barrier without the memory ordering. Non-.aligned forms: callers may have diverged.
__device__ __forceinline__ void ClusterArrive() {
#if JAX_OPS_SM90
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ClusterArriveRelaxed() {
#if JAX_OPS_SM90
  asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void ClusterWait() {
#if JAX_OPS_SM90
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
#endif
}

// The shared::cluster address of the same shared-memory offset in CTA `rank` of this cluster.
__device__ __forceinline__ uint32_t MapSharedRank(uint32_t smem_addr, uint32_t rank) {
  uint32_t out = smem_addr;
#if JAX_OPS_SM90
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_addr), "r"(rank));
#endif
  return out;
}

// 16-byte store to distributed shared memory (an address from MapSharedRank).
__device__ __forceinline__ void StSharedClusterV4(uint32_t addr, float4 v) {
#if JAX_OPS_SM90
  asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
#endif
}

// 4-byte store to distributed shared memory (an address from MapSharedRank).
__device__ __forceinline__ void StSharedClusterF32(uint32_t addr, float v) {
#if JAX_OPS_SM90
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
#endif
}

// 16-byte load from this CTA's shared memory (a shared::cta address).
__device__ __forceinline__ float4 LdSharedV4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

}  // namespace jax_ops::sm90
