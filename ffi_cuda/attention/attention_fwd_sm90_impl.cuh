// FlashAttention forward for Hopper (sm_90a): TMA + mbarrier pipeline, wgmma, warp specialisation.
// Included once per (dtype, head dim) by instantiations/fwd_sm90{,_persistent}_<dtype>_hd<D>.cu; head dims 64 and 128.
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
// rows) as 16-byte coalesced stores.
//
// kMods: the boolean mask and the additive bias (any broadcast shape), read per element from global memory into the
// S accumulators of every tile (LineMods). The softmax then runs on log2-domain logits instead of raw scores (the
// bias breaks the "max of the scores is the max of the logits" shortcut). One CTA per block only.
//
// kPersistent: one CTA per SM instead of one per block; each CTA loops over the blocks a static heavy-first
// schedule gives it (FwdSchedule). The barriers are initialised once: the K/V ring's stage and phase carry across
// blocks, q_full flips once per block, and a "Q free" barrier (q_empty) holds the next Q load until both consumer
// warpgroups are done with the Q tile, including the epilogue that writes O through it. Each block is computed by
// the same code in the same order as without kPersistent, so the results are bitwise the same.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "arch/sm80/fast_math.cuh"
#include "arch/sm80/mma.cuh"
#include "arch/sm90/sm90.cuh"
#include "attention/attention_kernels.h"
#include "attention/tile_math.cuh"
#include "common/cuda_helpers.h"

namespace jax_ops::attention {
namespace hopper {
using jax_ops::sm80::FastExp2, jax_ops::sm80::Mma, jax_ops::sm80::PackAFrags;
// The Hopper primitives used here (arch/sm90).
using jax_ops::sm90::NamedBarrier, jax_ops::sm90::NamedBarrierArrive, jax_ops::sm90::MbarInit,
    jax_ops::sm90::FenceBarrierInit, jax_ops::sm90::MbarArriveExpectTx, jax_ops::sm90::MbarArrive,
    jax_ops::sm90::MbarWait, jax_ops::sm90::FenceProxyAsyncSmem, jax_ops::sm90::TmaLoadPanels,
    jax_ops::sm90::PrefetchTensorMap, jax_ops::sm90::EncodeMap, jax_ops::sm90::SmemDesc, jax_ops::sm90::WgmmaFence,
    jax_ops::sm90::WgmmaCommit, jax_ops::sm90::WgmmaWait, jax_ops::sm90::FenceRegs, jax_ops::sm90::RegAlloc,
    jax_ops::sm90::RegDealloc, jax_ops::sm90::Wgmma, jax_ops::sm90::WgmmaA;

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

// One CTA's unit of work: kBlockM query rows of one (batch, head) and the key tiles they see.
struct FwdTile {
  int64_t n, b, kh, m0, q_len, kv_len;
  KeyRange inner;  // keys every row of the block may see: tiles inside skip the position test
  int tile_lo, num_tiles;
};

template <int kBM, int kBN>
__device__ __forceinline__ FwdTile FwdTileOf(const AttentionParams& p, const FwdPointers& ptr, int m_block, int64_t n,
                                             int64_t b) {
  FwdTile w;
  w.n = n;
  w.b = b;
  w.kh = n / p.group;
  w.m0 = int64_t{m_block} * kBM;
  const auto [q_len, kv_len] = SeqLensOf(p, ptr, b);
  w.q_len = q_len;
  w.kv_len = kv_len;
  const BlockKeyRanges block_keys = BlockKeys(p, w.m0, kBM, q_len, kv_len);
  w.inner = block_keys.all;
  const TileRange tiles = KeyTiles(block_keys.any, kBN);
  w.tile_lo = tiles.lo;
  w.num_tiles = tiles.hi - tiles.lo;
  return w;
}

// Static schedule of the persistent kernel. Blocks in heavy-first order: query blocks from the last (under a causal
// rule the most key tiles) to the first, the (batch, head) pairs fastest. CTA c takes, in round r, block
// r * grid + c on even rounds and r * grid + grid - 1 - c on odd ones (a snake), so the CTAs that drew the heaviest
// blocks of one round draw the lightest of the next: a longest-processing-time-first balance with no global
// counter, so no workspace and nothing that depends on timing. Not cut into L2-sized head groups: uneven groups
// break the snake's pairing (docs/design/attention.md).
struct FwdSchedule {
  uint32_t num_blocks;  // m_blocks * heads * batch, < 2^30 (the launcher checks)
  uint32_t m_blocks;
  uint32_t heads;
  uint32_t hb;  // heads * batch
};

// Block `round` of this CTA in the schedule, or false when the CTA has no more.
template <int kBM, int kBN>
__device__ __forceinline__ bool ScheduledTile(const AttentionParams& p, const FwdPointers& ptr, const FwdSchedule& s,
                                              uint32_t round, FwdTile& w) {
  const uint32_t t = round * gridDim.x + ((round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
  if (t >= s.num_blocks) return false;
  const uint32_t mi = t / s.hb, hb = t - mi * s.hb;
  w = FwdTileOf<kBM, kBN>(p, ptr, static_cast<int>(s.m_blocks - 1 - mi), hb % s.heads, hb / s.heads);
  return true;
}

// The K/V ring's (stage, phase) repeats every 2 kStages tiles: a tile count kept in [kStages, 3 kStages) once it
// has reached kStages keeps the producer's "ring filled once already" test (count >= kStages) and every stage and
// parity the same, and the int small however many blocks a persistent CTA runs.
template <int kStages>
__device__ __forceinline__ int AdvanceRing(int count, int tiles) {
  count += tiles;
  return count >= 3 * kStages ? kStages + (count - kStages) % (2 * kStages) : count;
}

// kDiag (timing experiments of ffi_cuda/tools/attention_fwd_bench.cu only; results are wrong when set):
// 1 = load only the first kStages K/V tiles and reuse them (no memory traffic in the loop),
// 2 = skip the softmax arithmetic (P = S).
template <typename T, int kHeadDim, int kStagesT, int kDiag = 0, int kBlockNT = 128, bool kPersistent = false,
          bool kMods = false>
__global__ void __launch_bounds__(384, 1)
    AttentionFwdSm90Kernel(const AttentionParams p, const FwdPointers ptr, const __grid_constant__ TensorMaps maps,
                           const FwdSchedule sched) {
#if JAX_OPS_SM90
  static_assert(!kPersistent || kDiag == 0, "the timing experiments run one block per CTA");
  static_assert(!kPersistent || !kMods, "masks and bias run one block per CTA");
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
  uint64_t* q_empty = kv_empty + kStages;  // kPersistent only: the consumers are done with the Q tile
  static_assert((2 + 3 * kStages) * 8 <= Tr::kBarrierBytes, "barriers");
  const int wg = threadIdx.x / 128;

  // Without kPersistent the CTA's one block, heavy (late) causal blocks first; unused otherwise.
  const FwdTile block_tile = FwdTileOf<kBM, kBN>(p, ptr, gridDim.x - 1 - blockIdx.x, blockIdx.y, blockIdx.z);

  if (threadIdx.x == 0) {
    MbarInit(q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      MbarInit(k_full + s, 1);
      MbarInit(v_full + s, 1);
      MbarInit(kv_empty + s, 8);  // one arrival per consumer warp
    }
    if constexpr (kPersistent) MbarInit(q_empty, 8);  // one arrival per consumer warp, after its epilogue
    FenceBarrierInit();
  }
  __syncthreads();

  if (wg == 0) {
    RegDealloc<Tr::kProducerRegs>();
    // Loads of one block. `round`: the CTA's block count so far (q_full/q_empty phase); `ring`: K/V tiles loaded
    // so far (AdvanceRing), whose stage and phase continue across blocks.
    auto produce = [&](const FwdTile& w, int round, int ring) {
      // Persistent: the next Q must wait until the consumers are done with the last one (q_empty), epilogue
      // included; the first K/V tiles of the block go out before that wait, so they land during the previous
      // block's last GEMMs and epilogue.
      const int q_after = kPersistent ? min(w.num_tiles, kStages) : 0;
      auto load_q = [&] {
        if constexpr (kPersistent) {
          if (round > 0) MbarWait(q_empty, (round - 1) & 1);
          // No keys: nothing to load, but the epilogue still writes O = 0 through the Q tile, so the block takes
          // its turn on q_full/q_empty like every other (one phase per block keeps the parities unambiguous).
          if (w.num_tiles == 0) {
            MbarArrive(q_full);
            return;
          }
        }
        MbarArriveExpectTx(q_full, Tr::kQBytes);
        TmaLoadPanels<Tr::kPanels, Tr::kQPanelBytes>({sQ}, {&maps.q}, q_full, static_cast<int>(w.n),
                                                     static_cast<int>(w.m0), static_cast<int>(w.b));
      };
      if (q_after == 0) load_q();
      for (int j = 0; j < (kDiag == 1 ? min(w.num_tiles, kStages) : w.num_tiles); ++j) {
        const int g = ring + j;
        const int stage = g % kStages;
        if (g >= kStages) MbarWait(kv_empty + stage, ((g / kStages) - 1) & 1);
        const int s0 = (w.tile_lo + j) * kBN;
        unsigned char* k_dst = sK + stage * Tr::kKvBytes;
        unsigned char* v_dst = sV + stage * Tr::kKvBytes;
        MbarArriveExpectTx(k_full + stage, Tr::kKvBytes);
        TmaLoadPanels<Tr::kPanels, Tr::kKvPanelBytes>({k_dst}, {&maps.k}, k_full + stage, static_cast<int>(w.kh), s0,
                                                      static_cast<int>(w.b));
        MbarArriveExpectTx(v_full + stage, Tr::kKvBytes);
        TmaLoadPanels<Tr::kPanels, Tr::kKvPanelBytes>({v_dst}, {&maps.v}, v_full + stage, static_cast<int>(w.kh), s0,
                                                      static_cast<int>(w.b));
        if (j + 1 == q_after) load_q();
      }
    };
    if constexpr (kPersistent) {
      if (threadIdx.x == 0) {
        PrefetchTensorMap(&maps.q);
        PrefetchTensorMap(&maps.k);
        PrefetchTensorMap(&maps.v);
        FwdTile w;
        int ring = 0;
        for (int round = 0; ScheduledTile<kBM, kBN>(p, ptr, sched, round, w); ++round) {
          produce(w, round, ring);
          ring = AdvanceRing<kStages>(ring, w.num_tiles);
        }
      }
    } else if (threadIdx.x == 0 && block_tile.num_tiles > 0) {
      PrefetchTensorMap(&maps.q);
      PrefetchTensorMap(&maps.k);
      PrefetchTensorMap(&maps.v);
      produce(block_tile, 0, 0);
    }
    return;
  }

  RegAlloc<Tr::kConsumerRegs>();
  const int cw = wg - 1;                   // consumer warpgroup: query rows [64 cw, 64 cw + 64) of the block
  const int tid = threadIdx.x - 128 * wg;  // thread in the warpgroup
  const int warp = tid >> 5, lane = tid & 31;

  // One block: `round` and `ring` as for the producer.
  auto consume = [&](const FwdTile& w, int round, int ring) {
    const int64_t n = w.n, b = w.b, m0 = w.m0;
    const int64_t q_len = w.q_len, kv_len = w.kv_len;
    const KeyRange inner = w.inner;
    const int tile_lo = w.tile_lo, num_tiles = w.num_tiles;
    const int row_in_block = cw * 64 + warp * 16 + (lane >> 2);
    const int64_t rows[2] = {m0 + row_in_block, m0 + row_in_block + 8};
    KeyRange row_keys[2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
      row_keys[i] = rows[i] < p.seqlen_q ? AllowedKeys(p, rows[i], q_len, kv_len) : KeyRange{0, 0};

    float acc_o[kHeadDim / 2];
#pragma unroll
    for (int i = 0; i < kHeadDim / 2; ++i) acc_o[i] = 0.f;
    // Of the raw scores (scale > 0: Sm90FwdSupports), or with kMods of the log2-domain logits.
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};
    const float scale_log2 = p.scale * kLog2e;
    // The factor from row_max's domain to the log2 domain.
    const float max_log2 = kMods ? 1.f : scale_log2;

    unsigned char* q_rows = sQ + cw * 64 * 128;  // this warpgroup's 64 rows in each Q panel

    float s[kBN / 2];          // S (then P, fp32) of the current tile
    uint32_t pa[kBN / 16][4];  // P of the previous tile packed to T: the A operand of O += P V
    // S = Q K^T of tile j: k16 steps along the head dim; a 128-byte panel holds 4 of them (32 bytes apart).
    auto issue_s = [&](int j) {
      const unsigned char* k_tile = sK + ((ring + j) % kStages) * Tr::kKvBytes;
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kHeadDim / 16; ++ks) {
        const int off = (ks / 4) * Tr::kQPanelBytes + (ks % 4) * 32;
        const int koff = (ks / 4) * Tr::kKvPanelBytes + (ks % 4) * 32;
        Wgmma<T, kBN, WgmmaA::kSmem>::Run(s, SmemDesc(q_rows + off, 16, 1024), SmemDesc(k_tile + koff, 16, 1024),
                                          ks > 0);
      }
      WgmmaCommit();
    };
    // O += P V of tile j: k16 steps along the keys (16 rows of 128 bytes); V is MN-major (head dim contiguous),
    // its 64-element panels kKvPanelBytes apart.
    auto issue_pv = [&](int j) {
      const int g = ring + j;
      const unsigned char* v_tile = sV + (g % kStages) * Tr::kKvBytes;
      if (kDiag != 1 || j < kStages) MbarWait(v_full + g % kStages, (g / kStages) & 1);
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kBN / 16; ++ks)
        Wgmma<T, kHeadDim, WgmmaA::kRegs>::Run(acc_o, pa[ks], SmemDesc(v_tile + ks * 2048, Tr::kKvPanelBytes, 1024), 1);
      WgmmaCommit();
    };
    auto release = [&](int j) {
      __syncwarp();
      if (lane == 0) MbarArrive(kv_empty + (ring + j) % kStages);
    };
    // Scale to the log2 domain, mask, online-softmax update of tile j's S in place (S becomes P); returns the
    // rescale factors of O and of the running sums in corr.
    // masked (std::true_type / std::false_type): a boundary tile, whose elements need the position test. Two
    // instantiations behind a uniform branch (softmax_tile), so interior tiles carry no masking code: written as one
    // body, the compiler if-converts the test into ~200 predicated instructions per tile on every tile.
    auto softmax = [&](int j, float (&corr)[2], const RowMaskWords<kNT>& words, auto masked) {
      if constexpr (kDiag == 2) {
        corr[0] = corr[1] = 1.f;
        return;
      }
      const int64_t s0 = int64_t{tile_lo + j} * kBN;
      // Column c of the tile is allowed for row i when lo[i] <= c < hi[i] (tile-relative, clamped to [0, kBN], so
      // the per-element test is two 32-bit compares).
      int lo[2] = {0, 0}, hi[2] = {kBN, kBN};
      if constexpr (decltype(masked)::value) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          lo[i] = static_cast<int>(Min64(Max64(row_keys[i].lo - s0, 0), kBN));
          hi[i] = static_cast<int>(Min64(Max64(row_keys[i].hi - s0, 0), kBN));
        }
      }
      if constexpr (kMods) {
        // Mask and bias at the allowed positions only (the others are outside the row's keys, maybe past S). The
        // row pointers are made per tile from live values: kept across the loop they would spill.
        const LineMods mods[2] = {RowModsOf(p, ptr, b, n, rows[0]), RowModsOf(p, ptr, b, n, rows[1])};
        ApplyRowMods<T, decltype(masked)::value, kNT>(p, ptr, s, mods, words, lo, hi, s0, lane, scale_log2);
      } else if constexpr (decltype(masked)::value) {
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
        // one FFMA + one ex2: exp2(s * scale_log2 - max * scale_log2) (max_log2 = 1 with kMods).
        const float new_max = fmaxf(row_max[i], mx);
        const float offset = new_max == -INFINITY ? 0.f : new_max * max_log2;  // no -inf - -inf
        corr[i] = FastExp2(fmaf(row_max[i], max_log2, -offset));
        row_max[i] = new_max;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          s[nt * 4 + 2 * i] = FastExp2(fmaf(s[nt * 4 + 2 * i], max_log2, -offset));
          s[nt * 4 + 2 * i + 1] = FastExp2(fmaf(s[nt * 4 + 2 * i + 1], max_log2, -offset));
          sum += s[nt * 4 + 2 * i] + s[nt * 4 + 2 * i + 1];
        }
        row_sum[i] = row_sum[i] * corr[i] + sum;
      }
    };
    auto softmax_tile = [&](int j, float (&corr)[2], const RowMaskWords<kNT>& words) {
      const int64_t s0 = int64_t{tile_lo + j} * kBN;
      if (s0 >= inner.lo && s0 + kBN <= inner.hi) {
        softmax(j, corr, words, std::false_type{});
      } else {
        softmax(j, corr, words, std::true_type{});
      }
    };
    // kMods: tile j's mask words (and its bias lines into L1), issued while its S wgmma runs.
    auto prefetch_mods = [&](int j) {
      RowMaskWords<kNT> words{};
      if constexpr (kMods) {
        const LineMods mods[2] = {RowModsOf(p, ptr, b, n, rows[0]), RowModsOf(p, ptr, b, n, rows[1])};
        words = PrefetchRowMods<T, kNT>(p, ptr, mods, int64_t{tile_lo + j} * kBN, lane);
      }
      return words;
    };
    auto rescale_o_and_pack_p = [&](const float (&corr)[2]) {
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        acc_o[dt * 4 + 0] *= corr[0];
        acc_o[dt * 4 + 1] *= corr[0];
        acc_o[dt * 4 + 2] *= corr[1];
        acc_o[dt * 4 + 3] *= corr[1];
      }
      PackAFrags<T>(pa, s);
    };

    // Schedule (FlashAttention-3 style): the two consumer warpgroups take turns issuing their GEMMs (named
    // barriers 3 and 4: "ping-pong"), so one's softmax runs while the other's GEMMs use the tensor cores; inside a
    // warpgroup, S(j) = Q K(j)^T is issued together with O += P(j-1) V(j-1) and the softmax of S(j) overlaps that
    // PV GEMM. Each warpgroup syncs once per tile on its own barrier and arrives once on the other's; warpgroup 1
    // opens the first turn for warpgroup 0 and skips its last arrival, so the counts match.
    const int my_turn = 3 + cw, other_turn = 4 - cw;
    // Persistent: every block, keys or not, waits for its Q phase (its epilogue reuses the Q tile).
    if constexpr (kPersistent) MbarWait(q_full, round & 1);
    if (num_tiles > 0) {
      if constexpr (!kPersistent) MbarWait(q_full, 0);
      if (cw == 1) NamedBarrierArrive(3, 256);
      float corr[2];
      // Tile 0: S only.
      MbarWait(k_full + ring % kStages, (ring / kStages) & 1);
      NamedBarrier(my_turn, 256);
      issue_s(0);
      if (!(cw == 1 && num_tiles == 1)) NamedBarrierArrive(other_turn, 256);
      RowMaskWords<kNT> words = prefetch_mods(0);
      WgmmaWait<0>();
      FenceRegs(s);
      softmax_tile(0, corr, words);
      rescale_o_and_pack_p(corr);
      for (int j = 1; j < num_tiles; ++j) {
        if (kDiag != 1 || j < kStages) MbarWait(k_full + (ring + j) % kStages, ((ring + j) / kStages) & 1);
        NamedBarrier(my_turn, 256);
        issue_s(j);
        issue_pv(j - 1);
        if (!(cw == 1 && j == num_tiles - 1)) NamedBarrierArrive(other_turn, 256);
        words = prefetch_mods(j);
        WgmmaWait<1>();  // S(j) done; PV(j-1) may still run (it reads pa, untouched until it ends)
        FenceRegs(s);
        softmax_tile(j, corr, words);
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
    RowEnd end[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float l = QuadSum(row_sum[i]);
      end[i] = EndRow(l);
      if ((lane & 3) == 0 && rows[i] < p.seqlen_q)
        ptr.lse[p.LseOffset(b, n, rows[i])] = end[i].empty ? -INFINITY : (row_max[i] * max_log2 + log2f(l)) / kLog2e;
    }
    if constexpr (kPersistent) {
      // The staging below overwrites Q rows that other warps of this warpgroup read in the previous block's
      // copy-out. q_empty -> producer -> q_full already orders the two, but compute-sanitizer's racecheck does not
      // follow that mbarrier chain and reported the pair as a hazard; this warpgroup barrier (same id as the one
      // after the staging) makes the order explicit, at one bar.sync per block and warpgroup.
      NamedBarrier(1 + cw, 128);
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
            Mma<T>::Pack(end[i].Out(acc_o[dt * 4 + 2 * i]), end[i].Out(acc_o[dt * 4 + 2 * i + 1]));
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
    if constexpr (kPersistent) {
      // Q free: this warp's reads and writes of the Q tile are done (the fence orders them before the producer's
      // next TMA write of it); 8 warps arrive once per block.
      FenceProxyAsyncSmem();
      __syncwarp();
      if (lane == 0) MbarArrive(q_empty);
    }
  };

  if constexpr (kPersistent) {
    FwdTile w;
    int ring = 0;
    for (int round = 0; ScheduledTile<kBM, kBN>(p, ptr, sched, round, w); ++round) {
      consume(w, round, ring);
      ring = AdvanceRing<kStages>(ring, w.num_tiles);
    }
  } else {
    consume(block_tile, 0, 0);
  }
#endif
}

}  // namespace hopper

template <typename T, int kHeadDim, int kStages, int kDiag, int kBlockN, bool kPersistent, bool kMods>
cudaError_t LaunchAttentionFwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   int num_ctas) {
  using Tr = hopper::FwdTraits<kHeadDim, kStages, kBlockN>;
  const auto kernel = hopper::AttentionFwdSm90Kernel<T, kHeadDim, kStages, kDiag, kBlockN, kPersistent, kMods>;
  if (kMods != HasScoreMods(p)) return kSm90Refused;  // a call has exactly one variant
  if (p.batch == 0 || p.seqlen_q == 0 || p.num_heads == 0) return cudaSuccess;
  const cudaError_t attr_status = SetDynamicSmemOnce(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes);
  if (attr_status != cudaSuccess) return attr_status;
  // A build without sm_90a machine code would run the empty (non-sm90a) body: refuse instead of returning garbage.
  static const int binary_version = KernelBinaryVersion(reinterpret_cast<const void*>(kernel));
  if (binary_version != 90) return kSm90Refused;
  hopper::TensorMaps maps;
  if (!sm90::EncodeMap<T>(&maps.q, ptr.q, p.batch, p.seqlen_q, p.num_heads, kHeadDim, Tr::kBlockM) ||
      !sm90::EncodeMap<T>(&maps.k, ptr.k, p.batch, p.seqlen_k, p.num_kv_heads, kHeadDim, Tr::kBlockN) ||
      !sm90::EncodeMap<T>(&maps.v, ptr.v, p.batch, p.seqlen_k, p.num_kv_heads, kHeadDim, Tr::kBlockN))
    return kSm90Refused;
  const int64_t m_blocks = (p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.batch));
  hopper::FwdSchedule sched{};
  if constexpr (kPersistent) {
    const int64_t hb = p.num_heads * p.batch, blocks = m_blocks * hb;
    if (blocks >= (int64_t{1} << 30)) return kSm90Refused;  // the schedule's 32-bit block index
    int device = 0, sms = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    // One CTA per SM is what fits (shared memory, and 384 threads at __launch_bounds__(384, 1)).
    const int64_t ctas = num_ctas > 0 ? num_ctas : sms;
    grid = dim3(static_cast<unsigned>(std::min(blocks, std::max<int64_t>(ctas, 1))));
    sched = hopper::FwdSchedule{static_cast<uint32_t>(blocks), static_cast<uint32_t>(m_blocks),
                                static_cast<uint32_t>(p.num_heads), static_cast<uint32_t>(hb)};
  }
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, ptr, maps, sched);
  return cudaGetLastError();
}

// The library's three variants of one dtype and head dim, one per file: one CTA per block or persistent
// (Sm90FwdUsePersistent picks) without mask and bias, and one CTA per block with them (kMods).
#define JAX_OPS_INSTANTIATE_ATTENTION_FWD_SM90(T, D, kPersistent, kMods)                         \
  template cudaError_t LaunchAttentionFwdSm90<T, D, kSm90FwdStages, 0, 128, kPersistent, kMods>( \
      cudaStream_t, const AttentionParams&, const FwdPointers&, int);

}  // namespace jax_ops::attention
