// Fused elementwise LSMR recurrences. Memory-bound: 16-byte vector loads/stores when the row's pointers share
// an alignment (after a scalar head), a scalar tail, several independent vectors in flight per thread.
#include <algorithm>

#include "lsmr/recurrence_kernels.h"
#include "lsmr/recurrence_params.h"

namespace jax_ops::lsmr {
namespace {

constexpr int kThreads = 256;

template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kLanes = 16 / sizeof(T);
  T lane[kLanes];
};

// kUnroll: vectors per thread per step; the loads of all of them issue before any math.
template <typename Update, int kUnroll, typename T, int NIn, int NOut, int NCoef>
__global__ void __launch_bounds__(kThreads) RowwiseKernel(RowwiseArgs<T, NIn, NOut, NCoef> args) {
  using V = Vec16<T>;
  constexpr int kLanes = V::kLanes;
  for (int64_t row = blockIdx.y; row < args.rows; row += gridDim.y) {
    const int64_t base = row * args.n;
    T c[NCoef];
#pragma unroll
    for (int k = 0; k < NCoef; ++k) c[k] = args.coef[k][row];

    // Elements before the first 16-byte boundary; the vector path needs every pointer to agree on it.
    auto misalign = [&](const void* p) { return static_cast<int>((reinterpret_cast<uintptr_t>(p) % 16) / sizeof(T)); };
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

    constexpr bool kNorms = Update::kNormOut >= 0;
    double squares = 0;  // this thread's share of the sum of squares of out[kNormOut] in this CTA
    auto add_square = [&](const T* out) {
      if constexpr (kNorms) squares += static_cast<double>(out[Update::kNormOut]) * out[Update::kNormOut];
    };
    // Scalar head and tail (the whole row when the pointers disagree on alignment).
    auto scalar = [&](int64_t i) {
      T in[NIn], out[NOut];
#pragma unroll
      for (int k = 0; k < NIn; ++k) in[k] = args.in[k][base + i];
      Update::Apply(c, in, out);
#pragma unroll
      for (int k = 0; k < NOut; ++k) args.out[k][base + i] = out[k];
      add_square(out);
    };
    for (int64_t i = tid; i < head; i += nthreads) scalar(i);
    for (int64_t i = tail_start + tid; i < args.n; i += nthreads) scalar(i);

    const V* vin[NIn];
    V* vout[NOut];
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
        V out[NOut];
#pragma unroll
        for (int l = 0; l < kLanes; ++l) {
          T e_in[NIn], e_out[NOut];
#pragma unroll
          for (int k = 0; k < NIn; ++k) e_in[k] = in[u][k].lane[l];
          Update::Apply(c, e_in, e_out);
#pragma unroll
          for (int k = 0; k < NOut; ++k) out[k].lane[l] = e_out[k];
          add_square(e_out);
        }
#pragma unroll
        for (int k = 0; k < NOut; ++k) vout[k][v] = out[k];
      }
    }
    if constexpr (kNorms) {
      // Fixed-order CTA sum (xor tree per warp, then warp 0 over the warps): deterministic for a given grid.
      __shared__ double warp_sums[kThreads / 32];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) squares += __shfl_xor_sync(0xffffffffu, squares, off);
      const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
      if (lane == 0) warp_sums[warp] = squares;
      __syncthreads();
      if (warp == 0) {
        double s = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
        if (lane == 0) args.partials[row * gridDim.x + blockIdx.x] = static_cast<T>(sqrt(s));
      }
      __syncthreads();  // warp_sums is reused by the next row
    }
  }
}

// Grid: x covers a row with at most blocks_per_sm * sm_count blocks in all (0: no cap, one step per thread),
// y walks the rows.
template <typename Update, int kUnroll, typename T>
cudaError_t LaunchRowwiseWith(cudaStream_t stream, const RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef>& args,
                              int sm_count, int blocks_per_sm) {
  if (args.rows == 0) return cudaSuccess;
  if (args.n == 0) {  // no elements: every row's norm is 0
    if (Update::kNormOut >= 0) return cudaMemsetAsync(args.partials, 0, args.rows * sizeof(T), stream);
    return cudaSuccess;
  }
  constexpr int64_t kElemsPerBlockStep = int64_t{kThreads} * (16 / sizeof(T)) * kUnroll;
  const int64_t per_row_blocks = (args.n + kElemsPerBlockStep - 1) / kElemsPerBlockStep;
  const int64_t grid_y = std::min<int64_t>(args.rows, 65535);
  int64_t grid_x = std::min<int64_t>(per_row_blocks, int64_t{1} << 30);
  if (blocks_per_sm > 0) {
    const int64_t target_blocks = int64_t{sm_count} * blocks_per_sm;
    grid_x = std::min<int64_t>(grid_x, (target_blocks + grid_y - 1) / grid_y);
  }
  grid_x = std::max<int64_t>(grid_x, 1);
  RowwiseKernel<Update, kUnroll>
      <<<dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(grid_y)), kThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

// Tuned on the H200 with ffi_cuda/tools/recurrence_bench.cu: one 16-byte vector per thread and an uncapped grid
// gave 1.01x the copy kernel's bandwidth at n = 1e8 (capped grid-stride variants: 0.89-0.97x). See
// docs/notes/recurrence.md.
template <typename Update, typename T>
cudaError_t LaunchRowwise(cudaStream_t stream, const RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef>& args,
                          int sm_count) {
  // kUnroll = 1 and no cap: the grid's x extent is NormPartials(n, sizeof(T)), the row length of `partials`.
  return LaunchRowwiseWith<Update, 1>(stream, args, sm_count, /*blocks_per_sm=*/0);
}

#define JAX_OPS_INSTANTIATE(UPDATE, T)                        \
  template cudaError_t LaunchRowwise<UPDATE, T>(cudaStream_t, \
                                                const RowwiseArgs<T, UPDATE::kIn, UPDATE::kOut, UPDATE::kCoef>&, int);
JAX_OPS_INSTANTIATE(HbarXUpdate, float)
JAX_OPS_INSTANTIATE(HbarXUpdate, double)
JAX_OPS_INSTANTIATE(HUpdate, float)
JAX_OPS_INSTANTIATE(HUpdate, double)
JAX_OPS_INSTANTIATE(LsmrStepUpdate, float)
JAX_OPS_INSTANTIATE(LsmrStepUpdate, double)
#undef JAX_OPS_INSTANTIATE

}  // namespace jax_ops::lsmr
