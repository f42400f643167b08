// FlashAttention forward (online softmax) with mma.sync m16n8k16 tensor-core tiles: the portable sm_80+ path.
// Included once per (dtype, head dim) by instantiations/fwd_<dtype>_hd<D>.cu.
//
// CTA = 4 warps = 64 query rows of one (batch, head); each warp owns 16 rows. K/V tiles of kBlockN keys stream
// through shared memory with cp.async: V(j) loads while S = Q K(j)^T computes, K(j+1) loads while O += P V(j)
// computes. Softmax state (m, l, O) is fp32 in registers, in the log2 domain (exp2 of scale*log2e*logit).
// Shared-memory rows are XOR-swizzled in 16-byte chunks so ldmatrix reads of 8 rows hit 8 different bank
// groups. Tiles wholly outside the allowed key range (causal, window, seq lengths) are skipped; tiles wholly
// inside skip the per-element position test. Heavy causal CTAs (late query blocks) are scheduled first.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "arch/sm80/cp_async.cuh"
#include "arch/sm80/ldmatrix.cuh"
#include "arch/sm80/mma.cuh"
#include "attention/attention_kernels.h"
#include "attention/tile_math.cuh"
#include "common/cuda_helpers.h"
#include "common/dtype_traits.h"

namespace jax_ops::attention {
namespace {
using sm80::CpAsyncCommit, sm80::CpAsyncWait, sm80::LdMatrixX4, sm80::Mma;

template <int kHeadDim>
struct FwdTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlockM = 16 * kWarps;
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kChunks = kHeadDim / 8;              // 16-byte chunks of a head row
  static constexpr int kPitch = (kHeadDim + 63) / 64 * 64;  // smem row pitch (elements): whole 8-chunk groups
  static constexpr bool kQInRegs = kHeadDim <= 128;
  static constexpr int kSmemBytes = (kBlockM + 2 * kBlockN) * kPitch * 2;
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(FwdTraits<kHeadDim>::kThreads, 2)
    AttentionFwdKernel(const AttentionParams p, const FwdPointers ptr) {
  using Tr = FwdTraits<kHeadDim>;
  constexpr int kBM = Tr::kBlockM, kBN = Tr::kBlockN, kP = Tr::kPitch;
  constexpr int kNT = kBN / 8;        // n-tiles of S per warp
  constexpr int kDT = kHeadDim / 8;   // d-tiles of O per warp
  constexpr int kKS = kHeadDim / 16;  // k-steps of Q K^T
  constexpr float kLog2e = 1.4426950408889634f;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + kBM * kP;
  T* sV = sK + kBN * kP;

  const int m_block = gridDim.x - 1 - blockIdx.x;  // heavy (late) causal blocks first
  const int64_t n = blockIdx.y, b = blockIdx.z;
  const int64_t kh = n / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t m0 = int64_t{m_block} * kBM;

  const auto [q_len, kv_len] = SeqLensOf(p, ptr, b);

  const BlockKeyRanges block_keys = BlockKeys(p, m0, kBM, q_len, kv_len);
  const KeyRange inner = block_keys.all;  // tiles inside need no per-element position test

  const T* q = static_cast<const T*>(ptr.q) + p.QOffset(b, m0, n);
  const T* k = static_cast<const T*>(ptr.k) + p.KOffset(b, 0, kh);
  const T* v = static_cast<const T*>(ptr.v) + p.KOffset(b, 0, kh);
  T* o = static_cast<T*>(ptr.o) + p.QOffset(b, m0, n);

  // Rows of this thread: r[0] = m0 + warp*16 + lane/4, r[1] = r[0] + 8; their allowed key ranges.
  const int row_in_block = warp * 16 + (lane >> 2);
  int64_t rows[2] = {m0 + row_in_block, m0 + row_in_block + 8};
  KeyRange row_keys[2];
#pragma unroll
  for (int i = 0; i < 2; ++i)
    row_keys[i] = rows[i] < p.seqlen_q ? AllowedKeys(p, rows[i], q_len, kv_len) : KeyRange{0, 0};

  const TileRange tiles = KeyTiles(block_keys.any, kBN);
  const int tile_lo = tiles.lo, tile_hi = tiles.hi;

  float acc_o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) acc_o[i][0] = acc_o[i][1] = acc_o[i][2] = acc_o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};  // this thread's partial sums; reduced over the quad at the end

  if (tile_lo < tile_hi) {
    const int q_valid = static_cast<int>(Min64(kBM, p.seqlen_q - m0));
    LoadTile<Tr>(sQ, q, p.q_row_stride, kBM, q_valid);
    {
      const int64_t s0 = int64_t{tile_lo} * kBN;
      LoadTile<Tr>(sK, k + s0 * p.k_row_stride, p.k_row_stride, kBN, static_cast<int>(Min64(kBN, p.seqlen_k - s0)));
    }
    CpAsyncCommit();

    uint32_t q_frag[Tr::kQInRegs ? kKS : 1][4];
    const float scale_log2 = p.scale * kLog2e;

    for (int tile = tile_lo; tile < tile_hi; ++tile) {
      const int64_t s0 = int64_t{tile} * kBN;
      const int kv_valid = static_cast<int>(Min64(kBN, p.seqlen_k - s0));
      CpAsyncWait<0>();
      __syncthreads();  // K(tile) (and Q) visible; every warp is done with V(tile-1)
      LoadTile<Tr>(sV, v + s0 * p.k_row_stride, p.k_row_stride, kBN, kv_valid);
      CpAsyncCommit();

      if constexpr (Tr::kQInRegs) {
        if (tile == tile_lo) {
#pragma unroll
          for (int ks = 0; ks < kKS; ++ks)
            LdMatrixX4(q_frag[ks], sQ + Swz<kP>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
        }
      }

      // S = Q K^T for this warp's 16 rows x kBN keys.
      float s[kNT][4];
#pragma unroll
      for (int i = 0; i < kNT; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        uint32_t a[4];
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a[i] = q_frag[ks][i];
        } else {
          LdMatrixX4(a, sQ + Swz<kP>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
        }
#pragma unroll
        for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
          uint32_t bk[4];
          LdMatrixX4(bk, sK + Swz<kP>(nt2 * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
          Mma<T>::Run(s[2 * nt2], a, bk[0], bk[1]);
          Mma<T>::Run(s[2 * nt2 + 1], a, bk[2], bk[3]);
        }
      }

      // Scale to the log2 domain, add bias, mask; then the online-softmax update.
      const bool interior = !p.has_mask && s0 >= inner.lo && s0 + kBN <= inner.hi;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = e >> 1;
          const int64_t col = s0 + nt * 8 + (lane & 3) * 2 + (e & 1);
          float x = s[nt][e] * scale_log2;
          if (p.has_bias) {
            bool in_range = rows[i] < p.seqlen_q && col < p.seqlen_k;
            if (in_range) {
              const int64_t off = p.bias_strides.Offset(b, n, rows[i], col);
              const float bv = ptr.bias_is_f32 ? static_cast<const float*>(ptr.bias)[off]
                                               : ToAcc(static_cast<const T*>(ptr.bias)[off]);
              x = AddBiasLog2(x, bv);
            }
          }
          if (!interior) {
            bool ok = col >= row_keys[i].lo && col < row_keys[i].hi;
            if (ok && p.has_mask) ok = MaskBit(ptr.mask + p.mask_strides.Offset(b, n, rows[i], 0), col);
            if (!ok) x = -INFINITY;
          }
          s[nt][e] = x;
        }
      }
      float corr[2];
      OnlineSoftmaxStep(s, row_max, row_sum, corr);
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) {
        acc_o[dt][0] *= corr[0];
        acc_o[dt][1] *= corr[0];
        acc_o[dt][2] *= corr[1];
        acc_o[dt][3] *= corr[1];
      }

      CpAsyncWait<0>();
      __syncthreads();  // V(tile) visible; every warp is done reading K(tile)
      if (tile + 1 < tile_hi) {
        const int64_t s1 = s0 + kBN;
        LoadTile<Tr>(sK, k + s1 * p.k_row_stride, p.k_row_stride, kBN, static_cast<int>(Min64(kBN, p.seqlen_k - s1)));
        CpAsyncCommit();
      }

      // O += P V: P's accumulator layout is the A-operand layout of the next mma (two n-tiles per k-step).
      MmaAccTile<kP>(acc_o, s, sV, lane);
    }
  }

  // Epilogue: O / l and the log-sum-exp (natural log); empty rows give O = 0, lse = -inf.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float l = QuadSum(row_sum[i]);
    const RowEnd end = EndRow(l);
    const int64_t t = rows[i];
    if (t >= p.seqlen_q) continue;
    T* orow = o + (t - m0) * p.q_row_stride;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      const uint32_t packed = Mma<T>::Pack(end.Out(acc_o[dt][2 * i]), end.Out(acc_o[dt][2 * i + 1]));
      *reinterpret_cast<uint32_t*>(orow + dt * 8 + (lane & 3) * 2) = packed;
    }
    if ((lane & 3) == 0) ptr.lse[p.LseOffset(b, n, t)] = end.empty ? -INFINITY : (row_max[i] + log2f(l)) / kLog2e;
  }
}

}  // namespace

template <typename T, int kHeadDim>
cudaError_t LaunchAttentionFwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr) {
  using Tr = FwdTraits<kHeadDim>;
  if (p.batch == 0 || p.seqlen_q == 0 || p.num_heads == 0) return cudaSuccess;
  const cudaError_t attr_status =
      SetDynamicSmemOnce(reinterpret_cast<const void*>(&AttentionFwdKernel<T, kHeadDim>), Tr::kSmemBytes);
  if (attr_status != cudaSuccess) return attr_status;
  const int64_t m_blocks = (p.seqlen_q + Tr::kBlockM - 1) / Tr::kBlockM;
  if (m_blocks > 0x7fffffff || p.num_heads > 65535 || p.batch > 65535) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(m_blocks), static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.batch));
  AttentionFwdKernel<T, kHeadDim><<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, ptr);
  return cudaGetLastError();
}

#define JAX_OPS_INSTANTIATE_ATTENTION_FWD(T, D) \
  template cudaError_t LaunchAttentionFwd<T, D>(cudaStream_t, const AttentionParams&, const FwdPointers&);

}  // namespace jax_ops::attention
