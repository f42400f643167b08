// Attention-specific device pieces shared by the forward and backward kernels (the hardware primitives they use
// live in arch/sm80 and arch/sm90): swizzled tile indexing and loads, per-batch sequence lengths, the softmax quad
// reductions, and the Hopper epilogue of a wgmma accumulator tile through shared memory.
#pragma once

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "arch/sm80/cp_async.cuh"
#include "arch/sm80/ldmatrix.cuh"
#include "arch/sm80/mma.cuh"
#include "attention/attention_kernels.h"
#include "common/dtype_traits.h"

namespace jax_ops::attention {
namespace {

// Element index of (row, 16-byte chunk) in a swizzled tile: rows of kPitch elements, each chunk's low 3 bits
// XORed with the row's (conflict-free ldmatrix). With kPanelRows > 0 the tile is kept as panels of 64 columns,
// each kPanelRows rows of 128 bytes: the layout a 128B-swizzled TMA box of 64 columns writes.
template <int kPitch, int kPanelRows = 0>
__device__ __forceinline__ int Swz(int row, int chunk) {
  if constexpr (kPanelRows > 0) {
    static_assert(kPitch == 64, "a panel row is 64 elements");
    return ((chunk >> 3) * kPanelRows + row) * 64 + (((chunk ^ row) & 7) << 3);
  } else {
    return row * kPitch + (((chunk & ~7) | ((chunk ^ row) & 7)) << 3);
  }
}

__device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Valid query / key lengths of batch b: q_seqlen[b] / kv_seqlen[b] clamped to [0, T] / [0, S], or T / S.
struct SeqLens {
  int64_t q, kv;
};
__device__ __forceinline__ SeqLens SeqLensOf(const AttentionParams& p, const FwdPointers& ptr, int64_t b) {
  return {p.has_q_seqlen ? Min64(Max64(ptr.q_seqlen[b], 0), p.seqlen_q) : p.seqlen_q,
          p.has_kv_seqlen ? Min64(Max64(ptr.kv_seqlen[b], 0), p.seqlen_k) : p.seqlen_k};
}

// x + bias * log2e (x a log2-domain logit), kept finite on the negative side when both are: the log2 domain
// overflows below -FLT_MAX / log2e, e.g. at a bias of finfo.min (a mask written as a bias), where the contract's
// logit is still finite (a row of only such keys averages uniformly, not an empty row); all such logits become
// -FLT_MAX. An infinite x or bias stays as it is; a finite bias above FLT_MAX / log2e still overflows to +inf.
__device__ __forceinline__ float AddBiasLog2(float x, float bias) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float y = fmaf(bias, kLog2e, x);
  return (y == -INFINITY && x > -INFINITY && bias > -INFINITY) ? -FLT_MAX : y;
}

// The boolean mask and additive bias along one line of the [T, S] logits of one (batch, head) -- a query row
// (RowModsOf: the forward and dQ kernels) or a key column (KeyModsOf: the dK/dV kernel) -- read from global memory
// by the Hopper kernels' kMods variants (a broadcast mask or bias stays in L2). Along a query row the packed mask's
// keys are the bits of consecutive words, so a 128-key tile costs a thread four word loads per row; along a key
// column each query is one word (mask_step words apart) of which the key is bit mask_bit. Null pointers: no mask,
// no bias.
struct LineMods {
  const uint32_t* mask;  // along a row: the row's packed line; along a column: word s / 32 of query 0's line
  const void* bias;      // position 0 of the line
  int64_t mask_step;     // along a column: words from one query's line to the next (0 on a broadcast dim)
  int64_t bias_step;     // elements from one position to the next (0 on a broadcast dim)
  int mask_bit;          // along a column: the key's bit of each word
  bool bias_pairs;       // along a row: two consecutive keys' bias values are one aligned 2-element load
};

// The LineMods through element (b, n, t, s), along the keys (along_keys) or the queries.
__device__ __forceinline__ LineMods LineModsAt(const AttentionParams& p, const FwdPointers& ptr, int64_t b, int64_t n,
                                               int64_t t, int64_t s, bool along_keys) {
  LineMods r;
  r.mask = p.has_mask ? ptr.mask + p.mask_strides.Offset(b, n, t, 0) + (along_keys ? 0 : s >> 5) : nullptr;
  r.mask_step = along_keys ? 0 : p.mask_strides.t;
  r.mask_bit = static_cast<int>(s & 31);
  const int64_t bias_off = p.bias_strides.Offset(b, n, t, s);
  r.bias = !p.has_bias       ? nullptr
           : ptr.bias_is_f32 ? static_cast<const void*>(static_cast<const float*>(ptr.bias) + bias_off)
                             : static_cast<const void*>(static_cast<const unsigned char*>(ptr.bias) + 2 * bias_off);
  r.bias_step = along_keys ? p.bias_strides.s : p.bias_strides.t;
  const uintptr_t pair_align = ptr.bias_is_f32 ? 8 : 4;
  r.bias_pairs = along_keys && r.bias_step == 1 && reinterpret_cast<uintptr_t>(r.bias) % pair_align == 0;
  return r;
}
// Query row t of (b, n), clamped to [0, T) (rows past T are never read).
__device__ __forceinline__ LineMods RowModsOf(const AttentionParams& p, const FwdPointers& ptr, int64_t b, int64_t n,
                                              int64_t t) {
  return LineModsAt(p, ptr, b, n, Min64(Max64(t, 0), p.seqlen_q - 1), 0, true);
}
// Key column s of (b, n), clamped to [0, S) (keys past S are never read).
__device__ __forceinline__ LineMods KeyModsOf(const AttentionParams& p, const FwdPointers& ptr, int64_t b, int64_t n,
                                              int64_t s) {
  return LineModsAt(p, ptr, b, n, 0, Min64(Max64(s, 0), p.seqlen_k - 1), false);
}

// Bias element i of a line (BiasT: f32 or the q dtype), and elements i, i + 1 of a bias_pairs line (i even).
template <typename BiasT>
__device__ __forceinline__ float BiasAt(const void* line, int64_t i) {
  return ToAcc(__ldg(static_cast<const BiasT*>(line) + i));
}
template <typename BiasT>
__device__ __forceinline__ float2 BiasPairAt(const void* line, int64_t i) {
  if constexpr (std::is_same_v<BiasT, float>) {
    return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(line) + i));
  } else {
    const unsigned int bits = __ldg(reinterpret_cast<const unsigned int*>(static_cast<const BiasT*>(line) + i));
    BiasT two[2];
    memcpy(two, &bits, sizeof(bits));
    return make_float2(ToAcc(two[0]), ToAcc(two[1]));
  }
}

// A tile's packed mask words along a thread's two query rows (kNT / 4 words of 32 keys from key x0, a multiple of
// 32; all set without a mask). The kernels load them before waiting on the S wgmma, so the load latency hides under
// the GEMM, and touch the tile's bias lines the same way (prefetch into L1: a row's bias is spread over a quad).
template <int kNT>
struct RowMaskWords {
  uint32_t w[2][kNT / 4];
};
template <typename T, int kNT>
__device__ __forceinline__ RowMaskWords<kNT> PrefetchRowMods(const AttentionParams& p, const FwdPointers& ptr,
                                                             const LineMods (&mods)[2], int64_t x0, int lane) {
  static_assert(kNT % 4 == 0 && (128 % (kNT * 8) == 0 || (kNT * 8) % 128 == 0), "tiles of whole mask words");
  RowMaskWords<kNT> words;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int w = 0; w < kNT / 4; ++w) words.w[h][w] = mods[h].mask ? __ldg(mods[h].mask + (x0 >> 5) + w) : ~0u;
  }
  if (p.has_bias) {
    const int line_bytes = kNT * 8 * (ptr.bias_is_f32 ? 4 : static_cast<int>(sizeof(T)));
    const int offset = (lane & 3) * 128;  // the quad's four lanes take one 128-byte line each
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (mods[h].bias_pairs && offset < line_bytes) {
        const int elem = ptr.bias_is_f32 ? 4 : static_cast<int>(sizeof(T));
        asm volatile(
            "prefetch.global.L1 [%0];" ::"l"(static_cast<const unsigned char*>(mods[h].bias) + x0 * elem + offset));
      }
    }
  }
  return words;
}

// One S tile of a kMods kernel's query rows (the wgmma m64nN accumulator layout of kNT 8-column tiles: element
// nt * 4 + e is row e >> 1 of the thread's two, column nt * 8 + (lane & 3) * 2 + (e & 1)) turned into log2-domain
// logits x * scale_log2 + bias * log2e, -inf where the mask is clear (a select: a masked key's NaN bias never
// reaches the softmax); mods[i] is row i's line, whose column c sits at position x0 + c (x0 a multiple of 32),
// words its mask bits (PrefetchRowMods). kPositions: a boundary tile, whose columns outside [lo[i], hi[i]) are -inf
// and not read (maybe past the line's end; a row's mask words are whole 128-key groups, so they exist). BiasT: the
// bias's element type, void without a bias.
template <typename BiasT, bool kPositions, int kNT>
__device__ __forceinline__ void RowModsToLogits(float* s, const LineMods (&mods)[2], const RowMaskWords<kNT>& words,
                                                const int (&lo)[2], const int (&hi)[2], int64_t x0, int lane,
                                                float scale_log2) {
  constexpr bool kBias = !std::is_void_v<BiasT>;
  const int c_lane = (lane & 3) * 2;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const bool pairs = kBias && !kPositions && mods[h].bias_pairs;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int c = nt * 8 + c_lane;
      float2 pair = make_float2(0.f, 0.f);
      if constexpr (kBias) {
        if (pairs) pair = BiasPairAt<BiasT>(mods[h].bias, x0 + c);
      }
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[nt * 4 + 2 * h + e];
        if (kPositions && (c + e < lo[h] || c + e >= hi[h])) {
          x = -INFINITY;
          continue;
        }
        float y = x * scale_log2;
        if constexpr (kBias) {
          const float bias =
              pairs ? (e ? pair.y : pair.x) : BiasAt<BiasT>(mods[h].bias, (x0 + c + e) * mods[h].bias_step);
          y = AddBiasLog2(y, bias);
        }
        x = (words.w[h][nt >> 2] >> ((nt & 3) * 8 + c_lane + e)) & 1u ? y : -INFINITY;
      }
    }
  }
}

// The same for an S^T tile of the dK/dV kernel, whose rows are key columns (mods along the queries, x0 the tile's
// first query): each query's mask bit is a word of its own; a thread's two keys usually share it.
template <typename BiasT, bool kPositions, int kNT>
__device__ __forceinline__ void KeyModsToLogits(float* s, const LineMods (&mods)[2], const int (&lo)[2],
                                                const int (&hi)[2], int64_t x0, int lane, float scale_log2) {
  constexpr bool kBias = !std::is_void_v<BiasT>;
  const int c_lane = (lane & 3) * 2;
  const bool shared_word = mods[0].mask == mods[1].mask && mods[0].mask_step == mods[1].mask_step;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int c = nt * 8 + c_lane + e;
      bool in[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) in[h] = !kPositions || (c >= lo[h] && c < hi[h]);
      uint32_t word[2] = {~0u, ~0u};
      if (mods[0].mask != nullptr) {
        if (in[0]) word[0] = __ldg(mods[0].mask + (x0 + c) * mods[0].mask_step);
        if (in[1]) word[1] = shared_word && in[0] ? word[0] : __ldg(mods[1].mask + (x0 + c) * mods[1].mask_step);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float& x = s[nt * 4 + 2 * h + e];
        if (!in[h]) {
          x = -INFINITY;
          continue;
        }
        float y = x * scale_log2;
        if constexpr (kBias) y = AddBiasLog2(y, BiasAt<BiasT>(mods[h].bias, (x0 + c) * mods[h].bias_step));
        x = (word[h] >> mods[h].mask_bit) & 1u ? y : -INFINITY;
      }
    }
  }
}

// RowModsToLogits / KeyModsToLogits with the call's bias type (a uniform branch over the three instantiations).
template <typename T, bool kPositions, int kNT>
__device__ __forceinline__ void ApplyRowMods(const AttentionParams& p, const FwdPointers& ptr, float* s,
                                             const LineMods (&mods)[2], const RowMaskWords<kNT>& words,
                                             const int (&lo)[2], const int (&hi)[2], int64_t x0, int lane,
                                             float scale_log2) {
  if (!p.has_bias) {
    RowModsToLogits<void, kPositions, kNT>(s, mods, words, lo, hi, x0, lane, scale_log2);
  } else if (ptr.bias_is_f32) {
    RowModsToLogits<float, kPositions, kNT>(s, mods, words, lo, hi, x0, lane, scale_log2);
  } else {
    RowModsToLogits<T, kPositions, kNT>(s, mods, words, lo, hi, x0, lane, scale_log2);
  }
}
template <typename T, bool kPositions, int kNT>
__device__ __forceinline__ void ApplyKeyMods(const AttentionParams& p, const FwdPointers& ptr, float* s,
                                             const LineMods (&mods)[2], const int (&lo)[2], const int (&hi)[2],
                                             int64_t x0, int lane, float scale_log2) {
  if (!p.has_bias) {
    KeyModsToLogits<void, kPositions, kNT>(s, mods, lo, hi, x0, lane, scale_log2);
  } else if (ptr.bias_is_f32) {
    KeyModsToLogits<float, kPositions, kNT>(s, mods, lo, hi, x0, lane, scale_log2);
  } else {
    KeyModsToLogits<T, kPositions, kNT>(s, mods, lo, hi, x0, lane, scale_log2);
  }
}

// Copies `rows` x kHeadDim elements (row stride `stride` elements) into a swizzled tile; rows >= `valid` are
// zero-filled (never read from global memory).
template <typename Tr, typename T>
__device__ __forceinline__ void LoadTile(T* smem, const T* g, int64_t stride, int rows, int valid) {
  for (int i = threadIdx.x; i < rows * Tr::kChunks; i += Tr::kThreads) {
    const int r = i / Tr::kChunks, c = i - r * Tr::kChunks;
    const bool ok = r < valid;
    sm80::CpAsync16(smem + Swz<Tr::kPitch>(r, c), ok ? g + r * stride + c * 8 : g, ok);
  }
}

// A warp's acc (16 rows x kDT n8 tiles, fp32) += X Y: X a 16 x (8 * kNT) fp32 mma accumulator (kNT n8 tiles),
// packed to T in place as the A operands of kNT / 2 k16 steps; Y the first 8 * kNT rows (k) of a row-major
// swizzled tile, read as transposed B operands. P V in the forward pass, dS K for dQ in the backward one.
template <int kPitch, int kPanelRows = 0, typename T, int kNT, int kDT>
__device__ __forceinline__ void MmaAccTile(float (&acc)[kDT][4], const float (&x)[kNT][4], const T* tile, int lane) {
#pragma unroll
  for (int ks = 0; ks < kNT / 2; ++ks) {
    uint32_t a[4];
    sm80::PackAFrag<T>(a, x[2 * ks], x[2 * ks + 1]);
#pragma unroll
    for (int dt2 = 0; dt2 < kDT / 2; ++dt2) {
      uint32_t b[4];
      sm80::LdMatrixX4Trans(
          b, tile + Swz<kPitch, kPanelRows>(ks * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dt2 * 2 + (lane >> 4)));
      sm80::Mma<T>::Run(acc[2 * dt2], a, b[0], b[1]);
      sm80::Mma<T>::Run(acc[2 * dt2 + 1], a, b[2], b[3]);
    }
  }
}

// One k16 step (16-byte chunks 2 * ks, 2 * ks + 1) of two warp GEMMs over the same rows of two tiles: x += ax X^T
// and y += ay Y^T, X / Y the first 8 * kNT rows (n) of two row-major swizzled tiles, read as B operands.
// S^T = K Q^T with dP^T = V dO^T for dK / dV, S = Q K^T with dP = dO V^T for dQ.
template <int kPitch, typename T, int kNT>
__device__ __forceinline__ void MmaPairStep(float (&x)[kNT][4], float (&y)[kNT][4], const uint32_t (&ax)[4],
                                            const uint32_t (&ay)[4], const T* x_tile, const T* y_tile, int ks,
                                            int lane) {
#pragma unroll
  for (int nt2 = 0; nt2 < kNT / 2; ++nt2) {
    uint32_t bx[4], by[4];
    const int r = nt2 * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
    sm80::LdMatrixX4(bx, x_tile + Swz<kPitch>(r, c));
    sm80::LdMatrixX4(by, y_tile + Swz<kPitch>(r, c));
    sm80::Mma<T>::Run(x[2 * nt2], ax, bx[0], bx[1]);
    sm80::Mma<T>::Run(x[2 * nt2 + 1], ax, bx[2], bx[3]);
    sm80::Mma<T>::Run(y[2 * nt2], ay, by[0], by[1]);
    sm80::Mma<T>::Run(y[2 * nt2 + 1], ay, by[2], by[3]);
  }
}

// The end of a row's online softmax, from l = its sum of exp2(logit - max) (quad-reduced): l == 0 is a row with no
// allowed key (O = 0 whatever the tiles held, lse = -inf); a NaN l (a NaN or +inf logit, which fmaxf keeps out of
// the max but not out of the sum) is not empty, so the NaN reaches O and lse as in jax.nn.
struct RowEnd {
  bool empty;
  float inv;  // 1 / l
  __device__ __forceinline__ float Out(float acc) const { return empty ? 0.f : acc * inv; }
};
__device__ __forceinline__ RowEnd EndRow(float l) { return {l == 0.f, 1.f / l}; }

__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One online-softmax step of a warp's 16-row S tile (kNT n8 mma tiles, log2 domain, disallowed entries -inf):
// updates the two rows' running max and this thread's partial sums, turns S into P = exp2(S - max) in place and
// returns in `corr` the factors that rescale the rows' previous O accumulators.
template <int kNT>
__device__ __forceinline__ void OnlineSoftmaxStep(float (&s)[kNT][4], float (&row_max)[2], float (&row_sum)[2],
                                                  float (&corr)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
    mx = QuadMax(mx);
    const float new_max = fmaxf(row_max[i], mx);
    // A row that has seen no allowed key keeps max = -inf; use 0 as the offset so exp2 gives 0, not NaN.
    const float offset = new_max == -INFINITY ? 0.f : new_max;
    corr[i] = exp2f(row_max[i] - offset);
    row_max[i] = new_max;
    float sum = 0.f;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      s[nt][2 * i] = exp2f(s[nt][2 * i] - offset);
      s[nt][2 * i + 1] = exp2f(s[nt][2 * i + 1] - offset);
      sum += s[nt][2 * i] + s[nt][2 * i + 1];
    }
    row_sum[i] = row_sum[i] * corr[i] + sum;
  }
}

}  // namespace

namespace hopper {

// Epilogue of a 64-row wgmma accumulator tile (m64nD fp32: thread (warp, lane) holds rows warp*16 + lane/4 and
// +8, columns dt*8 + (lane&3)*2 and +1): scaled per row and rounded to T into shared memory in the 128-byte-swizzled
// tile layout (rows of 128 bytes, 64-column panels `panel_bytes` apart; `rows` 1024-byte aligned), so that the
// global stores can be whole 16-byte row chunks (SmemRowsToGlobal) instead of 4-byte scattered ones.
template <typename T, int kHeadDim>
__device__ __forceinline__ void AccToSmemRows(const float (&acc)[kHeadDim / 2], const float (&scale)[2],
                                              unsigned char* rows, int panel_bytes, int warp, int lane) {
#pragma unroll
  for (int dt = 0; dt < kHeadDim / 8; ++dt) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = warp * 16 + (lane >> 2) + 8 * i;
      const int d = dt * 8 + (lane & 3) * 2;
      const int chunk = (d & 63) >> 3;
      unsigned char* dst = rows + (d >> 6) * panel_bytes + r * 128 + ((chunk ^ (r & 7)) << 4) + (d & 7) * 2;
      *reinterpret_cast<uint32_t*>(dst) =
          sm80::Mma<T>::Pack(acc[dt * 4 + 2 * i] * scale[i], acc[dt * 4 + 2 * i + 1] * scale[i]);
    }
  }
}

// kRows rows written by AccToSmemRows to global memory (row r at dst + r * row_stride), rows >= valid_rows
// skipped; kThreads threads (tid; by default the 128 of a warpgroup) store consecutive 16-byte chunks. `rows` is
// the tile's first row or one a multiple of 8 rows further (the swizzle follows r & 7).
template <typename T, int kHeadDim, int kRows = 64, int kThreads = 128>
__device__ __forceinline__ void SmemRowsToGlobal(const unsigned char* rows, int panel_bytes, T* dst, int64_t row_stride,
                                                 int valid_rows, int tid) {
  constexpr int kChunks = kHeadDim / 8;
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    if (r >= valid_rows) continue;
    const unsigned char* src = rows + (c >> 3) * panel_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    *reinterpret_cast<uint4*>(dst + r * row_stride + c * 8) = *reinterpret_cast<const uint4*>(src);
  }
}

}  // namespace hopper
}  // namespace jax_ops::attention
