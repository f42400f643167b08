// Standalone check and timing of the kv_cache kernels (no Python).
//   kv_cache_bench small: for compute-sanitizer, appends into shuffled pages and decodes (fp16, D 64 and 128,
//     page sizes 16, 64 and 5, both load paths where they apply, GQA 4, one token and chunks of 3, one split and
//     three, the three merged by log-sum-exp on the host or in the kernel's cluster, lengths 0 / 1 / ragged)
//     against a float64 host reference, poisoning every output first.
//   kv_cache_bench speed: the decode kernel at B 8, Hq 32, Hkv 8, D 128, fp16, page 16, shuffled pages, L 1k / 8k /
//     32k, for each load path and split count, with partial outputs (the merge not timed) and merged in the
//     cluster (splits 2..8): µs and K+V bytes read per second.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kv_cache/kernels.cu"
#include "tools/bench_check.h"

using namespace jax_ops::kv_cache;

namespace {

template <typename T>
T* ToDevice(const std::vector<T>& h) {
  T* d = nullptr;
  CHECK(cudaMalloc(&d, h.size() * sizeof(T) + 16));
  CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <typename T>
std::vector<T> ToHost(const T* d, size_t n) {
  std::vector<T> h(n);
  CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

std::vector<__half> RandomHalves(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal;
  std::vector<__half> h(n);
  for (auto& x : h) x = __float2half(normal(rng));
  return h;
}

struct Case {
  int64_t head_dim, page_size, tokens, splits;
  DecodeLoad load;
  bool cluster = false;  // splits merged inside the kernel (merge_in_cluster)
};

const char* LoadName(DecodeLoad load) { return load == DecodeLoad::kTma ? "tma" : "cp.async"; }

// Appends `tokens` per request, then decodes those chunks; returns the number of failed checks.
template <int kHeadDim>
int RunCase(const Case& c, std::mt19937& rng) {
  Shape s;
  s.batch = 3, s.num_kv_heads = 2, s.num_q_heads = 8, s.head_dim = kHeadDim, s.page_size = c.page_size;
  s.max_pages = (70 + c.page_size - 1) / c.page_size, s.num_pages = s.batch * s.max_pages + 1;
  s.tokens = c.tokens, s.dtype = xla::ffi::DataType::F16;
  const int64_t D = kHeadDim, Hkv = s.num_kv_heads, Hq = s.num_q_heads, B = s.batch, T = c.tokens;
  const std::vector<int32_t> lengths = {0, 1, static_cast<int32_t>(s.capacity() - T - 2)};
  std::vector<int32_t> table(B * s.max_pages);
  std::vector<int32_t> perm(s.num_pages);
  for (int64_t i = 0; i < s.num_pages; ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  for (size_t i = 0; i < table.size(); ++i) table[i] = perm[i];
  const size_t pool = s.num_pages * s.page_size * Hkv * D;
  std::vector<__half> k_pool = RandomHalves(pool, rng), v_pool = RandomHalves(pool, rng);
  std::vector<__half> k_new = RandomHalves(B * T * Hkv * D, rng), v_new = RandomHalves(B * T * Hkv * D, rng);
  std::vector<__half> q = RandomHalves(B * T * Hq * D, rng);

  AppendArgs ap;
  ap.shape = s, ap.elem_bytes = 2;
  ap.k_pages = ToDevice(k_pool), ap.v_pages = ToDevice(v_pool);
  ap.block_table = ToDevice(table), ap.lengths = ToDevice(lengths);
  ap.k_new = ToDevice(k_new), ap.v_new = ToDevice(v_new);
  ap.lengths_out = ToDevice(std::vector<int32_t>(B, -7)), ap.status = ToDevice(std::vector<int32_t>(B, -7));
  CHECK(LaunchAppend(nullptr, ap));
  CHECK(cudaDeviceSynchronize());
  int failures = 0;
  const auto new_lengths = ToHost(ap.lengths_out, B), status = ToHost(ap.status, B);
  for (int64_t b = 0; b < B; ++b) {
    if (status[b] != kStatusOk || new_lengths[b] != lengths[b] + T) ++failures;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = lengths[b] + t;
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t dst = s.PageOffset(table[b * s.max_pages + pos / s.page_size], pos % s.page_size, h);
        std::memcpy(&k_pool[dst], &k_new[((b * T + t) * Hkv + h) * D], D * sizeof(__half));
        std::memcpy(&v_pool[dst], &v_new[((b * T + t) * Hkv + h) * D], D * sizeof(__half));
      }
    }
  }
  const auto k_dev = ToHost(static_cast<__half*>(ap.k_pages), pool);
  if (std::memcmp(k_dev.data(), k_pool.data(), pool * sizeof(__half)) != 0) ++failures;

  DecodeArgs dp;
  dp.shape = s, dp.scale = 1.f / std::sqrt(static_cast<float>(D)), dp.splits = c.splits;
  dp.page_shift = (c.page_size & (c.page_size - 1)) == 0 ? __builtin_ctzll(c.page_size) : -1;
  dp.q = ToDevice(q), dp.k_pages = ap.k_pages, dp.v_pages = ap.v_pages;
  dp.block_table = ap.block_table, dp.lengths = ap.lengths_out;
  dp.merge_in_cluster = c.cluster, dp.load = c.load;
  const size_t out = B * T * Hq * D;
  const bool merged = c.splits == 1 || c.cluster;  // the kernel writes o
  if (merged) {
    dp.o = ToDevice(std::vector<__half>(out, __float2half(NAN)));
  } else {
    dp.o_parts = ToDevice(std::vector<float>(c.splits * out, NAN));
    dp.lse_parts = ToDevice(std::vector<float>(c.splits * B * T * Hq, NAN));
  }
  CHECK((LaunchDecode<__half, kHeadDim>(nullptr, dp)));
  CHECK(cudaDeviceSynchronize());
  std::vector<double> got(out);
  if (merged) {
    const auto o = ToHost(static_cast<__half*>(dp.o), out);
    for (size_t i = 0; i < out; ++i) got[i] = __half2float(o[i]);
  } else {  // merge the splits by log-sum-exp, as the Python side does
    const auto parts = ToHost(dp.o_parts, c.splits * out), lse = ToHost(dp.lse_parts, c.splits * B * T * Hq);
    for (size_t row = 0; row < out / D; ++row) {
      double top = -INFINITY, total = 0;
      for (int64_t p = 0; p < c.splits; ++p) top = std::max(top, double{lse[p * (out / D) + row]});
      for (int64_t d = 0; d < D; ++d) got[row * D + d] = 0;
      if (top == -INFINITY) continue;
      for (int64_t p = 0; p < c.splits; ++p) {
        const double w = std::exp(double{lse[p * (out / D) + row]} - top);
        total += w;
        for (int64_t d = 0; d < D; ++d) got[row * D + d] += w * parts[(p * (out / D) + row) * D + d];
      }
      for (int64_t d = 0; d < D; ++d) got[row * D + d] /= total;
    }
  }
  double max_err = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t L = lengths[b] + T;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t kvh = h / (Hq / Hkv), visible = L - T + t + 1;
        const __half* qrow = &q[((b * T + t) * Hq + h) * D];
        std::vector<double> logits(visible), acc(D, 0.0);
        double top = -INFINITY, total = 0;
        for (int64_t key = 0; key < visible; ++key) {
          const int64_t off = s.PageOffset(table[b * s.max_pages + key / s.page_size], key % s.page_size, kvh);
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += double{__half2float(qrow[d])} * __half2float(k_pool[off + d]);
          logits[key] = dot * dp.scale;
          top = std::max(top, logits[key]);
        }
        for (int64_t key = 0; key < visible; ++key) {
          const int64_t off = s.PageOffset(table[b * s.max_pages + key / s.page_size], key % s.page_size, kvh);
          const double w = std::exp(logits[key] - top);
          total += w;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * __half2float(v_pool[off + d]);
        }
        for (int64_t d = 0; d < D; ++d) {
          const double want = acc[d] / total, have = got[((b * T + t) * Hq + h) * D + d];
          const double err = std::fabs(have - want);
          if (!(err <= 2e-2)) ++failures;  // NaN (an unwritten output) fails too
          max_err = std::max(max_err, err);
        }
      }
    }
  }
  std::printf("D=%lld page=%lld T=%lld splits=%lld%s %s: max abs err %.2e, %d failures\n", (long long)D,
              (long long)c.page_size, (long long)T, (long long)c.splits, c.cluster ? " (cluster merge)" : "",
              LoadName(c.load), max_err, failures);
  for (void* p : {ap.k_pages, ap.v_pages, (void*)ap.block_table, (void*)ap.lengths, (void*)ap.k_new, (void*)ap.v_new,
                  (void*)ap.lengths_out, (void*)ap.status, (void*)dp.q, dp.o, (void*)dp.o_parts, (void*)dp.lse_parts})
    if (p) CHECK(cudaFree(p));
  return failures;
}

int Small() {
  std::mt19937 rng(1234);
  int failures = 0;
  for (int64_t page : {16, 64, 5})
    for (DecodeLoad load : {DecodeLoad::kCpAsync, DecodeLoad::kTma}) {
      if (load == DecodeLoad::kTma && page == 5) continue;  // TMA boxes need a power-of-two page >= 8
      for (int64_t tokens : {1, 3})
        for (int64_t splits : {1, 3})
          for (bool cluster : {false, true}) {
            if (cluster && splits == 1) continue;
            failures += RunCase<64>({64, page, tokens, splits, load, cluster}, rng);
            failures += RunCase<128>({128, page, tokens, splits, load, cluster}, rng);
          }
    }
  std::printf(failures ? "FAILED\n" : "all checks passed\n");
  return failures;
}

// Times the decode kernel (no merge) on the issue's serving shape for both load paths and several split counts.
int Speed() {
  constexpr int kHeadDim = 128, kReps = 50;
  std::mt19937 rng(7);
  for (int64_t length : {1024, 8192, 32768}) {
    Shape s;
    s.batch = 8, s.num_kv_heads = 8, s.num_q_heads = 32, s.head_dim = kHeadDim, s.page_size = 16, s.tokens = 1;
    s.max_pages = length / s.page_size, s.num_pages = s.batch * s.max_pages, s.dtype = xla::ffi::DataType::F16;
    std::vector<int32_t> table(s.batch * s.max_pages);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), rng);
    const size_t pool = s.num_pages * s.page_size * s.num_kv_heads * kHeadDim;
    DecodeArgs dp;
    dp.shape = s, dp.scale = 0.088f, dp.page_shift = 4;
    dp.q = ToDevice(RandomHalves(s.batch * s.num_q_heads * kHeadDim, rng));
    void* pools[2];
    for (void*& p : pools) {  // every element 0x3c3c (1.06): the values do not change the kernel's speed
      CHECK(cudaMalloc(&p, pool * sizeof(__half)));
      CHECK(cudaMemset(p, 0x3c, pool * sizeof(__half)));
    }
    dp.k_pages = pools[0], dp.v_pages = pools[1];
    dp.block_table = ToDevice(table), dp.lengths = ToDevice(std::vector<int32_t>(s.batch, length));
    dp.o = ToDevice(std::vector<__half>(s.batch * s.num_q_heads * kHeadDim));
    dp.o_parts = ToDevice(std::vector<float>(16 * s.batch * s.num_q_heads * kHeadDim));
    dp.lse_parts = ToDevice(std::vector<float>(16 * s.batch * s.num_q_heads));
    const double bytes = 2.0 * pool * sizeof(__half);
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    for (DecodeLoad load : {DecodeLoad::kCpAsync, DecodeLoad::kTma})
      for (int64_t splits : {1, 2, 4, 8, 16})
        for (bool cluster : {false, true}) {
          if (cluster && (splits == 1 || splits > kMaxKernelMergeSplits)) continue;
          dp.splits = splits, dp.merge_in_cluster = cluster, dp.load = load;
          for (int i = 0; i < 3; ++i) CHECK((LaunchDecode<__half, kHeadDim>(nullptr, dp)));
          CHECK(cudaEventRecord(start));
          for (int i = 0; i < kReps; ++i) CHECK((LaunchDecode<__half, kHeadDim>(nullptr, dp)));
          CHECK(cudaEventRecord(stop));
          CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          CHECK(cudaEventElapsedTime(&ms, start, stop));
          const double us = 1e3 * ms / kReps;
          std::printf("L=%6lld %-8s splits=%2lld %-14s: %8.1f us  %.2f TB/s\n", (long long)length, LoadName(load),
                      (long long)splits, cluster ? "cluster merge" : "partials", us, bytes / us * 1e-6);
        }
    for (const void* p : {dp.q, dp.k_pages, dp.v_pages, (const void*)dp.block_table, (const void*)dp.lengths,
                          (const void*)dp.o, (const void*)dp.o_parts, (const void*)dp.lse_parts})
      CHECK(cudaFree(const_cast<void*>(p)));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "small") == 0) return Small() ? 1 : 0;
  if (argc >= 2 && std::strcmp(argv[1], "speed") == 0) return Speed();
  std::printf("usage: %s small|speed\n", argv[0]);
  return 2;
}
