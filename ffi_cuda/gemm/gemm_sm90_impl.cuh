// Hopper GEMM (sm_90a): persistent, warp-specialised TMA + wgmma with the fused epilogue of params.h.
//
// One CTA = 3 warpgroups. Warpgroup 0 is the producer: one thread streams the A tile (128 rows x 128 bytes of K)
// and the B tile (128 bytes of K x kBN columns; gated: the gate and the up columns) of each K block into a
// kStages-deep shared-memory ring with TMA, signalling `full` mbarriers; it gives its registers to the consumers.
// Warpgroups 1 and 2 are the consumers, 64 rows of the 128-row tile each: wgmma m64 n256 (gated: two n128, one per
// projection) from the ring, releasing a stage on its `empty` mbarrier once the next K block's wgmma is issued, then
// the epilogue: accumulators staged through shared memory in column chunks, stored as 16-byte runs along rows. Tiles
// are visited in a grouped order (kGroupRows M tiles per group) so concurrent CTAs share A and B tiles in L2; the
// producer runs ahead into the next tile while the consumers finish the epilogue.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "arch/sm90/sm90.cuh"
#include "common/cuda_helpers.h"
#include "common/dtype_traits.h"
#include "gemm/epilogue.h"
#include "gemm/kernels.h"

namespace jax_ops::gemm {

using jax_ops::sm90::EncodeMap3d, jax_ops::sm90::NamedBarrier, jax_ops::sm90::FenceBarrierInit,
    jax_ops::sm90::FenceRegs, jax_ops::sm90::MbarArrive, jax_ops::sm90::MbarArriveExpectTx, jax_ops::sm90::MbarInit,
    jax_ops::sm90::MbarWait, jax_ops::sm90::PrefetchTensorMap, jax_ops::sm90::RegAlloc, jax_ops::sm90::RegDealloc,
    jax_ops::sm90::SmemDesc, jax_ops::sm90::TmaLoad3d, jax_ops::sm90::Wgmma, jax_ops::sm90::WgmmaA,
    jax_ops::sm90::WgmmaB, jax_ops::sm90::WgmmaCommit, jax_ops::sm90::WgmmaFence, jax_ops::sm90::WgmmaK32,
    jax_ops::sm90::WgmmaWait;

template <bool kGated>
struct Sm90Traits {
  static constexpr int kBlockM = 128;                 // two consumer warpgroups x 64 rows
  static constexpr int kKBytes = 128;                 // bytes of K per block: one 128-byte swizzle row
  static constexpr int kBlockN = kGated ? 128 : 256;  // output columns per tile
  static constexpr int kOperands = kGated ? 2 : 1;    // B projections per tile (gate, up)
  static constexpr int kStages = 4;
  static constexpr int kAStageBytes = kBlockM * kKBytes;
  static constexpr int kBOperandBytes = kBlockN * kKBytes;  // one projection's B tile (K-major or MN-major)
  static constexpr int kBStageBytes = kOperands * kBOperandBytes;
  static constexpr int kStageBytes = kAStageBytes + kBStageBytes;
  // Epilogue staging, per consumer warpgroup: 64 rows x kChunkCols output columns (gated: gate then up) of fp32,
  // rows padded to kStageStride floats: the 16-byte reads of 8 threads (two rows x 4 runs) hit distinct banks.
  static constexpr int kChunkCols = kGated ? 16 : 32;
  static constexpr int kStageStride = 36;
  static constexpr int kEpilogueBytes = 2 * 64 * kStageStride * 4;
  static constexpr int kBarrierBytes = 128;
  static constexpr int kSmemBytes =
      kStages * kStageBytes + kEpilogueBytes + kBarrierBytes + 1024;  // + 1 KiB to align to 1024
  static constexpr int kThreads = 384;
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static constexpr int kGroupRows = 8;  // M tiles per group of the tile order
};

// The wgmma of one k step for operand types TA x TB: 16-bit k16 (B K-major or MN-major) or 8-bit k32 (K-major).
template <typename TA, typename TB, int kN, WgmmaB kBMajor>
struct Sm90Mma {
  using Acc = float;
  static constexpr int kKStep = 16;
  __device__ __forceinline__ static void Run(float (&d)[kN / 2], uint64_t da, uint64_t db, int scale_d) {
    Wgmma<TA, kN, WgmmaA::kSmem, kBMajor>::Run(d, da, db, scale_d);
  }
};
template <typename TA, typename TB, int kN>
struct Sm90Mma8 {
  using Acc = typename WgmmaK32<TA, TB, kN>::Acc;
  static constexpr int kKStep = 32;
  __device__ __forceinline__ static void Run(Acc (&d)[kN / 2], uint64_t da, uint64_t db, int scale_d) {
    WgmmaK32<TA, TB, kN>::Run(d, da, db, scale_d);
  }
};
template <typename TA, typename TB, int kN, WgmmaB kBMajor>
using Sm90MmaOf = std::conditional_t<sizeof(TA) == 2, Sm90Mma<TA, TB, kN, kBMajor>, Sm90Mma8<TA, TB, kN>>;

struct Sm90Maps {
  CUtensorMap a, b, b_up;
};

// The persistent schedule: tiles numbered batch-major, then in groups of kGroupRows M tiles walked column by
// column, so the CTAs running at one time cover a few A row panels and a few B column panels.
struct Sm90Grid {
  int64_t m_tiles, n_tiles, tiles_per_batch, num_tiles;
  int64_t group_rows;  // M tiles per group
};

__device__ __forceinline__ void Sm90TileOf(const Sm90Grid& g, int64_t t, int64_t& batch, int64_t& m_tile,
                                           int64_t& n_tile) {
  batch = t / g.tiles_per_batch;
  const int64_t r = t - batch * g.tiles_per_batch;
  const int64_t group_tiles = g.group_rows * g.n_tiles;
  const int64_t first_m = (r / group_tiles) * g.group_rows;
  const int64_t rows = g.m_tiles - first_m < g.group_rows ? g.m_tiles - first_m : g.group_rows;
  const int64_t q = r - (r / group_tiles) * group_tiles;
  m_tile = first_m + q % rows;
  n_tile = q / rows;
}

// Eight consecutive elements of an output-shaped row as fp32: one 16-byte access per 16 bytes when `vec` (all eight
// exist and the row is aligned), else `count` scalar ones.
template <typename OutT>
__device__ __forceinline__ void Sm90Load8(const OutT* p, bool vec, int count, float (&x)[8]) {
  if (vec) {
    if constexpr (std::is_same_v<OutT, float>) {
      const float4 lo = reinterpret_cast<const float4*>(p)[0], hi = reinterpret_cast<const float4*>(p)[1];
      x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
    } else {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      const OutT* e = reinterpret_cast<const OutT*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = ToAcc(e[i]);
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if constexpr (std::is_same_v<OutT, float>) {
      x[i] = i < count ? p[i] : 0.f;
    } else {
      x[i] = i < count ? ToAcc(p[i]) : 0.f;
    }
  }
}

template <typename OutT>
__device__ __forceinline__ void Sm90Store8(OutT* p, bool vec, int count, const float (&y)[8]) {
  if (vec) {
    if constexpr (std::is_same_v<OutT, float>) {
      reinterpret_cast<float4*>(p)[0] = make_float4(y[0], y[1], y[2], y[3]);
      reinterpret_cast<float4*>(p)[1] = make_float4(y[4], y[5], y[6], y[7]);
    } else {
      uint4 v;
      OutT* e = reinterpret_cast<OutT*>(&v);
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = FromAcc<OutT>(y[i]);
      *reinterpret_cast<uint4*>(p) = v;
    }
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    if (i < count) {
      if constexpr (std::is_same_v<OutT, float>) {
        p[i] = y[i];
      } else {
        p[i] = FromAcc<OutT>(y[i]);
      }
    }
  }
}

// The epilogue of one staged chunk (64 rows x kChunkCols columns of one consumer warpgroup, fp32 in shared memory
// at byte `staged_offset` of the dynamic shared memory) to global memory: each thread takes runs of 8 consecutive
// columns, so loads and stores are 16-byte vectors along the row. row0 / col0: the chunk's first output row and
// column. The kernel arguments are read once into locals (behind the reference the compiler would reload them
// after every store) and the activation is a template parameter (no switch per element).
template <typename OutT, bool kGated, Activation kAct>
__device__ __forceinline__ void Sm90StoreChunk(const KernelArgs& args, uint32_t staged_offset, int64_t batch,
                                               int64_t row0, int64_t col0, int tid) {
  using Tr = Sm90Traits<kGated>;
  constexpr int kThreadsPerRow = Tr::kChunkCols / 8, kRowsPerPass = 128 / kThreadsPerRow;
  extern __shared__ unsigned char smem_raw[];
  const float* staged = reinterpret_cast<const float*>(smem_raw + staged_offset);
  const int64_t m = args.m, n = args.n;
  const float alpha = static_cast<float>(args.alpha), beta = static_cast<float>(args.beta);
  const float* __restrict__ bias_p = args.bias;
  const float* __restrict__ b_scale_p = args.b_scale;
  const float* __restrict__ a_scale_p = args.a_scale;
  const bool b_scale_one = args.b_scale_len == 1, a_scale_one = args.a_scale_len == 1;
  const OutT* __restrict__ c_p = static_cast<const OutT*>(args.c);
  const OutT* __restrict__ residual_p = static_cast<const OutT*>(args.residual);
  OutT* __restrict__ out_p = static_cast<OutT*>(args.out);
  OutT* __restrict__ preact_p = static_cast<OutT*>(args.preact);
  const int run = tid % kThreadsPerRow;
  const int64_t col = col0 + run * 8;
  if (col >= n) return;
  const int count = n - col < 8 ? static_cast<int>(n - col) : 8;
  const bool vec = count == 8 && n % 8 == 0;  // 8-element runs start 16-byte (32-byte for f32) aligned
  float bias[8], b_scale[8], bias_up[8], up_scale[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int64_t cc = i < count ? col + i : col;
    bias[i] = bias_p ? bias_p[cc] : 0.f;
    b_scale[i] = b_scale_p ? b_scale_p[b_scale_one ? 0 : cc] : 1.f;
    if constexpr (kGated) {
      bias_up[i] = bias_p ? bias_p[n + cc] : 0.f;
      up_scale[i] = b_scale_p ? b_scale_p[b_scale_one ? 0 : n + cc] : 1.f;
    }
  }
#pragma unroll 1
  for (int r = tid / kThreadsPerRow; r < 64; r += kRowsPerPass) {
    const int64_t row = row0 + r;
    if (row >= m) break;
    const float a_scale = a_scale_p ? a_scale_p[a_scale_one ? 0 : row] : 1.f;
    const int64_t off = (batch * m + row) * n + col;
    float cv[8], rv[8], z[8], zu[8], y[8];
    const float* staged_run = staged + r * Tr::kStageStride + run * 8;
    float acc[8], acc_up[8];
    Sm90Load8(staged_run, true, 8, acc);
    if constexpr (kGated) Sm90Load8(staged_run + Tr::kChunkCols, true, 8, acc_up);
    if (c_p) Sm90Load8(c_p + off, vec, count, cv);
    if (residual_p) Sm90Load8(residual_p + off, vec, count, rv);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      EpilogueScalars<float> s;
      s.scale = a_scale * b_scale[i];
      s.bias = bias[i];
      s.c = c_p ? cv[i] : 0.f;
      s.residual = residual_p ? rv[i] : 0.f;
      z[i] = PreActivation(acc[i], alpha, beta, s);
      if constexpr (kGated) {
        EpilogueScalars<float> su;
        su.scale = a_scale * up_scale[i];
        su.bias = bias_up[i];
        zu[i] = PreActivation(acc_up[i], alpha, 0.f, su);
        y[i] = GatedOutput(kAct, z[i], zu[i], s.residual);
      } else {
        y[i] = Output(kAct, z[i], s.residual);
      }
    }
    Sm90Store8(out_p + off, vec, count, y);
    if (preact_p) {
      OutT* pre = preact_p + (batch * m + row) * (kGated ? 2 : 1) * n + col;
      Sm90Store8(pre, vec, count, z);
      if constexpr (kGated) Sm90Store8(pre + n, vec, count, zu);
    }
  }
}

// The thread's accumulators of one chunk to the staging buffer: row pair r, r + 8, column pairs 8 o + 2 (lane % 4)
// of each octet o (gated: the up projection's kChunkCols columns after the gate's). The chunk is a runtime index,
// each case reads fixed registers.
template <bool kGated, typename Acc, int kRegs>
__device__ __forceinline__ void Sm90StageChunk(int chunk, const Acc (&acc)[kRegs],
                                               const Acc (&acc_up)[kGated ? kRegs : 1], float* staged, int r_local,
                                               int lane) {
  using Tr = Sm90Traits<kGated>;
  constexpr int kOctets = Tr::kChunkCols / 8;  // accumulator column octets per chunk (per projection)
#pragma unroll
  for (int at = 0; at < Tr::kBlockN / Tr::kChunkCols; ++at) {
    if (at != chunk) continue;
#pragma unroll
    for (int o = 0; o < kOctets; ++o) {
      const int j = at * kOctets + o, c = o * 8 + (lane % 4) * 2;
      *reinterpret_cast<float2*>(staged + r_local * Tr::kStageStride + c) =
          make_float2(static_cast<float>(acc[j * 4]), static_cast<float>(acc[j * 4 + 1]));
      *reinterpret_cast<float2*>(staged + (r_local + 8) * Tr::kStageStride + c) =
          make_float2(static_cast<float>(acc[j * 4 + 2]), static_cast<float>(acc[j * 4 + 3]));
      if constexpr (kGated) {
        *reinterpret_cast<float2*>(staged + r_local * Tr::kStageStride + Tr::kChunkCols + c) =
            make_float2(static_cast<float>(acc_up[j * 4]), static_cast<float>(acc_up[j * 4 + 1]));
        *reinterpret_cast<float2*>(staged + (r_local + 8) * Tr::kStageStride + Tr::kChunkCols + c) =
            make_float2(static_cast<float>(acc_up[j * 4 + 2]), static_cast<float>(acc_up[j * 4 + 3]));
      }
    }
  }
}

// The epilogue of one consumer warpgroup's 64-row tile: chunk by chunk (a rolled loop, so one copy of the store
// code), staged then stored along rows by Sm90StoreChunk.
template <typename OutT, bool kGated, Activation kAct, typename Acc, int kRegs>
__device__ __forceinline__ void Sm90EpilogueTile(const KernelArgs& args, const Acc (&acc)[kRegs],
                                                 const Acc (&acc_up)[kGated ? kRegs : 1], float* staged,
                                                 uint32_t staged_offset, int64_t batch, int64_t row_base,
                                                 int64_t col_tile, int cw, int r_local, int lane, int tid) {
  using Tr = Sm90Traits<kGated>;
#pragma unroll 1
  for (int chunk = 0; chunk < Tr::kBlockN / Tr::kChunkCols; ++chunk) {
    const int64_t col_base = col_tile + chunk * Tr::kChunkCols;
    if (col_base >= args.n) break;  // uniform: the rest of the tile is past N
    NamedBarrier(1 + cw, 128);      // the previous chunk's readers are done with the buffer
    Sm90StageChunk<kGated>(chunk, acc, acc_up, staged, r_local, lane);
    NamedBarrier(1 + cw, 128);
    Sm90StoreChunk<OutT, kGated, kAct>(args, staged_offset, batch, row_base, col_base, tid);
  }
}

// The tile epilogue for the call's activation and out dtype (one branch per tile; only the taken variant's code
// runs, so the instruction cache holds one).
template <typename OutT, bool kGated, typename Acc, int kRegs>
__device__ __forceinline__ void Sm90EpilogueOfAct(const KernelArgs& args, const Acc (&acc)[kRegs],
                                                  const Acc (&acc_up)[kGated ? kRegs : 1], float* staged,
                                                  uint32_t staged_offset, int64_t batch, int64_t row_base,
                                                  int64_t col_tile, int cw, int r_local, int lane, int tid) {
#define JAX_OPS_SM90_EPILOGUE(act)                                                                             \
  Sm90EpilogueTile<OutT, kGated, act>(args, acc, acc_up, staged, staged_offset, batch, row_base, col_tile, cw, \
                                      r_local, lane, tid)
  switch (args.activation) {
    case Activation::kRelu:
      return JAX_OPS_SM90_EPILOGUE(Activation::kRelu);
    case Activation::kGeluTanh:
      return JAX_OPS_SM90_EPILOGUE(Activation::kGeluTanh);
    case Activation::kGelu:
      return JAX_OPS_SM90_EPILOGUE(Activation::kGelu);
    case Activation::kSilu:
      return JAX_OPS_SM90_EPILOGUE(Activation::kSilu);
    default:
      return JAX_OPS_SM90_EPILOGUE(Activation::kIdentity);
  }
#undef JAX_OPS_SM90_EPILOGUE
}

template <bool kGated, typename Acc, int kRegs>
__device__ __forceinline__ void Sm90Epilogue(const KernelArgs& args, const Acc (&acc)[kRegs],
                                             const Acc (&acc_up)[kGated ? kRegs : 1], float* staged,
                                             uint32_t staged_offset, int64_t batch, int64_t row_base, int64_t col_tile,
                                             int cw, int r_local, int lane, int tid) {
  switch (args.out_dtype) {
    case ffi::DataType::F16:
      return Sm90EpilogueOfAct<__half, kGated>(args, acc, acc_up, staged, staged_offset, batch, row_base, col_tile, cw,
                                               r_local, lane, tid);
    case ffi::DataType::BF16:
      return Sm90EpilogueOfAct<__nv_bfloat16, kGated>(args, acc, acc_up, staged, staged_offset, batch, row_base,
                                                      col_tile, cw, r_local, lane, tid);
    default:
      return Sm90EpilogueOfAct<float, kGated>(args, acc, acc_up, staged, staged_offset, batch, row_base, col_tile, cw,
                                              r_local, lane, tid);
  }
}

template <typename TA, typename TB, bool kGated, WgmmaB kBMajor>
__global__ void __launch_bounds__(384, 1)
    GemmSm90Kernel(const __grid_constant__ Sm90Maps maps, const __grid_constant__ KernelArgs args, Sm90Grid grid) {
#if JAX_OPS_SM90
  using Tr = Sm90Traits<kGated>;
  using Mma = Sm90MmaOf<TA, TB, Tr::kBlockN, kBMajor>;
  using Acc = typename Mma::Acc;
  constexpr int kStages = Tr::kStages, kBlockK = Tr::kKBytes / static_cast<int>(sizeof(TA));
  constexpr int kRegs = Tr::kBlockN / 2;
  extern __shared__ unsigned char smem_raw[];
  // Offset from smem_raw (not a rounded integer address) so the compiler keeps these pointers in shared space.
  const uint32_t align_pad = (1024u - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023u)) & 1023u;
  unsigned char* smem = smem_raw + align_pad;
  unsigned char* sA = smem;
  unsigned char* sB = smem + kStages * Tr::kAStageBytes;
  float* sEpilogue = reinterpret_cast<float*>(sB + kStages * Tr::kBStageBytes);
  uint64_t* full = reinterpret_cast<uint64_t*>(reinterpret_cast<unsigned char*>(sEpilogue) + Tr::kEpilogueBytes);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full + s, 1);
      MbarInit(empty + s, 8);  // one arrival per consumer warp
    }
    FenceBarrierInit();
  }
  __syncthreads();
  const int wg = threadIdx.x / 128;
  const int64_t k_blocks = (args.k + kBlockK - 1) / kBlockK;
  if (wg == 0) {
    RegDealloc<Tr::kProducerRegs>();
    if (threadIdx.x != 0) return;
    PrefetchTensorMap(&maps.a);
    PrefetchTensorMap(&maps.b);
    if constexpr (kGated) PrefetchTensorMap(&maps.b_up);
    int64_t it = 0;
    for (int64_t t = blockIdx.x; t < grid.num_tiles; t += gridDim.x) {
      int64_t batch, m_tile, n_tile;
      Sm90TileOf(grid, t, batch, m_tile, n_tile);
      const int b_batch = args.b_batch_stride == 0 ? 0 : static_cast<int>(batch);
      const int m0 = static_cast<int>(m_tile * Tr::kBlockM), n0 = static_cast<int>(n_tile * Tr::kBlockN);
      for (int64_t kb = 0; kb < k_blocks; ++kb, ++it) {
        const int stage = static_cast<int>(it % kStages);
        if (it >= kStages) MbarWait(empty + stage, ((it / kStages) - 1) & 1);
        MbarArriveExpectTx(full + stage, Tr::kStageBytes);
        const int k0 = static_cast<int>(kb * kBlockK);
        TmaLoad3d(sA + stage * Tr::kAStageBytes, &maps.a, full + stage, k0, m0, static_cast<int>(batch));
        unsigned char* b_dst = sB + stage * Tr::kBStageBytes;
#pragma unroll
        for (int op = 0; op < Tr::kOperands; ++op) {
          // The up projection: a second map (separate weight) or the same map N columns on (packed weight).
          const CUtensorMap* map = op == 1 && args.gated == Gated::kSeparate ? &maps.b_up : &maps.b;
          const int col0 = n0 + (op == 1 ? static_cast<int>(args.up_offset) : 0);
          unsigned char* dst = b_dst + op * Tr::kBOperandBytes;
          if constexpr (kBMajor == WgmmaB::kKMajor) {
            TmaLoad3d(dst, map, full + stage, k0, col0, b_batch);
          } else {  // 64-column panels of kBlockK rows
#pragma unroll
            for (int p = 0; p < Tr::kBlockN / 64; ++p)
              TmaLoad3d(dst + p * kBlockK * 128, map, full + stage, col0 + p * 64, k0, b_batch);
          }
        }
      }
    }
    return;
  }
  RegAlloc<Tr::kConsumerRegs>();
  const int cw = wg - 1;  // consumer warpgroup: rows [64 cw, 64 cw + 64) of the tile
  const int tid = threadIdx.x - 128 * wg, warp = tid / 32, lane = tid % 32;
  int64_t it = 0;
  Acc acc[kRegs];
  Acc acc_up[kGated ? kRegs : 1];
  for (int64_t t = blockIdx.x; t < grid.num_tiles; t += gridDim.x) {
    int64_t batch, m_tile, n_tile;
    Sm90TileOf(grid, t, batch, m_tile, n_tile);
    FenceRegs(acc);
    if constexpr (kGated) FenceRegs(acc_up);
    for (int64_t kb = 0; kb < k_blocks; ++kb, ++it) {
      const int stage = static_cast<int>(it % kStages);
      MbarWait(full + stage, (it / kStages) & 1);
      const unsigned char* a_tile = sA + stage * Tr::kAStageBytes + cw * 64 * 128;
      const unsigned char* b_tile = sB + stage * Tr::kBStageBytes;
      WgmmaFence();
#pragma unroll
      for (int ks = 0; ks < kBlockK / Mma::kKStep; ++ks) {
        const uint64_t da = SmemDesc(a_tile + ks * 32, 16, 1024);
        const int scale_d = kb > 0 || ks > 0;
#pragma unroll
        for (int op = 0; op < Tr::kOperands; ++op) {
          const unsigned char* b_op = b_tile + op * Tr::kBOperandBytes;
          // K-major: 32 bytes of K per k step inside each 128-byte row; MN-major: 16 K rows (2 KiB) per k step,
          // the 64-column panels kBlockK * 128 bytes apart.
          const uint64_t db = kBMajor == WgmmaB::kKMajor ? SmemDesc(b_op + ks * 32, 16, 1024)
                                                         : SmemDesc(b_op + ks * 2048, kBlockK * 128, 1024);
          if (op == 0) {
            Mma::Run(acc, da, db, scale_d);
          } else if constexpr (kGated) {
            Mma::Run(acc_up, da, db, scale_d);
          }
        }
      }
      WgmmaCommit();
      if (kb > 0) {  // the previous K block's wgmma has finished reading its stage
        WgmmaWait<1>();
        __syncwarp();
        if (lane == 0) MbarArrive(empty + (it - 1) % kStages);
      }
    }
    WgmmaWait<0>();
    FenceRegs(acc);
    if constexpr (kGated) FenceRegs(acc_up);
    __syncwarp();
    if (lane == 0) MbarArrive(empty + (it - 1) % kStages);
    // Epilogue: the accumulators go to shared memory kChunkCols columns at a time, then along rows to global memory.
    float* staged = sEpilogue + cw * 64 * Tr::kStageStride;
    Sm90Epilogue<kGated>(args, acc, acc_up, staged,
                         static_cast<uint32_t>(reinterpret_cast<unsigned char*>(staged) - smem_raw), batch,
                         m_tile * Tr::kBlockM + cw * 64, n_tile * Tr::kBlockN, cw, warp * 16 + lane / 4, lane, tid);
  }
#endif
}

// Host side -------------------------------------------------------------------------------------------------------

template <typename T>
constexpr CUtensorMapDataType Sm90MapDType() {
  if constexpr (std::is_same_v<T, __half>) return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return CU_TENSOR_MAP_DATA_TYPE_UINT8;  // fp8 / int8: raw bytes
}

// Encodes the maps and launches one instantiation; cudaErrorInvalidValue when the driver refuses a map.
template <typename TA, typename TB, bool kGated, WgmmaB kBMajor>
cudaError_t LaunchSm90Kernel(const KernelArgs& args, int num_sms, cudaStream_t stream) {
  using Tr = Sm90Traits<kGated>;
  constexpr int kBlockK = Tr::kKBytes / static_cast<int>(sizeof(TA));
  Sm90Maps maps{};
  const int64_t b_batches = args.b_batch_stride == 0 ? 1 : args.batch;
  // a [batch, m, k] (K-major): boxes of kBlockK x 128 rows.
  bool ok = EncodeMap3d(&maps.a, Sm90MapDType<TA>(), sizeof(TA), args.a, args.k, args.m, args.batch, args.lda,
                        args.m * args.lda, kBlockK, Tr::kBlockM);
  const int64_t b_cols = args.gated == Gated::kPacked ? 2 * args.n : args.n;
  const int64_t b_plane = args.b_batch_stride == 0 ? args.k * b_cols : args.b_batch_stride;
  for (int op = 0; op < (args.gated == Gated::kSeparate ? 2 : 1); ++op) {
    CUtensorMap* map = op == 0 ? &maps.b : &maps.b_up;
    const void* base = op == 0 ? args.b : args.b_up;
    if constexpr (kBMajor == WgmmaB::kKMajor) {  // b [bb, n, k]: boxes of kBlockK x kBlockN rows
      ok = ok && EncodeMap3d(map, Sm90MapDType<TB>(), sizeof(TB), base, args.k, b_cols, b_batches, args.ldb, b_plane,
                             kBlockK, Tr::kBlockN);
    } else {  // b [bb, k, cols]: boxes of 64 columns x kBlockK rows
      ok = ok && EncodeMap3d(map, Sm90MapDType<TB>(), sizeof(TB), base, b_cols, args.k, b_batches, args.ldb, b_plane,
                             64, kBlockK);
    }
  }
  if (!ok) return cudaErrorInvalidValue;
  Sm90Grid grid;
  grid.m_tiles = (args.m + Tr::kBlockM - 1) / Tr::kBlockM;
  grid.n_tiles = (args.n + Tr::kBlockN - 1) / Tr::kBlockN;
  grid.tiles_per_batch = grid.m_tiles * grid.n_tiles;
  grid.num_tiles = grid.tiles_per_batch * args.batch;
  grid.group_rows = Tr::kGroupRows;
  const auto kernel = GemmSm90Kernel<TA, TB, kGated, kBMajor>;
  cudaError_t err = SetDynamicSmemOnce(reinterpret_cast<const void*>(kernel), Tr::kSmemBytes);
  if (err != cudaSuccess) return err;
  const int64_t ctas = grid.num_tiles < num_sms ? grid.num_tiles : num_sms;
  kernel<<<static_cast<unsigned>(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(maps, args, grid);
  return cudaGetLastError();
}

// The B-layout x gated choice for one operand-type pair (16-bit types take both B layouts; 8-bit ones K-major).
// Instantiated once per pair in gemm_sm90_<dtype>.cu (one translation unit each, so they compile in parallel).
template <typename TA, typename TB>
cudaError_t LaunchSm90Types(const KernelArgs& args, int num_sms, cudaStream_t stream) {
  const bool gated = args.gated != Gated::kNone;
  if constexpr (sizeof(TA) == 2) {
    if (!args.transpose_b)
      return gated ? LaunchSm90Kernel<TA, TB, true, WgmmaB::kMNMajor>(args, num_sms, stream)
                   : LaunchSm90Kernel<TA, TB, false, WgmmaB::kMNMajor>(args, num_sms, stream);
  }
  return gated ? LaunchSm90Kernel<TA, TB, true, WgmmaB::kKMajor>(args, num_sms, stream)
               : LaunchSm90Kernel<TA, TB, false, WgmmaB::kKMajor>(args, num_sms, stream);
}

}  // namespace jax_ops::gemm
