// FlashAttention backward for Hopper (sm_90a): TMA + mbarrier pipelines, wgmma, warp specialisation.
// Included once per (dtype, head dim) by instantiations/bwd_sm90_<dtype>_hd<D>.cu; head dims 64 and 128.
// Deterministic (no atomics; each output element has one owner) and with the semantics of the portable backward
// (attention_bwd_impl.cuh): position masks applied before the exponential, empty rows contribute nothing.
//
// Three kernels, in stream order:
//   BwdDeltaKernel: delta[b, n, t] = sum_d dO * O (fp32), written into the dq buffer reinterpreted as float
//     [B, N, T] (dq holds B*T*N*D 16-bit values, at least as many bytes as B*N*T floats): dq is the delta
//     workspace until DqSm90Kernel overwrites it. No extra workspace, no contract change.
//   DkDvSm90Kernel: CTA = 128 keys of one (batch, kv head). Producer warpgroup: warp 0 loads K and V once and
//     streams 64-query tiles of Q and dO (TMA) through a kStages ring; warp 1 fills the same stages with the
//     tiles' lse (log2 domain) and delta. Two consumer warpgroups of 64 keys each, per query tile:
//     S^T = K Q^T and dP^T = V dO^T (wgmma, operands in shared memory), P^T and dS^T = P^T (dP^T - delta) in
//     registers, dV += P^T dO and dK += dS^T Q (wgmma with A from registers: the accumulator layout of S^T is
//     wgmma's A-register layout). It loops over the G query heads of its group (the GQA sum stays in registers)
//     and the query tiles that can see its keys.
//     kCluster = J > 1 (GQA; J chosen by Sm90BwdDkDvCluster): a cluster of J CTAs shares the key block, each
//     loops over G / J of the group's heads, and the J partial dK/dV are summed in a fixed order through
//     distributed shared memory (DkDvClusterReduce); each rank then stores 128 / J of the block's key rows.
//     Deterministic; not bitwise equal to J = 1 (another summation order).
//   DqSm90Kernel: CTA = 128 query rows of one (batch, head), Q and dO resident, K/V tiles streamed like the
//     forward: S = Q K^T, dP = dO V^T, dS = P (dP - delta), dQ += dS K. It recomputes delta from O and dO (it
//     cannot read the dq buffer it overwrites).
// Tiles wholly inside the allowed region skip the position test (uniform branch between two instantiations, as
// in the forward). Out-of-range rows are zero-filled by TMA and masked. kMods: a boolean mask and a bias read per
// element into the recomputed logits of both kernels, as the forward's kMods variant; with a bias the dQ kernel
// also stores dS, the bias gradient before the sum over the bias's broadcast dims, as [B, N, T, S] f32.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <type_traits>

#include "arch/sm80/fast_math.cuh"
#include "arch/sm80/mma.cuh"
#include "arch/sm80/smem.cuh"
#include "arch/sm90/sm90.cuh"
#include "attention/attention_kernels.h"
#include "attention/tile_math.cuh"
#include "common/cuda_helpers.h"
#include "common/dtype_traits.h"

namespace jax_ops::attention {
namespace hopper {
using jax_ops::sm80::FastExp2, jax_ops::sm80::Mma, jax_ops::sm80::PackAFrags, jax_ops::sm80::SmemAddr;
// The Hopper primitives used here (arch/sm90).
using jax_ops::sm90::NamedBarrier, jax_ops::sm90::NamedBarrierArrive, jax_ops::sm90::ClusterArrive,
    jax_ops::sm90::ClusterArriveRelaxed, jax_ops::sm90::ClusterWait, jax_ops::sm90::MapSharedRank,
    jax_ops::sm90::StSharedClusterV4, jax_ops::sm90::LdSharedV4, jax_ops::sm90::MbarInit,
    jax_ops::sm90::FenceBarrierInit, jax_ops::sm90::MbarArriveExpectTx, jax_ops::sm90::MbarArrive,
    jax_ops::sm90::MbarWait, jax_ops::sm90::TmaLoadPanels, jax_ops::sm90::PrefetchTensorMap, jax_ops::sm90::EncodeMap,
    jax_ops::sm90::SmemDesc, jax_ops::sm90::WgmmaFence, jax_ops::sm90::WgmmaCommit, jax_ops::sm90::WgmmaWait,
    jax_ops::sm90::FenceRegs, jax_ops::sm90::RegAlloc, jax_ops::sm90::RegDealloc, jax_ops::sm90::Wgmma,
    jax_ops::sm90::WgmmaA;

inline constexpr float kBwdLog2e = 1.4426950408889634f;

// The queries [lo, hi) that can see key s under the position rules: the transpose of AllowedKeys (s is allowed
// for t iff t < q_len, s < kv_len, causal: t >= s, window_right: t >= s - right, window_left: t <= s + left).
// kv_len is already clamped to S (SeqLensOf). lo and hi are nondecreasing in s.
__device__ __forceinline__ KeyRange AllowedQueries(const AttentionParams& p, int64_t s, int64_t q_len, int64_t kv_len) {
  if (s >= kv_len) return {0, 0};
  int64_t lo = 0, hi = q_len;
  if (p.is_causal) lo = s;
  if (p.window_right >= 0) lo = Max64(lo, s - p.window_right);
  if (p.window_left >= 0) hi = Min64(hi, s + p.window_left + 1);
  lo = Max64(lo, 0);  // so that both ends fit in 32 bits (q_len < 2^31)
  return {lo, hi < lo ? lo : hi};
}

// lse in the log2 domain, for P = exp2(score * scale * log2e - lse2). An empty row's -inf becomes +inf, so its
// probabilities are exp2(-inf) = 0 without a branch (its keys are masked anyway; this keeps -inf - -inf out).
__device__ __forceinline__ float Lse2(float lse) { return lse == -INFINITY ? INFINITY : lse * kBwdLog2e; }

// sum over 16-byte chunks of dO * O for one row (8 products per chunk).
template <typename T>
__device__ __forceinline__ float DotChunk(const T* a, const T* b) {
  const uint4 av = *reinterpret_cast<const uint4*>(a), bv = *reinterpret_cast<const uint4*>(b);
  const T* ae = reinterpret_cast<const T*>(&av);
  const T* be = reinterpret_cast<const T*>(&bv);
  float acc = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc += ToAcc(ae[e]) * ToAcc(be[e]);
  return acc;
}

// delta[b, n, t] = sum_d dO * O into bp.dq as float [B, N, T] (see the top of the file). kHeadDim / 8 threads per
// row, one 16-byte chunk each; rows are the [B, T, N] rows of the dense o / do buffers.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) BwdDeltaKernel(const AttentionParams p, const BwdPointers bp) {
  constexpr int kLanes = kHeadDim / 8;  // divides 32: the shuffles stay inside a warp
  const int64_t rows = p.batch * p.seqlen_q * p.num_heads;
  const int64_t total = (rows * kLanes + 31) / 32 * 32;  // whole warps take part in every shuffle
  float* delta = static_cast<float*>(bp.dq);
  for (int64_t i = int64_t{blockIdx.x} * 256 + threadIdx.x; i < total; i += int64_t{gridDim.x} * 256) {
    const int64_t row = i / kLanes;
    const int c = static_cast<int>(i % kLanes);
    float acc = 0.f;
    if (row < rows)
      acc = DotChunk(static_cast<const T*>(bp.o) + row * kHeadDim + c * 8,
                     static_cast<const T*>(bp.d_o) + row * kHeadDim + c * 8);
#pragma unroll
    for (int m = kLanes / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (c == 0 && row < rows) {
      const int64_t n = row % p.num_heads, bt = row / p.num_heads;
      delta[p.LseOffset(bt / p.seqlen_q, n, bt % p.seqlen_q)] = acc;
    }
  }
}

struct BwdTensorMaps {
  CUtensorMap q, d_o, k, v;
};

template <int kHeadDim, int kStagesT>
struct DkDvTraits {
  static constexpr int kBlockN = 128;  // keys per CTA: two consumer warpgroups x 64
  static constexpr int kBlockM = 64;   // queries per pipeline stage
  static constexpr int kStages = kStagesT;
  static constexpr int kThreads = 384;
  static constexpr int kPanels = kHeadDim / 64;        // 64-element (128-byte) column panels of a head row
  static constexpr int kKvPanelBytes = kBlockN * 128;  // one panel of the K or V tile
  static constexpr int kQPanelBytes = kBlockM * 128;   // one panel of a Q or dO stage
  static constexpr int kKvBytes = kPanels * kKvPanelBytes;
  static constexpr int kQBytes = kPanels * kQPanelBytes;
  static constexpr int kStatBytes = 2 * kBlockM * 4;  // lse2 and delta of one stage
  static constexpr int kBarrierBytes = 128;
  // + 1 KiB so the tiles can start on a 1024-byte boundary (the swizzle atom).
  static constexpr int kSmemBytes = 2 * kKvBytes + kStages * (2 * kQBytes + kStatBytes) + kBarrierBytes + 1024;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  // Cluster reduction slots (DkDvClusterSlots) reuse the K / V tiles and the Q / dO stages, contiguous from the
  // first tile and free once the main loop is done.
  static constexpr int kTileBytes = 2 * kKvBytes + kStages * 2 * kQBytes;
};

// kCluster > 1: the reduction of the J partial dK / dV accumulators of a cluster (see the top of the file), called
// by the 256 consumer threads of every CTA after their main loop. Rows are owned per consumer warp (16 keys):
// warp slot g = 4 cw + warp belongs to rank g J / 8, so each rank finalises 128 / J consecutive key rows and all of
// its owner warps sit in one warpgroup. After a first cluster barrier (every CTA is done with its pipeline tiles,
// which hold the slots), non-owners push their accumulators into the owner CTA's slot for (owned warp, source
// rank) — remote stores do not stall, and the owners then read local shared memory. After a second (release /
// acquire) barrier the owners add their slots in the order rank + 1, rank + 2, ... (mod J): the owner of an
// element is fixed, so is its summation order (bitwise deterministic). Slots: 16-byte chunks laid out
// [owned warp][source][chunk][lane], so a warp's stores and loads are 512 contiguous bytes. Returns whether this
// thread owns its rows; no cross-CTA access follows (the non-owners may exit).
template <int kHeadDim, int kCluster>
struct DkDvClusterSlots {
  static constexpr int kChunks = kHeadDim / 4;      // float4 chunks per thread: dK then dV
  static constexpr int kSlotBytes = kChunks * 512;  // one warp's partial dK and dV
  static constexpr int kOwnedWarps = 8 / kCluster;
  static constexpr int kBytes = kOwnedWarps * (kCluster - 1) * kSlotBytes;
};
// acc (kN floats, 16-byte chunks 512 bytes apart) to distributed shared memory / acc += local shared memory.
template <int kN>
__device__ __forceinline__ void PushChunks(const float (&acc)[kN], uint32_t dst) {
#pragma unroll
  for (int c = 0; c < kN / 4; ++c)
    StSharedClusterV4(dst + c * 512, make_float4(acc[4 * c], acc[4 * c + 1], acc[4 * c + 2], acc[4 * c + 3]));
}
template <int kN>
__device__ __forceinline__ void AddChunks(float (&acc)[kN], uint32_t src) {
  __syncwarp();  // keeps ptxas from hoisting every load of the reduction ahead of the adds (spills)
#pragma unroll
  for (int c = 0; c < kN / 4; ++c) {
    const float4 x = LdSharedV4(src + c * 512);
    acc[4 * c] += x.x;
    acc[4 * c + 1] += x.y;
    acc[4 * c + 2] += x.z;
    acc[4 * c + 3] += x.w;
  }
}
template <int kHeadDim, int kCluster>
__device__ __forceinline__ bool DkDvClusterReduce(float (&acc_dk)[kHeadDim / 2], float (&acc_dv)[kHeadDim / 2],
                                                  uint32_t slots, int rank, int cw, int warp, int lane) {
  using Sl = DkDvClusterSlots<kHeadDim, kCluster>;
  constexpr int kDvOffset = Sl::kChunks / 2 * 512;  // dV's chunks follow dK's
  const int g = cw * 4 + warp;
  const int owner_rank = g / Sl::kOwnedWarps, g_local = g % Sl::kOwnedWarps;
  const bool owner = owner_rank == rank;
  ClusterArriveRelaxed();  // the tiles' last readers (wgmma) have waited for their reads
  ClusterWait();
  if (!owner) {
    const int o = (rank - owner_rank + kCluster) % kCluster;  // 1..J-1
    const uint32_t dst =
        MapSharedRank(slots + (g_local * (kCluster - 1) + o - 1) * Sl::kSlotBytes + lane * 16, owner_rank);
    PushChunks(acc_dk, dst);
    PushChunks(acc_dv, dst + kDvOffset);
  }
  ClusterArrive();  // release: the pushes above; acquire below
  ClusterWait();
  if (owner) {
#pragma unroll
    for (int o = 1; o < kCluster; ++o) {
      const uint32_t src = slots + (g_local * (kCluster - 1) + o - 1) * Sl::kSlotBytes + lane * 16;
      AddChunks(acc_dk, src);
      AddChunks(acc_dv, src + kDvOffset);
    }
  }
  return owner;
}

// kDvEarly: issue dV += P^T dO before computing dS^T (overlaps them; needs 16 more registers).
// kPingPong: the two consumer warpgroups take turns issuing S^T / dP^T (named barriers 3 and 4, as the forward),
// so one's exponentials overlap the other's GEMMs.
// kCluster: CTAs per cluster sharing one key block's group of query heads (1, 2 or 4; must divide the group).
// kMods: the boolean mask (and the bias, in P only) read per element into the recomputed logits (LineMods), as
// the forward's kMods variant.
template <typename T, int kHeadDim, int kStages, bool kDvEarly, bool kPingPong, int kCluster = 1, bool kMods = false>
__global__ void __launch_bounds__(384, 1)
    DkDvSm90Kernel(const AttentionParams p, const FwdPointers ptr, const BwdPointers bp,
                   const __grid_constant__ BwdTensorMaps maps) {
#if JAX_OPS_SM90
  using Tr = DkDvTraits<kHeadDim, kStages>;
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* sK = smem;
  unsigned char* sV = sK + Tr::kKvBytes;
  unsigned char* sQ = sV + Tr::kKvBytes;
  unsigned char* sDo = sQ + kStages * Tr::kQBytes;
  float* s_lse = reinterpret_cast<float*>(sDo + kStages * Tr::kQBytes);  // [kStages][kBM], log2 domain
  float* s_delta = s_lse + kStages * kBM;                                // [kStages][kBM]
  uint64_t* bars = reinterpret_cast<uint64_t*>(s_delta + kStages * kBM);
  uint64_t* kv_full = bars;
  uint64_t* q_full = bars + 1;  // Q, dO (TMA) + lse2, delta (producer warp 1) of a stage
  uint64_t* q_empty = q_full + kStages;

  static_assert(kCluster == 1 || kCluster == 2 || kCluster == 4, "cluster of 1, 2 or 4 CTAs");
  // Cluster (kCluster, 1, 1): the ranks of one key block are consecutive in x, so blockIdx.x % kCluster is the
  // CTA's rank in the cluster (%cluster_ctarank). Causal: heavy blocks first.
  const int rank = kCluster == 1 ? 0 : static_cast<int>(blockIdx.x % kCluster);
  // kMods: the (kv head, batch) pairs batch-fastest, so a bias or mask broadcast over the batch is shared in L2.
  const unsigned head_batch = blockIdx.y + gridDim.y * blockIdx.z;
  const int64_t s0 = int64_t{blockIdx.x / kCluster} * kBN;
  const int64_t kh = kMods ? head_batch / gridDim.z : blockIdx.y, b = kMods ? head_batch % gridDim.z : blockIdx.z;
  const int heads = static_cast<int>(p.group) / kCluster;  // query heads of this CTA (the launcher checks J | G)
  const int head0 = static_cast<int>(kh * p.group) + rank * heads;  // its first one (TMA coordinates are int)
  const int wg = threadIdx.x / 128;
  const auto [q_len, kv_len] = SeqLensOf(p, ptr, b);
  // Query tiles that can see some key of the block: from the first key's lo to the last valid key's hi.
  const int64_t s_last = Min64(s0 + kBN, kv_len) - 1;
  int64_t q_lo = 0, q_hi = 0;
  if (s_last >= s0) {
    q_lo = AllowedQueries(p, s0, q_len, kv_len).lo;
    q_hi = AllowedQueries(p, s_last, q_len, kv_len).hi;
  }
  const int tile_lo = q_hi > q_lo ? static_cast<int>(q_lo / kBM) : 0;
  const int tiles = q_hi > q_lo ? static_cast<int>((q_hi + kBM - 1) / kBM) - tile_lo : 0;
  const int iters = tiles * heads;  // the launcher checks that this fits

  if (threadIdx.x == 0) {
    MbarInit(kv_full, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarInit(q_full + s, 1 + 32);  // the TMA thread's expect_tx + the 32 lanes of warp 1
      // Every consumer thread arrives: each reads the stage's lse2 / delta with plain loads, and an arrival
      // releases only its own thread's accesses (one elected lane per warp would leave warp 1's next stores
      // racing with the other lanes' reads in the PTX memory model; compute-sanitizer racecheck flags it).
      MbarInit(q_empty + s, 256);
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (wg == 0) {
    RegDealloc<Tr::kProducerRegs>();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    if (warp == 0 && lane == 0 && iters > 0) {
      PrefetchTensorMap(&maps.q);
      PrefetchTensorMap(&maps.d_o);
      MbarArriveExpectTx(kv_full, 2 * Tr::kKvBytes);
      TmaLoadPanels<Tr::kPanels, Tr::kKvPanelBytes>({sK, sV}, {&maps.k, &maps.v}, kv_full, static_cast<int>(kh),
                                                    static_cast<int>(s0), static_cast<int>(b));
      for (int j = 0; j < iters; ++j) {
        const int stage = j % kStages;
        if (j >= kStages) MbarWait(q_empty + stage, ((j / kStages) - 1) & 1);
        const int n = head0 + j / tiles;
        const int t0 = (tile_lo + j % tiles) * kBM;
        MbarArriveExpectTx(q_full + stage, 2 * Tr::kQBytes);
        TmaLoadPanels<Tr::kPanels, Tr::kQPanelBytes>({sQ + stage * Tr::kQBytes, sDo + stage * Tr::kQBytes},
                                                     {&maps.q, &maps.d_o}, q_full + stage, n, t0, static_cast<int>(b));
      }
    } else if (warp == 1 && iters > 0) {
      // lse2 and delta of each stage's 64 queries (rows past T: P = 0, delta = 0). Plain loads: lse has no
      // padding a TMA box could rely on, and these are 512 bytes per stage.
      const float* delta = static_cast<const float*>(bp.dq);
      for (int j = 0; j < iters; ++j) {
        const int stage = j % kStages;
        if (j >= kStages) MbarWait(q_empty + stage, ((j / kStages) - 1) & 1);
        const int64_t n = head0 + j / tiles;
        const int64_t t0 = int64_t{tile_lo + j % tiles} * kBM;
#pragma unroll
        for (int h = 0; h < kBM / 32; ++h) {
          const int64_t t = t0 + h * 32 + lane;
          const bool ok = t < p.seqlen_q;
          s_lse[stage * kBM + h * 32 + lane] = ok ? Lse2(bp.lse[p.LseOffset(b, n, t)]) : INFINITY;
          s_delta[stage * kBM + h * 32 + lane] = ok ? delta[p.LseOffset(b, n, t)] : 0.f;
        }
        MbarArrive(q_full + stage);  // release: the stores above are visible to the consumers' acquire
      }
    }
    if constexpr (kCluster > 1) {  // the two cluster barriers of DkDvClusterReduce
      ClusterArriveRelaxed();
      ClusterWait();
      ClusterArrive();
      ClusterWait();
    }
    return;
  }

  RegAlloc<Tr::kConsumerRegs>();
  const int cw = wg - 1;                   // consumer warpgroup: keys [64 cw, 64 cw + 64) of the block
  const int tid = threadIdx.x - 128 * wg;  // thread in the warpgroup
  const int warp = tid >> 5, lane = tid & 31;
  const int64_t ws0 = s0 + cw * 64;
  unsigned char* k_rows = sK + cw * 64 * 128;  // this warpgroup's 64 rows in each K / V panel
  unsigned char* v_rows = sV + cw * 64 * 128;
  // The queries that see this thread's two keys (rows of S^T), and the query range that sees all 64 keys of the
  // warpgroup (tiles inside it need no position test).
  // 32-bit (T < 2^31, lo >= 0): registers are scarce in this kernel.
  int key_q_lo[2], key_q_hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const KeyRange r = AllowedQueries(p, ws0 + warp * 16 + (lane >> 2) + 8 * i, q_len, kv_len);
    key_q_lo[i] = static_cast<int>(r.lo);
    key_q_hi[i] = static_cast<int>(r.hi);
  }
  int inner_lo = 0, inner_hi = 0;
  if (ws0 + 64 <= kv_len) {
    inner_lo = static_cast<int>(AllowedQueries(p, ws0 + 63, q_len, kv_len).lo);
    inner_hi = static_cast<int>(AllowedQueries(p, ws0, q_len, kv_len).hi);
  }

  float acc_dk[kHeadDim / 2], acc_dv[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_dk[i] = acc_dv[i] = 0.f;
  float st[kBM / 2], dpt[kBM / 2];             // S^T then P^T; dP^T then dS^T (fp32, 64 keys x 64 queries)
  uint32_t pa[kBM / 16][4], pds[kBM / 16][4];  // P^T and dS^T packed to T: A operands of the dV and dK GEMMs
  const float scale_log2 = p.scale * kBwdLog2e;

  // S^T = K Q^T and dP^T = V dO^T: k16 steps along the head dim; a 128-byte panel holds 4 of them (32 bytes apart).
  auto issue_s_dp = [&](int stage) {
    const unsigned char* q_tile = sQ + stage * Tr::kQBytes;
    const unsigned char* do_tile = sDo + stage * Tr::kQBytes;
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const int ka = (ks / 4) * Tr::kKvPanelBytes + (ks % 4) * 32, kb = (ks / 4) * Tr::kQPanelBytes + (ks % 4) * 32;
      Wgmma<T, kBM, WgmmaA::kSmem>::Run(st, SmemDesc(k_rows + ka, 16, 1024), SmemDesc(q_tile + kb, 16, 1024), ks > 0);
    }
    WgmmaCommit();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const int ka = (ks / 4) * Tr::kKvPanelBytes + (ks % 4) * 32, kb = (ks / 4) * Tr::kQPanelBytes + (ks % 4) * 32;
      Wgmma<T, kBM, WgmmaA::kSmem>::Run(dpt, SmemDesc(v_rows + ka, 16, 1024), SmemDesc(do_tile + kb, 16, 1024), ks > 0);
    }
    WgmmaCommit();
  };
  // acc += A B with A (64 keys x 64 queries) from registers and B = the stage's dO or Q tile, MN-major (head dim
  // contiguous): k16 steps of 16 query rows (2048 bytes), 64-element panels kQPanelBytes apart.
  auto issue_rs = [&](float (&acc)[kHeadDim / 2], const uint32_t (&a)[kBM / 16][4], const unsigned char* tile) {
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kBM / 16; ++ks)
      Wgmma<T, kHeadDim, WgmmaA::kRegs>::Run(acc, a[ks], SmemDesc(tile + ks * 2048, Tr::kQPanelBytes, 1024), 1);
    WgmmaCommit();
  };
  // P^T in place of S^T. Element (key row i, query column c): c = nt * 8 + (lane & 3) * 2 + (e & 1).
  // masked (std::true_type): a boundary tile; query c is allowed for key i when lo[i] <= c < hi[i]. n: the query
  // head (kMods reads its mask and bias).
  auto probs = [&](int stage, int t0, int64_t n, auto masked) {
    const float* lse2 = s_lse + stage * kBM;
    int lo[2] = {0, 0}, hi[2] = {kBM, kBM};
    if constexpr (decltype(masked)::value) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        lo[i] = min(max(key_q_lo[i] - t0, 0), kBM);
        hi[i] = min(max(key_q_hi[i] - t0, 0), kBM);
      }
    }
    if constexpr (kMods) {
      // Log2-domain logits along this thread's two key columns (-inf outside the allowed queries), then
      // P^T = exp2(x - lse2 of the query).
      const int64_t key = ws0 + warp * 16 + (lane >> 2);
      const LineMods mods[2] = {KeyModsOf(p, ptr, b, n, key), KeyModsOf(p, ptr, b, n, key + 8)};
      ApplyKeyMods<T, decltype(masked)::value, kBM / 8>(p, ptr, st, mods, lo, hi, t0, lane, scale_log2);
#pragma unroll
      for (int nt = 0; nt < kBM / 8; ++nt) {
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + nt * 8 + (lane & 3) * 2);
#pragma unroll
        for (int e = 0; e < 4; ++e) st[nt * 4 + e] = FastExp2(st[nt * 4 + e] - ((e & 1) ? l2.y : l2.x));
      }
    } else {
#pragma unroll
      for (int nt = 0; nt < kBM / 8; ++nt) {
        const int c = nt * 8 + (lane & 3) * 2;
        const float2 l2 = *reinterpret_cast<const float2*>(lse2 + c);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = FastExp2(fmaf(st[nt * 4 + e], scale_log2, -((e & 1) ? l2.y : l2.x)));
          if constexpr (decltype(masked)::value) {
            const int cc = c + (e & 1);
            if (cc < lo[e >> 1] || cc >= hi[e >> 1]) v = 0.f;
          }
          st[nt * 4 + e] = v;
        }
      }
    }
  };
  // dS^T = P^T (dP^T - delta) (masked entries have P = 0), packed to T as it is produced so the fp32 dP^T and
  // P^T die early (register pressure: the dK and dV accumulators take 128 registers at D = 128).
  auto dscores_packed = [&](int stage) {
    const float* delta = s_delta + stage * kBM;
#pragma unroll
    for (int nt = 0; nt < kBM / 8; ++nt) {
      const float2 d2 = *reinterpret_cast<const float2*>(delta + nt * 8 + (lane & 3) * 2);
      const float x0 = st[nt * 4 + 0] * (dpt[nt * 4 + 0] - d2.x), x1 = st[nt * 4 + 1] * (dpt[nt * 4 + 1] - d2.y);
      const float x2 = st[nt * 4 + 2] * (dpt[nt * 4 + 2] - d2.x), x3 = st[nt * 4 + 3] * (dpt[nt * 4 + 3] - d2.y);
      pds[nt / 2][(nt & 1) * 2 + 0] = Mma<T>::Pack(x0, x1);
      pds[nt / 2][(nt & 1) * 2 + 1] = Mma<T>::Pack(x2, x3);
    }
  };
  auto release = [&](int j) { MbarArrive(q_empty + j % kStages); };

  // Per tile j: S^T and dP^T are issued together, P^T is computed while dP^T runs (and, with kDvEarly, dS^T while
  // dV runs). The tile ends with every GEMM done: keeping dV/dK in flight into the next tile's S^T/dP^T needs
  // more than the 240 registers (ptxas then serialises the wgmmas); the other consumer warpgroup fills the gaps.
  // Ping-pong turns: each warpgroup syncs once per tile on its own barrier and arrives once on the other's;
  // warpgroup 1 opens the first turn for warpgroup 0 and skips its last arrival, so the counts match.
  const int my_turn = 3 + cw, other_turn = 4 - cw;
  if (iters > 0) {
    MbarWait(kv_full, 0);
    if (kPingPong && cw == 1) NamedBarrierArrive(3, 256);
    for (int j = 0; j < iters; ++j) {
      const int stage = j % kStages;
      const int t0 = (tile_lo + j % tiles) * kBM;
      MbarWait(q_full + stage, (j / kStages) & 1);
      if (kPingPong) NamedBarrier(my_turn, 256);
      issue_s_dp(stage);
      if (kPingPong && !(cw == 1 && j == iters - 1)) NamedBarrierArrive(other_turn, 256);
      WgmmaWait<1>();  // S^T(j) done
      FenceRegs(st);
      const int64_t n = head0 + j / tiles;
      if (t0 >= inner_lo && t0 <= inner_hi - kBM) {
        probs(stage, t0, n, std::false_type{});
      } else {
        probs(stage, t0, n, std::true_type{});
      }
      if constexpr (kDvEarly) {
        PackAFrags<T>(pa, st);
        issue_rs(acc_dv, pa, sDo + stage * Tr::kQBytes);
        WgmmaWait<1>();  // dP^T(j) done; dV(j) may still run
        FenceRegs(dpt);
        dscores_packed(stage);
      } else {
        WgmmaWait<0>();  // dP^T(j) done
        FenceRegs(dpt);
        dscores_packed(stage);
        PackAFrags<T>(pa, st);
        issue_rs(acc_dv, pa, sDo + stage * Tr::kQBytes);
      }
      issue_rs(acc_dk, pds, sQ + stage * Tr::kQBytes);
      WgmmaWait<0>();
      FenceRegs(acc_dk);
      FenceRegs(acc_dv);
      release(j);
    }
  }

  // Epilogue: dK * scale and dV through this warpgroup's K / V rows (no longer read), 16-byte coalesced stores.
  const float dk_scale[2] = {p.scale, p.scale}, one[2] = {1.f, 1.f};
  if constexpr (kCluster == 1) {
    AccToSmemRows<T, kHeadDim>(acc_dk, dk_scale, k_rows, Tr::kKvPanelBytes, warp, lane);
    AccToSmemRows<T, kHeadDim>(acc_dv, one, v_rows, Tr::kKvPanelBytes, warp, lane);
    NamedBarrier(1 + cw, 128);
    const int valid = static_cast<int>(Max64(Min64(64, p.seqlen_k - ws0), 0));
    SmemRowsToGlobal<T, kHeadDim>(k_rows, Tr::kKvPanelBytes, static_cast<T*>(bp.dk) + p.KOffset(b, ws0, kh),
                                  p.k_row_stride, valid, tid);
    SmemRowsToGlobal<T, kHeadDim>(v_rows, Tr::kKvPanelBytes, static_cast<T*>(bp.dv) + p.KOffset(b, ws0, kh),
                                  p.k_row_stride, valid, tid);
  } else {
    static_assert(DkDvClusterSlots<kHeadDim, kCluster>::kBytes <= Tr::kTileBytes, "slots must fit the tiles");
    if (!DkDvClusterReduce<kHeadDim, kCluster>(acc_dk, acc_dv, SmemAddr(sK), rank, cw, warp, lane)) return;
    // The owners: 256 / J threads, 128 / J rows from warp first_warp of this warpgroup, staged in its K / V rows
    // once every owner has read its slots (they overlap).
    constexpr int kOwnerRows = 128 / kCluster, kOwners = 256 / kCluster;
    const int first_warp = kCluster == 2 ? 0 : (rank & 1) * 2;
    NamedBarrier(1, kOwners);
    AccToSmemRows<T, kHeadDim>(acc_dk, dk_scale, k_rows, Tr::kKvPanelBytes, warp, lane);
    AccToSmemRows<T, kHeadDim>(acc_dv, one, v_rows, Tr::kKvPanelBytes, warp, lane);
    NamedBarrier(1, kOwners);
    const int64_t r0 = ws0 + first_warp * 16;
    const int valid = static_cast<int>(Max64(Min64(kOwnerRows, p.seqlen_k - r0), 0));
    const int otid = tid - first_warp * 32;
    SmemRowsToGlobal<T, kHeadDim, kOwnerRows, kOwners>(k_rows + first_warp * 16 * 128, Tr::kKvPanelBytes,
                                                       static_cast<T*>(bp.dk) + p.KOffset(b, r0, kh), p.k_row_stride,
                                                       valid, otid);
    SmemRowsToGlobal<T, kHeadDim, kOwnerRows, kOwners>(v_rows + first_warp * 16 * 128, Tr::kKvPanelBytes,
                                                       static_cast<T*>(bp.dv) + p.KOffset(b, r0, kh), p.k_row_stride,
                                                       valid, otid);
  }
#endif
}

// One dS tile (the wgmma m64nN accumulator layout, as RowModsToLogits) into dS [B, N, T, S] f32 at rows `rows` of
// (b, n) and keys s0 + column; rows past T and keys past S are skipped.
template <int kNT>
__device__ __forceinline__ void StoreScores(const AttentionParams& p, float* ds_out, const float* ds, int64_t b,
                                            int64_t n, const int64_t (&rows)[2], int64_t s0, int lane) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rows[i] >= p.seqlen_q) continue;
    float* row = ds_out + p.LseOffset(b, n, rows[i]) * p.seqlen_k;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t s = s0 + nt * 8 + (lane & 3) * 2 + e;
        if (s < p.seqlen_k) row[s] = ds[nt * 4 + 2 * i + e];
      }
    }
  }
}

template <int kHeadDim, int kBlockNT, int kStagesT>
struct DqTraits {
  static constexpr int kBlockM = 128;  // query rows per CTA: two consumer warpgroups x 64
  static constexpr int kBlockN = kBlockNT;
  static constexpr int kStages = kStagesT;
  static constexpr int kThreads = 384;
  static constexpr int kPanels = kHeadDim / 64;
  static constexpr int kQPanelBytes = kBlockM * 128;
  static constexpr int kKvPanelBytes = kBlockN * 128;
  static constexpr int kQBytes = kPanels * kQPanelBytes;  // one of Q, dO
  static constexpr int kKvBytes = kPanels * kKvPanelBytes;
  static constexpr int kBarrierBytes = 128;
  static constexpr int kSmemBytes = 2 * kQBytes + 2 * kStages * kKvBytes + kBlockM * 4 + kBarrierBytes + 1024;
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
};

// kPingPong: as DkDvSm90Kernel, for S / dP. kMods: as DkDvSm90Kernel.
template <typename T, int kHeadDim, int kBlockN, int kStages, bool kPingPong, bool kMods = false>
__global__ void __launch_bounds__(384, 1)
    DqSm90Kernel(const AttentionParams p, const FwdPointers ptr, const BwdPointers bp,
                 const __grid_constant__ BwdTensorMaps maps) {
#if JAX_OPS_SM90
  using Tr = DqTraits<kHeadDim, kBlockN, kStages>;
  constexpr int kBM = Tr::kBlockM, kBN = kBlockN;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* sQ = smem;
  unsigned char* sDo = sQ + Tr::kQBytes;
  unsigned char* sK = sDo + Tr::kQBytes;
  unsigned char* sV = sK + kStages * Tr::kKvBytes;
  float* s_delta = reinterpret_cast<float*>(sV + kStages * Tr::kKvBytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(s_delta + kBM);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* kv_empty = v_full + kStages;

  const int m_block = gridDim.x - 1 - blockIdx.x;                   // heavy (late) causal blocks first
  const unsigned head_batch = blockIdx.y + gridDim.y * blockIdx.z;  // kMods: batch-fastest, as the dK/dV kernel
  const int64_t n = kMods ? head_batch / gridDim.z : blockIdx.y, b = kMods ? head_batch % gridDim.z : blockIdx.z;
  const int64_t kh = n / p.group;
  const int64_t m0 = int64_t{m_block} * kBM;
  const int wg = threadIdx.x / 128;

  const auto [q_len, kv_len] = SeqLensOf(p, ptr, b);
  const TileRange tiles = KeyTiles(BlockKeys(p, m0, kBM, q_len, kv_len).any, kBN);
  const int tile_lo = tiles.lo, num_tiles = tiles.hi - tiles.lo;

  if (threadIdx.x == 0) {
    MbarInit(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarInit(k_full + s, 1);
      MbarInit(v_full + s, 1);
      MbarInit(kv_empty + s, 8);  // one arrival per consumer warp
    }
    FenceBarrierInit();
  }
  __syncthreads();

  if (wg == 0) {
    RegDealloc<Tr::kProducerRegs>();
    if (threadIdx.x == 0 && num_tiles > 0) {
      PrefetchTensorMap(&maps.k);
      PrefetchTensorMap(&maps.v);
      MbarArriveExpectTx(q_full, 2 * Tr::kQBytes);
      TmaLoadPanels<Tr::kPanels, Tr::kQPanelBytes>({sQ, sDo}, {&maps.q, &maps.d_o}, q_full, static_cast<int>(n),
                                                   static_cast<int>(m0), static_cast<int>(b));
      for (int j = 0; j < num_tiles; ++j) {
        const int stage = j % kStages;
        if (j >= kStages) MbarWait(kv_empty + stage, ((j / kStages) - 1) & 1);
        const int s0 = (tile_lo + j) * kBN;
        MbarArriveExpectTx(k_full + stage, Tr::kKvBytes);
        TmaLoadPanels<Tr::kPanels, Tr::kKvPanelBytes>({sK + stage * Tr::kKvBytes}, {&maps.k}, k_full + stage,
                                                      static_cast<int>(kh), s0, static_cast<int>(b));
        MbarArriveExpectTx(v_full + stage, Tr::kKvBytes);
        TmaLoadPanels<Tr::kPanels, Tr::kKvPanelBytes>({sV + stage * Tr::kKvBytes}, {&maps.v}, v_full + stage,
                                                      static_cast<int>(kh), s0, static_cast<int>(b));
      }
    }
    return;
  }

  RegAlloc<Tr::kConsumerRegs>();
  const int cw = wg - 1;                   // consumer warpgroup: query rows [64 cw, 64 cw + 64) of the block
  const int tid = threadIdx.x - 128 * wg;  // thread in the warpgroup
  const int warp = tid >> 5, lane = tid & 31;
  const int64_t w0 = m0 + cw * 64;
  const int row_in_block = cw * 64 + warp * 16 + (lane >> 2);
  const int64_t rows[2] = {m0 + row_in_block, m0 + row_in_block + 8};
  KeyRange row_keys[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    row_keys[i] = rows[i] < p.seqlen_q ? AllowedKeys(p, rows[i], q_len, kv_len) : KeyRange{0, 0};
  KeyRange inner{0, 0};  // keys every row of the warpgroup may see
  if (w0 + 64 <= q_len) {
    inner.lo = AllowedKeys(p, w0 + 63, q_len, kv_len).lo;
    inner.hi = AllowedKeys(p, w0, q_len, kv_len).hi;
  }

  // delta of the warpgroup's 64 rows from O and dO in global memory, 2 threads per row (overlaps the Q / dO TMA).
  {
    const int r = tid >> 1, half = tid & 1;
    const int64_t t = w0 + r;
    float acc = 0.f;
    if (t < p.seqlen_q) {
      const T* orow = static_cast<const T*>(bp.o) + p.QOffset(b, t, n);
      const T* drow = static_cast<const T*>(bp.d_o) + p.QOffset(b, t, n);
#pragma unroll
      for (int c = half; c < kHeadDim / 8; c += 2) acc += DotChunk(orow + c * 8, drow + c * 8);
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    if (half == 0) s_delta[cw * 64 + r] = acc;
    NamedBarrier(1 + cw, 128);
  }
  float delta[2], lse2[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    delta[i] = s_delta[row_in_block + 8 * i];
    lse2[i] = rows[i] < p.seqlen_q ? Lse2(bp.lse[p.LseOffset(b, n, rows[i])]) : INFINITY;
  }

  float acc_dq[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_dq[i] = 0.f;
  float s[kBN / 2], dp[kBN / 2];  // S then P; dP then dS (fp32)
  uint32_t pds[kBN / 16][4];      // dS packed to T: the A operand of dQ += dS K
  const float scale_log2 = p.scale * kBwdLog2e;
  unsigned char* q_rows = sQ + cw * 64 * 128;  // this warpgroup's 64 rows in each Q / dO panel
  unsigned char* do_rows = sDo + cw * 64 * 128;

  auto issue_s_dp = [&](int j) {
    const unsigned char* k_tile = sK + (j % kStages) * Tr::kKvBytes;
    const unsigned char* v_tile = sV + (j % kStages) * Tr::kKvBytes;
    MbarWait(k_full + j % kStages, (j / kStages) & 1);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const int ka = (ks / 4) * Tr::kQPanelBytes + (ks % 4) * 32, kb = (ks / 4) * Tr::kKvPanelBytes + (ks % 4) * 32;
      Wgmma<T, kBN, WgmmaA::kSmem>::Run(s, SmemDesc(q_rows + ka, 16, 1024), SmemDesc(k_tile + kb, 16, 1024), ks > 0);
    }
    WgmmaCommit();
    MbarWait(v_full + j % kStages, (j / kStages) & 1);
    WgmmaFence();  // (ptxas inserts one here otherwise)
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const int ka = (ks / 4) * Tr::kQPanelBytes + (ks % 4) * 32, kb = (ks / 4) * Tr::kKvPanelBytes + (ks % 4) * 32;
      Wgmma<T, kBN, WgmmaA::kSmem>::Run(dp, SmemDesc(do_rows + ka, 16, 1024), SmemDesc(v_tile + kb, 16, 1024), ks > 0);
    }
    WgmmaCommit();
  };
  // dQ += dS K: k16 steps along the keys (16 rows of 128 bytes); K is MN-major here (head dim contiguous).
  auto issue_dq = [&](int j) {
    const unsigned char* k_tile = sK + (j % kStages) * Tr::kKvBytes;
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kBN / 16; ++ks)
      Wgmma<T, kHeadDim, WgmmaA::kRegs>::Run(acc_dq, pds[ks], SmemDesc(k_tile + ks * 2048, Tr::kKvPanelBytes, 1024), 1);
    WgmmaCommit();
  };
  // P in place of S; key column c = nt * 8 + (lane & 3) * 2 + (e & 1) is allowed for row i when lo[i] <= c < hi[i].
  auto probs = [&](int j, const RowMaskWords<kBN / 8>& words, auto masked) {
    const int64_t s0 = int64_t{tile_lo + j} * kBN;
    int lo[2] = {0, 0}, hi[2] = {kBN, kBN};
    if constexpr (decltype(masked)::value) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        lo[i] = static_cast<int>(Min64(Max64(row_keys[i].lo - s0, 0), kBN));
        hi[i] = static_cast<int>(Min64(Max64(row_keys[i].hi - s0, 0), kBN));
      }
    }
    if constexpr (kMods) {
      // Log2-domain logits with the mask and bias (-inf outside the allowed positions), then P = exp2(x - lse2).
      const LineMods mods[2] = {RowModsOf(p, ptr, b, n, rows[0]), RowModsOf(p, ptr, b, n, rows[1])};
      ApplyRowMods<T, decltype(masked)::value, kBN / 8>(p, ptr, s, mods, words, lo, hi, s0, lane, scale_log2);
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) s[i] = FastExp2(s[i] - lse2[(i >> 1) & 1]);
    } else {
#pragma unroll
      for (int nt = 0; nt < kBN / 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = FastExp2(fmaf(s[nt * 4 + e], scale_log2, -lse2[e >> 1]));
          if constexpr (decltype(masked)::value) {
            const int c = nt * 8 + (lane & 3) * 2 + (e & 1);
            if (c < lo[e >> 1] || c >= hi[e >> 1]) v = 0.f;
          }
          s[nt * 4 + e] = v;
        }
      }
    }
  };
  auto release = [&](int j) {
    __syncwarp();
    if (lane == 0) MbarArrive(kv_empty + j % kStages);
  };

  const int my_turn = 3 + cw, other_turn = 4 - cw;
  if (num_tiles > 0) {
    MbarWait(q_full, 0);
    if (kPingPong && cw == 1) NamedBarrierArrive(3, 256);
    for (int j = 0; j < num_tiles; ++j) {
      if (kPingPong) NamedBarrier(my_turn, 256);
      issue_s_dp(j);
      if (kPingPong && !(cw == 1 && j == num_tiles - 1)) NamedBarrierArrive(other_turn, 256);
      if (j > 0) {
        WgmmaWait<2>();  // dQ(j - 1) done: its K stage can be refilled
        FenceRegs(acc_dq);
        release(j - 1);
      }
      const int64_t s0 = int64_t{tile_lo + j} * kBN;
      RowMaskWords<kBN / 8> words{};  // kMods: tile j's mask words (and bias lines into L1), under the S wgmma
      if constexpr (kMods) {
        const LineMods mods[2] = {RowModsOf(p, ptr, b, n, rows[0]), RowModsOf(p, ptr, b, n, rows[1])};
        words = PrefetchRowMods<T, kBN / 8>(p, ptr, mods, s0, lane);
      }
      WgmmaWait<1>();
      FenceRegs(s);
      if (s0 >= inner.lo && s0 + kBN <= inner.hi) {
        probs(j, words, std::false_type{});
      } else {
        probs(j, words, std::true_type{});
      }
      WgmmaWait<0>();
      FenceRegs(dp);
#pragma unroll
      for (int i = 0; i < kBN / 2; ++i) dp[i] = s[i] * (dp[i] - delta[(i >> 1) & 1]);
      PackAFrags<T>(pds, dp);
      issue_dq(j);
      if constexpr (kMods) {
        // The bias gradient: dS of every (row, key) in [T, S] this tile covers (each is visited once: one owner,
        // deterministic), into the zeroed [B, N, T, S] f32 buffer; it overlaps the dQ wgmma.
        if (p.has_bias) StoreScores<kBN / 8>(p, bp.dbias, dp, b, n, rows, s0, lane);
      }
    }
    WgmmaWait<0>();
    FenceRegs(acc_dq);
    release(num_tiles - 1);
  }

  // Epilogue: dQ * scale through this warpgroup's Q rows, 16-byte coalesced stores.
  const float dq_scale[2] = {p.scale, p.scale};
  AccToSmemRows<T, kHeadDim>(acc_dq, dq_scale, q_rows, Tr::kQPanelBytes, warp, lane);
  NamedBarrier(1 + cw, 128);
  const int valid = static_cast<int>(Max64(Min64(64, p.seqlen_q - w0), 0));
  SmemRowsToGlobal<T, kHeadDim>(q_rows, Tr::kQPanelBytes, static_cast<T*>(bp.dq) + p.QOffset(b, w0, n), p.q_row_stride,
                                valid, tid);
#endif
}

}  // namespace hopper

namespace hopper {

// The dK/dV launch: a plain one for kCluster = 1, else clusters of (kCluster, 1, 1) along the key blocks.
template <typename T, int kHeadDim, int kStages, bool kDvEarly, bool kPingPong, int kCluster, bool kMods = false>
cudaError_t LaunchDkDv(cudaStream_t stream, dim3 grid, const AttentionParams& p, const FwdPointers& ptr,
                       const BwdPointers& bp, const BwdTensorMaps& maps) {
  using Tr = DkDvTraits<kHeadDim, kStages>;
  const auto kernel = DkDvSm90Kernel<T, kHeadDim, kStages, kDvEarly, kPingPong, kCluster, kMods>;
  if constexpr (kCluster == 1) {
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, ptr, bp, maps);
    return cudaGetLastError();
  } else {
    grid.x *= kCluster;
    const ClusterLaunch launch(grid, dim3(Tr::kThreads), Tr::kSmemBytes, stream, kCluster);
    const cudaError_t err = cudaLaunchKernelEx(&launch.config, kernel, p, ptr, bp, maps);
    return err != cudaSuccess ? err : cudaGetLastError();
  }
}

// How many clusters of the dK/dV kernel fit on the current device at once (0: none, e.g. a GPU partition without
// enough SMs in one GPC; -1: the query failed). Opts the kernel into its shared memory on this device first (the
// query needs it).
template <typename T, int kHeadDim, int kStages, bool kDvEarly, bool kPingPong, int kCluster, bool kMods = false>
int DkDvActiveClusters() {
  using Tr = DkDvTraits<kHeadDim, kStages>;
  const auto kernel = DkDvSm90Kernel<T, kHeadDim, kStages, kDvEarly, kPingPong, kCluster, kMods>;
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      SetDynamicSmemOnce(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it
    return -1;
  }
  const ClusterLaunch launch(dim3(kCluster * std::max(sms, 1)), dim3(Tr::kThreads), Tr::kSmemBytes, nullptr, kCluster);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return clusters;
}

// Whether any cluster of the dK/dV kernel fits on the current device (DkDvActiveClusters > 0), asked once per
// device and instantiation (the answer depends on the device, e.g. a MIG slice); a failed query answers "no" for
// this call only and is asked again next time. Thread-safe.
template <typename T, int kHeadDim, int kStages, bool kDvEarly, bool kPingPong, int kCluster, bool kMods = false>
bool DkDvClustersFit() {
  static std::mutex mu;
  static std::map<int, bool> fits;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::lock_guard<std::mutex> lock(mu);
  const auto it = fits.find(dev);
  if (it != fits.end()) return it->second;
  const int clusters = DkDvActiveClusters<T, kHeadDim, kStages, kDvEarly, kPingPong, kCluster, kMods>();
  if (clusters < 0) return false;
  fits.emplace(dev, clusters > 0);
  return clusters > 0;
}

}  // namespace hopper

// kParts (timing experiments of ffi_cuda/tools/attention_bwd_bench.cu only; results are wrong unless 7): bit 0 the
// delta kernel, bit 1 the dK/dV kernel, bit 2 the dQ kernel. kDkDvCluster: see DkDvSm90Kernel; refused (before
// launching anything) unless it divides the group and such clusters fit on the device. kMods: the variant for
// calls with a boolean mask or a bias (refused for the others, and the others refuse these).
template <typename T, int kHeadDim, int kDkDvStages, bool kDvEarly, int kDqBlockN, int kDqStages,
          bool kPingPong = false, int kParts = 7, int kDkDvCluster = 1, bool kMods = false>
cudaError_t LaunchAttentionBwdSm90Variant(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                          const BwdPointers& bp) {
  using DkDv = hopper::DkDvTraits<kHeadDim, kDkDvStages>;
  using Dq = hopper::DqTraits<kHeadDim, kDqBlockN, kDqStages>;
  const auto dkdv_kernel = hopper::DkDvSm90Kernel<T, kHeadDim, kDkDvStages, kDvEarly, kPingPong, kDkDvCluster, kMods>;
  const auto dq_kernel = hopper::DqSm90Kernel<T, kHeadDim, kDqBlockN, kDqStages, kPingPong, kMods>;
  if (kMods != HasScoreMods(p)) return kSm90Refused;
  if (p.batch == 0 || p.num_heads == 0) return cudaSuccess;
  // Empty sequences (tensor maps need nonzero extents) and absurd loop counts go to the portable kernel.
  const int64_t q_tiles = (p.seqlen_q + DkDv::kBlockM - 1) / DkDv::kBlockM;
  if (p.seqlen_q == 0 || p.seqlen_k == 0 || q_tiles * p.group >= (int64_t{1} << 31)) return kSm90Refused;
  if (p.group % kDkDvCluster != 0) return kSm90Refused;
  cudaError_t attr_status = SetDynamicSmemOnce(reinterpret_cast<const void*>(dkdv_kernel), DkDv::kSmemBytes);
  if (attr_status == cudaSuccess)
    attr_status = SetDynamicSmemOnce(reinterpret_cast<const void*>(dq_kernel), Dq::kSmemBytes);
  if (attr_status != cudaSuccess) return attr_status;
  // A build without sm_90a machine code would run the empty (non-sm90a) bodies: refuse instead of returning garbage.
  static const bool sm90_code = KernelBinaryVersion(reinterpret_cast<const void*>(dkdv_kernel)) == 90 &&
                                KernelBinaryVersion(reinterpret_cast<const void*>(dq_kernel)) == 90;
  if (!sm90_code) return kSm90Refused;
  if constexpr (kDkDvCluster > 1) {
    if (!hopper::DkDvClustersFit<T, kHeadDim, kDkDvStages, kDvEarly, kPingPong, kDkDvCluster, kMods>())
      return kSm90Refused;
  }
  hopper::BwdTensorMaps kv_maps, q_maps;  // for the dK/dV kernel (64-query boxes) and the dQ kernel (128-row boxes)
  const int64_t B = p.batch, T_ = p.seqlen_q, S = p.seqlen_k, N = p.num_heads, K = p.num_kv_heads;
  if (!sm90::EncodeMap<T>(&kv_maps.q, ptr.q, B, T_, N, kHeadDim, DkDv::kBlockM) ||
      !sm90::EncodeMap<T>(&kv_maps.d_o, bp.d_o, B, T_, N, kHeadDim, DkDv::kBlockM) ||
      !sm90::EncodeMap<T>(&kv_maps.k, ptr.k, B, S, K, kHeadDim, DkDv::kBlockN) ||
      !sm90::EncodeMap<T>(&kv_maps.v, ptr.v, B, S, K, kHeadDim, DkDv::kBlockN) ||
      !sm90::EncodeMap<T>(&q_maps.q, ptr.q, B, T_, N, kHeadDim, Dq::kBlockM) ||
      !sm90::EncodeMap<T>(&q_maps.d_o, bp.d_o, B, T_, N, kHeadDim, Dq::kBlockM) ||
      !sm90::EncodeMap<T>(&q_maps.k, ptr.k, B, S, K, kHeadDim, Dq::kBlockN) ||
      !sm90::EncodeMap<T>(&q_maps.v, ptr.v, B, S, K, kHeadDim, Dq::kBlockN))
    return kSm90Refused;
  if (kParts & 1) {
    const int64_t threads = B * T_ * N * (kHeadDim / 8);
    const int64_t blocks = std::min<int64_t>((threads + 255) / 256, int64_t{1} << 20);
    hopper::BwdDeltaKernel<T, kHeadDim><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(p, bp);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (kParts & 2) {
    const dim3 grid(static_cast<unsigned>((S + DkDv::kBlockN - 1) / DkDv::kBlockN), static_cast<unsigned>(K),
                    static_cast<unsigned>(B));
    const cudaError_t err = hopper::LaunchDkDv<T, kHeadDim, kDkDvStages, kDvEarly, kPingPong, kDkDvCluster, kMods>(
        stream, grid, p, ptr, bp, kv_maps);
    if (err != cudaSuccess) return err;
  }
  if (kParts & 4) {
    const dim3 grid(static_cast<unsigned>((T_ + Dq::kBlockM - 1) / Dq::kBlockM), static_cast<unsigned>(N),
                    static_cast<unsigned>(B));
    dq_kernel<<<grid, Dq::kThreads, Dq::kSmemBytes, stream>>>(p, ptr, bp, q_maps);
  }
  return cudaGetLastError();
}

// The default tiling with the dK/dV cluster size `setting` (the bwd_cluster attribute: -1 = the rule, 1, 2 or 4);
// num_sms as LaunchAttentionBwdSm90's. A cluster variant that refuses (before launching anything: no cluster fits on
// this device) falls back to J = 1.
template <typename T, int kHeadDim, bool kMods = false>
cudaError_t LaunchAttentionBwdSm90Cluster(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                          const BwdPointers& bp, int setting, int num_sms = 0) {
  constexpr int kStages = kSm90BwdDkDvStages, kDqN = kSm90BwdDqBlockN<kHeadDim>;
  constexpr bool kEarly = kSm90BwdDvEarly<kHeadDim>;
  if (p.group > 1) {
    int cluster = setting;
    if (cluster < 1 || p.group % cluster != 0) {
      int sms = num_sms, dev = 0;
      if (sms <= 0 && (cudaGetDevice(&dev) != cudaSuccess ||
                       cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0)) {
        cudaGetLastError();
        sms = 132;
      }
      cluster = Sm90BwdDkDvCluster(p, sms);
    }
    cudaError_t err = kSm90Refused;
    if (cluster == 2)
      err = LaunchAttentionBwdSm90Variant<T, kHeadDim, kStages, kEarly, kDqN, kSm90BwdDqStages, false, 7, 2, kMods>(
          stream, p, ptr, bp);
    else if (cluster == 4)
      err = LaunchAttentionBwdSm90Variant<T, kHeadDim, kStages, kEarly, kDqN, kSm90BwdDqStages, false, 7, 4, kMods>(
          stream, p, ptr, bp);
    if (err != kSm90Refused) return err;  // refused before launching anything: J = 1 below
  }
  return LaunchAttentionBwdSm90Variant<T, kHeadDim, kStages, kEarly, kDqN, kSm90BwdDqStages, false, 7, 1, kMods>(
      stream, p, ptr, bp);
}

template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   const BwdPointers& bp, int cluster, int num_sms) {
  if (HasScoreMods(p)) return LaunchAttentionBwdSm90Cluster<T, kHeadDim, true>(stream, p, ptr, bp, cluster, num_sms);
  return LaunchAttentionBwdSm90Cluster<T, kHeadDim>(stream, p, ptr, bp, cluster, num_sms);
}

#define JAX_OPS_INSTANTIATE_ATTENTION_BWD_SM90(T, D)                                                          \
  template cudaError_t LaunchAttentionBwdSm90<T, D>(cudaStream_t, const AttentionParams&, const FwdPointers&, \
                                                    const BwdPointers&, int, int);

}  // namespace jax_ops::attention
