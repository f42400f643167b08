// Standalone tuning bench for the fused LSMR recurrence (no Python): times launch variants with CUDA events
// against a plain copy kernel. Build here, carry the binary, run on the GPU machine:
//   nvcc -O3 -std=c++17 --fmad=false --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//     -cudart static -I ffi_cuda -I $(python3 -c "import jax.ffi as f; print(f.include_dir())") \
//     ffi_cuda/tools/lsmr_bench.cu -o lsmr_bench
#include <algorithm>
#include <cstdio>
#include <vector>

#include "lsmr/kernels.cu"
#include "tools/bench_check.h"

using namespace jax_ops::lsmr;

__global__ void Fill(float* p, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    p[i] = 1.0f + 1e-7f * static_cast<float>(i % 9973);
}

__global__ void CopyKernel(const float4* __restrict__ in, float4* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = in[i];
}

template <typename F>
float MedianMs(F&& launch, int rounds = 21) {
  return jax_ops::tools::Median(jax_ops::tools::RoundTimesMs(launch, 3, rounds, 10));
}

int main() {
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int64_t n : {int64_t{10000000}, int64_t{100000000}}) {
    float *h, *hbar, *x, *c;
    CHECK(cudaMalloc(&h, n * 4));
    CHECK(cudaMalloc(&hbar, n * 4));
    CHECK(cudaMalloc(&x, n * 4));
    CHECK(cudaMalloc(&c, 8));
    for (float* p : {h, hbar, x}) Fill<<<1024, 256>>>(p, n);
    Fill<<<1, 2>>>(c, 2);  // c_h = c_x = 1: values stay bounded over repeats
    CHECK(cudaDeviceSynchronize());
    float copy_ms = 0;
    for (int bps : {0, 8, 16, 32}) {
      int grid = bps ? sms * bps : static_cast<int>((n / 4 + 255) / 256);
      float ms = MedianMs(
          [&] { CopyKernel<<<grid, 256>>>(reinterpret_cast<float4*>(h), reinterpret_cast<float4*>(x), n / 4); });
      std::printf("n=%lld copy blocks/SM=%d: %.1f us, %.0f GB/s\n", (long long)n, bps, ms * 1e3,
                  2.0 * n * 4 / ms / 1e6);
      copy_ms = copy_ms == 0 ? ms : std::min(copy_ms, ms);
    }
    RowwiseArgs<float, 3, 2, 2> args{{h, hbar, x}, {hbar, x}, {c, c + 1}, 1, n};
    auto run = [&](auto unroll_tag, int bps) {
      constexpr int U = decltype(unroll_tag)::value;
      float ms = MedianMs([&] { CHECK((LaunchRowwiseWith<HbarXUpdate, U>(nullptr, args, sms, bps))); });
      double gbps = 5.0 * n * 4 / ms / 1e6;
      std::printf("n=%lld hbar_x unroll=%d blocks/SM=%d: %.1f us, %.0f GB/s (%.3f of best copy)\n", (long long)n, U,
                  bps, ms * 1e3, gbps, gbps / (2.0 * n * 4 / copy_ms / 1e6));
    };
    for (int bps : {0, 4, 8, 16, 32}) {
      run(std::integral_constant<int, 1>{}, bps);
      run(std::integral_constant<int, 2>{}, bps);
      run(std::integral_constant<int, 4>{}, bps);
    }
    CHECK(cudaFree(h));
    CHECK(cudaFree(hbar));
    CHECK(cudaFree(x));
    CHECK(cudaFree(c));
  }
  return 0;
}
