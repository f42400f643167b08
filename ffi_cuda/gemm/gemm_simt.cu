// The portable SIMT GEMM (sm_80+): every dtype pair of params.h, both transposes, batch broadcast, gated
// separate/packed, scales, write_preact, any M/N/K and no alignment needs. The fallback of the other kernels and the
// exact-fp32 / fp64 path.
//
// A CTA of 256 threads computes a 128x128 output tile in K steps of 8: both operands are loaded (scalar, bounds
// checked, converted to the compute type) into registers one step ahead and stored k-major into double-buffered
// shared memory; each thread accumulates an 8x8 micro-tile (rows ty*4 + {0..3, 64..67}, columns tx*4 + {0..3,
// 64..67}) with FFMA / DFMA / integer multiply-add. A gated GEMM's tile holds 64 gate columns in its left half and
// the same 64 up columns in its right half, so every thread owns the gate and up accumulators of its 4 x 4 x 2
// output elements and the epilogue combines them in registers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "gemm/epilogue_cuda.cuh"
#include "gemm/kernels.h"

namespace jax_ops::gemm {
namespace {

constexpr int kBM = 128, kBN = 128, kBK = 8, kThreads = 256;
constexpr int kPad = 4;  // smem row padding (keeps 16-byte alignment; spreads the transposing stores over banks)
constexpr unsigned kMaxGridYZ = 65535;

// Compute type of an input dtype: float (16-bit, f32, fp8), double (f64), int32 (s8).
template <typename T>
using ComputeOf = std::conditional_t<std::is_same_v<T, double>, double,
                                     std::conditional_t<std::is_same_v<T, int8_t>, int32_t, float>>;

// Accumulator rows staged per epilogue pass (a quarter of the tile): they fit in the operand tiles' space.
constexpr int kStageRows = 32;

template <typename C>
union SimtSmem {
  struct {
    C a[2][kBK][kBM + kPad];
    C b[2][kBK][kBN + kPad];
  } tiles;
  C stage[kStageRows][kBN + kPad];
};

template <typename C>
__device__ __forceinline__ void MulAdd(C& acc, C x, C y) {
  if constexpr (std::is_same_v<C, float>)
    acc = fmaf(x, y, acc);
  else if constexpr (std::is_same_v<C, double>)
    acc = fma(x, y, acc);
  else  // int8 products summed in int32 (wrapping, as the contract's int32 accumulator)
    acc = static_cast<int32_t>(static_cast<uint32_t>(acc) + static_cast<uint32_t>(x * y));
}

// Four consecutive shared-memory values into dst[at..at + 3] (16-byte aligned: one vector load, two for double).
template <typename C>
__device__ __forceinline__ void Load4(const C* src, C (&dst)[8], int at) {
  using V = std::conditional_t<std::is_same_v<C, float>, float4, int4>;
  if constexpr (sizeof(C) == 4) {
    const V v = *reinterpret_cast<const V*>(src);
    dst[at + 0] = v.x;
    dst[at + 1] = v.y;
    dst[at + 2] = v.z;
    dst[at + 3] = v.w;
  } else {
    const double2 lo = *reinterpret_cast<const double2*>(src);
    const double2 hi = *reinterpret_cast<const double2*>(src + 2);
    dst[at + 0] = lo.x;
    dst[at + 1] = lo.y;
    dst[at + 2] = hi.x;
    dst[at + 3] = hi.y;
  }
}

// One operand's part of a K step for this thread: 4 elements at ptr[0..3] (consecutive in memory), stored into the
// k-major shared tile at smem_off + j * smem_step. "Row" layout (k contiguous: a, or b transposed): the 4 elements are
// consecutive k of one row; "column" layout: consecutive rows/columns at one k. k_off: its k within the step (plus j in
// the row layout).
template <typename T>
struct OperandLoader {
  const T* ptr = nullptr;
  int64_t step = 0;  // elements between consecutive K steps
  int k_off = 0, smem_off = 0, smem_step = 0;
  bool row_layout = false;
  unsigned fixed_ok = 0;  // bit j: element j's row/column is in range

  template <typename C>
  __device__ __forceinline__ void Load(int64_t k0, int64_t k, C (&r)[4]) const {
    const T* src = ptr + (k0 / kBK) * step;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const bool ok = ((fixed_ok >> j) & 1u) && k0 + k_off + (row_layout ? j : 0) < k;
      r[j] = ok ? C(Widen(src[j])) : C(0);
    }
  }
};

// The loader of a tile's rows (a: fixed = rows m0.., contiguous_k = !transpose_a) or columns (b: contiguous_k =
// transpose_b). base points at fixed index 0 of this batch; ld is the stored row stride; fixed_limit the index bound;
// tile_pad the shared row length.
template <typename T>
__device__ __forceinline__ OperandLoader<T> MakeLoader(const T* base, int64_t fixed0, int64_t fixed_limit, int64_t ld,
                                                       bool contiguous_k, int tile_pad) {
  const int tid = threadIdx.x;
  OperandLoader<T> l;
  l.row_layout = contiguous_k;
  if (contiguous_k) {  // 128 rows x 8 k: row tid / 2, k (tid % 2) * 4 + j
    const int r = tid / 2;
    l.k_off = (tid % 2) * 4;
    l.ptr = base + (fixed0 + r) * ld + l.k_off;
    l.step = kBK;
    l.smem_off = l.k_off * tile_pad + r;
    l.smem_step = tile_pad;
    l.fixed_ok = fixed0 + r < fixed_limit ? 0xfu : 0u;
  } else {  // 8 k x 128 rows: k tid / 32, rows (tid % 32) * 4 + j
    const int c = (tid % 32) * 4;
    l.k_off = tid / 32;
    l.ptr = base + l.k_off * ld + fixed0 + c;
    l.step = kBK * ld;
    l.smem_off = l.k_off * tile_pad + c;
    l.smem_step = 1;
    for (int j = 0; j < 4; ++j) l.fixed_ok |= (fixed0 + c + j < fixed_limit ? 1u : 0u) << j;
  }
  return l;
}

template <typename TA, typename TB, typename TO>
__global__ void __launch_bounds__(kThreads, std::is_same_v<TA, double> ? 1 : 2) SimtGemmKernel(const KernelArgs p) {
  using C = ComputeOf<TA>;
  using Acc = EpilogueAcc<C>;
  __shared__ SimtSmem<C> smem;
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const bool gated = p.gated != Gated::kNone;
  const int64_t tile_cols = gated ? kBN / 2 : kBN;  // output columns per tile
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * tile_cols;
  const int64_t k_tiles = (p.k + kBK - 1) / kBK;
  // This thread's b column decides its source: a gated tile's columns 64.. are the up columns of n0.. (b_up, with b's
  // strides, or b + up_offset for a packed weight).
  const int b_col = p.transpose_b ? tid / 2 : (tid % 32) * 4;
  const bool up_half = gated && b_col >= kBN / 2;
  const TB* b_src = static_cast<const TB*>(p.gated == Gated::kSeparate && up_half ? p.b_up : p.b);
  if (up_half && p.gated == Gated::kPacked) b_src += p.up_offset;
  // The loader's index of tile column c: n0 + c, or n0 + c - 64 in a gated tile's up half (the up weight's column).
  const int64_t b_n0 = n0 - (up_half ? kBN / 2 : 0);

  for (int64_t batch = blockIdx.z; batch < p.batch; batch += gridDim.z) {
    const TA* a = static_cast<const TA*>(p.a) + batch * p.a_batch_stride;
    const TB* b = b_src + batch * p.b_batch_stride;
    for (int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM; m0 < p.m; m0 += static_cast<int64_t>(gridDim.y) * kBM) {
      const OperandLoader<TA> la = MakeLoader(a, m0, p.m, p.lda, !p.transpose_a, kBM + kPad);
      const OperandLoader<TB> lb = MakeLoader(b, b_n0, p.n, p.ldb, p.transpose_b, kBN + kPad);
      C ra[4], rb[4];
      auto store = [&](int buf) {
        C* sa = &smem.tiles.a[buf][0][0] + la.smem_off;
        C* sb = &smem.tiles.b[buf][0][0] + lb.smem_off;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          sa[j * la.smem_step] = ra[j];
          sb[j * lb.smem_step] = rb[j];
        }
      };

      C acc[8][8];
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = C(0);
      if (k_tiles > 0) {
        la.Load(0, p.k, ra);
        lb.Load(0, p.k, rb);
        store(0);
      }
      __syncthreads();
      for (int64_t kt = 0; kt < k_tiles; ++kt) {
        const int buf = static_cast<int>(kt & 1);
        if (kt + 1 < k_tiles) {  // global loads in flight during the FMAs below
          la.Load((kt + 1) * kBK, p.k, ra);
          lb.Load((kt + 1) * kBK, p.k, rb);
        }
#pragma unroll
        for (int kk = 0; kk < kBK; ++kk) {
          C fa[8], fb[8];
          Load4(&smem.tiles.a[buf][kk][ty * 4], fa, 0);
          Load4(&smem.tiles.a[buf][kk][kBM / 2 + ty * 4], fa, 4);
          Load4(&smem.tiles.b[buf][kk][tx * 4], fb, 0);
          Load4(&smem.tiles.b[buf][kk][kBN / 2 + tx * 4], fb, 4);
#pragma unroll
          for (int i = 0; i < 8; ++i)
#pragma unroll
            for (int j = 0; j < 8; ++j) MulAdd(acc[i][j], fa[i], fb[j]);
        }
        // The other buffer was last read in step kt - 1, which every thread finished before the barrier below it.
        if (kt + 1 < k_tiles) store(buf ^ 1);
        __syncthreads();
      }

      // Epilogue through shared memory (the operand tiles' space), a quarter of the rows per pass: rolled loops over
      // coalesced columns instead of 64 unrolled element epilogues (their register demand would spill the mainloop).
      // Stage row r of pass q is tile row (r / 16) * 64 + (r % 16) * 4 + q.
#pragma unroll
      for (int q = 0; q < 4; ++q) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int j = 0; j < 8; ++j)
            smem.stage[h * 16 + ty][j < 4 ? tx * 4 + j : kBN / 2 + tx * 4 + j - 4] = acc[h * 4 + q][j];
        __syncthreads();
        const int out_cols = gated ? kBN / 2 : kBN;
        for (int e = tid; e < kStageRows * out_cols; e += kThreads) {
          const int r = e / out_cols, col = e % out_cols;
          const int64_t m = m0 + (r / 16) * (kBM / 2) + (r % 16) * 4 + q, n = n0 + col;
          if (m >= p.m || n >= p.n) continue;
          const C* row = smem.stage[r];
          if (gated)
            StoreGated<TO, Acc>(p, batch, m, n, Acc(row[col]), Acc(row[col + kBN / 2]));
          else
            StorePlain<TO, Acc>(p, batch, m, n, Acc(row[col]));
        }
        __syncthreads();
      }
    }
  }
}

template <typename TA, typename TB, typename TO>
cudaError_t Launch(const KernelArgs& p, cudaStream_t stream) {
  const int64_t tile_cols = p.gated != Gated::kNone ? kBN / 2 : kBN;
  const int64_t n_tiles = (p.n + tile_cols - 1) / tile_cols, m_tiles = (p.m + kBM - 1) / kBM;
  if (n_tiles > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(std::min<int64_t>(m_tiles, kMaxGridYZ)),
                  static_cast<unsigned>(std::min<int64_t>(p.batch, kMaxGridYZ)));
  SimtGemmKernel<TA, TB, TO><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
constexpr ffi::DataType DTypeOf() {
  if constexpr (std::is_same_v<T, __half>) return ffi::DataType::F16;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return ffi::DataType::BF16;
  if constexpr (std::is_same_v<T, float>) return ffi::DataType::F32;
  if constexpr (std::is_same_v<T, double>) return ffi::DataType::F64;
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>) return ffi::DataType::F8E4M3FN;
  if constexpr (std::is_same_v<T, __nv_fp8_e5m2>) return ffi::DataType::F8E5M2;
  return ffi::DataType::S8;
}

// The kernel for inputs (TA, TB) and the out dtype among Outs (params.h's rules); cudaErrorNotSupported if b or out
// has another dtype.
template <typename TA, typename TB, typename... Outs>
cudaError_t LaunchFor(const KernelArgs& p, cudaStream_t stream) {
  if (p.a_dtype != DTypeOf<TA>() || p.b_dtype != DTypeOf<TB>()) return cudaErrorNotSupported;
  cudaError_t err = cudaErrorNotSupported;
  (void)((p.out_dtype == DTypeOf<Outs>() && ((err = Launch<TA, TB, Outs>(p, stream)), true)) || ...);
  return err;
}

template <typename TA>
cudaError_t LaunchFp8(const KernelArgs& p, cudaStream_t stream) {
  if (p.b_dtype == ffi::DataType::F8E4M3FN)
    return LaunchFor<TA, __nv_fp8_e4m3, __half, __nv_bfloat16, float>(p, stream);
  return LaunchFor<TA, __nv_fp8_e5m2, __half, __nv_bfloat16, float>(p, stream);
}

}  // namespace

cudaError_t LaunchSimt(const KernelArgs& p, cudaStream_t stream) {
  if (p.batch == 0 || p.m == 0 || p.n == 0) return cudaSuccess;
  using DT = ffi::DataType;
  switch (p.a_dtype) {
    case DT::F16:
      return LaunchFor<__half, __half, __half, float>(p, stream);
    case DT::BF16:
      return LaunchFor<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float>(p, stream);
    case DT::F32:  // exact fp32 FFMA, with or without the tf32 attribute (tf32 permits rounding, never requires it)
      return LaunchFor<float, float, float>(p, stream);
    case DT::F64:
      return LaunchFor<double, double, double>(p, stream);
    case DT::F8E4M3FN:
      return LaunchFp8<__nv_fp8_e4m3>(p, stream);
    case DT::F8E5M2:
      return LaunchFp8<__nv_fp8_e5m2>(p, stream);
    case DT::S8:
      return LaunchFor<int8_t, int8_t, __half, __nv_bfloat16, float>(p, stream);
    default:
      return cudaErrorNotSupported;
  }
}

}  // namespace jax_ops::gemm
