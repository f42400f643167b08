// Standalone check + timing of the CUDA attention forward kernels (no Python): the Hopper kernel
// (attention_fwd_sm90_impl.cuh) against the sm_80 mma.sync kernel and a CPU fp32 reference on sampled rows.
// Build here, carry the binary, run on the GPU machine:
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -cudart static -I ffi_cuda \
//     -isystem $(python3 -c "import jax.ffi as f; print(f.include_dir())") ffi_cuda/tools/attention_fwd_bench.cu \
//     -o attention_fwd_bench
// Usage: attention_fwd_bench [check|bench|all]
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "attention/attention_fwd_impl.cuh"
#include "attention/attention_fwd_sm90_impl.cuh"
#include "tools/attention_bench_case.h"
#include "tools/bench_check.h"

using namespace jax_ops::attention;
using T = __nv_bfloat16;

int g_stages = 2;  // Hopper kernel pipeline depth under test
int g_diag = 0;    // Hopper timing experiment (kDiag of attention_fwd_sm90_impl.cuh), with 3 stages
template <int D>
cudaError_t Launch(bool hopper, const AttentionParams& p, const FwdPointers& ptr) {
  if (hopper && g_diag == 1) return LaunchAttentionFwdSm90<T, D, 3, 1>(nullptr, p, ptr);
  if (hopper && g_diag == 2) return LaunchAttentionFwdSm90<T, D, 3, 2>(nullptr, p, ptr);
  if (hopper && g_diag == 3) return LaunchAttentionFwdSm90<T, D, 2, 0, 176>(nullptr, p, ptr);
  if (!hopper) return LaunchAttentionFwd<T, D>(nullptr, p, ptr);
  return g_stages == 3 ? LaunchAttentionFwdSm90<T, D, 3>(nullptr, p, ptr)
                       : LaunchAttentionFwdSm90<T, D, 2>(nullptr, p, ptr);
}
cudaError_t LaunchAny(bool hopper, const AttentionParams& p, const FwdPointers& ptr) {
  return p.head_dim == 64 ? Launch<64>(hopper, p, ptr) : Launch<128>(hopper, p, ptr);
}

struct Buffers {
  T *q, *k, *v, *o;
  float* lse;
  int32_t *qsl, *kvsl;
  std::vector<T> hq, hk, hv;
};

// Pseudo-normal fill on the device (sum of 4 hashed uniforms, variance 1): timing inputs without a host copy.
__global__ void FillNormal(T* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    float acc = 0.f;
    for (uint32_t r = 0; r < 4; ++r) {
      uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed + r) * 2246822519u ^ static_cast<uint32_t>(i >> 32);
      h ^= h >> 15;
      h *= 2246822519u;
      h ^= h >> 13;
      acc += (h & 0xffffff) * (1.f / 16777216.f) - 0.5f;
    }
    x[i] = __float2bfloat16(acc * 1.7320508f);
  }
}

Buffers Alloc(const Case& c, unsigned seed, bool host_copy = true) {
  Buffers b;
  const size_t nq = size_t{1} * c.B * c.T * c.H * c.D, nk = size_t{1} * c.B * c.S * c.K * c.D;
  if (host_copy) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    b.hq.resize(nq);
    b.hk.resize(nk);
    b.hv.resize(nk);
    for (auto& x : b.hq) x = __float2bfloat16(nd(rng));
    for (auto& x : b.hk) x = __float2bfloat16(nd(rng));
    for (auto& x : b.hv) x = __float2bfloat16(nd(rng));
  }
  CHECK(cudaMalloc(&b.q, nq * 2));
  CHECK(cudaMalloc(&b.o, nq * 2));
  CHECK(cudaMalloc(&b.k, nk * 2));
  CHECK(cudaMalloc(&b.v, nk * 2));
  CHECK(cudaMalloc(&b.lse, size_t{1} * c.B * c.H * c.T * 4));
  CHECK(cudaMalloc(&b.qsl, 4 * c.B));
  CHECK(cudaMalloc(&b.kvsl, 4 * c.B));
  std::vector<int32_t> ql(c.B, c.q_len), kl(c.B, c.kv_len);
  CHECK(cudaMemcpy(b.qsl, ql.data(), 4 * c.B, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.kvsl, kl.data(), 4 * c.B, cudaMemcpyHostToDevice));
  if (host_copy) {
    CHECK(cudaMemcpy(b.q, b.hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.k, b.hk.data(), nk * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b.v, b.hv.data(), nk * 2, cudaMemcpyHostToDevice));
  } else {
    FillNormal<<<1024, 256>>>(b.q, nq, seed);
    FillNormal<<<1024, 256>>>(b.k, nk, seed + 7);
    FillNormal<<<1024, 256>>>(b.v, nk, seed + 13);
    CHECK(cudaGetLastError());
  }
  return b;
}

void Free(Buffers& b) {
  for (void* p : {static_cast<void*>(b.q), static_cast<void*>(b.k), static_cast<void*>(b.v), static_cast<void*>(b.o),
                  static_cast<void*>(b.lse), static_cast<void*>(b.qsl), static_cast<void*>(b.kvsl)})
    cudaFree(p);
}

FwdPointers Ptrs(const Buffers& b) {
  return FwdPointers{b.q, b.k, b.v, nullptr, nullptr, b.qsl, b.kvsl, b.o, b.lse, false};
}

// Runs the kernel with poisoned outputs; compares sampled rows with an fp32 CPU reference.
bool Check(const Case& c, bool hopper) {
  AttentionParams p = MakeParams<T>(c);
  Buffers b = Alloc(c, 1234 + c.T);
  const size_t nq = size_t{1} * c.B * c.T * c.H * c.D;
  CHECK(cudaMemset(b.o, 0xff, nq * 2));  // NaN poison
  CHECK(cudaMemset(b.lse, 0xff, size_t{1} * c.B * c.H * c.T * 4));
  CHECK(LaunchAny(hopper, p, Ptrs(b)));
  CHECK(cudaDeviceSynchronize());
  std::vector<T> ho(nq);
  std::vector<float> hl(size_t{1} * c.B * c.H * c.T);
  CHECK(cudaMemcpy(ho.data(), b.o, nq * 2, cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(hl.data(), b.lse, hl.size() * 4, cudaMemcpyDeviceToHost));
  double max_err = 0, err2 = 0, ref2 = 0, lse_err = 0;
  bool nan = false;
  std::mt19937 rng(7);
  const int samples = 48;
  for (int si = 0; si < samples; ++si) {
    const int bb = rng() % c.B, n = rng() % c.H;
    int t = si < 8 ? (si < 4 ? si : c.T - 1 - (si - 4)) : static_cast<int>(rng() % c.T);
    t = std::clamp(t, 0, c.T - 1);
    const int kh = n / (c.H / c.K);
    const int64_t ql = c.q_len >= 0 ? std::min(c.q_len, c.T) : c.T, kl = c.kv_len >= 0 ? std::min(c.kv_len, c.S) : c.S;
    const KeyRange r = AllowedKeys(p, t, ql, kl);
    std::vector<double> logit(c.S);
    double mx = -INFINITY;
    for (int64_t s = r.lo; s < r.hi; ++s) {
      double acc = 0;
      for (int d = 0; d < c.D; ++d)
        acc +=
            double(__bfloat162float(b.hq[p.QOffset(bb, t, n) + d])) * __bfloat162float(b.hk[p.KOffset(bb, s, kh) + d]);
      logit[s] = acc * p.scale;
      mx = std::max(mx, logit[s]);
    }
    double l = 0;
    std::vector<double> out(c.D, 0.0);
    for (int64_t s = r.lo; s < r.hi; ++s) {
      const double w = std::exp(logit[s] - mx);
      l += w;
      for (int d = 0; d < c.D; ++d) out[d] += w * __bfloat162float(b.hv[p.KOffset(bb, s, kh) + d]);
    }
    for (int d = 0; d < c.D; ++d) {
      const double ref = l > 0 ? out[d] / l : 0.0;
      const double got = __bfloat162float(ho[p.QOffset(bb, t, n) + d]);
      if (!std::isfinite(got)) nan = true;
      max_err = std::max(max_err, std::abs(got - ref));
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
    const double lse_ref = l > 0 ? mx + std::log(l) : -INFINITY;
    const double lse_got = hl[p.LseOffset(bb, n, t)];
    if (l > 0)
      lse_err = std::max(lse_err, std::abs(lse_got - lse_ref));
    else if (!(std::isinf(lse_got) && lse_got < 0))
      lse_err = INFINITY;
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-30));
  const bool ok = !nan && rel < 1e-2 && lse_err < 1e-2;
  std::printf(
      "check %-6s B=%d T=%d S=%d H=%d K=%d D=%d causal=%d win=(%lld,%lld) len=(%d,%d): max_abs %.3e rel_l2 %.3e lse "
      "%.2e %s\n",
      hopper ? "sm90" : "sm80", c.B, c.T, c.S, c.H, c.K, c.D, c.causal, (long long)c.wl, (long long)c.wr, c.q_len,
      c.kv_len, max_err, rel, lse_err, ok ? "OK" : "FAIL");
  Free(b);
  return ok;
}

double TimeMs(const Case& c, bool hopper) {
  AttentionParams p = MakeParams<T>(c);
  Buffers b = Alloc(c, 99, /*host_copy=*/false);
  const FwdPointers ptr = Ptrs(b);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < 3; ++i) CHECK(LaunchAny(hopper, p, ptr));
  std::vector<float> ts;
  const int reps = c.T <= 2048 ? 50 : 10;
  for (int r = 0; r < 5; ++r) {
    CHECK(cudaEventRecord(e0));
    for (int i = 0; i < reps; ++i) LaunchAny(hopper, p, ptr);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms / reps);
  }
  std::sort(ts.begin(), ts.end());
  Free(b);
  return ts[ts.size() / 2];
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout kill
  const char* mode = argc > 1 ? argv[1] : "all";
  bool all_ok = true;
  if (!std::strcmp(mode, "check") || !std::strcmp(mode, "all")) {
    const Case cases[] = {
        {1, 128, 128, 1, 1, 128, false},
        {1, 128, 128, 1, 1, 64, false},
        {2, 300, 517, 4, 2, 128, false},
        {2, 300, 517, 4, 2, 128, true},
        {1, 1000, 1000, 4, 1, 64, true},
        {1, 1, 1000, 2, 2, 128, false},
        {2, 1000, 1, 2, 2, 128, false},
        {1, 777, 777, 2, 2, 128, true, 100, 0},
        {2, 640, 640, 2, 2, 64, true, -1, -1, 500, 333},
        {1, 4096, 4096, 2, 2, 128, true},
    };
    for (const Case& c : cases) {
      all_ok &= Check(c, true);
      g_stages = 3;
      all_ok &= Check(c, true);
      g_stages = 2;
      g_diag = 3;  // 176-key tiles (a correct variant, unlike 1 and 2)
      all_ok &= Check(c, true);
      g_diag = 0;
    }
  }
  if (!std::strcmp(mode, "bench") || !std::strcmp(mode, "all")) {
    for (int D : {128, 64})
      for (bool causal : {true, false})
        for (int N : {1024, 4096, 8192, 16384}) {
          if (D == 64 && N != 4096) continue;
          const Case c{1, N, N, 32, 32, D, causal};
          const double flops = (causal ? 2.0 : 4.0) * 32 * double(N) * N * D;
          const double t80 = TimeMs(c, false);
          g_stages = 2;
          const double t90 = TimeMs(c, true);
          g_stages = 3;
          const double t93 = TimeMs(c, true);
          g_diag = 1;
          const double t_noload = TimeMs(c, true);
          g_diag = 2;
          const double t_nosoftmax = TimeMs(c, true);
          g_diag = 3;
          const double t176 = TimeMs(c, true);
          g_diag = 0;
          g_stages = 2;
          std::printf(
              "bench D=%d N=%5d causal=%d: sm80 %6.1f TF/s | sm90 2-stage %6.1f | 3-stage %6.1f | 3-stage without "
              "K/V loads %6.1f | 3-stage without softmax %6.1f | 2-stage 176-key tiles %6.1f TF/s\n",
              D, N, causal, flops / t80 / 1e9, flops / t90 / 1e9, flops / t93 / 1e9, flops / t_noload / 1e9,
              flops / t_nosoftmax / 1e9, flops / t176 / 1e9);
        }
  }
  std::printf(all_ok ? "ALL OK\n" : "SOME FAILED\n");
  return all_ok ? 0 : 1;
}
