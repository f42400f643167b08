// Launchers of the kv_cache CUDA kernels (kernels.cu), called by the handlers in kv_cache_cuda.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kv_cache/params.h"

namespace jax_ops::kv_cache {

// Device pointers and sizes of one append (contract in params.h); the pools (and scales) are written in place.
struct AppendArgs {
  Shape shape;
  int64_t elem_bytes = 0;  // of a token element (k_new / v_new)
  void* k_pages = nullptr;
  void* v_pages = nullptr;
  float* k_scales = nullptr;  // [P, Hkv] with f8e4m3fn pages
  float* v_scales = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* lengths = nullptr;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  int32_t* lengths_out = nullptr;
  int32_t* status = nullptr;
};

// How the decode kernel loads its key tiles: cp.async, or the TMA engine (page size a power of two >= 8, sm_90a):
// kTma where it does not apply returns cudaErrorNotSupported and launches nothing (the standalone tool forces it),
// kTmaWhereItApplies falls back to cp.async (the tma_load attribute).
enum class DecodeLoad { kCpAsync, kTma, kTmaWhereItApplies };

// Device pointers, sizes and attributes of one decode (contract in params.h).
struct DecodeArgs {
  Shape shape;
  float scale = 1.f, softcap = 0.f;
  int64_t splits = 1;
  int page_shift = -1;  // log2(page_size) when it is a power of two, else -1
  const void* q = nullptr;
  const void* k_pages = nullptr;
  const void* v_pages = nullptr;
  const float* k_scales = nullptr;  // [P, Hkv] with f8e4m3fn pages
  const float* v_scales = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* lengths = nullptr;
  void* o = nullptr;           // splits == 1 or merge_in_cluster
  float* o_parts = nullptr;    // splits > 1, unless merge_in_cluster
  float* lse_parts = nullptr;  // splits > 1, unless merge_in_cluster
  // splits in [2, kMaxKernelMergeSplits] merged inside the kernel: the splits of a row block run as one
  // thread-block cluster and merge through distributed shared memory in split order (sm_90a); o is written.
  bool merge_in_cluster = false;
  DecodeLoad load = DecodeLoad::kCpAsync;
};

cudaError_t LaunchAppend(cudaStream_t stream, const AppendArgs& args);

// T: __half or __nv_bfloat16 (the queries, and the pages unless kFp8: f8e4m3fn pages, cp.async loads only);
// kHeadDim one of kCudaDecodeHeadDims.
template <typename T, int kHeadDim, bool kFp8>
cudaError_t LaunchDecode(cudaStream_t stream, const DecodeArgs& args);

}  // namespace jax_ops::kv_cache
