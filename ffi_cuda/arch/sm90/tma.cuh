// Hopper (sm_90a) building blocks of the attention kernels: mbarriers, TMA tensor loads, wgmma shared-memory
// descriptors and fences, warpgroup register reallocation. Device code compiles to real instructions only for
// sm_90a (JAX_OPS_SM90 below); other targets get empty bodies and the launcher never selects those kernels there.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "arch/sm80/mma.cuh"
#include "arch/sm90/wgmma.cuh"

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

// Orders this thread's earlier generic-proxy shared-memory accesses (ld/st.shared) before async-proxy accesses (a
// TMA load another thread issues after a barrier) to the same bytes: the write-after-read/write of a reused tile.
__device__ __forceinline__ void FenceProxyAsyncSmem() {
#if JAX_OPS_SM90
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
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

// Thread-block clusters (sm_90). ClusterArrive (release) + ClusterWait (acquire) is a barrier over every thread of
// every CTA of the cluster: shared-memory stores before it, local or remote, are visible to the loads after it.
// ClusterArriveRelaxed: the barrier without the memory ordering. Non-.aligned forms: callers may have diverged.
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

// 16-byte load from this CTA's shared memory (a shared::cta address).
__device__ __forceinline__ float4 LdSharedV4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}

__device__ __forceinline__ float FastExp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Epilogue of a 64-row wgmma accumulator tile (m64nD fp32: thread (warp, lane) holds rows warp*16 + lane/4 and
// +8, columns dt*8 + (lane&3)*2 and +1): scaled per row and rounded to T into shared memory in the 128-byte-swizzled
// tile layout (rows of 128 bytes, 64-column panels `panel_bytes` apart; `rows` 1024-byte aligned), so that the
// global stores can be whole 16-byte row chunks (SmemRowsToGlobal) instead of 4-byte scattered ones.
template <typename T, int kHeadDim>
__device__ __forceinline__ void AccToSmemRows(const float (&acc)[kHeadDim / 2], const float (&scale)[2],
                                              unsigned char* rows, int panel_bytes, int warp, int lane) {
#pragma unroll
  for (int dt = 0; dt < kHeadDim / 8; ++dt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp * 16 + (lane >> 2) + 8 * i;
      const int d = dt * 8 + (lane & 3) * 2;
      const int chunk = (d & 63) >> 3;
      unsigned char* dst = rows + (d >> 6) * panel_bytes + r * 128 + ((chunk ^ (r & 7)) << 4) + (d & 7) * 2;
      *reinterpret_cast<uint32_t*>(dst) =
          Mma<T>::Pack(acc[dt * 4 + 2 * i] * scale[i], acc[dt * 4 + 2 * i + 1] * scale[i]);
    }
  }
}

// kRows rows written by AccToSmemRows to global memory (row r at dst + r * row_stride), rows >= valid_rows
// skipped; kThreads threads (tid; by default the 128 of a warpgroup) store consecutive 16-byte chunks. `rows` is
// the tile's first row or one a multiple of 8 rows further (the swizzle follows r & 7).
template <typename T, int kHeadDim, int kRows = 64, int kThreads = 128>
__device__ __forceinline__ void SmemRowsToGlobal(const unsigned char* rows, int panel_bytes, T* dst, int64_t row_stride,
                                                 int valid_rows, int tid) {
  constexpr int kChunks = kHeadDim / 8;
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    if (r >= valid_rows) continue;
    const unsigned char* src = rows + (c >> 3) * panel_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(dst + r * row_stride + c * 8) = *reinterpret_cast<const uint4*>(src);
  }
}

// cuTensorMapEncodeTiled from the driver, looked up once through the runtime (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult qres;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &qres) !=
            cudaSuccess ||
        qres != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// Map of a dense [B, rows, heads, D] tensor; box = 64 elements x 1 head x box_rows rows x 1 batch, 128B swizzle.
template <typename T>
bool EncodeMap(CUtensorMap* map, const void* base, int64_t batch, int64_t rows, int64_t heads, int64_t head_dim,
               int box_rows) {
  const auto encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(head_dim * 2), static_cast<cuuint64_t>(heads * head_dim * 2),
                                 static_cast<cuuint64_t>(rows * heads * head_dim * 2)};
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUtensorMapDataType dtype =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(map, dtype, 4, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace jax_ops::attention::sm90
