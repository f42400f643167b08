// FlashAttention backward with mma.sync m16n8k16 (portable sm_80+ path). Included once per (dtype, head dim) by
// instantiations/bwd_<dtype>_hd<D>.cu. Deterministic: no atomics; each output element has one owner.
//
//   DkDvKernel: CTA = 64 keys of one (batch, kv head); each warp owns 16 keys. It loops over the G query heads of
//     the group and over the query blocks that can see its keys, recomputing S^T = K Q^T and P^T = exp(S^T - lse)
//     and accumulating dV += P^T dO and dK += dS^T Q in registers (GQA reduction inside the CTA).
//   DqKernel: CTA = 64 query rows of one (batch, head); loops over key blocks like the forward, recomputing
//     P, dP = dO V^T, dS = P (dP - delta), and accumulating dQ += dS K.
// delta[t] = rowsum(dO * O) is recomputed where needed (no workspace). No bias gradient here: with a bias the
// handler takes the Hopper kernels or fails (attention_cuda.cu), and jax_ops routes the other cases to the
// reference backward.
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
using sm80::CpAsyncCommit, sm80::CpAsyncWait, sm80::LdMatrixX4, sm80::LdMatrixX4Trans, sm80::Mma, sm80::PackAFrag;

template <int kHeadDim>
struct BwdTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBlock = 64;  // queries per block (DkDv loop, Dq CTA) and keys per block
  static constexpr int kChunks = kHeadDim / 8;
  static constexpr int kPitch = (kHeadDim + 63) / 64 * 64;
  static constexpr int kTileElems = kBlock * kPitch;
  static constexpr int kSmemBytes = 4 * kTileElems * 2 + 2 * kBlock * 4;  // 4 tiles + delta + lse
};

constexpr float kLog2eBwd = 1.4426950408889634f;

// The backward kernels' shared memory: K, V, Q, dO tiles, then delta and lse (log2) of the query block.
template <typename T, typename Tr>
struct BwdSmem {
  T *k, *v, *q, *d_o;
  float *delta, *lse;
  __device__ explicit BwdSmem(unsigned char* raw)
      : k(reinterpret_cast<T*>(raw)),
        v(k + Tr::kTileElems),
        q(v + Tr::kTileElems),
        d_o(q + Tr::kTileElems),
        delta(reinterpret_cast<float*>(d_o + Tr::kTileElems)),
        lse(delta + Tr::kBlock) {}
};

// Whether key s is visible from query t (position rules + boolean mask); `kr` = AllowedKeys(t).
__device__ __forceinline__ bool Visible(const AttentionParams& p, const FwdPointers& ptr, int64_t b, int64_t n,
                                        int64_t t, int64_t s, KeyRange kr) {
  if (s < kr.lo || s >= kr.hi) return false;
  return !p.has_mask || MaskBit(ptr.mask + p.mask_strides.Offset(b, n, t, 0), s);
}

// delta and lse (log2 domain) of `rows` query rows starting at t0 into shared memory; rows past T give
// lse = -inf (so P = 0). dO comes from the staged smem tile, O from global memory. 2 threads per row.
template <typename Tr, typename T>
__device__ __forceinline__ void RowStats(const AttentionParams& p, const BwdPointers& bp, int64_t b, int64_t n,
                                         int64_t t0, const T* s_do, float* s_delta, float* s_lse) {
  const int row = threadIdx.x >> 1, half = threadIdx.x & 1;
  const int64_t t = t0 + row;
  float acc = 0.f;
  if (t < p.seqlen_q) {
    const T* orow = static_cast<const T*>(bp.o) + p.QOffset(b, t, n);
    for (int c = half; c < Tr::kChunks; c += 2) {
      const T* dchunk = s_do + Swz<Tr::kPitch>(row, c);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += ToAcc(orow[c * 8 + e]) * ToAcc(dchunk[e]);
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (half == 0) {
    s_delta[row] = acc;
    s_lse[row] = t < p.seqlen_q ? bp.lse[p.LseOffset(b, n, t)] * kLog2eBwd : -INFINITY;
  }
}

__device__ __forceinline__ float ProbLog2(float x, float lse2) { return lse2 == -INFINITY ? 0.f : exp2f(x - lse2); }

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    DkDvKernel(const AttentionParams p, const FwdPointers ptr, const BwdPointers bp) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kB = Tr::kBlock, kP = Tr::kPitch;
  constexpr int kNT = kB / 8, kDT = kHeadDim / 8, kKS = kHeadDim / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BwdSmem<T, Tr> sm(smem_raw);
  T *sK = sm.k, *sV = sm.v, *sQ = sm.q, *sDo = sm.d_o;
  float *s_delta = sm.delta, *s_lse = sm.lse;

  const int64_t s0 = int64_t{blockIdx.x} * kB, kh = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const auto [q_len, kv_len] = SeqLensOf(p, ptr, b);
  const int kv_valid = static_cast<int>(Min64(kB, p.seqlen_k - s0));
  const T* kbase = static_cast<const T*>(ptr.k) + p.KOffset(b, s0, kh);
  const T* vbase = static_cast<const T*>(ptr.v) + p.KOffset(b, s0, kh);
  LoadTile<Tr>(sK, kbase, p.k_row_stride, kB, kv_valid);
  LoadTile<Tr>(sV, vbase, p.k_row_stride, kB, kv_valid);
  CpAsyncCommit();

  // Queries that can see keys [s0, s1): causal needs t >= s, the window t in [s - right, s + left].
  const int64_t s1 = Min64(s0 + kB, kv_len);
  int64_t t_lo = 0, t_hi = q_len;
  if (s1 <= s0) t_hi = 0;
  if (p.is_causal) t_lo = Max64(t_lo, s0);
  if (p.window_right >= 0) t_lo = Max64(t_lo, s0 - p.window_right);
  if (p.window_left >= 0) t_hi = Min64(t_hi, s1 - 1 + p.window_left + 1);

  float acc_dk[kDT][4], acc_dv[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc_dk[i][e] = acc_dv[i][e] = 0.f;

  const float scale_log2 = p.scale * kLog2eBwd;
  // This thread's keys (rows of S^T): key[0] = s0 + warp*16 + lane/4, key[1] = key[0] + 8.
  const int64_t keys[2] = {s0 + warp * 16 + (lane >> 2), s0 + warp * 16 + (lane >> 2) + 8};

  for (int64_t g = 0; g < p.group && t_lo < t_hi; ++g) {
    const int64_t n = kh * p.group + g;
    for (int64_t t0 = t_lo / kB * kB; t0 < t_hi; t0 += kB) {
      const int q_valid = static_cast<int>(Min64(kB, p.seqlen_q - t0));
      __syncthreads();  // every warp is done with the previous Q / dO tiles
      LoadTile<Tr>(sQ, static_cast<const T*>(ptr.q) + p.QOffset(b, t0, n), p.q_row_stride, kB, q_valid);
      LoadTile<Tr>(sDo, static_cast<const T*>(bp.d_o) + p.QOffset(b, t0, n), p.q_row_stride, kB, q_valid);
      CpAsyncCommit();
      CpAsyncWait<0>();
      __syncthreads();
      RowStats<Tr>(p, bp, b, n, t0, sDo, s_delta, s_lse);
      __syncthreads();

      // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x 64 queries.
      float st[kNT][4], dpt[kNT][4];
#pragma unroll
      for (int i = 0; i < kNT; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[i][e] = dpt[i][e] = 0.f;
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        uint32_t ak[4], av[4];
        LdMatrixX4(ak, sK + Swz<kP>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
        LdMatrixX4(av, sV + Swz<kP>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
        MmaPairStep<kP>(st, dpt, ak, av, sQ, sDo, ks, lane);
      }
      // P^T and dS^T = P^T (dP^T - delta), masked per (query, key).
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qi = nt * 8 + (lane & 3) * 2 + (e & 1);
          const int64_t t = t0 + qi, s = keys[e >> 1];
          float prob = 0.f;
          if (t < p.seqlen_q && s < p.seqlen_k && Visible(p, ptr, b, n, t, s, AllowedKeys(p, t, q_len, kv_len)))
            prob = ProbLog2(st[nt][e] * scale_log2, s_lse[qi]);
          st[nt][e] = prob;
          dpt[nt][e] = prob * (dpt[nt][e] - s_delta[qi]);
        }
      }
      // dV += P^T dO and dK += dS^T Q (k-dim = queries; B operands from the row-major tiles, transposed).
#pragma unroll
      for (int ks = 0; ks < kB / 16; ++ks) {
        uint32_t ap[4], ads[4];
        PackAFrag<T>(ap, st[2 * ks], st[2 * ks + 1]);
        PackAFrag<T>(ads, dpt[2 * ks], dpt[2 * ks + 1]);
#pragma unroll
        for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
          uint32_t bdo[4], bq[4];
          const int r = ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), c = dt2 * 2 + (lane >> 4);
          LdMatrixX4Trans(bdo, sDo + Swz<kP>(r, c));
          LdMatrixX4Trans(bq, sQ + Swz<kP>(r, c));
          Mma<T>::Run(acc_dv[2 * dt2], ap, bdo[0], bdo[1]);
          Mma<T>::Run(acc_dv[2 * dt2 + 1], ap, bdo[2], bdo[3]);
          Mma<T>::Run(acc_dk[2 * dt2], ads, bq[0], bq[1]);
          Mma<T>::Run(acc_dk[2 * dt2 + 1], ads, bq[2], bq[3]);
        }
      }
    }
  }
  CpAsyncWait<0>();  // the K/V tiles were never waited on when no query sees this block

  // dK = scale * acc_dk, dV = acc_dv; rows past S are not written.
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int64_t s = keys[i];
    if (s >= p.seqlen_k) continue;
    T* dk = static_cast<T*>(bp.dk) + p.KOffset(b, s, kh);
    T* dv = static_cast<T*>(bp.dv) + p.KOffset(b, s, kh);
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) {
      const int col = dt * 8 + (lane & 3) * 2;
      *reinterpret_cast<uint32_t*>(dk + col) =
          Mma<T>::Pack(acc_dk[dt][2 * i] * p.scale, acc_dk[dt][2 * i + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv + col) = Mma<T>::Pack(acc_dv[dt][2 * i], acc_dv[dt][2 * i + 1]);
    }
  }
}

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(BwdTraits<kHeadDim>::kThreads, 1)
    DqKernel(const AttentionParams p, const FwdPointers ptr, const BwdPointers bp) {
  using Tr = BwdTraits<kHeadDim>;
  constexpr int kB = Tr::kBlock, kP = Tr::kPitch;
  constexpr int kNT = kB / 8, kDT = kHeadDim / 8, kKS = kHeadDim / 16;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const BwdSmem<T, Tr> sm(smem_raw);
  T *sK = sm.k, *sV = sm.v, *sQ = sm.q, *sDo = sm.d_o;
  float *s_delta = sm.delta, *s_lse = sm.lse;

  const int64_t t0 = int64_t{blockIdx.x} * kB, n = blockIdx.y, b = blockIdx.z;
  const int64_t kh = n / p.group;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const auto [q_len, kv_len] = SeqLensOf(p, ptr, b);
  const int q_valid = static_cast<int>(Min64(kB, p.seqlen_q - t0));
  LoadTile<Tr>(sQ, static_cast<const T*>(ptr.q) + p.QOffset(b, t0, n), p.q_row_stride, kB, q_valid);
  LoadTile<Tr>(sDo, static_cast<const T*>(bp.d_o) + p.QOffset(b, t0, n), p.q_row_stride, kB, q_valid);
  CpAsyncCommit();

  const TileRange tiles = KeyTiles(BlockKeys(p, t0, kB, q_len, kv_len).any, kB);
  const int tile_lo = tiles.lo, tile_hi = tiles.hi;

  CpAsyncWait<0>();
  __syncthreads();
  RowStats<Tr>(p, bp, b, n, t0, sDo, s_delta, s_lse);
  __syncthreads();

  const int row_in_block = warp * 16 + (lane >> 2);
  const int64_t rows[2] = {t0 + row_in_block, t0 + row_in_block + 8};
  KeyRange row_keys[2];
  float delta[2], lse2[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_keys[i] = rows[i] < p.seqlen_q ? AllowedKeys(p, rows[i], q_len, kv_len) : KeyRange{0, 0};
    delta[i] = s_delta[row_in_block + 8 * i];
    lse2[i] = s_lse[row_in_block + 8 * i];
  }
  uint32_t q_frag[kKS][4], do_frag[kKS][4];
#pragma unroll
  for (int ks = 0; ks < kKS; ++ks) {
    LdMatrixX4(q_frag[ks], sQ + Swz<kP>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
    LdMatrixX4(do_frag[ks], sDo + Swz<kP>(warp * 16 + (lane & 15), ks * 2 + (lane >> 4)));
  }
  float acc_dq[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) acc_dq[i][0] = acc_dq[i][1] = acc_dq[i][2] = acc_dq[i][3] = 0.f;
  const float scale_log2 = p.scale * kLog2eBwd;

  for (int tile = tile_lo; tile < tile_hi; ++tile) {
    const int64_t s0 = int64_t{tile} * kB;
    const int kv_valid = static_cast<int>(Min64(kB, p.seqlen_k - s0));
    __syncthreads();  // every warp is done with the previous K / V tiles
    LoadTile<Tr>(sK, static_cast<const T*>(ptr.k) + p.KOffset(b, s0, kh), p.k_row_stride, kB, kv_valid);
    LoadTile<Tr>(sV, static_cast<const T*>(ptr.v) + p.KOffset(b, s0, kh), p.k_row_stride, kB, kv_valid);
    CpAsyncCommit();
    CpAsyncWait<0>();
    __syncthreads();

    float s[kNT][4], dp[kNT][4];
#pragma unroll
    for (int i = 0; i < kNT; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[i][e] = dp[i][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kKS; ++ks) MmaPairStep<kP>(s, dp, q_frag[ks], do_frag[ks], sK, sV, ks, lane);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = e >> 1;
        const int64_t col = s0 + nt * 8 + (lane & 3) * 2 + (e & 1);
        float prob = 0.f;
        if (col < p.seqlen_k && Visible(p, ptr, b, n, rows[i], col, row_keys[i]))
          prob = ProbLog2(s[nt][e] * scale_log2, lse2[i]);
        dp[nt][e] = prob * (dp[nt][e] - delta[i]);
      }
    }
    // dQ += dS K: B(k = key, n = d) = K[key][d], transposed ldmatrix of the row-major tile.
    MmaAccTile<kP>(acc_dq, dp, sK, lane);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rows[i] >= p.seqlen_q) continue;
    T* dq = static_cast<T*>(bp.dq) + p.QOffset(b, rows[i], n);
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
      *reinterpret_cast<uint32_t*>(dq + dt * 8 + (lane & 3) * 2) =
          Mma<T>::Pack(acc_dq[dt][2 * i] * p.scale, acc_dq[dt][2 * i + 1] * p.scale);
  }
}

}  // namespace

template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                               const BwdPointers& bp) {
  using Tr = BwdTraits<kHeadDim>;
  if (p.batch == 0 || p.num_heads == 0) return cudaSuccess;
  const cudaError_t attr_dkdv =
      SetDynamicSmemOnce(reinterpret_cast<const void*>(&DkDvKernel<T, kHeadDim>), Tr::kSmemBytes);
  const cudaError_t attr_dq = SetDynamicSmemOnce(reinterpret_cast<const void*>(&DqKernel<T, kHeadDim>), Tr::kSmemBytes);
  if (attr_dkdv != cudaSuccess) return attr_dkdv;
  if (attr_dq != cudaSuccess) return attr_dq;
  const int64_t kv_blocks = (p.seqlen_k + Tr::kBlock - 1) / Tr::kBlock;
  const int64_t q_blocks = (p.seqlen_q + Tr::kBlock - 1) / Tr::kBlock;
  if (kv_blocks > 0) {
    DkDvKernel<T, kHeadDim><<<dim3(static_cast<unsigned>(kv_blocks), static_cast<unsigned>(p.num_kv_heads),
                                   static_cast<unsigned>(p.batch)),
                              Tr::kThreads, Tr::kSmemBytes, stream>>>(p, ptr, bp);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  if (q_blocks > 0) {
    DqKernel<T, kHeadDim>
        <<<dim3(static_cast<unsigned>(q_blocks), static_cast<unsigned>(p.num_heads), static_cast<unsigned>(p.batch)),
           Tr::kThreads, Tr::kSmemBytes, stream>>>(p, ptr, bp);
  }
  return cudaGetLastError();
}

#define JAX_OPS_INSTANTIATE_ATTENTION_BWD(T, D)                                                           \
  template cudaError_t LaunchAttentionBwd<T, D>(cudaStream_t, const AttentionParams&, const FwdPointers&, \
                                                const BwdPointers&);

}  // namespace jax_ops::attention
