// Fused elementwise LSMR recurrences. Memory-bound: 16-byte vector loads/stores when the row's pointers share
// an alignment (after a scalar head), a scalar tail, several independent vectors in flight per thread.
#include <algorithm>

#include "lsmr/heuristics.h"
#include "lsmr/kernels.h"
#include "lsmr/params.h"

namespace jax_ops::lsmr {
namespace {

template <typename T>
struct alignas(kVectorBytes) Vec {
  static constexpr int kLanes = kVectorBytes / sizeof(T);
  T lane[kLanes];
};

// Sum of `value` over the CTA (every thread gets it) in a fixed order: an xor tree per warp, then warp 0 over the
// warps. Deterministic for a given blockDim, so every CTA that sums the same values gets the same bits.
__device__ double BlockSum(double value) {
  __shared__ double warp_sums[kThreads / 32];
  __shared__ double total;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) value += __shfl_xor_sync(0xffffffffu, value, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = value;
  __syncthreads();
  if (warp == 0) {
    double w = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) w += __shfl_xor_sync(0xffffffffu, w, off);
    if (lane == 0) total = w;
  }
  __syncthreads();
  const double result = total;
  __syncthreads();  // warp_sums / total are reused by the next call
  return result;
}

// Sum of squares of a row's partial norms (strided per thread, then BlockSum).
template <typename T>
__device__ double BlockSumOfSquares(const T* partials, int64_t count) {
  double s = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreads) s += static_cast<double>(partials[i]) * partials[i];
  return BlockSum(s);
}

// kUnroll: vectors per thread per step; the loads of all of them issue before any math.
template <typename Update, int kUnroll, typename T, int NIn, int NOut, int NCoef>
__global__ void __launch_bounds__(kThreads) RowwiseKernel(RowwiseArgs<T, NIn, NOut, NCoef> args) {
  using V = Vec<T>;
  constexpr int kLanes = V::kLanes;
  constexpr int kOutN = NOut > 0 ? NOut : 1;  // array extents (an update may have no outputs)
  constexpr int kCoefN = NCoef > 0 ? NCoef : 1;
  for (int64_t row = blockIdx.y; row < args.rows; row += gridDim.y) {
    const int64_t base = row * args.n;
    T c[kCoefN];
    if constexpr (Update::kCoefFromState) {
      // Every CTA of the row derives the coefficients from the same state (thread 0; shared with the CTA).
      __shared__ T coef_shared[kCoefN];
      const double squares = BlockSumOfSquares(args.state.norm_partials + row * args.state.num_norm_partials,
                                               args.state.num_norm_partials);
      if (threadIdx.x == 0) Update::Coefficients(args.state, row, squares, blockIdx.x == 0, coef_shared);
      __syncthreads();
#pragma unroll
      for (int k = 0; k < NCoef; ++k) c[k] = coef_shared[k];
      __syncthreads();  // coef_shared is rewritten for the next row
    } else {
#pragma unroll
      for (int k = 0; k < NCoef; ++k) c[k] = args.coef[k][row];
    }

    // Elements before the first 16-byte boundary; the vector path needs every pointer to agree on it.
    auto misalign = [&](const void* p) {
      return static_cast<int>((reinterpret_cast<uintptr_t>(p) % kVectorBytes) / sizeof(T));
    };
    const int m0 = misalign(args.in[0] + base);
    bool aligned = (reinterpret_cast<uintptr_t>(args.in[0] + base) % sizeof(T)) == 0;
#pragma unroll
    for (int k = 0; k < NIn; ++k) aligned &= misalign(args.in[k] + base) == m0;
#pragma unroll
    for (int k = 0; k < NOut; ++k) aligned &= misalign(args.out[k] + base) == m0;
    const int64_t lead = (kLanes - m0) % kLanes;
    const int64_t head = aligned ? (lead < args.n ? lead : args.n) : args.n;
    const int64_t nvec = aligned ? (args.n - head) / kLanes : 0;
    const int64_t tail_start = head + nvec * kLanes;

    const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;

    constexpr bool kNorms = Update::kNormOut >= 0 || Update::kNormIn >= 0;
    double squares = 0;  // this thread's share of the sum of squares of the normed vector in this CTA
    auto add_square = [&](const T* in, const T* out) {
      if constexpr (Update::kNormOut >= 0)
        squares += static_cast<double>(out[Update::kNormOut]) * out[Update::kNormOut];
      if constexpr (Update::kNormIn >= 0) squares += static_cast<double>(in[Update::kNormIn]) * in[Update::kNormIn];
    };
    // Scalar head and tail (the whole row when the pointers disagree on alignment).
    auto scalar = [&](int64_t i) {
      T in[NIn], out[kOutN];
#pragma unroll
      for (int k = 0; k < NIn; ++k) in[k] = args.in[k][base + i];
      Update::Apply(c, in, out);
#pragma unroll
      for (int k = 0; k < NOut; ++k) args.out[k][base + i] = out[k];
      add_square(in, out);
    };
    for (int64_t i = tid; i < head; i += nthreads) scalar(i);
    for (int64_t i = tail_start + tid; i < args.n; i += nthreads) scalar(i);

    const V* vin[NIn];
    V* vout[kOutN];
#pragma unroll
    for (int k = 0; k < NIn; ++k) vin[k] = reinterpret_cast<const V*>(args.in[k] + base + head);
#pragma unroll
    for (int k = 0; k < NOut; ++k) vout[k] = reinterpret_cast<V*>(args.out[k] + base + head);

    for (int64_t v0 = tid; v0 < nvec; v0 += nthreads * kUnroll) {
      V in[kUnroll][NIn];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + u * nthreads;
        if (v < nvec) {
#pragma unroll
          for (int k = 0; k < NIn; ++k) in[u][k] = vin[k][v];
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t v = v0 + u * nthreads;
        if (v >= nvec) break;
        V out[kOutN];
#pragma unroll
        for (int l = 0; l < kLanes; ++l) {
          T e_in[NIn], e_out[kOutN];
#pragma unroll
          for (int k = 0; k < NIn; ++k) e_in[k] = in[u][k].lane[l];
          Update::Apply(c, e_in, e_out);
#pragma unroll
          for (int k = 0; k < NOut; ++k) out[k].lane[l] = e_out[k];
          add_square(e_in, e_out);
        }
#pragma unroll
        for (int k = 0; k < NOut; ++k) vout[k][v] = out[k];
      }
    }
    if constexpr (kNorms) {
      const double total = BlockSum(squares);  // fixed order: deterministic for a given grid
      if (threadIdx.x == 0) args.partials[row * gridDim.x + blockIdx.x] = static_cast<T>(sqrt(total));
    }
  }
}

// Grid: x covers a row with at most blocks_per_sm * sm_count blocks in all (0: no cap, one step per thread),
// y walks the rows. The launches use kRowBlocksPerSm (heuristics.h); ffi_cuda/tools/lsmr_bench.cu sweeps the cap.
template <typename Update, int kUnroll, typename T>
cudaError_t LaunchRowwiseWith(cudaStream_t stream, const RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef>& args,
                              int sm_count, int blocks_per_sm) {
  if (args.rows == 0) return cudaSuccess;
  // n = 0 still launches one CTA per row: it writes the row's partial norm (0) and, for kCoefFromState, its outputs.
  constexpr int64_t kElemsPerBlockStep = int64_t{kThreads} * (kVectorBytes / sizeof(T)) * kUnroll;
  const int64_t per_row_blocks = (args.n + kElemsPerBlockStep - 1) / kElemsPerBlockStep;
  const int64_t grid_y = std::min<int64_t>(args.rows, kMaxGridY);
  int64_t grid_x = std::min<int64_t>(per_row_blocks, kMaxGridX);
  if (blocks_per_sm > 0) {
    const int64_t target_blocks = int64_t{sm_count} * blocks_per_sm;
    grid_x = std::min<int64_t>(grid_x, (target_blocks + grid_y - 1) / grid_y);
  }
  grid_x = std::max<int64_t>(grid_x, 1);
  RowwiseKernel<Update, kUnroll>
      <<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

// Column layout: CTA x takes rows [x * R, (x + 1) * R) of every column (R = ColumnsRowsPerCta(cols)); y walks the
// batch. Columns go in tiles of kc = min(cols, kThreads): thread t takes column c0 + t % kc and every tpc-th row
// (tpc = kThreads / kc), so a warp reads whole [.., cols] rows (coalesced). Partial norms: each thread's sum, then
// the tpc sums of a column in a fixed order (deterministic).
template <typename Update, typename T, int NIn, int NOut, int NCoef>
__global__ void __launch_bounds__(kThreads) ColumnsKernel(ColumnsArgs<T, NIn, NOut, NCoef> args) {
  constexpr int kOutN = NOut > 0 ? NOut : 1;
  constexpr int kCoefN = NCoef > 0 ? NCoef : 1;
  constexpr bool kNorms = Update::kNormOut >= 0 || Update::kNormIn >= 0;
  __shared__ double column_squares[kThreads];
  const int64_t cols = args.cols;
  const int kc = static_cast<int>(cols < kThreads ? cols : kThreads);
  const int tpc = kThreads / kc;
  const int local = threadIdx.x % kc, lane_row = threadIdx.x / kc;
  const int64_t per_cta = ColumnsRowsPerCta(cols);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * per_cta;
  const int64_t r1 = r0 + per_cta < args.rows ? r0 + per_cta : args.rows;
  for (int64_t b = blockIdx.y; b < args.batch; b += gridDim.y) {
    const int64_t base = b * args.rows * cols;
    for (int64_t c0 = 0; c0 < cols; c0 += kc) {
      const int64_t col = c0 + local;
      const int64_t state_row = b * cols + col;
      const bool mine = lane_row < tpc && col < cols;
      T c[kCoefN];
#pragma unroll
      for (int j = 0; j < NCoef; ++j) c[j] = mine ? args.coef[state_row * NCoef + j] : T(0);
      double squares = 0;
      if (mine) {
        for (int64_t r = r0 + lane_row; r < r1; r += int64_t{tpc} * kColumnsRowUnroll) {
          T in[kColumnsRowUnroll][NIn];
#pragma unroll
          for (int u = 0; u < kColumnsRowUnroll; ++u) {
            const int64_t rr = r + int64_t{u} * tpc;
            if (rr < r1) {
#pragma unroll
              for (int k = 0; k < NIn; ++k) in[u][k] = args.in[k][base + rr * cols + col];
            }
          }
#pragma unroll
          for (int u = 0; u < kColumnsRowUnroll; ++u) {
            const int64_t rr = r + int64_t{u} * tpc;
            if (rr >= r1) break;
            T out[kOutN];
            Update::Apply(c, in[u], out);
#pragma unroll
            for (int k = 0; k < NOut; ++k) args.out[k][base + rr * cols + col] = out[k];
            if constexpr (Update::kNormOut >= 0)
              squares += static_cast<double>(out[Update::kNormOut]) * out[Update::kNormOut];
            if constexpr (Update::kNormIn >= 0)
              squares += static_cast<double>(in[u][Update::kNormIn]) * in[u][Update::kNormIn];
          }
        }
      }
      if constexpr (kNorms) {
        column_squares[threadIdx.x] = squares;
        __syncthreads();
        if (lane_row == 0 && col < cols) {
          double s = 0;
          for (int j = 0; j < tpc; ++j) s += column_squares[j * kc + local];
          args.partials[state_row * gridDim.x + blockIdx.x] = static_cast<T>(sqrt(s));
        }
        __syncthreads();  // column_squares is reused by the next tile
      }
    }
  }
}

// One CTA per state row (column): its coefficients from the state (Update::Coefficients on the partials' sum of
// squares, the row kernel's code).
template <typename Update, typename T>
__global__ void __launch_bounds__(kThreads) StateCoefficientsKernel(ColumnState<T> state, T* coef, int64_t rows) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const double squares =
        BlockSumOfSquares(state.norm_partials + row * state.num_norm_partials, state.num_norm_partials);
    if (threadIdx.x == 0) Update::Coefficients(state, row, squares, /*first_cta=*/true, coef + row * Update::kCoef);
  }
}

}  // namespace

template <typename Update, typename T>
cudaError_t LaunchColumns(cudaStream_t stream, ColumnsArgs<T, Update::kIn, Update::kOut, Update::kCoef> args,
                          const ColumnState<T>& state, T* coef_ws) {
  const int64_t state_rows = args.batch * args.cols;
  if (state_rows == 0) return cudaSuccess;
  if constexpr (Update::kCoefFromState) {
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(state_rows, kMaxGridY));
    StateCoefficientsKernel<Update, T><<<grid, kThreads, 0, stream>>>(state, coef_ws, state_rows);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    args.coef = coef_ws;
  }
  const dim3 grid(static_cast<unsigned>(ColumnsPartials(args.rows, args.cols)),
                  static_cast<unsigned>(std::min<int64_t>(args.batch, kMaxGridY)));
  ColumnsKernel<Update><<<grid, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

// Update::kUnroll vectors per thread, grid per kRowBlocksPerSm (heuristics.h).
template <typename Update, typename T>
cudaError_t LaunchRowwise(cudaStream_t stream, const RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef>& args,
                          int sm_count) {
  // Uncapped, the grid's x extent is NormPartials(n, sizeof(T), Update::kUnroll), the row length of `partials`.
  static_assert(kRowBlocksPerSm == 0, "a capped row grid would not match NormPartials, the partials' row length");
  return LaunchRowwiseWith<Update, Update::kUnroll>(stream, args, sm_count, kRowBlocksPerSm);
}

// One CTA per row: the partials' sums of squares, then thread 0 runs the scalar recurrence.
template <typename T>
__global__ void __launch_bounds__(kThreads) ScalarsKernel(ScalarsArgs<T> args) {
  for (int64_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
    const double squares_v = BlockSumOfSquares(args.v_partials + row * args.num_v_partials, args.num_v_partials);
    const double squares_x = BlockSumOfSquares(args.x_partials + row * args.num_x_partials, args.num_x_partials);
    if (threadIdx.x == 0) LsmrScalarStep(args, row, squares_v, squares_x);
  }
}

template <typename T>
cudaError_t LaunchScalars(cudaStream_t stream, const ScalarsArgs<T>& args) {
  if (args.rows == 0) return cudaSuccess;
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(args.rows, kMaxGridY));
  ScalarsKernel<T><<<grid, kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}
template cudaError_t LaunchScalars<float>(cudaStream_t, const ScalarsArgs<float>&);
template cudaError_t LaunchScalars<double>(cudaStream_t, const ScalarsArgs<double>&);

// Row layout for every update; the fused iteration's updates also in the column layout.
#define JAX_OPS_INSTANTIATE_ROWS(UPDATE, T)                   \
  template cudaError_t LaunchRowwise<UPDATE, T>(cudaStream_t, \
                                                const RowwiseArgs<T, UPDATE::kIn, UPDATE::kOut, UPDATE::kCoef>&, int);
#define JAX_OPS_INSTANTIATE_BOTH(UPDATE, T)      \
  JAX_OPS_INSTANTIATE_ROWS(UPDATE, T)            \
  template cudaError_t LaunchColumns<UPDATE, T>( \
      cudaStream_t, ColumnsArgs<T, UPDATE::kIn, UPDATE::kOut, UPDATE::kCoef>, const ColumnState<T>&, T*);
#define JAX_OPS_INSTANTIATE(MACRO, UPDATE) MACRO(UPDATE, float) MACRO(UPDATE, double)
JAX_OPS_INSTANTIATE(JAX_OPS_INSTANTIATE_ROWS, HbarXUpdate)
JAX_OPS_INSTANTIATE(JAX_OPS_INSTANTIATE_ROWS, HUpdate)
JAX_OPS_INSTANTIATE(JAX_OPS_INSTANTIATE_ROWS, LsmrStepUpdate)
JAX_OPS_INSTANTIATE(JAX_OPS_INSTANTIATE_BOTH, PartialNormsUpdate)
JAX_OPS_INSTANTIATE(JAX_OPS_INSTANTIATE_BOTH, NormalizeUpdate)
JAX_OPS_INSTANTIATE(JAX_OPS_INSTANTIATE_BOTH, LsmrIterationUpdate)
#undef JAX_OPS_INSTANTIATE
#undef JAX_OPS_INSTANTIATE_BOTH
#undef JAX_OPS_INSTANTIATE_ROWS

}  // namespace jax_ops::lsmr
