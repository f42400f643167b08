// The skinny (decode) GEMM kernel template, M <= 64 (fp8: 16): streams the weights b [K, N] (N contiguous; gated
// separate or packed too) once, at copy bandwidth, through mma.sync with fp32 accumulators: m16n8k16 for f16/bf16,
// m16n8k32 for fp8 (sm_89+). gemm_skinny.cu instantiates the 16-bit kernels, gemm_skinny_fp8.cu the fp8 ones.
//
// Layout. The product is computed transposed, out^T = b^T op(a)^T: each mma takes 16 weight columns as its rows and
// 8 rows of op(a) (tokens) as its columns. Lane (g, t) = (lane / 4, lane % 4) owns kLaneCols = 16 bytes of weight
// columns (8 at 16 bits, 16 at fp8) starting at column kLaneCols * g, so a warp owns 8 * kLaneCols columns. Per K
// chunk (16 deep at 16 bits, 32 at fp8) the lane loads its kRows rows kRows * t.. (4 or 8) with one 16-byte load each,
// and byte-permutes them into the A fragments of kLaneCols / 2 mmas: mma j's fragment rows g / g + 8 are columns
// kLaneCols * g + 2j / + 1, and the fragment's k positions of lane t are the lane's rows in order (the mma's k order
// is free as long as both operands agree). The B fragment is then kRows consecutive k of one token, one 8-byte load
// of op(a) (L1/L2-resident; staging it in shared memory would take M * K * 2 bytes per CTA).
//
// Work split. A CTA of 8 warps owns one warp's column tile; its warps split the K range (gated: 4 warps read the
// gate columns and 4 the same up columns). When the column tiles alone do not fill the GPU, a cluster of S CTAs
// (heuristics.h SkinnySplit) shares a tile's K range. Partial sums are reduced in a fixed order, so results are
// deterministic: the warps of a role reduce through shared memory as a fixed tree; with S > 1 each CTA then pushes
// every slice of its sum to the CTA that owns the slice (distributed shared memory, no workspace), and the owner
// adds the S slices in rank order and runs the epilogue (epilogue_cuda.cuh: gate and up of one column meet in one
// thread's registers).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "arch/sm80/mma.cuh"
#include "arch/sm90/cluster.cuh"
#include "arch/sm90/target.cuh"
#include "common/cuda_helpers.h"
#include "gemm/epilogue_cuda.cuh"
#include "gemm/heuristics.h"
#include "gemm/kernels.h"

namespace jax_ops::gemm::skinny {

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kSlots = kWarps / 2;     // partial tiles of the warps' tree reduction
constexpr unsigned kMaxGridY = 65535;  // batches per launch row; more loop inside the kernel

// The tiling of weights of TW (2 or 1 bytes).
template <typename TW>
struct Geometry {
  static constexpr int kBytes = sizeof(TW);
  static constexpr int kRows = 8 / kBytes;           // weight rows per lane and chunk (8 bytes of op(a) per token)
  static constexpr int kChunk = 4 * kRows;           // K per mma
  static constexpr int kLaneCols = 16 / kBytes;      // columns per lane: one 16-byte load per row
  static constexpr int kMmas = kLaneCols / 2;        // mmas per chunk and token tile
  static constexpr int kTileCols = 8 * kLaneCols;    // columns per warp and CTA
  static constexpr int kSlotStride = kTileCols + 4;  // floats per token row of a partial tile (padded)
  static constexpr int kRowQuads = kTileCols / 4;    // float4 groups per token row
};

// K chunks in flight per warp and CTAs per SM: as many as the register budget allows without spilling (128 registers
// a thread at 2 CTAs per SM).
template <typename TW, int kMT>
constexpr int kUnroll = sizeof(TW) == 2 ? (kMT == 2 || kMT == 8 ? 2 : 4) : 1;
template <typename TW, int kMT>
constexpr int kCtasPerSm = (sizeof(TW) == 2 ? kMT <= 2 : kMT == 1) ? 2 : 1;

template <typename TW, int kMT>
constexpr int SlotFloats() {
  return kMT * 8 * Geometry<TW>::kSlotStride;
}
template <typename TW, int kMT>
constexpr int TileQuads() {  // float4 groups of one role's tile
  return kMT * 8 * Geometry<TW>::kRowQuads;
}
// Shared memory: the kSlots partial tiles, then, where clusters can run, the slices pushed by each CTA (both roles).
template <typename TW, int kMT>
constexpr int SlotBytes() {
  return kSlots * SlotFloats<TW, kMT>() * 4;
}
template <typename TW, int kMT>
constexpr int RecvBytes() {
  return 2 * TileQuads<TW, kMT>() * 16;
}

struct Config {
  int split = 1;       // S: CTAs per cluster along K (gridDim.x = tiles * S)
  bool w_vec = false;  // b, b's up columns, ldb and the batch stride allow 16-byte loads
  bool a_vec = false;  // op(a) rows allow 8-byte loads (a not transposed, aligned rows)
};

// The bits of one element (zero-extended).
template <typename T>
__device__ __forceinline__ uint32_t LoadBits(const T* src) {
  if constexpr (sizeof(T) == 2)
    return __ldg(reinterpret_cast<const unsigned short*>(src));
  else
    return __ldg(reinterpret_cast<const unsigned char*>(src));
}

// Consecutive elements packed little-endian into kWords words, `valid` of them loaded (the rest zero).
template <typename T, int kWords>
__device__ __forceinline__ void LoadPacked(const T* src, int valid, uint32_t (&w)[kWords]) {
  constexpr int kPerWord = 4 / sizeof(T);
#pragma unroll
  for (int i = 0; i < kWords; ++i) w[i] = 0u;
#pragma unroll
  for (int i = 0; i < kWords * kPerWord; ++i) {
    if (i >= valid) break;
    w[i / kPerWord] |= LoadBits(src + i) << (8 * sizeof(T) * (i % kPerWord));
  }
}

// One lane's 16 bytes of a weight row (`valid` columns in range); vec: one 16-byte load.
template <typename TW>
__device__ __forceinline__ uint4 LoadWeights(const TW* src, int valid, bool vec) {
  uint4 v;
  if (vec) {  // streamed once: keep it out of L1, which holds op(a)
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(src));
    return v;
  }
  uint32_t w[4];
  LoadPacked<TW, 4>(src, valid, w);
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// op(a)[tok][k..k + kRows - 1] as two packed words (zeros outside M x K).
template <typename TX>
__device__ __forceinline__ uint2 LoadTokens(const KernelArgs& p, const TX* a, int64_t tok, int64_t k, bool vec) {
  constexpr int kRows = Geometry<TX>::kRows, kPerWord = 4 / sizeof(TX);
  if (tok >= p.m || k >= p.k) return make_uint2(0u, 0u);
  if (vec) return __ldg(reinterpret_cast<const uint2*>(a + tok * p.lda + k));
  uint32_t w[2] = {0u, 0u};
  if (!p.transpose_a) {
    LoadPacked<TX, 2>(a + tok * p.lda + k, static_cast<int>(std::min<int64_t>(p.k - k, kRows)), w);
  } else {  // a [K, M]: the k run is strided
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (k + i >= p.k) break;
      w[i / kPerWord] |= LoadBits(a + (k + i) * p.lda + tok) << (8 * sizeof(TX) * (i % kPerWord));
    }
  }
  return make_uint2(w[0], w[1]);
}

// Word j of a 16-byte load; j is a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t Word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// The A fragment of mma j from the lane's kRows weight rows (row r: fragment k position r of this lane).
template <typename TW>
__device__ __forceinline__ void WeightFragment(const uint4 (&w)[Geometry<TW>::kRows], int j, uint32_t (&f)[4]) {
  if constexpr (sizeof(TW) == 2) {
    // Word j holds columns 2j (low half: fragment row g) and 2j + 1 (high half: row g + 8) of rows 0..3.
    const uint32_t w0 = Word(w[0], j), w1 = Word(w[1], j), w2 = Word(w[2], j), w3 = Word(w[3], j);
    f[0] = __byte_perm(w0, w1, 0x5410);
    f[1] = __byte_perm(w0, w1, 0x7632);
    f[2] = __byte_perm(w2, w3, 0x5410);
    f[3] = __byte_perm(w2, w3, 0x7632);
  } else {
    // Columns 2j, 2j + 1 are bytes (2j % 4, + 1) of word j / 2 in each of rows 0..7: interleave row pairs, then
    // gather rows 0..3 (k positions 4t..4t + 3) and 4..7 (4t + 16..4t + 19) of each column into one word.
    const int wi = j / 2;
    const uint32_t sel = j % 2 ? 0x7362 : 0x5140;
    const uint32_t p01 = __byte_perm(Word(w[0], wi), Word(w[1], wi), sel);
    const uint32_t p23 = __byte_perm(Word(w[2], wi), Word(w[3], wi), sel);
    const uint32_t p45 = __byte_perm(Word(w[4], wi), Word(w[5], wi), sel);
    const uint32_t p67 = __byte_perm(Word(w[6], wi), Word(w[7], wi), sel);
    f[0] = __byte_perm(p01, p23, 0x5410);
    f[1] = __byte_perm(p01, p23, 0x7632);
    f[2] = __byte_perm(p45, p67, 0x5410);
    f[3] = __byte_perm(p45, p67, 0x7632);
  }
}

// d += a (16 weight columns x chunk) * b (chunk x 8 tokens): weights of TW, tokens of TX.
#define JAX_OPS_GEMM_MMA_FP8(ATYPE, BTYPE)                                    \
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." ATYPE "." BTYPE       \
               ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])               \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1))
template <typename TW, typename TX>
__device__ __forceinline__ void MmaStep(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (sizeof(TW) == 2) {
    sm80::Mma<TW>::Run(d, a, b0, b1);
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    constexpr bool kWe4 = std::is_same_v<TW, __nv_fp8_e4m3>, kXe4 = std::is_same_v<TX, __nv_fp8_e4m3>;
    if constexpr (kWe4 && kXe4)
      JAX_OPS_GEMM_MMA_FP8("e4m3", "e4m3");
    else if constexpr (kWe4)
      JAX_OPS_GEMM_MMA_FP8("e4m3", "e5m2");
    else if constexpr (kXe4)
      JAX_OPS_GEMM_MMA_FP8("e5m2", "e4m3");
    else
      JAX_OPS_GEMM_MMA_FP8("e5m2", "e5m2");
#else
    __trap();  // the host launches fp8 kernels only for sm_89+ machine code
#endif
  }
}
#undef JAX_OPS_GEMM_MMA_FP8

// A warp's partial tile in a slot ([token][column], kSlotStride floats a row): accumulator i of mma (j, mt) is column
// kLaneCols * g + 2j + i / 2, token mt * 8 + 2t + i % 2. SlotAdd adds a slot back into the accumulators (same map).
template <typename TW, int kMT>
__device__ __forceinline__ void SlotStore(const float (&acc)[Geometry<TW>::kMmas][kMT][4], float* slot, int g, int t) {
  using G = Geometry<TW>;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      float* row = slot + (mt * 8 + 2 * t + par) * G::kSlotStride + G::kLaneCols * g;
#pragma unroll
      for (int jj = 0; jj < G::kMmas / 2; ++jj)
        *reinterpret_cast<float4*>(row + 4 * jj) = make_float4(acc[2 * jj][mt][par], acc[2 * jj][mt][par + 2],
                                                               acc[2 * jj + 1][mt][par], acc[2 * jj + 1][mt][par + 2]);
    }
}
template <typename TW, int kMT>
__device__ __forceinline__ void SlotAdd(float (&acc)[Geometry<TW>::kMmas][kMT][4], const float* slot, int g, int t) {
  using G = Geometry<TW>;
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      const float* row = slot + (mt * 8 + 2 * t + par) * G::kSlotStride + G::kLaneCols * g;
#pragma unroll
      for (int jj = 0; jj < G::kMmas / 2; ++jj) {
        const float4 v = *reinterpret_cast<const float4*>(row + 4 * jj);
        acc[2 * jj][mt][par] += v.x;
        acc[2 * jj][mt][par + 2] += v.y;
        acc[2 * jj + 1][mt][par] += v.z;
        acc[2 * jj + 1][mt][par + 2] += v.w;
      }
    }
}

// TW: the weights' (b's) element type, TX: op(a)'s, TO: the output's; kMT token tiles of 8 rows.
template <typename TW, typename TX, typename TO, int kMT>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<TW, kMT>) SkinnyKernel(const KernelArgs p, const Config cfg) {
  using G = Geometry<TW>;
  static_assert(sizeof(TW) == sizeof(TX), "weights and tokens share the mma's operand width");
  constexpr int kU = kUnroll<TW, kMT>, kSlotFloats = SlotFloats<TW, kMT>(), kQuads = TileQuads<TW, kMT>();
  extern __shared__ float4 smem_quads[];
  float* slots = reinterpret_cast<float*>(smem_quads);
  float4* recv = smem_quads + kSlots * kSlotFloats / 4;  // only with split > 1
#if !JAX_OPS_SM90
  if (cfg.split > 1) __trap();  // the host launches clusters only for sm_90a machine code
#endif
  const int split = cfg.split, rank = static_cast<int>(blockIdx.x % split);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / split) * G::kTileCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool gated = p.gated != Gated::kNone;
  const int roles = gated ? 2 : 1, warps_per_role = kWarps / roles;
  const int role = warp / warps_per_role, kgroup = warp % warps_per_role;
  const int64_t col = n0 + G::kLaneCols * g;  // this lane's first weight column
  const int valid = static_cast<int>(std::min<int64_t>(std::max<int64_t>(p.n - col, 0), G::kLaneCols));
  const bool w_vec = cfg.w_vec && valid == G::kLaneCols;
  // This warp's chunks: the cluster's K groups (S CTAs x warps_per_role) split the chunks evenly, in rank order.
  const int64_t chunks = (p.k + G::kChunk - 1) / G::kChunk, groups = int64_t{split} * warps_per_role;
  const int64_t group = int64_t{rank} * warps_per_role + kgroup;
  const int64_t c_begin = chunks * group / groups, c_end = chunks * (group + 1) / groups;
  const TW* w_all = static_cast<const TW*>(role == 1 && p.gated == Gated::kSeparate ? p.b_up : p.b) +
                    (role == 1 && p.gated == Gated::kPacked ? p.up_offset : 0) + col;

  for (int64_t bz = blockIdx.y; bz < p.batch; bz += gridDim.y) {
    // Peers may still read last round's slices out of this CTA's receive buffer; and (first round) a peer's shared
    // memory must exist before it is written: arrive now, wait before pushing.
    if (split > 1) sm90::ClusterArrive();
    const TW* w = w_all + bz * p.b_batch_stride;
    const TX* a = static_cast<const TX*>(p.a) + bz * p.a_batch_stride;
    float acc[G::kMmas][kMT][4];
#pragma unroll
    for (int j = 0; j < G::kMmas; ++j)
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][mt][i] = 0.f;

    for (int64_t c = c_begin; c < c_end; c += kU) {
      uint4 wr[kU][G::kRows];
      uint2 xr[kU][kMT];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (c + u >= c_end) break;
        const int64_t k = (c + u) * G::kChunk + G::kRows * t;
#pragma unroll
        for (int r = 0; r < G::kRows; ++r)
          wr[u][r] = k + r < p.k ? LoadWeights(w + (k + r) * p.ldb, valid, w_vec) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) xr[u][mt] = LoadTokens(p, a, mt * 8 + g, k, cfg.a_vec);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        if (c + u >= c_end) break;
#pragma unroll
        for (int j = 0; j < G::kMmas; ++j) {
          uint32_t frag[4];
          WeightFragment<TW>(wr[u], j, frag);
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) MmaStep<TW, TX>(acc[j][mt], frag, xr[u][mt].x, xr[u][mt].y);
        }
      }
    }

    // The CTA's sum over the warps of each role, as a fixed tree (deterministic): in round `half`, warps
    // [half, 2 half) of the role store their partial to a slot, warps [0, half) add it. The role's total ends in
    // its first slot.
    const int slots_per_role = warps_per_role / 2;
    float* role_slots = slots + role * slots_per_role * kSlotFloats;
    for (int half = slots_per_role; half >= 1; half /= 2) {
      if (kgroup >= half && kgroup < 2 * half)
        SlotStore<TW, kMT>(acc, role_slots + (kgroup - half) * kSlotFloats, g, t);
      __syncthreads();
      if (kgroup < half) SlotAdd<TW, kMT>(acc, role_slots + kgroup * kSlotFloats, g, t);
      __syncthreads();
    }
    if (kgroup == 0) SlotStore<TW, kMT>(acc, role_slots, g, t);
    __syncthreads();
    // Float4 group q of role r's CTA total: token q / kRowQuads, columns 4 (q % kRowQuads)...
    auto cta_sum = [&](int r, int q) {
      return *reinterpret_cast<const float4*>(slots + r * slots_per_role * kSlotFloats +
                                              (q / G::kRowQuads) * G::kSlotStride + (q % G::kRowQuads) * 4);
    };
    auto epilogue = [&](int q, const float4& s0, const float4& s1) {
      const int64_t m = q / G::kRowQuads, n = n0 + (q % G::kRowQuads) * 4;
      if (m >= p.m) return;
      const float v0[4] = {s0.x, s0.y, s0.z, s0.w}, v1[4] = {s1.x, s1.y, s1.z, s1.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (n + i >= p.n) break;
        if (gated)
          StoreGated<TO, float>(p, bz, m, n + i, v0[i], v1[i]);
        else
          StorePlain<TO, float>(p, bz, m, n + i, v0[i]);
      }
    };
    if (split == 1) {
      for (int q = threadIdx.x; q < kQuads; q += kThreads) epilogue(q, cta_sum(0, q), gated ? cta_sum(1, q) : float4{});
    } else {
      // Slice o (quads [o * per, (o + 1) * per)) belongs to CTA o; this CTA's part of it goes to its slot `rank`
      // there. Every peer has arrived at the top of this round (so it runs and no longer reads the last round's
      // slices).
      const int per = kQuads / split;
      sm90::ClusterWait();
      for (int q = threadIdx.x; q < kQuads; q += kThreads) {
        const int owner = q / per, l = q % per;
        for (int r = 0; r < roles; ++r) {
          const uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(recv + (rank * 2 + r) * per + l));
          sm90::StSharedClusterV4(sm90::MapSharedRank(local, owner), cta_sum(r, q));
        }
      }
      sm90::ClusterArrive();
      sm90::ClusterWait();
      for (int l = threadIdx.x; l < per; l += kThreads) {
        float4 s[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
        for (int src = 0; src < split; ++src)
          for (int r = 0; r < roles; ++r) {
            const float4 v = recv[(src * 2 + r) * per + l];
            s[r].x += v.x, s[r].y += v.y, s[r].z += v.z, s[r].w += v.w;
          }
        epilogue(rank * per + l, s[0], s[1]);
      }
    }
    __syncthreads();  // the slots are rewritten next round
  }
}

// Per device and instantiation: the dynamic shared memory (the slots, plus the receive buffer where clusters can
// run: sm_90a machine code on an sm_90 device), resident CTAs per SM, and the CTAs resident at once per cluster size.
// Asked once (thread-safe). ctas_per_sm == 0: the kernel cannot run here (too little shared memory, or machine code
// older than min_binary: fp8 mma needs sm_89).
struct Fit {
  int smem_bytes = 0;
  int ctas_per_sm = 0;
  int64_t resident_ctas[kSkinnySplitSizes] = {};  // [i]: in clusters of 2^i CTAs (0: that size cannot run)
};

template <typename TW, int kMT, typename Kernel>
Fit QueryFit(Kernel kernel, int num_sms) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, Fit> cache;
  int dev = 0, cc_major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return {};
  const auto key = std::make_pair(dev, reinterpret_cast<const void*>(kernel));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  Fit fit;
  const int binary_version = KernelBinaryVersion(reinterpret_cast<const void*>(kernel));
  if (binary_version == 0) return {};
  const int min_binary = sizeof(TW) == 1 ? 89 : 80;
  const bool clusters = binary_version >= 90 && cc_major >= 9;
  fit.smem_bytes = SlotBytes<TW, kMT>() + (clusters ? RecvBytes<TW, kMT>() : 0);
  if (binary_version < min_binary ||
      SetDynamicSmemOnce(reinterpret_cast<const void*>(kernel), fit.smem_bytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit.ctas_per_sm, kernel, kThreads, fit.smem_bytes) !=
          cudaSuccess) {
    cudaGetLastError();
    fit.ctas_per_sm = 0;
  }
  fit.resident_ctas[0] = int64_t{fit.ctas_per_sm} * std::max(num_sms, 1);
  for (int i = 1, s = 2; clusters && fit.ctas_per_sm > 0 && s <= kSkinnyMaxSplit; ++i, s *= 2) {
    const ClusterLaunch launch(dim3(s * 64), dim3(kThreads), fit.smem_bytes, nullptr, s);
    int active = 0;
    if (cudaOccupancyMaxActiveClusters(&active, kernel, &launch.config) != cudaSuccess) {
      cudaGetLastError();
      break;
    }
    if (active == 0) break;
    fit.resident_ctas[i] = int64_t{active} * s;
  }
  cache.emplace(key, fit);
  return fit;
}

inline bool Aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

// Launches one instantiation: split 0 takes heuristics.h's SkinnySplit, else that split (cudaErrorNotSupported
// where it does not fit). cudaErrorNotSupported before launching anything when the kernel cannot run here.
template <typename TW, typename TX, typename TO, int kMT>
cudaError_t Launch(const KernelArgs& p, int num_sms, int forced_split, cudaStream_t stream, int* used_split) {
  using G = Geometry<TW>;
  const auto kernel = SkinnyKernel<TW, TX, TO, kMT>;
  const Fit fit = QueryFit<TW, kMT>(kernel, num_sms);
  if (fit.ctas_per_sm == 0) return cudaErrorNotSupported;
  const int64_t tiles = (p.n + G::kTileCols - 1) / G::kTileCols, rows = std::min<int64_t>(p.batch, kMaxGridY);
  const int warps_per_split = p.gated != Gated::kNone ? kWarps / 2 : kWarps;
  Config cfg;
  if (forced_split > 0) {
    int i = 0;
    while (i < kSkinnySplitSizes && (1 << i) < forced_split) ++i;
    if (i == kSkinnySplitSizes || (1 << i) != forced_split || fit.resident_ctas[i] == 0) return cudaErrorNotSupported;
    cfg.split = forced_split;
  } else {
    cfg.split = SkinnySplit(tiles * rows, (p.k + G::kChunk - 1) / G::kChunk, warps_per_split, fit.resident_ctas);
  }
  if (used_split) *used_split = cfg.split;
  if (tiles * cfg.split > 0x7fffffff) return cudaErrorInvalidValue;
  const void* up = p.gated == Gated::kSeparate ? p.b_up : p.b;
  cfg.w_vec = Aligned(p.b, 16) && Aligned(up, 16) && p.ldb % G::kLaneCols == 0 && p.up_offset % G::kLaneCols == 0 &&
              p.b_batch_stride % G::kLaneCols == 0;
  cfg.a_vec = !p.transpose_a && Aligned(p.a, 8) && p.lda % G::kRows == 0 && p.a_batch_stride % G::kRows == 0;
  const dim3 grid(static_cast<unsigned>(tiles * cfg.split), static_cast<unsigned>(rows));
  if (cfg.split == 1) {
    kernel<<<grid, kThreads, fit.smem_bytes, stream>>>(p, cfg);
    return cudaGetLastError();
  }
  const ClusterLaunch launch(grid, dim3(kThreads), fit.smem_bytes, stream, static_cast<unsigned>(cfg.split));
  const cudaError_t err = cudaLaunchKernelEx(&launch.config, kernel, p, cfg);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// The output dtype (f16, bf16 or f32; 16-bit inputs: their own or f32) and the smallest token-tile count holding M
// (at most kMaxTiles tiles of 8 rows).
template <typename TW, typename TX, int kMaxTiles>
cudaError_t LaunchFor(const KernelArgs& p, int num_sms, int split, cudaStream_t stream, int* used_split) {
  auto for_out = [&](auto out_tag) -> cudaError_t {
    using TO = typename decltype(out_tag)::type;
    if (p.m <= 8) return Launch<TW, TX, TO, 1>(p, num_sms, split, stream, used_split);
    if (p.m <= 16) return Launch<TW, TX, TO, 2>(p, num_sms, split, stream, used_split);
    if constexpr (kMaxTiles >= 8) {
      if (p.m <= 32) return Launch<TW, TX, TO, 4>(p, num_sms, split, stream, used_split);
      return Launch<TW, TX, TO, 8>(p, num_sms, split, stream, used_split);
    }
    return cudaErrorNotSupported;
  };
  switch (p.out_dtype) {
    case ffi::DataType::F32:
      return for_out(TypeTag<float>{});
    case ffi::DataType::F16:
      if constexpr (!std::is_same_v<TW, __nv_bfloat16>) return for_out(TypeTag<__half>{});
      return cudaErrorNotSupported;
    case ffi::DataType::BF16:
      if constexpr (!std::is_same_v<TW, __half>) return for_out(TypeTag<__nv_bfloat16>{});
      return cudaErrorNotSupported;
    default:
      return cudaErrorNotSupported;
  }
}

// The fp8 kernels (gemm_skinny_fp8.cu).
cudaError_t LaunchFp8(const KernelArgs& p, int num_sms, int split, cudaStream_t stream, int* used_split);

}  // namespace jax_ops::gemm::skinny
