// The kv_cache CUDA kernels: the fused paged append and the paged GQA decode (contract in params.h).
//
// Append: one launch writes every request's new K and V rows straight into their pages (16-byte copies when a
// head row allows it); the CTAs of a request first agree, with one __syncthreads_and, that all of its positions
// have a page, so a request that does not fit writes nothing.
//
// Decode: CTA = (16 packed query rows, one split, one kv head, one request). The G query heads of the kv head
// and the T query tokens are packed as rows t * G + g of one mma tile (GQA by index mapping: K/V are read once
// per group). Key tiles of 64 rows stream through a ring of shared-memory stages, translated through the block
// table inside the kernel (no gathered copy), loaded one of two ways (DecodeLoad): by cp.async, every thread
// copying 16-byte chunks of its rows (the page id read once per key row), or by the TMA engine, one box per page
// and 64 columns (page size a power of two >= 8, sm_90a; one thread issues a tile, the page ids read once per
// page). Each of the 4 warps runs
// the attention family's online softmax over its 16 keys of every tile; the warps' states merge through shared
// memory at the end, and splits > 1 write normalised partial outputs with their log-sum-exp for the Python merge,
// or (merge_in_cluster) run as one cluster per row block and merge through distributed shared memory.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "arch/sm80/cp_async.cuh"
#include "arch/sm80/ldmatrix.cuh"
#include "arch/sm80/mma.cuh"
#include "arch/sm80/smem.cuh"
#include "arch/sm90/cluster.cuh"
#include "arch/sm90/mbarrier.cuh"
#include "arch/sm90/tma.cuh"
#include "attention/tile_math.cuh"
#include "common/cuda_helpers.h"
#include "common/dtype_traits.h"
#include "kv_cache/kernels.h"

namespace jax_ops::kv_cache {
namespace {

using attention::EndRow, attention::MmaAccTile, attention::OnlineSoftmaxStep, attention::QuadSum, attention::RowEnd,
    attention::Swz;
using sm80::CpAsync4, sm80::CpAsync16, sm80::CpAsyncCommit, sm80::CpAsyncWait, sm80::LdMatrixX4, sm80::Mma;
using sm90::FenceBarrierInit, sm90::MbarArriveExpectTx, sm90::MbarInit, sm90::MbarWait, sm90::TmaLoad4d;

// ---------------------------------------------------------------- append

constexpr int kAppendThreads = 256;

// Whether request b's tokens [length, length + T) all land in allocated slots. Every thread of the CTA checks a
// share of the slots; the CTA agrees through __syncthreads_and (so every thread must call it).
__device__ bool RequestFits(const AppendArgs& a, int64_t b) {
  const Shape& s = a.shape;
  const int64_t length = a.lengths[b];
  bool ok = length >= 0 && length + s.tokens <= s.capacity();
  if (ok && s.tokens > 0) {
    const int64_t first = length / s.page_size, last = (length + s.tokens - 1) / s.page_size;
    for (int64_t slot = first + threadIdx.x; slot <= last; slot += blockDim.x) {
      const int32_t page = a.block_table[b * s.max_pages + slot];
      ok = ok && page >= 0 && page < s.num_pages;
    }
  }
  return __syncthreads_and(ok);
}

// The append kernels' common start: whether request b fits (every thread of the CTA must call it); CTA 0 of the
// request writes its status and new length.
__device__ bool AdmitRequest(const AppendArgs& a, int64_t b) {
  const bool fits = RequestFits(a, b);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const int64_t length = a.lengths[b];
    a.status[b] = fits ? kStatusOk : kStatusPastAllocatedPages;
    a.lengths_out[b] = static_cast<int32_t>(fits ? length + a.shape.tokens : length);
  }
  return fits;
}

// grid (CTAs per request, B): request blockIdx.y's T * Hkv head rows, `Vec` bytes a thread per step.
template <typename Vec>
__global__ void __launch_bounds__(kAppendThreads) PagedAppendKernel(const AppendArgs a) {
  const Shape& s = a.shape;
  const int64_t b = blockIdx.y;
  if (!AdmitRequest(a, b)) return;
  const int64_t length = a.lengths[b];
  const int64_t row_vecs = s.head_dim * a.elem_bytes / static_cast<int64_t>(sizeof(Vec));
  const int64_t total = s.tokens * s.num_kv_heads * row_vecs;
  const int64_t src_base = b * total;  // k_new / v_new [B, T, Hkv, D] in Vec units
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % row_vecs, row = i / row_vecs;
    const int64_t h = row % s.num_kv_heads, t = row / s.num_kv_heads;
    const int64_t pos = length + t;
    const int32_t page = a.block_table[b * s.max_pages + pos / s.page_size];
    const int64_t dst = s.PageOffset(page, pos % s.page_size, h) * a.elem_bytes / static_cast<int64_t>(sizeof(Vec)) + c;
    static_cast<Vec*>(a.k_pages)[dst] = static_cast<const Vec*>(a.k_new)[src_base + i];
    static_cast<Vec*>(a.v_pages)[dst] = static_cast<const Vec*>(a.v_new)[src_base + i];
  }
}

template <typename Vec>
cudaError_t LaunchAppendVec(cudaStream_t stream, const AppendArgs& a) {
  const Shape& s = a.shape;
  const int64_t total = s.tokens * s.num_kv_heads * (s.head_dim * a.elem_bytes / static_cast<int64_t>(sizeof(Vec)));
  const int64_t ctas = std::clamp<int64_t>((total + kAppendThreads - 1) / kAppendThreads, 1, 1024);
  PagedAppendKernel<Vec>
      <<<dim3(static_cast<unsigned>(ctas), static_cast<unsigned>(s.batch)), kAppendThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// float8 pages (rules in params.h): grid (pages a chunk can touch x Hkv, B); a CTA owns one (page, kv head) of one
// request, so the page's scale, its re-quantised earlier rows and its new rows need no other CTA.
__device__ __forceinline__ float NanMax(float a, float b) {
  return a != a || b != b ? __int_as_float(0x7fffffff) : fmaxf(a, b);
}

__device__ __forceinline__ uint8_t QuantizeE4m3(float x, float scale) {
  return __nv_cvt_float_to_fp8(x * InverseFp8Scale(scale), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float E4m3ToFloat(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3)));
}

// One pool's rows [r0, r1) of `page` for kv head h, from the request's tokens `src` ([T, Hkv, D], first row at
// position `base + r0`), with the page's scale grown and its rows [0, r0) re-quantised.
template <typename Src>
__device__ void QuantizePageRows(const Shape& s, const Src* src, uint8_t* pages, float* scales, int64_t page, int64_t h,
                                 int64_t r0, int64_t r1, int64_t first_token) {
  __shared__ float warp_amax[kAppendThreads / 32];
  const int64_t D = s.head_dim, n_new = (r1 - r0) * D;
  auto token = [&](int64_t i) {  // new element i: row r0 + i / D, column i % D
    return ToAcc(src[((first_token + i / D) * s.num_kv_heads + h) * D + i % D]);
  };
  float amax = 0.f;
  for (int64_t i = threadIdx.x; i < n_new; i += blockDim.x) amax = NanMax(amax, fabsf(token(i)));
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = NanMax(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  float& scale_ref = scales[page * s.num_kv_heads + h];
  const float old = r0 > 0 ? scale_ref : 0.f;
  if ((threadIdx.x & 31) == 0) warp_amax[threadIdx.x >> 5] = amax;
  __syncthreads();  // every thread has read `old` and published its warp's amax
  amax = 0.f;
#pragma unroll
  for (int w = 0; w < kAppendThreads / 32; ++w) amax = NanMax(amax, warp_amax[w]);
  const float grown = NanMax(old, Fp8Scale(amax));
  uint8_t* rows = pages + s.PageOffset(page, 0, h);  // row r at r * Hkv * D
  const int64_t row_pitch = s.num_kv_heads * D;
  if (r0 > 0 && grown > old) {
    for (int64_t i = threadIdx.x; i < r0 * D; i += blockDim.x) {
      uint8_t& v = rows[i / D * row_pitch + i % D];
      v = QuantizeE4m3(E4m3ToFloat(v) * old, grown);
    }
  }
  for (int64_t i = threadIdx.x; i < n_new; i += blockDim.x)
    rows[(r0 + i / D) * row_pitch + i % D] = QuantizeE4m3(token(i), grown);
  __syncthreads();  // warp_amax is reused by the next pool
  if (threadIdx.x == 0) scale_ref = grown;
}

template <typename Src>
__global__ void __launch_bounds__(kAppendThreads) PagedAppendFp8Kernel(const AppendArgs a) {
  const Shape& s = a.shape;
  const int64_t b = blockIdx.y;
  if (!AdmitRequest(a, b)) return;
  const int64_t length = a.lengths[b];
  const int64_t h = blockIdx.x % s.num_kv_heads, slot = length / s.page_size + blockIdx.x / s.num_kv_heads;
  const int64_t base = slot * s.page_size, end = length + s.tokens;
  if (base >= end) return;
  const int64_t page = a.block_table[b * s.max_pages + slot];
  const int64_t r0 = max(length - base, int64_t{0}), r1 = min(s.page_size, end - base);
  const int64_t first_token = base + r0 - length;  // index in the request's T new tokens
  const int64_t request = b * s.tokens * s.num_kv_heads * s.head_dim;
  QuantizePageRows(s, static_cast<const Src*>(a.k_new) + request, static_cast<uint8_t*>(a.k_pages), a.k_scales, page, h,
                   r0, r1, first_token);
  QuantizePageRows(s, static_cast<const Src*>(a.v_new) + request, static_cast<uint8_t*>(a.v_pages), a.v_scales, page, h,
                   r0, r1, first_token);
}

template <typename Src>
cudaError_t LaunchAppendFp8(cudaStream_t stream, const AppendArgs& a) {
  const Shape& s = a.shape;
  const int64_t pages = (s.tokens + s.page_size - 1) / s.page_size + 1;  // a chunk of T rows touches at most this
  if (pages * s.num_kv_heads > 0x7fffffff) return cudaErrorInvalidConfiguration;
  PagedAppendFp8Kernel<Src><<<dim3(static_cast<unsigned>(pages * s.num_kv_heads), static_cast<unsigned>(s.batch)),
                              kAppendThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

// ---------------------------------------------------------------- decode

constexpr int kMinTmaPage = 8;  // a smaller TMA box would break the 1024-byte swizzle period of a panel

// TMA tensor maps of the K and V pools, [P, page, Hkv, D] seen as [batch, rows, heads, D]: box = 64 columns x
// one head x min(page, 64) rows x one page.
struct PageMaps {
  CUtensorMap k, v;
};

// kFp8: f8e4m3fn pages. Their ring stages hold the raw K and V rows and each row's scale; every tile is then
// converted (dequantised into T) into one K/V tile pair after the ring, which the mma loops read.
template <int kHeadDim, bool kFp8 = false>
struct DecodeTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRows = 16;           // packed query rows per CTA: one mma row tile
  static constexpr int kKeys = 16 * kWarps;  // keys per tile, 16 per warp
  static constexpr int kStages = kFp8 ? (kHeadDim <= 128 ? 4 : 3) : (kHeadDim <= 128 ? 3 : 2);
  static constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks of a T head row
  static constexpr int kPageElemBytes = kFp8 ? 1 : 2;
  static constexpr int kLoadChunks = kHeadDim * kPageElemBytes / 16;  // 16-byte chunks of a page row
  static constexpr int kPanels = kHeadDim / 64;                       // 64-column panels of a tile on the TMA path
  static constexpr int kKS = kHeadDim / 16;                           // k-steps of Q K^T
  static constexpr int kDT = kHeadDim / 8;                            // n8 tiles of O
  static constexpr bool kQInRegs = kHeadDim <= 128;
  static constexpr int kMaxBoxes = kKeys / kMinTmaPage;  // TMA boxes (pages) of a key tile, at most
  static constexpr int kQBytes = kRows * kHeadDim * 2;
  static constexpr int kTileElems = kKeys * kHeadDim;
  static constexpr int kPageTileBytes = kTileElems * kPageElemBytes;
  // K and V tiles as stored, then (kFp8) the K and V scale of each key row.
  static constexpr int kStageBytes = 2 * kPageTileBytes + (kFp8 ? 2 * kKeys * 4 : 0);
  static constexpr int kConvertedBytes = kFp8 ? 2 * kTileElems * 2 : 0;  // the dequantised K/V tile pair
  static constexpr int kMergePitch = kHeadDim + 4;                       // floats: rows of the warps' O in the merge
  static constexpr int kMergeBytes = kWarps * kRows * (kMergePitch + 2) * 4;
  static constexpr int kRingEnd = kQBytes + kStages * kStageBytes + kConvertedBytes;  // then one mbarrier per stage
  // + 1 KB to align the base: the TMA's 128-byte swizzle repeats every 1024 bytes of shared address.
  static constexpr int kSmemBytes = kRingEnd + kStages * 8 + 1024;
  static_assert(kHeadDim % 64 == 0, "tiles are whole 64-column panels");
  static_assert(kKeys == kSplitKeyAlign, "a split is a whole number of key tiles");
  static_assert(kMergeBytes <= kRingEnd, "the merge reuses the tile ring");
  static constexpr int kSlotPitch = kHeadDim + 4;  // floats: a split's output row in the cluster merge
  static_assert(kMaxKernelMergeSplits * kRows * (kSlotPitch + 1) * 4 <= kRingEnd, "the cluster merge reuses the ring");
};

// kTma: the TMA load path (maps used); else cp.async (maps unused). kFp8: f8e4m3fn pages (cp.async only).
template <typename T, int kHeadDim, bool kTma, bool kFp8>
__global__ void __launch_bounds__(DecodeTraits<kHeadDim, kFp8>::kThreads, 2)
    PagedDecodeKernel(const DecodeArgs a, const __grid_constant__ PageMaps maps) {
  using Tr = DecodeTraits<kHeadDim, kFp8>;
  static_assert(!(kTma && kFp8), "float8 pages load by cp.async");
  constexpr int kKeys = Tr::kKeys, kStages = Tr::kStages;
  // Tile layouts (Swz<kPitch, panel rows>): 64-column panels on the TMA path (what a 128B-swizzled box writes),
  // whole swizzled rows on the cp.async one.
  constexpr int kPitch = kTma ? 64 : kHeadDim, kKeyPanel = kTma ? kKeys : 0, kQPanel = kTma ? Tr::kRows : 0;
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  const Shape& s = a.shape;
#if defined(__CUDA_ARCH__) && !JAX_OPS_SM90
  if (kTma || a.merge_in_cluster) __trap();  // their sm90 primitives are empty here (the launcher never asks)
#endif

  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  T* sQ = reinterpret_cast<T*>(smem);
  T* ring = reinterpret_cast<T*>(smem + Tr::kQBytes);                 // stage i: K at 2i tiles, V at 2i + 1
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Tr::kRingEnd);  // TMA path: stage i's loads landed
  // kFp8: stage i holds K, V (bytes) and their row scales from smem + kQBytes + i * kStageBytes; the dequantised
  // pair follows the ring.
  unsigned char* ring8 = smem + Tr::kQBytes;
  T* converted = reinterpret_cast<T*>(smem + Tr::kQBytes + Tr::kStages * Tr::kStageBytes);

  const int64_t group = s.group(), packed_rows = group * s.tokens;
  const int64_t row_blocks = (packed_rows + Tr::kRows - 1) / Tr::kRows;
  // A cluster merge needs a row block's splits adjacent in x (one cluster, rank = split).
  const int64_t split = a.merge_in_cluster ? blockIdx.x % a.splits : blockIdx.x / row_blocks;
  const int64_t rb = a.merge_in_cluster ? blockIdx.x / a.splits : blockIdx.x % row_blocks;
  const int64_t kvh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tid = threadIdx.x;

  const int64_t length = min(max(int64_t{a.lengths[b]}, int64_t{0}), s.capacity());
  const int64_t chunk = SplitChunk(length, a.splits);
  const int64_t lo = split * chunk, hi = min(length, lo + chunk);
  const int n_tiles = hi > lo ? static_cast<int>((hi - lo + kKeys - 1) / kKeys) : 0;

  // The two rows this thread holds in the mma layout, and the first key each may not see.
  int64_t key_end[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t pr = rb * Tr::kRows + (lane >> 2) + 8 * i;
    key_end[i] = pr < packed_rows ? min(hi, length - s.tokens + pr / group + 1) : lo;
  }
  const int64_t unmasked_end = min(key_end[0], key_end[1]);

  using PageT = std::conditional_t<kFp8, uint8_t, T>;
  const PageT* k_pages = static_cast<const PageT*>(a.k_pages);
  const PageT* v_pages = static_cast<const PageT*>(a.v_pages);
  const int32_t* table = a.block_table + b * s.max_pages;
  // Each thread copies one 16-byte chunk column of kRowsPerThread rows of every tile. Key positions fit in int32
  // (the handler checks the capacity); the page of a row is a shift when the page size is a power of two.
  constexpr int kRowStep = Tr::kThreads / Tr::kLoadChunks, kRowsPerThread = kKeys / kRowStep;
  constexpr int kChunkElems = 16 / Tr::kPageElemBytes;
  const int my_chunk = tid % Tr::kLoadChunks, my_row = tid / Tr::kLoadChunks;
  const int32_t lo32 = static_cast<int32_t>(lo), hi32 = static_cast<int32_t>(hi);
  const int32_t page_size = static_cast<int32_t>(s.page_size), page_mask = page_size - 1;
  const int32_t max_page = static_cast<int32_t>(s.num_pages - 1);
  auto slot_of = [&](int32_t key) { return a.page_shift >= 0 ? key >> a.page_shift : key / page_size; };
  auto row_of = [&](int32_t key) { return a.page_shift >= 0 ? key & page_mask : key % page_size; };
  // The page ids of this thread's rows of the next tile to load, read one tile ahead so that the table's latency
  // hides behind a tile of compute.
  int32_t next_pages[kRowsPerThread];
  auto fetch_pages = [&](int tile) {
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int32_t key = lo32 + tile * kKeys + my_row + j * kRowStep;
      next_pages[j] = key < hi32 ? __ldg(table + slot_of(key)) : 0;
    }
  };
  // Issues the cp.async loads of key tile `tile` (pages from fetch_pages(tile)) into ring stage `stage`; rows past
  // hi are zero-filled, never read.
  // kFp8: rows stay unswizzled in the stage (each thread converts the chunks it copied), and the first chunk's
  // thread also copies the row's K and V scales.
  auto load_tile = [&](int tile, int stage) {
    unsigned char* stage_base =
        kFp8 ? ring8 + stage * Tr::kStageBytes : reinterpret_cast<unsigned char*>(ring + 2 * stage * Tr::kTileElems);
    PageT* sK = reinterpret_cast<PageT*>(stage_base);
    PageT* sV = sK + Tr::kTileElems;
#pragma unroll
    for (int j = 0; j < kRowsPerThread; ++j) {
      const int r = my_row + j * kRowStep;
      const int32_t key = lo32 + tile * kKeys + r;
      const bool valid = key < hi32;
      const int32_t page = min(max(next_pages[j], 0), max_page);
      const int64_t off = s.PageOffset(page, valid ? row_of(key) : 0, kvh) + my_chunk * kChunkElems;
      if constexpr (kFp8) {
        CpAsync16(sK + r * kHeadDim + my_chunk * 16, k_pages + off, valid);
        CpAsync16(sV + r * kHeadDim + my_chunk * 16, v_pages + off, valid);
        if (my_chunk == 0) {
          float* scales = reinterpret_cast<float*>(sV + Tr::kTileElems);  // [kKeys] K scales, then V scales
          const int64_t at = int64_t{page} * s.num_kv_heads + kvh;
          CpAsync4(scales + r, a.k_scales + at, valid);
          CpAsync4(scales + kKeys + r, a.v_scales + at, valid);
        }
      } else {
        CpAsync16(sK + Swz<kPitch, kKeyPanel>(r, my_chunk), k_pages + off, valid);
        CpAsync16(sV + Swz<kPitch, kKeyPanel>(r, my_chunk), v_pages + off, valid);
      }
    }
  };
  // kFp8: dequantises this thread's chunks of the tile in ring stage `stage` (every scale of the stage visible)
  // into the converted K/V pair: 16 bytes -> two swizzled 16-byte T chunks, each value times its row's scale.
  auto convert_tile = [&](int stage) {
    if constexpr (kFp8) {
      const uint8_t* sK8 = ring8 + stage * Tr::kStageBytes;
      const uint8_t* sV8 = sK8 + Tr::kTileElems;
      const float* scales = reinterpret_cast<const float*>(sV8 + Tr::kTileElems);
#pragma unroll
      for (int j = 0; j < kRowsPerThread; ++j) {
        const int r = my_row + j * kRowStep;
#pragma unroll
        for (int kv = 0; kv < 2; ++kv) {
          const uint4 raw = *reinterpret_cast<const uint4*>((kv ? sV8 : sK8) + r * kHeadDim + my_chunk * 16);
          const float scale = scales[kv * kKeys + r];
          const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
          uint32_t packed[8];
#pragma unroll
          for (int w = 0; w < 4; ++w) {
#pragma unroll
            for (int half_word = 0; half_word < 2; ++half_word) {
              const __nv_fp8x2_storage_t pair = static_cast<__nv_fp8x2_storage_t>(words[w] >> (16 * half_word));
              const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
              packed[2 * w + half_word] = Mma<T>::Pack(f.x * scale, f.y * scale);
            }
          }
          T* dst = converted + kv * Tr::kTileElems;
          *reinterpret_cast<uint4*>(dst + Swz<kHeadDim, 0>(r, 2 * my_chunk)) =
              make_uint4(packed[0], packed[1], packed[2], packed[3]);
          *reinterpret_cast<uint4*>(dst + Swz<kHeadDim, 0>(r, 2 * my_chunk + 1)) =
              make_uint4(packed[4], packed[5], packed[6], packed[7]);
        }
      }
    }
  };
  // TMA path: thread 0 reads the page ids of the next tile's boxes (one per page, or one per 64 rows of a larger
  // page) a tile ahead, and issues a tile as one mbarrier transaction; boxes past hi are not loaded.
  const int box_rows = min(page_size, kKeys), boxes = kKeys / box_rows;
  int32_t next_box_pages[kTma ? Tr::kMaxBoxes : 1];
  auto fetch_box_pages = [&](int tile) {
#pragma unroll
    for (int j = 0; j < (kTma ? Tr::kMaxBoxes : 1); ++j) {
      const int32_t key = lo32 + tile * kKeys + j * box_rows;
      next_box_pages[j] = j < boxes && key < hi32 ? __ldg(table + slot_of(key)) : 0;
    }
  };
  auto load_tile_tma = [&](int tile, int stage) {
    T* sK = ring + 2 * stage * Tr::kTileElems;
    T* sV = sK + Tr::kTileElems;
    const int32_t key0 = lo32 + tile * kKeys;
    const int valid_boxes = min(boxes, (hi32 - key0 + box_rows - 1) / box_rows);
    MbarArriveExpectTx(full + stage, static_cast<uint32_t>(valid_boxes * box_rows * kHeadDim * 2 * 2));
#pragma unroll
    for (int j = 0; j < (kTma ? Tr::kMaxBoxes : 1); ++j) {
      if (j < valid_boxes) {
        const int page = min(max(next_box_pages[j], 0), max_page);
        const int row = row_of(key0 + j * box_rows);
#pragma unroll
        for (int p = 0; p < Tr::kPanels; ++p) {
          const int dst = (p * kKeys + j * box_rows) * 64;
          TmaLoad4d(sK + dst, &maps.k, full + stage, p * 64, static_cast<int>(kvh), row, page);
          TmaLoad4d(sV + dst, &maps.v, full + stage, p * 64, static_cast<int>(kvh), row, page);
        }
      }
    }
  };

  float acc_o[Tr::kDT][4];
#pragma unroll
  for (int i = 0; i < Tr::kDT; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  if (n_tiles > 0) {
    // Q rows (zero past the packed rows), with tile 0 in the first cp.async group.
    const T* q = static_cast<const T*>(a.q);
    for (int idx = tid; idx < Tr::kRows * Tr::kChunks; idx += Tr::kThreads) {
      const int r = idx / Tr::kChunks, c = idx % Tr::kChunks;
      const int64_t pr = rb * Tr::kRows + r;
      const bool valid = pr < packed_rows;
      const int64_t t = valid ? pr / group : 0, g = valid ? pr % group : 0;
      CpAsync16(sQ + Swz<kPitch, kQPanel>(r, c),
                q + ((b * s.tokens + t) * s.num_q_heads + kvh * group + g) * kHeadDim + c * 8, valid);
    }
    if constexpr (kTma) {
      if (tid == 0) {
        sm90::PrefetchTensorMap(&maps.k);
        sm90::PrefetchTensorMap(&maps.v);
#pragma unroll
        for (int st = 0; st < kStages; ++st) MbarInit(full + st, 1);
        FenceBarrierInit();
      }
      __syncthreads();  // the barriers are initialised before anyone waits on them
      if (tid == 0) {
#pragma unroll
        for (int st = 0; st < kStages - 1; ++st) {
          if (st < n_tiles) {
            fetch_box_pages(st);
            load_tile_tma(st, st);
          }
        }
        fetch_box_pages(kStages - 1);
      }
      CpAsyncCommit();
      CpAsyncWait<0>();  // Q (the loop's first barrier publishes it)
    } else {
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st) {
        if (st < n_tiles) {
          fetch_pages(st);
          load_tile(st, st);
        }
        CpAsyncCommit();
      }
      fetch_pages(kStages - 1);
    }

    uint32_t q_frag[Tr::kQInRegs ? Tr::kKS : 1][4];
    const bool capped = a.softcap > 0.f;
    const float scale_log2 = a.scale * kLog2e;
    for (int tile = 0; tile < n_tiles; ++tile) {
      const int stage = tile % kStages;
      if constexpr (kTma) {
        __syncthreads();  // every warp is done with the stage the next load overwrites
        if (tid == 0 && tile + kStages - 1 < n_tiles) {
          load_tile_tma(tile + kStages - 1, (tile + kStages - 1) % kStages);
          fetch_box_pages(tile + kStages);
        }
        MbarWait(full + stage, (tile / kStages) & 1);
        const int32_t rows_left = hi32 - (lo32 + tile * kKeys);
        if (rows_left < kKeys) {  // the last tile: V rows past hi hold another page's rows or nothing; zero them
          T* sV = ring + (2 * stage + 1) * Tr::kTileElems;
          const int zero_rows = kKeys - rows_left;
          for (int i = tid; i < zero_rows * Tr::kChunks; i += Tr::kThreads) {
            const int r = rows_left + i / Tr::kChunks, c = i % Tr::kChunks;
            *reinterpret_cast<uint4*>(sV + Swz<kPitch, kKeyPanel>(r, c)) = make_uint4(0, 0, 0, 0);
          }
          __syncthreads();
        }
      } else {
        CpAsyncWait<kStages - 2>();
        __syncthreads();  // tile `tile` visible; every warp is done with the stage the next load overwrites
        if (tile + kStages - 1 < n_tiles) {
          load_tile(tile + kStages - 1, (tile + kStages - 1) % kStages);
          fetch_pages(tile + kStages);
        }
        CpAsyncCommit();
        if constexpr (kFp8) {  // (the barrier above also means no warp still reads the previous converted tile)
          convert_tile(stage);
          __syncthreads();  // the converted tile is visible
        }
      }
      if constexpr (Tr::kQInRegs) {
        if (tile == 0) {
#pragma unroll
          for (int ks = 0; ks < Tr::kKS; ++ks)
            LdMatrixX4(q_frag[ks], sQ + Swz<kPitch, kQPanel>(lane & 15, ks * 2 + (lane >> 4)));
        }
      }
      const T* sK = (kFp8 ? converted : ring + 2 * stage * Tr::kTileElems) + warp * 16 * kPitch;
      const T* sV = sK + Tr::kTileElems;

      // S = Q K^T: the 16 packed rows x this warp's 16 keys of the tile.
      float sc[2][4] = {};
#pragma unroll
      for (int ks = 0; ks < Tr::kKS; ++ks) {
        uint32_t qa[4];
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) qa[i] = q_frag[ks][i];
        } else {
          LdMatrixX4(qa, sQ + Swz<kPitch, kQPanel>(lane & 15, ks * 2 + (lane >> 4)));
        }
        uint32_t bk[4];
        LdMatrixX4(bk, sK + Swz<kPitch, kKeyPanel>((lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
        Mma<T>::Run(sc[0], qa, bk[0], bk[1]);
        Mma<T>::Run(sc[1], qa, bk[2], bk[3]);
      }

      const int64_t s0 = lo + int64_t{tile} * kKeys + warp * 16;
      const bool masked = s0 + 16 > unmasked_end;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = sc[nt][e];
          x = capped ? a.softcap * tanhf(x * a.scale / a.softcap) * kLog2e : x * scale_log2;
          // a select after the softcap: a masked key's logit is -inf whatever its row held (the TMA path's rows
          // past hi are another page's or stale, possibly NaN)
          if (masked && s0 + nt * 8 + (lane & 3) * 2 + (e & 1) >= key_end[e >> 1]) x = -INFINITY;
          sc[nt][e] = x;
        }
      }
      float corr[2];
      OnlineSoftmaxStep(sc, row_max, row_sum, corr);
#pragma unroll
      for (int dt = 0; dt < Tr::kDT; ++dt) {
        acc_o[dt][0] *= corr[0];
        acc_o[dt][1] *= corr[0];
        acc_o[dt][2] *= corr[1];
        acc_o[dt][3] *= corr[1];
      }
      MmaAccTile<kPitch, kKeyPanel>(acc_o, sc, sV, lane);
    }
    if constexpr (!kTma) CpAsyncWait<0>();
  }
  __syncthreads();  // the ring is free: it holds the warps' states for the merge

  // Merge the 4 warps' (max, sum, O) per row through shared memory.
  float* s_max = reinterpret_cast<float*>(smem);
  float* s_sum = s_max + Tr::kWarps * Tr::kRows;
  float* s_acc = s_sum + Tr::kWarps * Tr::kRows;  // [warp][row][kMergePitch]
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = QuadSum(row_sum[i]);
    const int r = (lane >> 2) + 8 * i;
    if ((lane & 3) == 0) {
      s_max[warp * Tr::kRows + r] = row_max[i];
      s_sum[warp * Tr::kRows + r] = l;
    }
    float* dst = s_acc + (warp * Tr::kRows + r) * Tr::kMergePitch + (lane & 3) * 2;
#pragma unroll
    for (int dt = 0; dt < Tr::kDT; ++dt)
      *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(acc_o[dt][2 * i], acc_o[dt][2 * i + 1]);
  }
  __syncthreads();

  constexpr int kRowThreads = Tr::kThreads / Tr::kRows;  // 8 threads per output row, 4 columns each per step
  constexpr int kColSteps = kHeadDim / (4 * kRowThreads);
  const int r = tid / kRowThreads, col0 = (tid % kRowThreads) * 4;
  const int64_t pr = rb * Tr::kRows + r;
  const bool row_valid = pr < packed_rows;
  if (!row_valid && !a.merge_in_cluster) return;  // (a cluster merge needs every thread at its barriers)
  float top = -INFINITY;
#pragma unroll
  for (int w = 0; w < Tr::kWarps; ++w) top = fmaxf(top, s_max[w * Tr::kRows + r]);
  const float offset = top == -INFINITY ? 0.f : top;
  float weight[Tr::kWarps], total = 0.f;
#pragma unroll
  for (int w = 0; w < Tr::kWarps; ++w) {
    weight[w] = exp2f(s_max[w * Tr::kRows + r] - offset);
    total += weight[w] * s_sum[w * Tr::kRows + r];
  }
  const RowEnd end = EndRow(total);
  float4 v[kColSteps];
#pragma unroll
  for (int j = 0; j < kColSteps; ++j) {
    const int c = col0 + j * 4 * kRowThreads;
    float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < Tr::kWarps; ++w) {
      const float4 x = *reinterpret_cast<const float4*>(s_acc + (w * Tr::kRows + r) * Tr::kMergePitch + c);
      x4.x += weight[w] * x.x, x4.y += weight[w] * x.y, x4.z += weight[w] * x.z, x4.w += weight[w] * x.w;
    }
    v[j] = make_float4(end.Out(x4.x), end.Out(x4.y), end.Out(x4.z), end.Out(x4.w));
  }
  const int64_t t = pr / group, hq = kvh * group + pr % group;
  const int64_t row = (b * s.tokens + t) * s.num_q_heads + hq;  // [B, T, Hq] row index
  T* o = static_cast<T*>(a.o) + row * kHeadDim;
  auto store_o = [&](int j, float4 x) {
    *reinterpret_cast<uint2*>(o + col0 + j * 4 * kRowThreads) =
        make_uint2(Mma<T>::Pack(x.x, x.y), Mma<T>::Pack(x.z, x.w));
  };
  if (!a.merge_in_cluster) {
    const int64_t rows_total = s.batch * s.tokens * s.num_q_heads;
#pragma unroll
    for (int j = 0; j < kColSteps; ++j) {
      if (a.splits == 1)
        store_o(j, v[j]);
      else
        *reinterpret_cast<float4*>(a.o_parts + (split * rows_total + row) * kHeadDim + col0 + j * 4 * kRowThreads) =
            v[j];
    }
    if (a.splits > 1 && tid % kRowThreads == 0)
      a.lse_parts[split * rows_total + row] = end.empty ? -INFINITY : (top + log2f(total)) * kLn2;
    return;
  }

  // The cluster merge: every split pushes its rows' normalised O and log2-sum-exp into the leader's (split 0's)
  // shared memory, which merges them in split order as merge_by_lse does (empty splits weigh 0, NaN stays NaN).
  float* slot_o = reinterpret_cast<float*>(smem);                                 // [split][row][kSlotPitch]
  float* slot_lse = slot_o + kMaxKernelMergeSplits * Tr::kRows * Tr::kSlotPitch;  // [split][row]
  sm90::ClusterArrive();
  sm90::ClusterWait();  // every CTA of the cluster is done with its own shared memory
  const uint32_t leader_o = sm90::MapSharedRank(sm80::SmemAddr(slot_o), 0);
  const uint32_t leader_lse = sm90::MapSharedRank(sm80::SmemAddr(slot_lse), 0);
  const int slot_row = static_cast<int>(split) * Tr::kRows + r;
#pragma unroll
  for (int j = 0; j < kColSteps; ++j)
    sm90::StSharedClusterV4(leader_o + 4 * (slot_row * Tr::kSlotPitch + col0 + j * 4 * kRowThreads), v[j]);
  if (tid % kRowThreads == 0)
    sm90::StSharedClusterF32(leader_lse + 4 * slot_row, end.empty ? -INFINITY : top + log2f(total));
  sm90::ClusterArrive();
  sm90::ClusterWait();  // the leader holds every split's rows
  if (split != 0 || !row_valid) return;
  float best = -INFINITY;
  bool nan = false;
  for (int sp = 0; sp < a.splits; ++sp) {
    const float x = slot_lse[sp * Tr::kRows + r];
    nan = nan || x != x;
    best = fmaxf(best, x);
  }
  const float shift = best == -INFINITY ? 0.f : best;
  float split_weight[kMaxKernelMergeSplits];  // unrolled below, so the weights stay in registers
  float weights_total = 0.f;
#pragma unroll
  for (int sp = 0; sp < kMaxKernelMergeSplits; ++sp) {
    split_weight[sp] = sp < a.splits ? exp2f(slot_lse[sp * Tr::kRows + r] - shift) : 0.f;
    weights_total += split_weight[sp];
  }
  const float inv = nan ? NAN : weights_total == 0.f ? 0.f : 1.f / weights_total;
#pragma unroll
  for (int j = 0; j < kColSteps; ++j) {
    float4 x4 = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int sp = 0; sp < kMaxKernelMergeSplits; ++sp) {
      if (sp >= a.splits) break;
      const float w = split_weight[sp];
      const float4 x =
          *reinterpret_cast<const float4*>(slot_o + (sp * Tr::kRows + r) * Tr::kSlotPitch + col0 + j * 4 * kRowThreads);
      x4.x += w * x.x, x4.y += w * x.y, x4.z += w * x.z, x4.w += w * x.w;
    }
    store_o(j, make_float4(x4.x * inv, x4.y * inv, x4.z * inv, x4.w * inv));
  }
}

}  // namespace

cudaError_t LaunchAppend(cudaStream_t stream, const AppendArgs& args) {
  const Shape& s = args.shape;
  if (s.batch == 0) return cudaSuccess;
  if (s.quantized()) {
    switch (s.dtype) {
      case ffi::DataType::F16:
        return LaunchAppendFp8<__half>(stream, args);
      case ffi::DataType::BF16:
        return LaunchAppendFp8<__nv_bfloat16>(stream, args);
      case ffi::DataType::F32:
        return LaunchAppendFp8<float>(stream, args);
      default:
        return cudaErrorInvalidValue;
    }
  }
  const int64_t row_bytes = s.head_dim * args.elem_bytes;
  if (row_bytes % 16 == 0) return LaunchAppendVec<uint4>(stream, args);
  if (row_bytes % 4 == 0) return LaunchAppendVec<uint32_t>(stream, args);
  return LaunchAppendVec<uint16_t>(stream, args);
}

namespace {

// Whether this device runs the kernel's sm_90a machine code: a build without it would run the empty TMA and
// cluster primitives.
template <typename T, int kHeadDim, bool kTma, bool kFp8>
bool RunsSm90Code() {
  static const int binary_version =
      KernelBinaryVersion(reinterpret_cast<const void*>(&PagedDecodeKernel<T, kHeadDim, kTma, kFp8>));
  return binary_version == 90;
}

// Whether the TMA load path applies (page size a power of two >= kMinTmaPage, sm_90a code, maps the driver
// accepts); fills `maps` when it does.
template <typename T, int kHeadDim>
bool EncodePageMaps(const DecodeArgs& a, PageMaps& maps) {
  const Shape& s = a.shape;
  if (a.page_shift < 0 || s.page_size < kMinTmaPage || !RunsSm90Code<T, kHeadDim, true, false>()) return false;
  const int box_rows = static_cast<int>(std::min<int64_t>(s.page_size, DecodeTraits<kHeadDim>::kKeys));
  return sm90::EncodeMap<T>(&maps.k, a.k_pages, s.num_pages, s.page_size, s.num_kv_heads, kHeadDim, box_rows) &&
         sm90::EncodeMap<T>(&maps.v, a.v_pages, s.num_pages, s.page_size, s.num_kv_heads, kHeadDim, box_rows);
}

template <typename T, int kHeadDim, bool kTma, bool kFp8>
cudaError_t LaunchDecodeKernel(cudaStream_t stream, const DecodeArgs& args, const PageMaps& maps, dim3 grid) {
  using Tr = DecodeTraits<kHeadDim, kFp8>;
  // The largest carveout asked for, not left to the driver per launch: two CTAs per SM need ~200 KB.
  const cudaError_t attr =
      SetDynamicSmemOnce(reinterpret_cast<const void*>(&PagedDecodeKernel<T, kHeadDim, kTma, kFp8>), Tr::kSmemBytes,
                         /*max_shared_carveout=*/true);
  if (attr != cudaSuccess) return attr;
  if (!args.merge_in_cluster) {
    PagedDecodeKernel<T, kHeadDim, kTma, kFp8><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(args, maps);
    return cudaGetLastError();
  }
  if (args.splits < 2 || args.splits > kMaxKernelMergeSplits) return cudaErrorNotSupported;
  if (!RunsSm90Code<T, kHeadDim, kTma, kFp8>()) {  // no clusters here: the same o from one split per row block
    DecodeArgs one = args;
    one.splits = 1, one.merge_in_cluster = false;
    PagedDecodeKernel<T, kHeadDim, kTma, kFp8>
        <<<dim3(grid.x / args.splits, grid.y, grid.z), Tr::kThreads, Tr::kSmemBytes, stream>>>(one, maps);
    return cudaGetLastError();
  }
  const ClusterLaunch launch(grid, dim3(Tr::kThreads), Tr::kSmemBytes, stream, static_cast<unsigned>(args.splits));
  const cudaError_t err = cudaLaunchKernelEx(&launch.config, &PagedDecodeKernel<T, kHeadDim, kTma, kFp8>, args, maps);
  if (err != cudaSuccess) (void)cudaGetLastError();  // the error is returned, not left for the next launch to read
  return err != cudaSuccess ? err : cudaGetLastError();
}

}  // namespace

template <typename T, int kHeadDim, bool kFp8>
cudaError_t LaunchDecode(cudaStream_t stream, const DecodeArgs& args) {
  using Tr = DecodeTraits<kHeadDim, kFp8>;
  const Shape& s = args.shape;
  const int64_t rows = s.group() * s.tokens;
  if (s.batch == 0 || rows == 0) return cudaSuccess;
  const int64_t x_blocks = args.splits * ((rows + Tr::kRows - 1) / Tr::kRows);
  if (x_blocks > 0x7fffffff || s.num_kv_heads > 65535 || s.batch > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(x_blocks), static_cast<unsigned>(s.num_kv_heads),
                  static_cast<unsigned>(s.batch));
  PageMaps maps{};
  if constexpr (kFp8) {  // the TMA path reads pages of T
    if (args.load == DecodeLoad::kTma) return cudaErrorNotSupported;
    return LaunchDecodeKernel<T, kHeadDim, false, true>(stream, args, maps, grid);
  } else {
    const bool tma = args.load != DecodeLoad::kCpAsync && EncodePageMaps<T, kHeadDim>(args, maps);
    if (args.load == DecodeLoad::kTma && !tma) return cudaErrorNotSupported;
    return tma ? LaunchDecodeKernel<T, kHeadDim, true, false>(stream, args, maps, grid)
               : LaunchDecodeKernel<T, kHeadDim, false, false>(stream, args, maps, grid);
  }
}

#define JAX_OPS_INSTANTIATE_KV_DECODE(T, D)                                        \
  template cudaError_t LaunchDecode<T, D, false>(cudaStream_t, const DecodeArgs&); \
  template cudaError_t LaunchDecode<T, D, true>(cudaStream_t, const DecodeArgs&);
JAX_OPS_INSTANTIATE_KV_DECODE(__half, 64)
JAX_OPS_INSTANTIATE_KV_DECODE(__half, 128)
JAX_OPS_INSTANTIATE_KV_DECODE(__half, 256)
JAX_OPS_INSTANTIATE_KV_DECODE(__nv_bfloat16, 64)
JAX_OPS_INSTANTIATE_KV_DECODE(__nv_bfloat16, 128)
JAX_OPS_INSTANTIATE_KV_DECODE(__nv_bfloat16, 256)

}  // namespace jax_ops::kv_cache
