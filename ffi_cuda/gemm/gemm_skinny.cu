// The skinny (decode) GEMM, M <= 64: streams the weights b [K, N] (N contiguous; gated separate or packed too) once,
// at copy bandwidth, through 16-bit mma.sync with fp32 accumulators.
//
// Layout. The product is computed transposed, out^T = b^T op(a)^T: each m16n8k16 mma takes 16 weight columns as its
// rows and 8 rows of op(a) (tokens) as its columns. A warp owns 64 weight columns: lane (g, t) = (lane / 4, lane % 4)
// loads, per 16-deep K chunk, rows 4t..4t+3 of columns 8g..8g+7 with four 16-byte loads, and byte-permutes them into
// the A fragments of 4 mmas (mma j: rows g / g + 8 are columns 8g + 2j / 8g + 2j + 1; the fragment's k positions
// 2t, 2t + 1, 2t + 8, 2t + 9 are the chunk's rows 4t..4t + 3). The B fragment is then 4 consecutive k of one token, an
// 8-byte load of op(a) (L1/L2-resident; staging it in shared memory would take M * K * 2 bytes per CTA).
//
// Work split. A CTA of 8 warps owns a 64-column tile; its warps split the K range (gated: 4 warps read the gate
// columns and 4 the same up columns). When the column tiles alone do not fill the GPU, a cluster of S CTAs
// (heuristics.h SkinnySplit) shares a tile's K range. Partial sums are reduced in a fixed order, so results are
// deterministic: each warp stores its fp32 partial tile to shared memory, the warps' partials are summed in warp
// order; with S > 1 each CTA then pushes every slice of its sum to the CTA that owns the slice (distributed shared
// memory, no workspace), and the owner adds the S slices in rank order and runs the epilogue (epilogue_cuda.cuh:
// gate and up of one column meet in one thread's registers).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>

#include "arch/sm80/mma.cuh"
#include "arch/sm90/cluster.cuh"
#include "arch/sm90/target.cuh"
#include "common/cuda_helpers.h"
#include "gemm/epilogue_cuda.cuh"
#include "gemm/heuristics.h"
#include "gemm/kernels.h"
#include "gemm/skinny.h"

namespace jax_ops::gemm {
namespace {

using sm80::Mma;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kTileCols = 64;               // weight columns per CTA (8 lane groups x 8 columns)
constexpr int kChunk = 16;                  // K per mma step
constexpr int kSlotStride = kTileCols + 4;  // floats per token row of a warp's partial (padded against conflicts)
constexpr unsigned kMaxGridY = 65535;       // batches per launch row; more loop inside the kernel
// K chunks in flight per warp: as many as the register budget allows (128 a thread at 2 CTAs per SM for M <= 16).
constexpr int kUnrollFor(int mt) { return mt == 2 || mt == 8 ? 2 : 4; }

// Shared memory: kSlots partial tiles (the warps' tree reduction), then, where clusters can run, the slices pushed by
// each CTA of the cluster (both roles).
constexpr int kSlots = kWarps / 2;
constexpr int SlotFloats(int mt) { return mt * 8 * kSlotStride; }
constexpr int TileQuads(int mt) { return mt * 8 * kTileCols / 4; }  // float4 groups of one role's tile
constexpr int SlotBytes(int mt) { return kSlots * SlotFloats(mt) * 4; }
constexpr int RecvBytes(int mt) { return 2 * TileQuads(mt) * 16; }

struct SkinnyConfig {
  int split = 1;       // S: CTAs per cluster along K (gridDim.x = tiles * S)
  bool w_vec = false;  // b, b's up columns and ldb allow 16-byte loads
  bool a_vec = false;  // op(a) rows allow 8-byte loads (a not transposed, lda % 4 == 0, 8-byte aligned)
};

// Eight consecutive 16-bit weights (columns col..col + 7 of one row) as 4 words; `valid` of them in range.
template <typename T>
__device__ __forceinline__ uint4 LoadWeights(const T* src, int valid, bool vec) {
  uint4 v;
  if (vec) {  // streamed once: keep it out of L1, which holds op(a)
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(src));
    return v;
  }
  const unsigned short* s = reinterpret_cast<const unsigned short*>(src);
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = 2 * i < valid ? __ldg(s + 2 * i) : 0u, hi = 2 * i + 1 < valid ? __ldg(s + 2 * i + 1) : 0u;
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Word j (columns 2j, 2j + 1) of a 16-byte weight load; j is a compile-time constant after unrolling.
__device__ __forceinline__ uint32_t Word(const uint4& v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// op(a)[tok][k..k + 3] as two packed words (zeros outside M x K).
template <typename T>
__device__ __forceinline__ uint2 LoadTokens(const KernelArgs& p, const T* a, int64_t tok, int64_t k, bool vec) {
  if (tok >= p.m || k >= p.k) return make_uint2(0u, 0u);
  if (vec) return __ldg(reinterpret_cast<const uint2*>(a + tok * p.lda + k));
  const unsigned short* s = reinterpret_cast<const unsigned short*>(a);
  uint32_t e[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t kk = k + i;
    e[i] = kk < p.k ? __ldg(s + (p.transpose_a ? kk * p.lda + tok : tok * p.lda + kk)) : 0u;
  }
  return make_uint2(e[0] | (e[1] << 16), e[2] | (e[3] << 16));
}

// A warp's partial tile in a slot ([token][column], kSlotStride floats a row): accumulator i of mma (j, mt) is column
// 8g + 2j + i / 2, token mt * 8 + 2t + i % 2. SlotAdd adds a slot back into the accumulators (the same mapping).
template <int kMT>
__device__ __forceinline__ void SlotStore(const float (&acc)[4][kMT][4], float* slot, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      float* row = slot + (mt * 8 + 2 * t + par) * kSlotStride + 8 * g;
      *reinterpret_cast<float4*>(row) =
          make_float4(acc[0][mt][par], acc[0][mt][par + 2], acc[1][mt][par], acc[1][mt][par + 2]);
      *reinterpret_cast<float4*>(row + 4) =
          make_float4(acc[2][mt][par], acc[2][mt][par + 2], acc[3][mt][par], acc[3][mt][par + 2]);
    }
}
template <int kMT>
__device__ __forceinline__ void SlotAdd(float (&acc)[4][kMT][4], const float* slot, int g, int t) {
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int par = 0; par < 2; ++par) {
      const float* row = slot + (mt * 8 + 2 * t + par) * kSlotStride + 8 * g;
      const float4 lo = *reinterpret_cast<const float4*>(row), hi = *reinterpret_cast<const float4*>(row + 4);
      acc[0][mt][par] += lo.x, acc[0][mt][par + 2] += lo.y, acc[1][mt][par] += lo.z, acc[1][mt][par + 2] += lo.w;
      acc[2][mt][par] += hi.x, acc[2][mt][par + 2] += hi.y, acc[3][mt][par] += hi.z, acc[3][mt][par + 2] += hi.w;
    }
}

template <typename T, typename TO, int kMT>
__global__ void __launch_bounds__(kThreads, kMT <= 2 ? 2 : 1) SkinnyKernel(const KernelArgs p, const SkinnyConfig cfg) {
  constexpr int kUnroll = kUnrollFor(kMT);
  extern __shared__ float4 smem_quads[];
  float* slots = reinterpret_cast<float*>(smem_quads);
  float4* recv = smem_quads + kSlots * SlotFloats(kMT) / 4;  // only with split > 1
#if !JAX_OPS_SM90
  if (cfg.split > 1) __trap();  // the host launches clusters only for sm_90a machine code
#endif
  const int split = cfg.split, rank = static_cast<int>(blockIdx.x % split);
  const int64_t n0 = static_cast<int64_t>(blockIdx.x / split) * kTileCols;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool gated = p.gated != Gated::kNone;
  const int roles = gated ? 2 : 1, warps_per_role = kWarps / roles;
  const int role = warp / warps_per_role, kgroup = warp % warps_per_role;
  const int64_t col = n0 + 8 * g;  // this lane's first weight column
  const int valid = static_cast<int>(std::min<int64_t>(std::max<int64_t>(p.n - col, 0), 8));
  const bool w_vec = cfg.w_vec && valid == 8;
  // This warp's chunks: the cluster's K groups (S CTAs x warps_per_role) split the chunks evenly, in rank order.
  const int64_t chunks = (p.k + kChunk - 1) / kChunk, groups = int64_t{split} * warps_per_role;
  const int64_t group = int64_t{rank} * warps_per_role + kgroup;
  const int64_t c_begin = chunks * group / groups, c_end = chunks * (group + 1) / groups;
  const T* w_all = static_cast<const T*>(role == 1 && p.gated == Gated::kSeparate ? p.b_up : p.b) +
                   (role == 1 && p.gated == Gated::kPacked ? p.up_offset : 0) + col;

  for (int64_t bz = blockIdx.y; bz < p.batch; bz += gridDim.y) {
    // Peers may still read last round's slices out of this CTA's receive buffer; and (first round) a peer's shared
    // memory must exist before it is written: arrive now, wait before pushing.
    if (split > 1) sm90::ClusterArrive();
    const T* w = w_all + bz * p.b_batch_stride;
    const T* a = static_cast<const T*>(p.a) + bz * p.a_batch_stride;
    float acc[4][kMT][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][mt][i] = 0.f;

    for (int64_t c = c_begin; c < c_end; c += kUnroll) {
      uint4 wr[kUnroll][4];
      uint2 xr[kUnroll][kMT];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c + u >= c_end) break;
        const int64_t k = (c + u) * kChunk + 4 * t;
#pragma unroll
        for (int r = 0; r < 4; ++r)
          wr[u][r] = k + r < p.k ? LoadWeights(w + (k + r) * p.ldb, valid, w_vec) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) xr[u][mt] = LoadTokens(p, a, mt * 8 + g, k, cfg.a_vec);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (c + u >= c_end) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint32_t w0 = Word(wr[u][0], j), w1 = Word(wr[u][1], j), w2 = Word(wr[u][2], j), w3 = Word(wr[u][3], j);
          // Low halves: column 8g + 2j (fragment row g); high halves: 8g + 2j + 1 (row g + 8).
          const uint32_t frag[4] = {__byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632),
                                    __byte_perm(w2, w3, 0x5410), __byte_perm(w2, w3, 0x7632)};
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) Mma<T>::Run(acc[j][mt], frag, xr[u][mt].x, xr[u][mt].y);
        }
      }
    }

    // The CTA's sum over the warps of each role, as a fixed tree (deterministic): in round `half`, warps
    // [half, 2 half) of the role store their partial to a slot, warps [0, half) add it. The role's total ends in
    // its first slot.
    const int slots_per_role = warps_per_role / 2;
    float* role_slots = slots + role * slots_per_role * SlotFloats(kMT);
    for (int half = slots_per_role; half >= 1; half /= 2) {
      if (kgroup >= half && kgroup < 2 * half) SlotStore(acc, role_slots + (kgroup - half) * SlotFloats(kMT), g, t);
      __syncthreads();
      if (kgroup < half) SlotAdd(acc, role_slots + kgroup * SlotFloats(kMT), g, t);
      __syncthreads();
    }
    if (kgroup == 0) SlotStore(acc, role_slots, g, t);
    __syncthreads();
    // Float4 group q of role r's CTA total: token q / 16, columns 4 (q % 16)...
    auto cta_sum = [&](int r, int q) {
      return *reinterpret_cast<const float4*>(slots + r * slots_per_role * SlotFloats(kMT) + (q / 16) * kSlotStride +
                                              (q % 16) * 4);
    };
    auto epilogue = [&](int q, const float4& s0, const float4& s1) {
      const int64_t m = q / 16, n = n0 + (q % 16) * 4;
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
    constexpr int kQuads = TileQuads(kMT);
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
// run: sm_90a machine code on an sm_90 device), resident CTAs per SM, and the largest cluster split that fits.
// Asked once (thread-safe). ctas_per_sm == 0: the kernel does not fit this device (e.g. too little shared memory).
struct SkinnyFit {
  int smem_bytes = 0;
  int ctas_per_sm = 0;
  int max_split = 1;
};

template <int kMT, typename Kernel>
SkinnyFit QueryFit(Kernel kernel) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, SkinnyFit> cache;
  int dev = 0, cc_major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return {};
  const auto key = std::make_pair(dev, reinterpret_cast<const void*>(kernel));
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  SkinnyFit fit;
  cudaFuncAttributes attr{};
  if (cudaFuncGetAttributes(&attr, kernel) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  const bool clusters = attr.binaryVersion >= 90 && cc_major >= 9;
  fit.smem_bytes = SlotBytes(kMT) + (clusters ? RecvBytes(kMT) : 0);
  if (SetDynamicSmemOnce(reinterpret_cast<const void*>(kernel), fit.smem_bytes) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit.ctas_per_sm, kernel, kThreads, fit.smem_bytes) !=
          cudaSuccess) {
    cudaGetLastError();
    fit.ctas_per_sm = 0;
  }
  for (int s = 2; clusters && fit.ctas_per_sm > 0 && s <= kSkinnyMaxSplit; s *= 2) {
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = s;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(s * 64);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = fit.smem_bytes;
    cfg.attrs = &cluster;
    cfg.numAttrs = 1;
    int active = 0;
    if (cudaOccupancyMaxActiveClusters(&active, kernel, &cfg) != cudaSuccess) {
      cudaGetLastError();
      break;
    }
    if (active == 0) break;
    fit.max_split = s;
  }
  cache.emplace(key, fit);
  return fit;
}

bool Aligned(const void* ptr, int bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

template <typename T, typename TO, int kMT>
cudaError_t LaunchTyped(const KernelArgs& p, int num_sms, int forced_split, cudaStream_t stream, int* used_split) {
  const auto kernel = SkinnyKernel<T, TO, kMT>;
  const SkinnyFit fit = QueryFit<kMT>(kernel);
  if (fit.ctas_per_sm == 0) return cudaErrorNotSupported;  // refused before launching: the caller falls back
  const int64_t tiles = (p.n + kTileCols - 1) / kTileCols, rows = std::min<int64_t>(p.batch, kMaxGridY);
  const int warps_per_split = p.gated != Gated::kNone ? kWarps / 2 : kWarps;
  SkinnyConfig cfg;
  if (forced_split > 0) {
    if (forced_split > fit.max_split || (forced_split & (forced_split - 1))) return cudaErrorNotSupported;
    cfg.split = forced_split;
  } else {
    cfg.split = SkinnySplit(tiles * rows, (p.k + kChunk - 1) / kChunk, warps_per_split,
                            int64_t{fit.ctas_per_sm} * std::max(num_sms, 1), fit.max_split);
  }
  if (used_split) *used_split = cfg.split;
  if (tiles * cfg.split > 0x7fffffff) return cudaErrorInvalidValue;
  const void* up = p.gated == Gated::kSeparate ? p.b_up : p.b;
  cfg.w_vec =
      Aligned(p.b, 16) && Aligned(up, 16) && p.ldb % 8 == 0 && p.up_offset % 8 == 0 && p.b_batch_stride % 8 == 0;
  cfg.a_vec = !p.transpose_a && Aligned(p.a, 8) && p.lda % 4 == 0 && p.a_batch_stride % 4 == 0;
  const dim3 grid(static_cast<unsigned>(tiles * cfg.split), static_cast<unsigned>(rows));
  if (cfg.split == 1) {
    kernel<<<grid, kThreads, fit.smem_bytes, stream>>>(p, cfg);
    return cudaGetLastError();
  }
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cfg.split;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t launch{};
  launch.gridDim = grid;
  launch.blockDim = dim3(kThreads);
  launch.dynamicSmemBytes = fit.smem_bytes;
  launch.stream = stream;
  launch.attrs = &cluster;
  launch.numAttrs = 1;
  const cudaError_t err = cudaLaunchKernelEx(&launch, kernel, p, cfg);
  return err != cudaSuccess ? err : cudaGetLastError();
}

// Token tiles of 8 rows: the smallest instantiation that holds M.
template <typename T, typename TO>
cudaError_t LaunchForM(const KernelArgs& p, int num_sms, int split, cudaStream_t stream, int* used_split) {
  if (p.m <= 8) return LaunchTyped<T, TO, 1>(p, num_sms, split, stream, used_split);
  if (p.m <= 16) return LaunchTyped<T, TO, 2>(p, num_sms, split, stream, used_split);
  if (p.m <= 32) return LaunchTyped<T, TO, 4>(p, num_sms, split, stream, used_split);
  return LaunchTyped<T, TO, 8>(p, num_sms, split, stream, used_split);
}

template <typename T>
cudaError_t LaunchForOut(const KernelArgs& p, int num_sms, int split, cudaStream_t stream, int* used_split) {
  if (p.out_dtype == ffi::DataType::F32) return LaunchForM<T, float>(p, num_sms, split, stream, used_split);
  return LaunchForM<T, T>(p, num_sms, split, stream, used_split);
}

}  // namespace

bool SkinnySupports(const KernelArgs& args) { return SkinnyRefusal(args) == nullptr; }

cudaError_t LaunchSkinnyWithSplit(const KernelArgs& p, int num_sms, int split, cudaStream_t stream, int* used_split) {
  if (!SkinnySupports(p)) return cudaErrorNotSupported;
  if (p.batch == 0 || p.m == 0 || p.n == 0) return cudaSuccess;
  if (p.a_dtype == ffi::DataType::F16) return LaunchForOut<__half>(p, num_sms, split, stream, used_split);
  return LaunchForOut<__nv_bfloat16>(p, num_sms, split, stream, used_split);
}

cudaError_t LaunchSkinny(const KernelArgs& p, int num_sms, cudaStream_t stream) {
  return LaunchSkinnyWithSplit(p, num_sms, 0, stream, nullptr);
}

}  // namespace jax_ops::gemm
