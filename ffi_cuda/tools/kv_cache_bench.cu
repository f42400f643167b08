// Standalone check and timing of the kv_cache kernels (no Python).
//   kv_cache_bench small: for compute-sanitizer, appends into shuffled pages and decodes (fp16; D 64 and 128 with
//     pages 16 and 5 on cp.async and 8, 16, 64 and 128 on TMA, D 256 with pages 16 and 128 on both; GQA 4; one
//     token and chunks of 5 (two query blocks); one split, three merged on the host, three merged in the kernel's
//     cluster; lengths 0, 1 and one long enough to wrap the stage ring in every split) against a float64 host
//     reference, with NaN in every pool row no request holds and every output poisoned first.
//   kv_cache_bench speed: the decode kernel at B 8, Hq 32, Hkv 8, D 128, fp16, page 16, shuffled pages, L 1k / 8k /
//     32k (1k fits in L2), for each load path and split count, with partial outputs (the host merge not timed) and
//     merged in the cluster (splits 2..8): µs, K+V bytes read per second, and each result against the first.
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

namespace jax_ops::tools {

// Pseudo-random halves in [-1, 1) by a hash of the index (a host generator would take seconds for these pools).
__global__ void FillHalves(__half* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = __float2half(static_cast<float>(x & 0xffff) / 32768.f - 1.f);
  }
}

}  // namespace jax_ops::tools

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

// Keys of the longest request: 3 splits of it still take 4 key tiles each, so both rings wrap (3 stages).
constexpr int64_t kLongRequest = 600;

bool IsHopper() {
  int major = 0;
  CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  return major == 9;
}

const __half kNanHalf = __ushort_as_half(0x7e00);

const char* LoadName(DecodeLoad load) { return load == DecodeLoad::kTma ? "tma" : "cp.async"; }

// A decode's output `rows` x `head_dim` as doubles: o where the kernel wrote it (one split, or merged in the
// cluster), else the partial outputs merged by their natural-log LSE as the Python side does (empty rows 0).
std::vector<double> DecodeResult(const DecodeArgs& dp, size_t rows, int64_t head_dim) {
  const size_t out = rows * head_dim;
  std::vector<double> got(out, 0.0);
  if (dp.splits == 1 || dp.merge_in_cluster) {
    const auto o = ToHost(static_cast<const __half*>(dp.o), out);
    for (size_t i = 0; i < out; ++i) got[i] = __half2float(o[i]);
    return got;
  }
  const auto parts = ToHost(dp.o_parts, dp.splits * out), lse = ToHost(dp.lse_parts, dp.splits * rows);
  for (size_t row = 0; row < rows; ++row) {
    double top = -INFINITY, total = 0;
    for (int64_t p = 0; p < dp.splits; ++p) top = std::max(top, double{lse[p * rows + row]});
    if (top == -INFINITY) continue;
    for (int64_t p = 0; p < dp.splits; ++p) {
      const double w = std::exp(double{lse[p * rows + row]} - top);
      total += w;
      for (int64_t d = 0; d < head_dim; ++d) got[row * head_dim + d] += w * parts[(p * rows + row) * head_dim + d];
    }
    for (int64_t d = 0; d < head_dim; ++d) got[row * head_dim + d] /= total;
  }
  return got;
}

// Appends `tokens` per request, then decodes those chunks; returns the number of failed checks.
template <int kHeadDim>
int RunCase(const Case& c, std::mt19937& rng) {
  Shape s;
  s.batch = 3, s.num_kv_heads = 2, s.num_q_heads = 8, s.head_dim = kHeadDim, s.page_size = c.page_size;
  s.max_pages = (kLongRequest + c.page_size - 1) / c.page_size, s.num_pages = s.batch * s.max_pages + 1;
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
  // NaN in every row no request holds (past each length, and the spare page): a path that reads one, or lets one
  // into P V, fails; the appended rows overwrite theirs.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t pos = lengths[b]; pos < s.capacity(); ++pos)
      for (int64_t h = 0; h < Hkv; ++h) {
        const int64_t row = s.PageOffset(table[b * s.max_pages + pos / s.page_size], pos % s.page_size, h);
        std::fill_n(&k_pool[row], D, kNanHalf), std::fill_n(&v_pool[row], D, kNanHalf);
      }
  const int64_t spare = s.PageOffset(perm.back(), 0, 0), page_elems = s.page_size * Hkv * D;
  std::fill_n(&k_pool[spare], page_elems, kNanHalf), std::fill_n(&v_pool[spare], page_elems, kNanHalf);
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
  auto release = [&] {
    for (void* p : {ap.k_pages, ap.v_pages, (void*)ap.block_table, (void*)ap.lengths, (void*)ap.k_new, (void*)ap.v_new,
                    (void*)ap.lengths_out, (void*)ap.status, (void*)dp.q, dp.o, (void*)dp.o_parts, (void*)dp.lse_parts})
      if (p) CHECK(cudaFree(p));
  };
  const cudaError_t launched = LaunchDecode<__half, kHeadDim, false>(nullptr, dp);
  if (launched == cudaErrorNotSupported && !IsHopper()) {  // TMA and clusters need sm_90a; on Hopper a refusal fails
    std::printf("D=%lld page=%lld: %s%s needs sm_90a: skipped\n", (long long)D, (long long)c.page_size,
                LoadName(c.load), c.cluster ? " + cluster merge" : "");
    release();
    return 0;
  }
  CHECK(launched);
  CHECK(cudaDeviceSynchronize());
  const std::vector<double> got = DecodeResult(dp, out / D, D);
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
  release();
  return failures;
}

int Small() {
  std::mt19937 rng(1234);
  int failures = 0;
  // splits: 1, 3 merged on the host, 3 merged in the kernel's cluster
  const std::pair<int64_t, bool> split_modes[] = {{1, false}, {3, false}, {3, true}};
  for (int64_t page : {16, 5, 8, 64, 128})
    for (DecodeLoad load : {DecodeLoad::kCpAsync, DecodeLoad::kTma}) {
      if (load == DecodeLoad::kTma && page == 5) continue;  // TMA boxes need a power-of-two page >= 8
      if (load == DecodeLoad::kCpAsync && (page == 8 || page == 64 || page == 128)) continue;
      for (int64_t tokens : {1, 5})  // 5: 20 packed rows, two row blocks (the cluster's block mapping)
        for (auto [splits, cluster] : split_modes) {
          failures += RunCase<64>({64, page, tokens, splits, load, cluster}, rng);
          failures += RunCase<128>({128, page, tokens, splits, load, cluster}, rng);
        }
    }
  for (int64_t page : {16, 128})  // D 256: two stages, Q read from shared memory every tile, four panels
    for (DecodeLoad load : {DecodeLoad::kCpAsync, DecodeLoad::kTma})
      for (auto [splits, cluster] : split_modes) failures += RunCase<256>({256, page, 1, splits, load, cluster}, rng);
  std::printf(failures ? "FAILED\n" : "all checks passed\n");
  return failures;
}

// Times the decode kernel on the issue's serving shapes for both load paths, several split counts and both merges
// (partial outputs: the host merge is not timed); every configuration's result is compared with the first one's
// (cp.async, one split), so a fast but wrong variant fails. Returns the number of failed comparisons.
int Speed() {
  int failures = 0;
  constexpr int kHeadDim = 128, kReps = 50;
  std::mt19937 rng(7);
  constexpr int kMaxSplits = 32;
  struct ServingShape {
    int64_t batch, kv_heads, length;
  };
  // B8 Hq32/8 at L 1k-32k, and the latency-bound small decode B4 Hq32/4 at L4k
  for (const ServingShape shape :
       {ServingShape{8, 8, 1024}, ServingShape{8, 8, 8192}, ServingShape{8, 8, 32768}, ServingShape{4, 4, 4096}}) {
    const int64_t length = shape.length;
    Shape s;
    s.batch = shape.batch, s.num_kv_heads = shape.kv_heads, s.num_q_heads = 32, s.head_dim = kHeadDim;
    s.page_size = 16, s.tokens = 1;
    s.max_pages = length / s.page_size, s.num_pages = s.batch * s.max_pages, s.dtype = xla::ffi::DataType::F16;
    std::vector<int32_t> table(s.batch * s.max_pages);
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), rng);
    const size_t pool = s.num_pages * s.page_size * s.num_kv_heads * kHeadDim;
    DecodeArgs dp;
    // scale 0.5: peaked softmaxes, so the splits' log-sum-exps differ and a wrongly weighted merge shows
    dp.shape = s, dp.scale = 0.5f, dp.page_shift = 4;
    dp.q = ToDevice(RandomHalves(s.batch * s.num_q_heads * kHeadDim, rng));
    void* pools[2];
    for (int i = 0; i < 2; ++i) {
      CHECK(cudaMalloc(&pools[i], pool * sizeof(__half)));
      jax_ops::tools::FillHalves<<<1024, 256>>>(static_cast<__half*>(pools[i]), pool, 17u + i);
      CHECK(cudaGetLastError());
    }
    dp.k_pages = pools[0], dp.v_pages = pools[1];
    dp.block_table = ToDevice(table), dp.lengths = ToDevice(std::vector<int32_t>(s.batch, length));
    dp.o = ToDevice(std::vector<__half>(s.batch * s.num_q_heads * kHeadDim));
    dp.o_parts = ToDevice(std::vector<float>(kMaxSplits * s.batch * s.num_q_heads * kHeadDim));
    dp.lse_parts = ToDevice(std::vector<float>(kMaxSplits * s.batch * s.num_q_heads));
    const double bytes = 2.0 * pool * sizeof(__half);
    const size_t out = s.batch * s.num_q_heads * kHeadDim, rows = s.batch * s.num_q_heads;
    std::vector<double> first;  // o of the first configuration
    for (DecodeLoad load : {DecodeLoad::kCpAsync, DecodeLoad::kTma})
      for (int64_t splits : {1, 2, 4, 8, 16, 32})
        for (bool cluster : {false, true}) {
          if (cluster && (splits == 1 || splits > kMaxKernelMergeSplits)) continue;
          if (length / splits < kSplitKeyAlign) continue;  // a split is at least one key tile
          dp.splits = splits, dp.merge_in_cluster = cluster, dp.load = load;
          // poisoned first (0xFF.. is NaN in fp16 and fp32): a variant that writes nothing fails the comparison
          CHECK(cudaMemset(dp.o, 0xFF, out * sizeof(__half)));
          CHECK(cudaMemset(dp.o_parts, 0xFF, kMaxSplits * out * sizeof(float)));
          CHECK(cudaMemset(dp.lse_parts, 0xFF, kMaxSplits * rows * sizeof(float)));
          const double us = 1e3 * jax_ops::tools::Median(jax_ops::tools::RoundTimesMs(
                                      [&] { return LaunchDecode<__half, kHeadDim, false>(nullptr, dp); }, 3, 1, kReps));
          const std::vector<double> got = DecodeResult(dp, rows, kHeadDim);
          if (first.empty()) first = got;
          double diff = 0;
          for (size_t i = 0; i < out; ++i) diff = std::max(diff, std::fabs(got[i] - first[i]));
          const bool ok = diff <= 2e-3;  // fp16 rounding of o; NaN fails
          failures += !ok;
          std::printf("B=%lld Hkv=%lld L=%6lld %-8s splits=%2lld %-14s: %8.1f us  %.2f TB/s  max diff %.1e%s\n",
                      (long long)s.batch, (long long)s.num_kv_heads, (long long)length, LoadName(load),
                      (long long)splits, cluster ? "cluster merge" : "partials", us, bytes / us * 1e-6, diff,
                      ok ? "" : "  MISMATCH");
        }
    for (const void* p : {dp.q, dp.k_pages, dp.v_pages, (const void*)dp.block_table, (const void*)dp.lengths,
                          (const void*)dp.o, (const void*)dp.o_parts, (const void*)dp.lse_parts})
      CHECK(cudaFree(const_cast<void*>(p)));
  }
  // How many CTAs per SM and clusters per GPU the launches above had (a cluster merge slower than its partials at the
  // same splits points here first).
  using Tr = DecodeTraits<kHeadDim>;
  const void* kernel = reinterpret_cast<const void*>(&PagedDecodeKernel<__half, kHeadDim, false>);
  int ctas_per_sm = 0;
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, kernel, Tr::kThreads, Tr::kSmemBytes));
  std::printf("occupancy: %d CTAs per SM, clusters per GPU:", ctas_per_sm);
  for (unsigned splits = 2; splits <= kMaxKernelMergeSplits; splits *= 2) {
    const jax_ops::ClusterLaunch launch(dim3(splits * 64), dim3(Tr::kThreads), Tr::kSmemBytes, nullptr, splits);
    int clusters = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config));
    std::printf(" %u x %d", splits, clusters);
  }
  std::printf("\n");
  std::printf(failures ? "FAILED\n" : "all configurations agree\n");
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::strcmp(argv[1], "small") == 0) return Small() ? 1 : 0;
  if (argc >= 2 && std::strcmp(argv[1], "speed") == 0) return Speed() ? 1 : 0;
  std::printf("usage: %s small|speed\n", argv[0]);
  return 2;
}
