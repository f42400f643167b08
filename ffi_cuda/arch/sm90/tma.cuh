// TMA (sm_90a): tensor-map encoding on the host, 4-D tensor loads completing on an mbarrier, tensor-map prefetch
// and the generic -> async proxy fence.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "arch/sm80/smem.cuh"
#include "arch/sm90/target.cuh"

namespace jax_ops::sm90 {

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
      "[%6];\n" ::"r"(sm80::SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(sm80::SmemAddr(bar))
      : "memory");
#endif
}

// TMA: tiles stored as kPanels 64-column panels kPanelBytes apart, one box per panel (columns 64·pn, the other
// coordinates c1..c3), all completing on `bar`; several tiles at the same coordinates (K and V, Q and dO) go panel
// by panel.
template <int kPanels, int kPanelBytes, int kTiles>
__device__ __forceinline__ void TmaLoadPanels(unsigned char* const (&dst)[kTiles],
                                              const CUtensorMap* const (&map)[kTiles], uint64_t* bar, int c1, int c2,
                                              int c3) {
  for (int pn = 0; pn < kPanels; ++pn)
    for (int t = 0; t < kTiles; ++t) TmaLoad4d(dst[t] + pn * kPanelBytes, map[t], bar, pn * 64, c1, c2, c3);
}

// TMA: one box of a 3-D tensor map into shared memory; completion is counted on `bar` in bytes.
__device__ __forceinline__ void TmaLoad3d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2) {
#if JAX_OPS_SM90
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::
          "r"(sm80::SmemAddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(sm80::SmemAddr(bar))
      : "memory");
#endif
}

__device__ __forceinline__ void PrefetchTensorMap(const CUtensorMap* map) {
#if JAX_OPS_SM90
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
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

// Map of a dense [B, rows, heads, D] tensor of T (__half or __nv_bfloat16); box = 64 elements x 1 head x box_rows
// rows x 1 batch, 128B swizzle (the layout the wgmma descriptors of warpgroup.cuh read).
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

// Map of a dense row-major 3-D tensor [d2][d1][d0] of `elem_bytes`-byte elements (d0 contiguous), loaded in
// boxes of box0 x box1 x 1 with 128-byte swizzle (box0 * elem_bytes must be 128: one swizzle row). Out-of-range
// box elements read as zero. False when the driver refuses (alignment: base and row strides multiples of 16 bytes).
inline bool EncodeMap3d(CUtensorMap* map, CUtensorMapDataType dtype, int elem_bytes, const void* base, int64_t d0,
                        int64_t d1, int64_t d2, int64_t row_stride_elems, int64_t plane_stride_elems, int box0,
                        int box1) {
  const auto encode = TensorMapEncoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d0), static_cast<cuuint64_t>(d1), static_cast<cuuint64_t>(d2)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(row_stride_elems * elem_bytes),
                                 static_cast<cuuint64_t>(plane_stride_elems * elem_bytes)};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box0), static_cast<cuuint32_t>(box1), 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  return encode(map, dtype, 3, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace jax_ops::sm90
