// FlashAttention forward for Hopper (sm_90a): TMA + mbarrier pipeline, wgmma, warp specialisation.
// Included once per (dtype, head dim) by attention_fwd_sm90_kernels_<dtype>_hd<D>.cu; head dims 64 and 128.
//
// CTA = 3 warpgroups for 128 query rows of one (batch, head):
//   warpgroup 0, the producer: one thread issues TMA loads of Q (once) and of K/V tiles (kBlockN keys) into a
//     kStages-deep ring; it gives its registers to the consumers (setmaxnreg).
//   warpgroups 1 and 2, the consumers: 64 query rows each. Per key tile: S = Q Kᵀ (wgmma, both operands in
//     shared memory), scale/mask/online softmax in registers (fp32 m, l, O; log2 domain), O += P V (wgmma with P
//     from registers: the S accumulator layout is wgmma's A-register layout), then release the stage.
//     The two consumer warpgroups interleave naturally: one's softmax overlaps the other's GEMMs.
// K/V stages have separate "K full" and "V full" barriers, so Q Kᵀ starts while V is still landing.
// Tiles wholly outside the allowed key range are never loaded; tiles wholly inside skip the position test.
// Out-of-range rows/keys (tails) are zero-filled by TMA. O goes back through shared memory (the consumer's own Q
// rows) as 16-byte coalesced stores. No bias or boolean mask here: the launcher routes those to the sm_80 kernel.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "attention/attention_kernels.h"
#include "attention/attention_mma.cuh"
#include "attention/attention_sm90.cuh"
#include "common/cuda_helpers.h"

namespace jax_ops::attention {
namespace sm90 {

template <int kHeadDim, int kStagesT = 2, int kBlockNT = 128>
struct FwdTraits {
  static constexpr int kBlockM = 128;  // two consumer warpgroups x 64 rows
  static constexpr int kBlockN = kBlockNT;
  static constexpr int kStages = kStagesT;
  static constexpr int kThreads = 384;
  static constexpr int kPanels = kHeadDim / 64;        // 64-element (128-byte) column panels of a head row
  static constexpr int kQPanelBytes = kBlockM * 128;   // one panel of the Q tile
  static constexpr int kKvPanelBytes = kBlockN * 128;  // one panel of a K or V tile
  static constexpr int kQBytes = kPanels * kQPanelBytes;
  static constexpr int kKvBytes = kPanels * kKvPanelBytes;
  static constexpr int kBarrierBytes = 128;
  // + 1 KiB so the tiles can start on a 1024-byte boundary (the swizzle atom).
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + kBarrierBytes + 1024;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
};

struct TensorMaps {
  CUtensorMap q, k, v;
};

// kDiag (timing experiments of ffi_cuda/tools/attention_fwd_bench.cu only; results are wrong when set):
// 1 = load only the first kStages K/V tiles and reuse them (no memory traffic in the loop),
// 2 = skip the softmax arithmetic (P = S).
template <typename T, int kHeadDim, int kStagesT, int kDiag = 0, int kBlockNT = 128>
__global__ void __launch_bounds__(384, 1)
    AttentionFwdSm90Kernel(const AttentionParams p, const FwdPointers ptr, const __grid_constant__ TensorMaps maps) {
#if JAX_OPS_SM90
  using Tr = FwdTraits<kHeadDim, kStagesT, kBlockNT>;
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kStages = Tr::kStages;
  constexpr int kNT = kBN / 8;  // 8-column tiles of S per thread row pair
  constexpr int kDT = kHeadDim / 8;
  constexpr float kLog2e = 1.4426950408889634f;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + Tr::kQBytes;
  unsigned char* sV = sK + kStages * Tr::kKvBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sV + kStages * Tr::kKvBytes);
  uint64_t* q_full = bars;
  uint64_t* k_full = bars + 1;
  uint64_t* v_full = k_full + kStages;
  uint64_t* kv_empty = v_full + kStages;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heavy (late) causal blocks first
  const int64_t n = blockIdx.y, b = blockIdx.z;
  const int64_t kh = n / p.group;
  const int64_t m0 = int64_t{m_block} * kBM;
  const int wg = threadIdx.x / 128;

  const auto [q_len, kv_len] = SeqLensOf(p, ptr, b);
  const BlockKeyRanges block_keys = BlockKeys(p, m0, kBM, q_len, kv_len);
  const KeyRange inner = block_keys.all;
  const TileRange tiles = KeyTiles(block_keys.any, kBN);
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
      PrefetchTensorMap(&maps.q);
      PrefetchTensorMap(&maps.k);
      PrefetchTensorMap(&maps.v);
      MbarArriveExpectTx(q_full, Tr::kQBytes);
      for (int pn = 0; pn < Tr::kPanels; ++pn)
        TmaLoad4d(sQ + pn * Tr::kQPanelBytes, &maps.q, q_full, pn * 64, static_cast<int>(n), static_cast<int>(m0),
                  static_cast<int>(b));
      for (int j = 0; j < (kDiag == 1 ? min(num_tiles, kStages) : num_tiles); ++j) {
        const int stage = j % kStages;
        if (j >= kStages) MbarWait(kv_empty + stage, ((j / kStages) - 1) & 1);
        const int s0 = (tile_lo + j) * kBN;
        unsigned char* k_dst = sK + stage * Tr::kKvBytes;
        unsigned char* v_dst = sV + stage * Tr::kKvBytes;
        MbarArriveExpectTx(k_full + stage, Tr::kKvBytes);
        for (int pn = 0; pn < Tr::kPanels; ++pn)
          TmaLoad4d(k_dst + pn * Tr::kKvPanelBytes, &maps.k, k_full + stage, pn * 64, static_cast<int>(kh), s0,
                    static_cast<int>(b));
        MbarArriveExpectTx(v_full + stage, Tr::kKvBytes);
        for (int pn = 0; pn < Tr::kPanels; ++pn)
          TmaLoad4d(v_dst + pn * Tr::kKvPanelBytes, &maps.v, v_full + stage, pn * 64, static_cast<int>(kh), s0,
                    static_cast<int>(b));
      }
    }
    return;
  }

  RegAlloc<Tr::kConsumerRegs>();
  const int cw = wg - 1;                   // consumer warpgroup: query rows [64 cw, 64 cw + 64) of the block
  const int tid = threadIdx.x - 128 * wg;  // thread in the warpgroup
  const int warp = tid >> 5, lane = tid & 31;
  const int row_in_block = cw * 64 + warp * 16 + (lane >> 2);
  const int64_t rows[2] = {m0 + row_in_block, m0 + row_in_block + 8};
  KeyRange row_keys[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    row_keys[i] = rows[i] < p.seqlen_q ? AllowedKeys(p, rows[i], q_len, kv_len) : KeyRange{0, 0};

  float acc_o[kHeadDim / 2];
#pragma unroll
  for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // of the raw scores (scale > 0: Sm90FwdSupports)
  float row_sum[2] = {0.f, 0.f};
  const float scale_log2 = p.scale * kLog2e;

  unsigned char* q_rows = sQ + cw * 64 * 128;  // this warpgroup's 64 rows in each Q panel

  float s[kBN / 2];          // S (then P, fp32) of the current tile
  uint32_t pa[kBN / 16][4];  // P of the previous tile packed to T: the A operand of O += P V
  // S = Q K^T of tile j: k16 steps along the head dim; a 128-byte panel holds 4 of them (32 bytes apart).
  auto issue_s = [&](int j) {
    const unsigned char* k_tile = sK + (j % kStages) * Tr::kKvBytes;
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      const int off = (ks / 4) * Tr::kQPanelBytes + (ks % 4) * 32;
      const int koff = (ks / 4) * Tr::kKvPanelBytes + (ks % 4) * 32;
      Wgmma<T, kBN, WgmmaA::kSmem>::Run(s, SmemDesc(q_rows + off, 16, 1024), SmemDesc(k_tile + koff, 16, 1024), ks > 0);
    }
    WgmmaCommit();
  };
  // O += P V of tile j: k16 steps along the keys (16 rows of 128 bytes); V is MN-major (head dim contiguous),
  // its 64-element panels kKvPanelBytes apart.
  auto issue_pv = [&](int j) {
    const unsigned char* v_tile = sV + (j % kStages) * Tr::kKvBytes;
    if (kDiag != 1 || j < kStages) MbarWait(v_full + j % kStages, (j / kStages) & 1);
    WgmmaFence();
#pragma unroll
    for (int ks = 0; ks < kBN / 16; ++ks)
      Wgmma<T, kHeadDim, WgmmaA::kRegs>::Run(acc_o, pa[ks], SmemDesc(v_tile + ks * 2048, Tr::kKvPanelBytes, 1024), 1);
    WgmmaCommit();
  };
  auto release = [&](int j) {
    __syncwarp();
    if (lane == 0) MbarArrive(kv_empty + j % kStages);
  };
  // Scale to the log2 domain, mask, online-softmax update of tile j's S in place (S becomes P); returns the
  // rescale factors of O and of the running sums in corr.
  // masked (std::true_type / std::false_type): a boundary tile, whose elements need the position test. Two
  // instantiations behind a uniform branch (softmax_tile), so interior tiles carry no masking code: written as one
  // body, the compiler if-converts the test into ~200 predicated instructions per tile on every tile.
  auto softmax = [&](int j, float (&corr)[2], auto masked) {
    if constexpr (kDiag == 2) {
      corr[0] = corr[1] = 1.f;
      return;
    }
    const int64_t s0 = int64_t{tile_lo + j} * kBN;
    // Column c of the tile is allowed for row i when lo[i] <= c < hi[i] (tile-relative, clamped to [0, kBN], so
    // the per-element test is two 32-bit compares).
    if constexpr (decltype(masked)::value) {
      int lo[2], hi[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        lo[i] = static_cast<int>(Min64(Max64(row_keys[i].lo - s0, 0), kBN));
        hi[i] = static_cast<int>(Min64(Max64(row_keys[i].hi - s0, 0), kBN));
      }
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nt * 8 + (lane & 3) * 2 + (e & 1);
          if (c < lo[e >> 1] || c >= hi[e >> 1]) s[nt * 4 + e] = -INFINITY;
        }
      }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * i], s[nt * 4 + 2 * i + 1]));
      mx = QuadMax(mx);
      // The max of the raw scores scales to the max of the logits because scale > 0, so each probability is
      // one FFMA + one ex2: exp2(s * scale_log2 - max * scale_log2).
      const float new_max = fmaxf(row_max[i], mx);
      const float offset = new_max == -INFINITY ? 0.f : new_max * scale_log2;  // no -inf - -inf
      corr[i] = FastExp2(fmaf(row_max[i], scale_log2, -offset));
      row_max[i] = new_max;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        s[nt * 4 + 2 * i] = FastExp2(fmaf(s[nt * 4 + 2 * i], scale_log2, -offset));
        s[nt * 4 + 2 * i + 1] = FastExp2(fmaf(s[nt * 4 + 2 * i + 1], scale_log2, -offset));
        sum += s[nt * 4 + 2 * i] + s[nt * 4 + 2 * i + 1];
      }
      row_sum[i] = row_sum[i] * corr[i] + sum;
    }
  };
  auto softmax_tile = [&](int j, float (&corr)[2]) {
    const int64_t s0 = int64_t{tile_lo + j} * kBN;
    if (s0 >= inner.lo && s0 + kBN <= inner.hi) {
      softmax(j, corr, std::false_type{});
    } else {
      softmax(j, corr, std::true_type{});
    }
  };
  auto rescale_o_and_pack_p = [&](const float (&corr)[2]) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      acc_o[dt * 4 + 0] *= corr[0];
      acc_o[dt * 4 + 1] *= corr[0];
      acc_o[dt * 4 + 2] *= corr[1];
      acc_o[dt * 4 + 3] *= corr[1];
    }
#pragma unroll
    for (int ks = 0; ks < kBN / 16; ++ks) {
      pa[ks][0] = Mma<T>::Pack(s[ks * 8 + 0], s[ks * 8 + 1]);
      pa[ks][1] = Mma<T>::Pack(s[ks * 8 + 2], s[ks * 8 + 3]);
      pa[ks][2] = Mma<T>::Pack(s[ks * 8 + 4], s[ks * 8 + 5]);
      pa[ks][3] = Mma<T>::Pack(s[ks * 8 + 6], s[ks * 8 + 7]);
    }
  };

  // Schedule (FlashAttention-3 style): the two consumer warpgroups take turns issuing their GEMMs (named
  // barriers 3 and 4: "ping-pong"), so one's softmax runs while the other's GEMMs use the tensor cores; inside a
  // warpgroup, S(j) = Q K(j)^T is issued together with O += P(j-1) V(j-1) and the softmax of S(j) overlaps that
  // PV GEMM. Each warpgroup syncs once per tile on its own barrier and arrives once on the other's; warpgroup 1
  // opens the first turn for warpgroup 0 and skips its last arrival, so the counts match.
  const int my_turn = 3 + cw, other_turn = 4 - cw;
  if (num_tiles > 0) {
    MbarWait(q_full, 0);
    if (cw == 1) NamedBarrierArrive(3, 256);
    float corr[2];
    // Tile 0: S only.
    MbarWait(k_full, 0);
    NamedBarrier(my_turn, 256);
    issue_s(0);
    if (!(cw == 1 && num_tiles == 1)) NamedBarrierArrive(other_turn, 256);
    WgmmaWait<0>();
    FenceRegs(s);
    softmax_tile(0, corr);
    rescale_o_and_pack_p(corr);
    for (int j = 1; j < num_tiles; ++j) {
      if (kDiag != 1 || j < kStages) MbarWait(k_full + j % kStages, (j / kStages) & 1);
      NamedBarrier(my_turn, 256);
      issue_s(j);
      issue_pv(j - 1);
      if (!(cw == 1 && j == num_tiles - 1)) NamedBarrierArrive(other_turn, 256);
      WgmmaWait<1>();  // S(j) done; PV(j-1) may still run (it reads pa, untouched until it ends)
      FenceRegs(s);
      softmax_tile(j, corr);
      WgmmaWait<0>();
      FenceRegs(acc_o);
      release(j - 1);
      rescale_o_and_pack_p(corr);
    }
    issue_pv(num_tiles - 1);
    WgmmaWait<0>();
    FenceRegs(acc_o);
    release(num_tiles - 1);
  }

  // Epilogue: O / l into this warpgroup's Q rows (swizzled like the tile), then 16-byte coalesced stores.
  float inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = QuadSum(row_sum[i]);
    inv[i] = l > 0.f ? 1.f / l : 0.f;
    if ((lane & 3) == 0 && rows[i] < p.seqlen_q)
      ptr.lse[p.LseOffset(b, n, rows[i])] = l > 0.f ? row_max[i] * p.scale + log2f(l) / kLog2e : -INFINITY;
  }
#pragma unroll
  for (int dt = 0; dt < kDT; ++dt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp * 16 + (lane >> 2) + 8 * i;  // row within the warpgroup's 64
      const int d = dt * 8 + (lane & 3) * 2;
      const int chunk = (d & 63) >> 3;
      unsigned char* dst = q_rows + (d >> 6) * Tr::kQPanelBytes + r * 128 + ((chunk ^ (r & 7)) << 4) + (d & 7) * 2;
      *reinterpret_cast<uint32_t*>(dst) =
          Mma<T>::Pack(acc_o[dt * 4 + 2 * i] * inv[i], acc_o[dt * 4 + 2 * i + 1] * inv[i]);
    }
  }
  NamedBarrier(1 + cw, 128);
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  T* o = static_cast<T*>(ptr.o);
  for (int idx = tid; idx < 64 * kChunks; idx += 128) {
    const int r = idx / kChunks, c = idx % kChunks;
    const int64_t t = m0 + cw * 64 + r;
    if (t >= p.seqlen_q) continue;
    const unsigned char* src = q_rows + (c >> 3) * Tr::kQPanelBytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(o + p.QOffset(b, t, n) + c * 8) = *reinterpret_cast<const uint4*>(src);
  }
#endif
}

}  // namespace sm90

template <typename T, int kHeadDim, int kStages, int kDiag, int kBlockN>
cudaError_t LaunchAttentionFwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr) {
  using Tr = sm90::FwdTraits<kHeadDim, kStages, kBlockN>;
  if (p.batch == 0 || p.seqlen_q == 0 || p.num_heads == 0) return cudaSuccess;
  const cudaError_t attr_status = SetDynamicSmemOnce(
      reinterpret_cast<const void*>(&sm90::AttentionFwdSm90Kernel<T, kHeadDim, kStages, kDiag, kBlockN>),
      Tr::kSmemBytes);
  if (attr_status != cudaSuccess) return attr_status;
  // A build without sm_90a machine code would run the empty (non-sm90a) body: refuse instead of returning garbage.
  static const int binary_version = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, sm90::AttentionFwdSm90Kernel<T, kHeadDim, kStages, kDiag, kBlockN>) ==
                   cudaSuccess
               ? attr.binaryVersion
               : 0;
  }();
  if (binary_version != 90) return kSm90Refused;
  sm90::TensorMaps maps;
  if (!sm90::EncodeMap<T>(&maps.q, ptr.q, p.batch, p.seqlen_q, p.num_heads, kHeadDim, Tr::kBlockM) ||
      !sm90::EncodeMap<T>(&maps.k, ptr.k, p.batch, p.seqlen_k, p.num_kv_heads, kHeadDim, Tr::kBlockN) ||
      !sm90::EncodeMap<T>(&maps.v, ptr.v, p.batch, p.seqlen_k, p.num_kv_heads, kHeadDim, Tr::kBlockN))
    return kSm90Refused;
  const int64_t m_blocks = (p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.batch));
  sm90::AttentionFwdSm90Kernel<T, kHeadDim, kStages, kDiag, kBlockN>
      <<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, ptr, maps);
  return cudaGetLastError();
}

#define JAX_OPS_INSTANTIATE_ATTENTION_FWD_SM90(T, D)                                                      \
  template cudaError_t LaunchAttentionFwdSm90<T, D, kSm90FwdStages>(cudaStream_t, const AttentionParams&, \
                                                                    const FwdPointers&);

}  // namespace jax_ops::attention
