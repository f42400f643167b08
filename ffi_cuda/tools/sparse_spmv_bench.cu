// Standalone SpMV tuning bench (no Python): the suite's matrices of jax_ops/bench/sparse.py generated in C++
// (same shapes and row profiles, seeded), every candidate plan of the real kernels (spmm_kernels_impl.cuh) and
// cuSPARSE (cusparseSpMV, CSR, ALG_DEFAULT and CSR_ALG2), CUDA-event timing (median of 7 runs of `reps`
// launches), each result checked against a float64 CPU reference with the output poisoned (NaN) first.
// Built by CMake with JAX_OPS_TOOLS=ON (target sparse_spmv_bench, ffi_cuda/tools/CMakeLists.txt).
// Usage: sparse_spmv_bench [--small] [--quick] [--slab] [--tails] [--blocks] [--blocks-small] [--csv FILE]
//   (no flag): every suite matrix, Ax and ATu: cuSPARSE, the row-group baseline, the dispatched plan and a sweep of
//            the rows kernel's parameters, then a summary table.
//   --blocks: the blocks plan (rows sharing a column list) on the bundle-adjustment matrices, vs cuSPARSE and the
//            dispatched CSR plan; --blocks-small: its ragged checks only (also part of --small).
//   --tails: the cases slower than cuSPARSE (power-law Ax/ATu, bundle-adj 1M and LSMR's ba-like Ax/ATu, uniform
//            ATu): cuSPARSE, the dispatched plan, vector G/2 and 2G, split at chunk 128/256/512, the segmented plan
//            (rows per chunk 1024/4096/16384, G x0.5/x2, one launch per segment), a summary table last.
//   --small: only the small every-path correctness checks (all dtypes, N = 1 and SpMM, the slab kernels' ragged
//            cases), e.g. under compute-sanitizer; --quick: no parameter sweeps, only the dispatched plan and
//            cuSPARSE; --slab: the slab kernels' ragged checks, then the two LSQ matrices (slab predicate: yes) and
//            bundle-adjustment (predicate: no) only, Ax/Aᵀu by the dispatched plan and cuSPARSE and Aᵀu by the
//            library's column-slab kernels (sparse/slab_spmv_kernels_impl.cuh) in the library's config.
// SPMV_BENCH_ONCE=1: each timed candidate runs once (its times are meaningless), for ncu profiles of every kernel,
//   e.g. ncu --clock-control none --section SpeedOfLight ... sparse_spmv_bench --tails.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cusparse.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "sparse/slab_spmv_kernels_impl.cuh"
#include "sparse/spmm_kernels_impl.cuh"
#include "tools/bench_check.h"
#include "tools/slab_host.h"

using namespace jax_ops::sparse;

inline std::string SpStatusText(cusparseStatus_t s) { return std::to_string(static_cast<int>(s)); }
#define CHECK_SP(x) CHECK_STATUS(x, CUSPARSE_STATUS_SUCCESS, "cuSPARSE", SpStatusText)

// ------------------------------------------------------------------------------------------------ matrices
struct Csr {
  std::string name;
  int64_t m = 0, k = 0;
  std::vector<int32_t> indptr, indices;
  std::vector<float> values;
  int64_t nnz() const { return static_cast<int64_t>(indices.size()); }
};

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 12345) {}
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
  int32_t below(int64_t n) { return static_cast<int32_t>(next() % static_cast<uint64_t>(n)); }
};

static void FillValues(Csr& a, Rng& rng) {
  a.values.resize(a.indices.size());
  for (auto& v : a.values) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
}

static Csr FromLens(std::string name, int64_t m, int64_t k, const std::vector<int64_t>& lens, Rng& rng, bool sort) {
  Csr a;
  a.name = std::move(name);
  a.m = m, a.k = k;
  a.indptr.resize(m + 1);
  int64_t p = 0;
  for (int64_t r = 0; r < m; ++r) a.indptr[r] = static_cast<int32_t>(p), p += lens[r];
  a.indptr[m] = static_cast<int32_t>(p);
  a.indices.resize(p);
  for (auto& c : a.indices) c = rng.below(k);
  if (sort)
    for (int64_t r = 0; r < m; ++r) std::sort(a.indices.begin() + a.indptr[r], a.indices.begin() + a.indptr[r + 1]);
  FillValues(a, rng);
  return a;
}

static Csr Uniform(int64_t m, int64_t k, int per_row) {
  Rng rng(0);
  return FromLens("uniform " + std::to_string(m / 1000000) + "M 16/row", m, k, std::vector<int64_t>(m, per_row), rng,
                  true);
}

static Csr PowerLaw(int64_t m, int64_t k, double scale = 4.0, double shape = 1.2, int64_t max_len = 200000) {
  Rng rng(1);
  std::vector<int64_t> lens(m);
  for (auto& l : lens) {
    const double u = 1.0 - rng.uniform();  // (0, 1]
    const double lomax = std::pow(u, -1.0 / shape) - 1.0;
    l = static_cast<int64_t>(std::min((lomax + 1.0) * scale, static_cast<double>(max_len)));
  }
  return FromLens("power-law 1M", m, k, lens, rng, false);
}

static Csr Poisson(std::vector<int64_t> dims) {
  Rng rng(2);
  Csr a;
  a.name = dims.size() == 2 ? "poisson2d 2048^2" : "poisson3d 128^3";
  int64_t n = 1;
  for (auto d : dims) n *= d;
  a.m = a.k = n;
  std::vector<int64_t> strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  a.indptr.assign(n + 1, 0);
  a.indices.reserve(n * (2 * dims.size() + 1));
  std::vector<int64_t> coord(dims.size());
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i;
    for (size_t d = 0; d < dims.size(); ++d) coord[d] = rem / strides[d], rem %= strides[d];
    // negative offsets (largest stride first), centre, positive offsets (smallest stride first): sorted columns
    for (size_t d = 0; d < dims.size(); ++d)
      if (coord[d] > 0) a.indices.push_back(static_cast<int32_t>(i - strides[d]));
    a.indices.push_back(static_cast<int32_t>(i));
    for (int d = static_cast<int>(dims.size()) - 1; d >= 0; --d)
      if (coord[d] + 1 < dims[d]) a.indices.push_back(static_cast<int32_t>(i + strides[d]));
    a.indptr[i + 1] = static_cast<int32_t>(a.indices.size());
  }
  FillValues(a, rng);
  return a;
}

static Csr Lsq(int64_t m, int64_t k, double avg, uint64_t seed = 3) {
  Rng rng(seed);
  std::mt19937_64 gen(seed);
  std::poisson_distribution<int64_t> pois(avg);
  std::vector<int64_t> lens(m);
  for (auto& l : lens) l = std::clamp<int64_t>(pois(gen), 1, k);
  return FromLens("lsq " + std::to_string(m) + "x" + std::to_string(k), m, k, lens, rng, false);
}

static Csr BundleAdjustment(int64_t n_obs, int64_t n_cams, int64_t n_pts, std::string name = "bundle-adj 1M obs") {
  Rng rng(4);
  Csr a;
  a.name = std::move(name);
  a.m = 2 * n_obs, a.k = n_cams * 9 + n_pts * 3;
  a.indptr.resize(a.m + 1);
  a.indices.resize(a.m * 12);
  for (int64_t o = 0; o < n_obs; ++o) {
    const int64_t cam = rng.below(n_cams), pt = rng.below(n_pts);
    for (int rr = 0; rr < 2; ++rr) {
      int32_t* c = &a.indices[(2 * o + rr) * 12];
      for (int j = 0; j < 9; ++j) c[j] = static_cast<int32_t>(cam * 9 + j);
      for (int j = 0; j < 3; ++j) c[9 + j] = static_cast<int32_t>(n_cams * 9 + pt * 3 + j);
    }
  }
  for (int64_t r = 0; r <= a.m; ++r) a.indptr[r] = static_cast<int32_t>(r * 12);
  FillValues(a, rng);
  return a;
}

// Power-law test matrix of tests/test_sparse_gpu.py::_power_law (small every-path checks).
static Csr SmallPowerLaw(int64_t m, int64_t k, int64_t max_len, uint64_t seed) {
  Rng rng(seed);
  std::vector<int64_t> lens(m);
  for (auto& l : lens) {
    const double lomax = std::pow(1.0 - rng.uniform(), -1.0 / 1.3) - 1.0;
    l = static_cast<int64_t>(std::min((lomax + 1.0) * 2.0, static_cast<double>(max_len)));
  }
  lens[m / 3] = max_len;
  Csr a = FromLens("small power-law", m, k, lens, rng, false);
  for (int i = 0; i < 5 && a.nnz() > 10; ++i)
    a.indices[rng.below(a.nnz())] = (i & 1) ? -3 : static_cast<int32_t>(k + 7);
  return a;
}

static Csr Transpose(const Csr& a) {
  Csr t;
  t.name = a.name;
  t.m = a.k, t.k = a.m;
  t.indptr.assign(t.m + 1, 0);
  for (int32_t c : a.indices)
    if (c >= 0 && c < a.k) t.indptr[c + 1]++;
  for (int64_t i = 0; i < t.m; ++i) t.indptr[i + 1] += t.indptr[i];
  t.indices.resize(t.indptr[t.m]);
  t.values.resize(t.indptr[t.m]);
  std::vector<int32_t> pos(t.indptr.begin(), t.indptr.end() - 1);
  for (int64_t r = 0; r < a.m; ++r)
    for (int32_t p = a.indptr[r]; p < a.indptr[r + 1]; ++p) {
      const int32_t c = a.indices[p];
      if (c < 0 || c >= a.k) continue;
      t.indices[pos[c]] = static_cast<int32_t>(r);
      t.values[pos[c]++] = a.values[p];
    }
  return t;
}

struct Profile {
  double avg = 0, p95 = 0, cv = 0;
  int64_t max = 0;
};

static Profile ProfileOf(const Csr& a) {
  Profile p;
  std::vector<int64_t> lens(a.m);
  double sum = 0, sq = 0;
  for (int64_t r = 0; r < a.m; ++r) {
    lens[r] = a.indptr[r + 1] - a.indptr[r];
    sum += lens[r], sq += double(lens[r]) * lens[r];
    p.max = std::max(p.max, lens[r]);
  }
  p.avg = a.m ? sum / a.m : 0;
  p.cv = p.avg > 0 ? std::sqrt(std::max(0.0, sq / a.m - p.avg * p.avg)) / p.avg : 0;
  if (a.m) {
    std::nth_element(lens.begin(), lens.begin() + static_cast<int64_t>(0.95 * (a.m - 1)), lens.end());
    p.p95 = static_cast<double>(lens[static_cast<int64_t>(0.95 * (a.m - 1))]);
  }
  return p;
}

static std::vector<double> Reference(const Csr& a, const std::vector<float>& x) {
  std::vector<double> y(a.m, 0.0);
  for (int64_t r = 0; r < a.m; ++r) {
    double s = 0;
    for (int32_t p = a.indptr[r]; p < a.indptr[r + 1]; ++p) {
      const int32_t c = a.indices[p];
      if (c >= 0 && c < a.k) s += double(a.values[p]) * x[c];
    }
    y[r] = s;
  }
  return y;
}

// ---------------------------------------------------------------------------------------------- device side
struct DevCsr {
  int32_t *indptr = nullptr, *indices = nullptr;
  float* values = nullptr;
  int64_t m = 0, k = 0, nnz = 0;
};

static DevCsr Upload(const Csr& a) {
  DevCsr d;
  d.m = a.m, d.k = a.k, d.nnz = a.nnz();
  CHECK(cudaMalloc(&d.indptr, (a.m + 1) * 4));
  CHECK(cudaMalloc(&d.indices, std::max<int64_t>(1, d.nnz) * 4));
  CHECK(cudaMalloc(&d.values, std::max<int64_t>(1, d.nnz) * 4));
  CHECK(cudaMemcpy(d.indptr, a.indptr.data(), (a.m + 1) * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d.indices, a.indices.data(), d.nnz * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(d.values, a.values.data(), d.nnz * 4, cudaMemcpyHostToDevice));
  return d;
}

static void Free(DevCsr& d) {
  cudaFree(d.indptr), cudaFree(d.indices), cudaFree(d.values);
  d = DevCsr{};
}

// SPMV_BENCH_ONCE=1 (for ncu): every timed candidate runs once instead of 3 + 7 x reps times.
static const bool g_once = std::getenv("SPMV_BENCH_ONCE") != nullptr;

template <typename F>
static double MedianUs(F&& launch, int reps) {
  if (g_once) {
    launch();
    CHECK(cudaDeviceSynchronize());
    return 1.0;
  }
  return 1e3 * jax_ops::tools::Median(jax_ops::tools::RoundTimesMs(launch, 3, 7, reps));
}

__global__ void CopyKernel(const float4* __restrict__ in, float4* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = in[i];
}

// Everything one SpMV case needs: the matrix on the device, x, y, alpha/beta, the split lists and workspace.
struct Case {
  const Csr* host = nullptr;
  DevCsr d;
  float *x = nullptr, *y = nullptr, *alpha = nullptr, *beta = nullptr, *ws = nullptr;
  int32_t *long_rows = nullptr, *long_ptr = nullptr;
  int64_t num_long = 0, units = 0;
  std::vector<float> hx;
  std::vector<double> ref;
  double bytes = 0;
  int sms = 0;
};

static SpmmArgs<float, float> BaseArgs(const Case& c) {
  SpmmArgs<float, float> a;
  a.indptr = c.d.indptr, a.indices = c.d.indices, a.values = c.d.values, a.b = c.x;
  a.alpha = c.alpha, a.beta = c.beta, a.y = nullptr, a.out = c.y, a.ws = c.ws;
  a.long_rows = c.long_rows, a.long_ptr = c.long_ptr;
  a.m = c.d.m, a.k = c.d.k, a.n = 1, a.nnz = c.d.nnz;
  return a;
}

// Long-row lists of the split algorithm for `chunk` (host, as jax_ops.sparse._long_rows_host).
static void LongLists(const Csr& h, int64_t chunk, std::vector<int32_t>* rows, std::vector<int32_t>* ptr) {
  rows->clear();
  *ptr = {0};
  for (int64_t r = 0; r < h.m; ++r)
    if (h.indptr[r + 1] - h.indptr[r] > chunk) rows->push_back(static_cast<int32_t>(r));
  auto len = [&](int32_t r) { return int64_t{h.indptr[r + 1]} - h.indptr[r]; };
  for (int32_t r : *rows) ptr->push_back(static_cast<int32_t>(ptr->back() + (len(r) + chunk - 1) / chunk));
}

// Split lists on the device; the workspace holds the units' partials.
static void SetSplit(Case& c, int64_t chunk) {
  cudaFree(c.long_rows), cudaFree(c.long_ptr), cudaFree(c.ws);
  std::vector<int32_t> rows, ptr;
  LongLists(*c.host, chunk, &rows, &ptr);
  c.num_long = static_cast<int64_t>(rows.size());
  c.units = ptr.back();
  CHECK(cudaMalloc(&c.long_rows, std::max<size_t>(1, rows.size()) * 4));
  CHECK(cudaMalloc(&c.long_ptr, ptr.size() * 4));
  CHECK(cudaMalloc(&c.ws, std::max<int64_t>(1, c.units) * 4));
  if (!rows.empty()) CHECK(cudaMemcpy(c.long_rows, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(c.long_ptr, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice));
}

// Row classes of the segmented plan (as jax_ops.sparse.segments_host + _segment_table): chunks of `rows` rows,
// G from each chunk's average (the vector rule), equal neighbours merged; `gmul` scales every segment's G
// (0.5, 1, 2; clamped to [1, 32]) to try other G choices. table int32[3 S], CTA prefix int32[S + 1].
static int RuleGroup(double avg) { return avg < 10 ? 1 : avg < 64 ? 4 : avg < 128 ? 8 : avg < 256 ? 16 : 32; }
static int64_t Segments(const Csr& h, int64_t rows, double gmul, std::vector<int32_t>* table,
                        std::vector<int32_t>* ptr) {
  table->clear();
  *ptr = {0};
  std::vector<std::array<int64_t, 3>> segs;
  for (int64_t b = 0; b < h.m; b += rows) {
    const int64_t e = std::min(h.m, b + rows);
    const int g = RuleGroup(double(h.indptr[e] - h.indptr[b]) / double(e - b));
    if (!segs.empty() && segs.back()[2] == g)
      segs.back()[1] = e;
    else
      segs.push_back({b, e, g});
  }
  if (segs.empty()) segs.push_back({0, 0, 1});
  for (auto& sg : segs) {
    const int g = std::clamp(static_cast<int>(sg[2] * gmul), 1, 32);
    table->insert(table->end(), {static_cast<int32_t>(sg[0]), static_cast<int32_t>(sg[1]), g});
    const int64_t rpc = SegmentRowsPerCta(g);
    ptr->push_back(static_cast<int32_t>(ptr->back() + std::max<int64_t>(1, (sg[1] - sg[0] + rpc - 1) / rpc)));
  }
  return ptr->back();
}

static void SetSegments(Case& c, int64_t rows, double gmul) {
  cudaFree(c.long_rows), cudaFree(c.long_ptr);
  std::vector<int32_t> table, ptr;
  c.units = Segments(*c.host, rows, gmul, &table, &ptr);  // CTAs (SpmmArgs::chunk of segmented)
  c.num_long = static_cast<int64_t>(ptr.size()) - 1;
  CHECK(cudaMalloc(&c.long_rows, table.size() * 4));
  CHECK(cudaMalloc(&c.long_ptr, ptr.size() * 4));
  CHECK(cudaMemcpy(c.long_rows, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(c.long_ptr, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice));
}

static bool Verify(Case& c, const std::function<void()>& launch, double* err_out) {
  CHECK(cudaMemset(c.y, 0xFF, c.d.m * 4));  // NaN
  launch();
  CHECK(cudaGetLastError());
  CHECK(cudaDeviceSynchronize());
  std::vector<float> out(c.d.m);
  CHECK(cudaMemcpy(out.data(), c.y, c.d.m * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (int64_t i = 0; i < c.d.m; ++i) {
    if (!std::isfinite(out[i])) {
      *err_out = INFINITY;
      return false;
    }
    num += (out[i] - c.ref[i]) * (out[i] - c.ref[i]);
    den += c.ref[i] * c.ref[i];
  }
  *err_out = std::sqrt(num / std::max(den, 1e-300));
  return *err_out < 1e-5;
}

struct Result {
  std::string plan;
  double us = 0, err = 0;
  bool ok = false;
  int repeat_diffs = -1;  // runs (of kRepeatRuns) whose output differed bitwise from the first; -1: not checked
};

// Bitwise run-to-run repeatability (the library's contract is deterministic output): how many of `runs`
// launches give an output that differs in any bit from the first launch's.
constexpr int kRepeatRuns = 20;
static int RepeatDiffs(Case& c, const std::function<void()>& launch, int runs) {
  std::vector<float> first(c.d.m), out(c.d.m);
  int diffs = 0;
  for (int i = 0; i < runs; ++i) {
    launch();
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(i == 0 ? first.data() : out.data(), c.y, c.d.m * 4, cudaMemcpyDeviceToHost));
    if (i > 0 && std::memcmp(first.data(), out.data(), c.d.m * 4) != 0) ++diffs;
  }
  return diffs;
}

static int Reps(const Case& c) { return c.bytes > 1e8 ? 20 : 100; }

static Result Measure(Case& c, const std::string& plan, const std::function<void()>& launch) {
  Result r;
  r.plan = plan;
  r.ok = Verify(c, launch, &r.err);
  r.us = MedianUs(launch, Reps(c));
  return r;
}

// ---------------------------------------------------------------------------------------------- candidates
template <int G, int U, int S, bool H, int MB>
static void RowsLaunch(const SpmmArgs<float, float>& a, int64_t cap) {
  CHECK((LaunchSpmvRows<float, float, G, U, S, H, MB>(nullptr, a, cap)));
}

using RowsFn = void (*)(const SpmmArgs<float, float>&, int64_t);
// (G, U, S, hint, min blocks) -> launcher; U * S <= 16.
template <int G, bool H, int MB>
static RowsFn RowsGHM(int u, int s) {
  if (u == 1)
    return s == 2 ? &RowsLaunch<G, 1, 2, H, MB> : s == 4 ? &RowsLaunch<G, 1, 4, H, MB> : &RowsLaunch<G, 1, 8, H, MB>;
  if (u == 2)
    return s == 2 ? &RowsLaunch<G, 2, 2, H, MB> : s == 4 ? &RowsLaunch<G, 2, 4, H, MB> : &RowsLaunch<G, 2, 8, H, MB>;
  return s == 2 ? &RowsLaunch<G, 4, 2, H, MB> : &RowsLaunch<G, 4, 4, H, MB>;
}
template <bool H, int MB>
static RowsFn RowsHM(int g, int u, int s) {
  switch (g) {
    case 1:
      return RowsGHM<1, H, MB>(u, s);
    case 2:
      return RowsGHM<2, H, MB>(u, s);
    case 4:
      return RowsGHM<4, H, MB>(u, s);
    case 8:
      return RowsGHM<8, H, MB>(u, s);
    case 16:
      return RowsGHM<16, H, MB>(u, s);
    default:
      return RowsGHM<32, H, MB>(u, s);
  }
}
static RowsFn Rows(int g, int u, int s, bool hint, bool occ) {
  if (occ) return hint ? RowsHM<true, 6>(g, u, s) : RowsHM<false, 6>(g, u, s);
  return hint ? RowsHM<true, 1>(g, u, s) : RowsHM<false, 1>(g, u, s);
}

static int NextPow2Host(double v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}
static int VectorGroup(double avg) { return std::min(32, std::max(2, NextPow2Host(avg / 2.0))); }

// Rows per CTA of the baseline's stream plan.
static int64_t StreamRows(const Csr& a) {
  const double avg = a.m ? double(a.nnz()) / a.m : 0;
  int64_t rows = 256;
  while (rows > 8 && rows * std::max(avg, 1.0) > 2048) rows /= 2;
  while (rows > 8) {
    int64_t worst = 0;
    for (int64_t r0 = 0; r0 < a.m; r0 += rows)
      worst = std::max<int64_t>(worst, a.indptr[std::min(r0 + rows, a.m)] - a.indptr[r0]);
    if (worst <= 4096) break;
    rows /= 2;
  }
  return rows;
}

// Baseline: the row-group plans (one row per group of G lanes: SpmvGroupKernel, SpmvCtaKernel, stream).
static Result GroupBaseline(Case& c) {
  const Csr& h = *c.host;
  const Profile p = ProfileOf(h);
  SpmmArgs<float, float> a = BaseArgs(c);
  const int64_t cap = int64_t{c.sms} * 64;
  auto blocks_for = [&](int64_t threads) {
    return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, (threads + 255) / 256)));
  };
  std::string alg;
  if (p.max > std::max(2048.0, 32 * p.avg))
    alg = "split";
  else if (p.avg >= 512 && p.cv < 1)
    alg = "cta";
  else if (p.avg >= 48)
    alg = "warp";
  else if (p.max > 512 || (h.k * 4 > 32 * 1024 && h.k * 4 <= 192 * 1024))
    alg = "vector";
  else
    alg = "stream";
  if (alg == "stream") {
    a.algorithm = kStream;
    a.chunk = StreamRows(h);
    return Measure(c, "group stream R=" + std::to_string(a.chunk), [&] {
      SpmvStreamKernel<float, float><<<static_cast<unsigned>((a.m + a.chunk - 1) / a.chunk), 256>>>(a);
    });
  }
  if (alg == "cta")
    return Measure(c, "group cta", [&] { SpmvCtaKernel<float, float><<<std::min<int64_t>(a.m, cap), 256>>>(a); });
  if (alg == "split") {
    SetSplit(c, 1024);
    a = BaseArgs(c);
    a.algorithm = kSplit, a.chunk = 1024, a.num_long = c.num_long, a.units = c.units;
    const int g = VectorGroup(std::min(p.avg, p.p95));
    return Measure(c, "group split G=" + std::to_string(g), [&] {
      WithGroup(g, [&](auto gc) {
        constexpr int G = decltype(gc)::value;
        SpmvGroupKernel<float, float, G><<<blocks_for(a.m * G), 256>>>(a, false);
        return cudaGetLastError();
      });
      SpmvGroupKernel<float, float, 32><<<blocks_for(a.units * 32), 256>>>(a, true);
      SplitFixupKernel<float, float><<<blocks_for(a.num_long * 32), 256>>>(a);
    });
  }
  const int g = alg == "warp" ? 32 : VectorGroup(p.avg);
  return Measure(c, "group " + alg + " G=" + std::to_string(g), [&] {
    WithGroup(g, [&](auto gc) {
      constexpr int G = decltype(gc)::value;
      SpmvGroupKernel<float, float, G><<<blocks_for(a.m * G), 256>>>(a, false);
      return cudaGetLastError();
    });
  });
}

static bool g_repeat_check = false;  // --tails: cuSPARSE rows also report bitwise run-to-run repeatability

// How a cuSPARSE row prepares the call: kOnce = descriptors, buffer and (kPreprocess) cusparseSpMV_preprocess set
// up once outside the timed launches; kPerCall = everything per launch (descriptors, bufferSize, preprocess, SpMV,
// destroy: what an FFI handler without persistent state would do; the buffer stays allocated).
enum CusparsePrep { kNoPreprocess, kPreprocess, kPerCall };

// cuSPARSE SpMV of the case's matrix (op: CSR as is, or its transpose), alg default/ALG1/ALG2.
static Result Cusparse(Case& c, cusparseHandle_t h, cusparseOperation_t op, cusparseSpMVAlg_t alg, const char* name,
                       const DevCsr& mat, CusparsePrep prep) {
  cusparseSpMatDescr_t A;
  cusparseDnVecDescr_t X, Y;
  auto create = [&] {
    CHECK_SP(cusparseCreateCsr(&A, mat.m, mat.k, mat.nnz, mat.indptr, mat.indices, mat.values, CUSPARSE_INDEX_32I,
                               CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F));
    CHECK_SP(cusparseCreateDnVec(&X, c.d.k, c.x, CUDA_R_32F));
    CHECK_SP(cusparseCreateDnVec(&Y, c.d.m, c.y, CUDA_R_32F));
  };
  auto destroy = [&] { cusparseDestroySpMat(A), cusparseDestroyDnVec(X), cusparseDestroyDnVec(Y); };
  create();
  const float one = 1.0f, zero = 0.0f;
  size_t ws = 0;
  Result r;
  r.plan = name;
  if (cusparseSpMV_bufferSize(h, op, &one, A, X, &zero, Y, CUDA_R_32F, alg, &ws) != CUSPARSE_STATUS_SUCCESS) {
    r.plan += " (unsupported)";
    destroy();
    return r;
  }
  void* buf = nullptr;
  const size_t cap = std::max<size_t>(ws, 16);
  CHECK(cudaMalloc(&buf, cap));
  if (prep == kPreprocess) CHECK_SP(cusparseSpMV_preprocess(h, op, &one, A, X, &zero, Y, CUDA_R_32F, alg, buf));
  std::function<void()> launch = [&] { CHECK_SP(cusparseSpMV(h, op, &one, A, X, &zero, Y, CUDA_R_32F, alg, buf)); };
  if (prep == kPerCall) {
    destroy();
    launch = [&] {
      create();
      size_t need = 0;
      CHECK_SP(cusparseSpMV_bufferSize(h, op, &one, A, X, &zero, Y, CUDA_R_32F, alg, &need));
      if (need > cap) std::exit(2);
      CHECK_SP(cusparseSpMV_preprocess(h, op, &one, A, X, &zero, Y, CUDA_R_32F, alg, buf));
      CHECK_SP(cusparseSpMV(h, op, &one, A, X, &zero, Y, CUDA_R_32F, alg, buf));
      destroy();
    };
  }
  r = Measure(c, name, launch);
  if (g_repeat_check) r.repeat_diffs = RepeatDiffs(c, launch, kRepeatRuns);
  if (g_repeat_check)
    std::printf("  (%s: buffer %zu bytes = %.2f per row, %.3f per nnz)\n", name, ws,
                double(ws) / std::max<int64_t>(1, mat.m), double(ws) / std::max<int64_t>(1, mat.nnz));
  cudaFree(buf);
  if (prep != kPerCall) destroy();
  return r;
}

static FILE* g_csv = nullptr;

static void Print(const Case& c, const char* op, const Result& r, double ref_us) {
  const double gbps = c.bytes / (r.us * 1e-6) / 1e9;
  std::printf("  %-34s %9.1f us %7.0f GB/s  x%5.2f  err %.1e%s", r.plan.c_str(), r.us, gbps, ref_us / r.us, r.err,
              r.ok ? "" : "  FAIL");
  if (r.repeat_diffs >= 0) std::printf("  bitwise repeat: %d of %d runs differ", r.repeat_diffs, kRepeatRuns - 1);
  std::printf("\n");
  if (g_csv)
    std::fprintf(g_csv, "%s,%s,%s,%.2f,%.1f,%.3e,%d\n", c.host->name.c_str(), op, r.plan.c_str(), r.us, gbps, r.err,
                 int(r.ok));
}

struct Summary {
  std::string name, op, plan;
  double ours = 0, cusp = 0, cusp_best = 0, gbps = 0;
};
static std::vector<Summary> g_summary;

// All candidates for one SpMV (A x, or Aᵀ u when `mat` is CSR(Aᵀ)); `csr_a` (optional) is CSR(A) for cuSPARSE's
// transpose op.
static void SetupCase(Case& c, const Csr& mat, int sms) {
  c.host = &mat;
  c.d = Upload(mat);
  c.sms = sms;
  c.hx.resize(mat.k);
  Rng rng(77);
  for (auto& v : c.hx) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  c.ref = Reference(mat, c.hx);
  CHECK(cudaMalloc(&c.x, std::max<int64_t>(1, mat.k) * 4));
  CHECK(cudaMalloc(&c.y, std::max<int64_t>(1, mat.m) * 4));
  CHECK(cudaMalloc(&c.alpha, 4));
  CHECK(cudaMalloc(&c.beta, 4));
  CHECK(cudaMemcpy(c.x, c.hx.data(), mat.k * 4, cudaMemcpyHostToDevice));
  const float one = 1.0f, zero = 0.0f;
  CHECK(cudaMemcpy(c.alpha, &one, 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(c.beta, &zero, 4, cudaMemcpyHostToDevice));
  SetSplit(c, 1 << 30);
  c.bytes = double(mat.nnz()) * 8 + double(mat.m + 1) * 4 + double(mat.k) * 4 + double(mat.m) * 4;
}

static void FreeCase(Case& c) {
  cudaFree(c.x), cudaFree(c.y), cudaFree(c.alpha), cudaFree(c.beta), cudaFree(c.ws), cudaFree(c.long_rows),
      cudaFree(c.long_ptr);
  c.x = c.y = c.alpha = c.beta = c.ws = nullptr, c.long_rows = c.long_ptr = nullptr;
  Free(c.d);
}

// jax_ops.sparse.segmented_applies: the G = 32 class of the 4096-row segment table and the other classes each hold
// >= 10 % of the nnz.
static bool SegmentedApplies(const Csr& h) {
  std::vector<int32_t> table, ptr;
  Segments(h, 4096, 1.0, &table, &ptr);
  int64_t warp = 0, total = 0;
  for (size_t sg = 0; sg + 2 < table.size(); sg += 3) {
    const int64_t nnz = int64_t{h.indptr[table[sg + 1]]} - h.indptr[table[sg]];
    total += nnz;
    if (table[sg + 2] == 32) warp += nnz;
  }
  return total > 0 && warp >= 0.1 * total && total - warp >= 0.1 * total;
}

// The plan jax_ops.sparse dispatches today (choose_algorithm/_group_for/_vector_group_for, segmented_applies),
// through LaunchCsrSpmm (f32: the gathered operand is K * 4 bytes).
static Result Production(Case& c) {
  const Profile p = ProfileOf(*c.host);
  const bool long_rows = p.max > std::max(2048.0, 32 * p.avg);
  SpmmArgs<float, float> a = BaseArgs(c);
  std::string name;
  if (!long_rows && p.avg < 256 && SegmentedApplies(*c.host)) {
    SetSegments(c, 4096, 1.0);
    a = BaseArgs(c);
    a.algorithm = kSegmented, a.chunk = c.units, a.num_long = c.num_long;
    name = "NEW segmented r=4096 S=" + std::to_string(c.num_long);
  } else if (long_rows) {
    const int64_t chunk = 256;
    SetSplit(c, chunk);
    a = BaseArgs(c);
    a.algorithm = kSplit, a.chunk = chunk, a.num_long = c.num_long, a.units = c.units;
    a.group = std::min(32, 2 * RuleGroup(std::min(p.avg, p.p95)));
    name = "NEW split chunk=256 G=" + std::to_string(a.group);
  } else {
    a.algorithm = kVector;
    a.group = RuleGroup(p.avg);
    const bool varied = p.avg >= 16 && p.avg < 64 && p.avg < p.p95 && p.p95 <= 2 * p.avg;
    if (a.group == 4 && varied && c.d.k * 4 > 128 * 1024) a.group = 8;  // the operand is not L1-resident
    name = "NEW vector G=" + std::to_string(a.group);
  }
  Result r = Measure(c, name, [&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, a, false, c.sms))); });
  SetSplit(c, 1 << 30);
  return r;
}

static void RunCase(const Csr& mat, const DevCsr* csr_a, const char* op, cusparseHandle_t handle, int sms, bool quick) {
  Case c;
  SetupCase(c, mat, sms);
  const Profile p = ProfileOf(mat);
  std::printf("\n== %s  %s: M=%lld K=%lld nnz=%lld avg=%.1f p95=%.0f max=%lld cv=%.2f, %.1f MB\n", mat.name.c_str(), op,
              (long long)mat.m, (long long)mat.k, (long long)mat.nnz(), p.avg, p.p95, (long long)p.max, p.cv,
              c.bytes / 1e6);

  std::vector<Result> cusp;
  cusp.push_back(Cusparse(c, handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_SPMV_ALG_DEFAULT, "cuSPARSE default",
                          c.d, kNoPreprocess));
  cusp.push_back(Cusparse(c, handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_SPMV_CSR_ALG2, "cuSPARSE CSR_ALG2+pre",
                          c.d, kPreprocess));
  if (csr_a)
    cusp.push_back(Cusparse(c, handle, CUSPARSE_OPERATION_TRANSPOSE, CUSPARSE_SPMV_ALG_DEFAULT,
                            "cuSPARSE default op=T on CSR(A)", *csr_a, kNoPreprocess));
  const double ref_us = cusp[0].us;
  double best_cusp = 1e30;
  for (auto& r : cusp) {
    if (r.us > 0) Print(c, op, r, ref_us);
    if (r.us > 0 && r.ok) best_cusp = std::min(best_cusp, r.us);
  }
  Print(c, op, GroupBaseline(c), ref_us);
  SetSplit(c, 1 << 30);

  // Production dispatch (LaunchCsrSpmm with the plan jax_ops.sparse would choose).
  const Result prod = Production(c);
  Print(c, op, prod, ref_us);
  g_summary.push_back({mat.name, op, prod.plan, prod.us, ref_us, best_cusp, c.bytes / (prod.us * 1e-6) / 1e9});
  SetSplit(c, 1 << 30);

  if (!quick) {
    // Sweep of the rows kernel: G around the vector group, U rows per lane, streaming hint, grid cap.
    std::vector<Result> sweep;
    const int g0 = VectorGroup(p.avg);
    const bool long_rows = p.max > std::max(2048.0, 32 * p.avg);
    std::vector<int64_t> chunks = long_rows ? std::vector<int64_t>{128, 256, 512} : std::vector<int64_t>{0};
    for (int64_t chunk : chunks) {
      if (chunk) SetSplit(c, chunk);
      const std::vector<int> gs =
          p.avg >= 256 ? std::vector<int>{16, 32} : std::vector<int>{g0 / 8, g0 / 4, g0 / 2, g0};
      for (int g : gs) {
        if (g < 1 || g > 32) continue;
        for (int u : {1, 2, 4})
          for (int st : {2, 4, 8})
            for (int hint : {0, 1})
              for (int occ : {0, 1}) {
                if (u * st > 16) continue;
                SpmmArgs<float, float> a = BaseArgs(c);
                if (chunk) a.algorithm = kSplit, a.chunk = chunk, a.num_long = c.num_long, a.units = c.units;
                const int64_t cap = int64_t{sms} * 64;
                RowsFn fn = Rows(g, u, st, hint, occ);
                char name[96];
                std::snprintf(name, sizeof name, "rows G=%d U=%d S=%d%s%s%s", g, u, st, hint ? " cs" : "",
                              occ ? " mb6" : "", chunk ? (" chunk=" + std::to_string(chunk)).c_str() : "");
                auto launch = [&] {
                  fn(a, cap);
                  if (chunk) {
                    SpmvUnitKernel<float, float, false>
                        <<<std::max<int64_t>(1, std::min<int64_t>(sms * 64, (a.units * 32 + 255) / 256)), 256>>>(a);
                    SpmvFixupKernel<float, float>
                        <<<std::max<int64_t>(1, std::min<int64_t>(sms * 64, (a.num_long * 32 + 255) / 256)), 256>>>(a);
                  }
                };
                sweep.push_back(Measure(c, name, launch));
                if (chunk == 256 && g == 4 && u == 2 && st == 4 && !hint && !occ) {  // where split's time goes
                  Result parts[3];
                  parts[0] = Measure(c, "  part: short rows only", [&] { fn(a, cap); });
                  parts[1] = Measure(c, "  part: units only", [&] {
                    SpmvUnitKernel<float, float, false>
                        <<<std::max<int64_t>(1, std::min<int64_t>(sms * 64, (a.units * 32 + 255) / 256)), 256>>>(a);
                  });
                  parts[2] = Measure(c, "  part: fixup only", [&] {
                    SpmvFixupKernel<float, float>
                        <<<std::max<int64_t>(1, std::min<int64_t>(sms * 64, (a.num_long * 32 + 255) / 256)), 256>>>(a);
                  });
                  for (auto& r : parts) std::printf("  %-34s %9.1f us\n", r.plan.c_str(), r.us);
                }
              }
      }
    }
    if (p.avg >= 256) {
      SpmmArgs<float, float> a = BaseArgs(c);
      sweep.push_back(Measure(c, "cta (256 thr/row)", [&] {
        SpmvCtaKernel<float, float><<<std::min<int64_t>(a.m, int64_t{sms} * 64), 256>>>(a);
      }));
      for (int64_t chunk : {256, 512}) {
        SetSplit(c, chunk);
        SpmmArgs<float, float> s = BaseArgs(c);
        s.algorithm = kSplit, s.chunk = chunk, s.num_long = c.num_long, s.units = c.units;
        sweep.push_back(Measure(c, "all-units split chunk=" + std::to_string(chunk), [&] {
          SpmvUnitKernel<float, float, false>
              <<<std::max<int64_t>(1, std::min<int64_t>(sms * 64, (s.units * 32 + 255) / 256)), 256>>>(s);
          SpmvFixupKernel<float, float>
              <<<std::max<int64_t>(1, std::min<int64_t>(sms * 64, (s.num_long * 32 + 255) / 256)), 256>>>(s);
        }));
      }
    }
    std::sort(sweep.begin(), sweep.end(), [](const Result& x, const Result& y) {
      if (x.ok != y.ok) return x.ok;
      return x.us < y.us;
    });
    int failed = 0;
    for (auto& r : sweep) failed += !r.ok;
    std::printf("  -- sweep: %zu variants, %d failed; best 8:\n", sweep.size(), failed);
    for (size_t i = 0; i < sweep.size(); ++i) {
      if (i < 8 || !sweep[i].ok)
        Print(c, op, sweep[i], ref_us);
      else if (g_csv)
        std::fprintf(g_csv, "%s,%s,%s,%.2f,%.1f,%.3e,%d\n", mat.name.c_str(), op, sweep[i].plan.c_str(), sweep[i].us,
                     c.bytes / (sweep[i].us * 1e-6) / 1e9, sweep[i].err, int(sweep[i].ok));
    }
  }
  FreeCase(c);
}

// SpMM (N > 1) time of the split plan for two chunks: the plan's chunk is shared by SpMV and SpMM.
static void SpmmSplitCompare(const Csr& h, int sms) {
  DevCsr d = Upload(h);
  for (int64_t n : {8, 32, 128}) {
    float *b, *out, *al, *be;
    CHECK(cudaMalloc(&b, h.k * n * 4));
    CHECK(cudaMalloc(&out, h.m * n * 4));
    CHECK(cudaMalloc(&al, n * 4));
    CHECK(cudaMalloc(&be, n * 4));
    CHECK(cudaMemset(b, 0, h.k * n * 4));
    CHECK(cudaMemset(al, 0, n * 4));
    CHECK(cudaMemset(be, 0, n * 4));
    for (int64_t chunk : {256, 1024}) {
      Case c;
      c.host = &h;
      SetSplit(c, chunk);
      float* ws;
      CHECK(cudaMalloc(&ws, std::max<int64_t>(1, c.units * n) * 4));
      SpmmArgs<float, float> a;
      a.indptr = d.indptr, a.indices = d.indices, a.values = d.values, a.b = b, a.alpha = al, a.beta = be;
      a.out = out, a.ws = ws, a.long_rows = c.long_rows, a.long_ptr = c.long_ptr;
      a.m = h.m, a.k = h.k, a.n = n, a.nnz = d.nnz, a.num_long = c.num_long, a.units = c.units, a.chunk = chunk;
      a.algorithm = kSplit, a.group = 16;
      const double us = MedianUs([&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, a, true, sms))); }, 5);
      std::printf("  SpMM N=%lld split chunk=%lld: %.1f us\n", (long long)n, (long long)chunk, us);
      cudaFree(ws), cudaFree(c.long_rows), cudaFree(c.long_ptr), cudaFree(c.ws);
    }
    cudaFree(b), cudaFree(out), cudaFree(al), cudaFree(be);
  }
  Free(d);
}

// --------------------------------------------------------------------------- small every-path checks (dtypes)
template <typename T>
static T FromF(float v) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half_rn(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __float2bfloat16_rn(v);
  else
    return static_cast<T>(v);
}
template <typename T>
static double ToD(T v) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(v);
  else
    return static_cast<double>(v);
}

// out = alpha * A B + beta * y for every algorithm, N in {1, 3, 8, 130}; returns the number of failures.
template <typename T, typename Acc>
static int SmallChecks(const char* dname, double tol, int sms) {
  int fails = 0;
  const Csr a = SmallPowerLaw(300, 257, 600, 3);
  const Csr t = Transpose(a);
  for (const Csr* mat : {&a, &t}) {
    const int64_t m = mat->m, k = mat->k, nnz = mat->nnz();
    std::vector<T> hv(nnz);
    std::vector<double> vd(nnz);
    for (int64_t i = 0; i < nnz; ++i) hv[i] = FromF<T>(mat->values[i]), vd[i] = ToD(hv[i]);
    for (int64_t n : {1, 3, 8, 130}) {
      Rng rng(5);
      std::vector<T> hb(k * n), hy(m * n);
      std::vector<Acc> halpha(n), hbeta(n);
      for (auto& v : hb) v = FromF<T>(static_cast<float>(rng.uniform() * 2 - 1));
      for (auto& v : hy) v = FromF<T>(static_cast<float>(rng.uniform() * 2 - 1));
      for (int64_t j = 0; j < n; ++j) halpha[j] = Acc(0.5 + 0.01 * j), hbeta[j] = Acc(-0.5);
      std::vector<double> ref(m * n);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int32_t p = mat->indptr[r]; p < mat->indptr[r + 1]; ++p) {
            const int32_t c = mat->indices[p];
            if (c >= 0 && c < k) s += vd[p] * ToD(hb[c * n + j]);
          }
          ref[r * n + j] = double(halpha[j]) * s + double(hbeta[j]) * ToD(hy[r * n + j]);
        }
      int32_t *ip, *ix, *lr, *lp;
      T *v, *b, *y, *out;
      Acc *al, *be, *ws;
      CHECK(cudaMalloc(&ip, (m + 1) * 4));
      CHECK(cudaMalloc(&ix, nnz * 4));
      CHECK(cudaMalloc(&v, nnz * sizeof(T)));
      CHECK(cudaMalloc(&b, k * n * sizeof(T)));
      CHECK(cudaMalloc(&y, m * n * sizeof(T)));
      CHECK(cudaMalloc(&out, m * n * sizeof(T)));
      CHECK(cudaMalloc(&al, n * sizeof(Acc)));
      CHECK(cudaMalloc(&be, n * sizeof(Acc)));
      CHECK(cudaMemcpy(ip, mat->indptr.data(), (m + 1) * 4, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(ix, mat->indices.data(), nnz * 4, cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(v, hv.data(), nnz * sizeof(T), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(b, hb.data(), k * n * sizeof(T), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(y, hy.data(), m * n * sizeof(T), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(al, halpha.data(), n * sizeof(Acc), cudaMemcpyHostToDevice));
      CHECK(cudaMemcpy(be, hbeta.data(), n * sizeof(Acc), cudaMemcpyHostToDevice));
      const Profile p = ProfileOf(*mat);
      struct Alg {
        const char* name;
        int32_t code, group;
        int64_t chunk;
      };
      std::vector<Alg> algs = {{"vector1", kVector, 1, 0},
                               {"vector2", kVector, 2, 0},
                               {"vector4", kVector, 4, 0},
                               {"vector8", kVector, 8, 0},
                               {"vector16", kVector, 16, 0},
                               {"warp", kVector, 32, 0},
                               {"cta", kCta, 32, 0},
                               {"split64", kSplit, VectorGroup(std::min(p.avg, p.p95)), 64},
                               {"split_c1", kSplit, 2, 1},
                               {"stream", kStream, 32, 8},
                               {"segmented16", kSegmented, 1, 16},
                               {"segmented1", kSegmented, 1, 1}};
      for (const Alg& alg : algs) {
        std::vector<int32_t> rows, ptr{0};
        int64_t seg_ctas = 0, units = 0, num_long = 0;
        if (alg.code == kSplit) {
          LongLists(*mat, alg.chunk, &rows, &ptr);
          units = ptr.back(), num_long = static_cast<int64_t>(rows.size());
        } else if (alg.code == kSegmented) {  // chunk: rows per classification chunk
          seg_ctas = Segments(*mat, alg.chunk, 1.0, &rows, &ptr);
          num_long = static_cast<int64_t>(ptr.size()) - 1;
        }
        CHECK(cudaMalloc(&lr, std::max<size_t>(1, rows.size()) * 4));
        CHECK(cudaMalloc(&lp, ptr.size() * 4));
        const int64_t ws_elems = std::max<int64_t>(1, units * n);
        CHECK(cudaMalloc(&ws, ws_elems * sizeof(Acc)));
        CHECK(cudaMemset(ws, 0x7F, ws_elems * sizeof(Acc)));  // garbage workspace: every partial is written first
        if (!rows.empty()) CHECK(cudaMemcpy(lr, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(lp, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice));
        for (int with_y = 0; with_y < 2; ++with_y) {
          SpmmArgs<T, Acc> args;
          args.indptr = ip, args.indices = ix, args.values = v, args.b = b, args.alpha = al, args.beta = be;
          args.y = with_y ? y : nullptr, args.out = out, args.ws = ws, args.long_rows = lr, args.long_ptr = lp;
          args.m = m, args.k = k, args.n = n, args.nnz = nnz, args.num_long = num_long;
          args.units = units, args.chunk = alg.code == kSegmented ? seg_ctas : alg.chunk;
          args.algorithm = alg.code, args.group = alg.group;
          const bool vec16 = n % (16 / sizeof(T)) == 0 && n > 1;
          CHECK(cudaMemset(out, 0xFF, m * n * sizeof(T)));
          CHECK((LaunchCsrSpmm<T, Acc>(nullptr, args, vec16, sms)));
          CHECK(cudaDeviceSynchronize());
          std::vector<T> ho(m * n);
          CHECK(cudaMemcpy(ho.data(), out, m * n * sizeof(T), cudaMemcpyDeviceToHost));
          double num = 0, den = 0;
          bool finite = true;
          for (int64_t i = 0; i < m * n; ++i) {
            const double o = ToD(ho[i]);
            const double r = with_y ? ref[i] : ref[i] - double(hbeta[i % n]) * ToD(hy[i]);
            finite &= std::isfinite(o);
            num += (o - r) * (o - r), den += r * r;
          }
          const double err = std::sqrt(num / std::max(den, 1e-300));
          if (!finite || err > tol) {
            ++fails;
            std::printf("  SMALL FAIL %s %s M=%lld n=%lld y=%d: err %.2e finite %d\n", dname, alg.name, (long long)m,
                        (long long)n, with_y, err, int(finite));
          }
        }
        cudaFree(lr), cudaFree(lp), cudaFree(ws);
      }
      cudaFree(ip), cudaFree(ix), cudaFree(v), cudaFree(b), cudaFree(y), cudaFree(out), cudaFree(al), cudaFree(be);
    }
  }
  std::printf("small checks %s: %d failures\n", dname, fails);
  return fails;
}

// ------------------------------------------------- column-slab Aᵀu (library kernels, sparse/slab_spmv_*)
namespace sh = jax_ops::sparse::slab_host;

// The slab format of one matrix on the device, with its work list and the library's launch arguments.
struct DevSlabs {
  sh::SlabHost h;
  int32_t *ptr = nullptr, *work = nullptr;
  uint16_t* col = nullptr;
  float *val = nullptr, *part = nullptr;
  int64_t items = 0;
  void Upload(sh::SlabHost host) {
    h = std::move(host);
    CHECK(cudaMalloc(&ptr, h.ptr.size() * 4));
    CHECK(cudaMalloc(&col, std::max<int64_t>(1, h.nnz) * 2));
    CHECK(cudaMalloc(&val, std::max<int64_t>(1, h.nnz) * 4));
    CHECK(cudaMalloc(&part, std::max<int64_t>(1, h.j * h.rows) * 4));
    CHECK(cudaMemcpy(ptr, h.ptr.data(), h.ptr.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(col, h.col.data(), h.nnz * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(val, h.val.data(), h.nnz * 4, cudaMemcpyHostToDevice));
  }
  void SetWork(int64_t items_target) {
    cudaFree(work);
    const std::vector<int32_t> w = sh::SlabWork(h, items_target);
    items = static_cast<int64_t>(w.size() / 3);
    CHECK(cudaMalloc(&work, std::max<size_t>(1, w.size()) * 4));
    if (!w.empty()) CHECK(cudaMemcpy(work, w.data(), w.size() * 4, cudaMemcpyHostToDevice));
  }
  double PerSlabRow() const { return h.rows ? double(h.nnz) / double(h.j * h.rows) : 0.0; }
  // Launch arguments as the FFI handler fills them (prefetch: SlabPrefetchNnz, or `prefetch` when >= 0).
  SlabArgs<float, float> Args(const float* u, const float* alpha, const float* beta, const float* y, float* out,
                              int group, int sms, int32_t prefetch = -1) const {
    SlabArgs<float, float> a;
    a.ptr = ptr, a.col = col, a.val = val, a.work = work, a.u = u, a.part = part;
    a.alpha = alpha, a.beta = beta, a.y = y, a.out = out;
    a.n = h.rows, a.m = h.cols, a.nnz = h.nnz, a.w = h.w, a.j = h.j, a.items = items, a.group = group;
    a.prefetch_nnz = prefetch >= 0 ? prefetch : SlabPrefetchNnz(h.w, sms);
    return a;
  }
  void Poison() const { CHECK(cudaMemset(part, 0xFF, std::max<int64_t>(1, h.j * h.rows) * 4)); }
  ~DevSlabs() { cudaFree(ptr), cudaFree(col), cudaFree(val), cudaFree(part), cudaFree(work); }
};

static constexpr int64_t kSlabWidthMax = sh::kSlabSmemBytes / 4;  // f32

// Ragged cases against a float64 reference, outputs and partials poisoned (NaN) first; every G of the library
// kernel, two work-list sizes, prefetch off / clamped, with and without the beta * y term. Returns the failures.
static int SlabSmallChecks(int sms) {
  struct SmallCase {
    std::string name;
    Csr a;
    int64_t w_max;
    bool misalign;
  };
  std::vector<SmallCase> cases;
  {  // m = 5003 (not a multiple of W = 836 nor of 4), an empty slab (rows 836..1671), empty Aᵀ rows 3 and 17,
     // out-of-range columns (dropped)
    Rng rng(11);
    std::vector<int64_t> lens(5003);
    for (int64_t i = 0; i < 5003; ++i) lens[i] = (i >= 836 && i < 1672) ? 0 : 1 + rng.below(9);
    Csr a = FromLens("ragged 5003x37", 5003, 37, lens, rng, true);
    for (auto& c : a.indices)
      if (c == 3 || c == 17) c = 4;
    for (int i = 0; i < 6; ++i) a.indices[rng.below(a.nnz())] = (i & 1) ? -3 : 37 + 7;
    cases.push_back({"ragged J=6", a, 1000, false});
    cases.push_back({"ragged J=6 u misaligned", a, 1000, true});
    cases.push_back({"ragged J=1", a, kSlabWidthMax, false});
  }
  {  // n = 1: Aᵀ is one row; every third row of A empty; W = 100, J = 8, last slab 77 wide
    Rng rng(12);
    std::vector<int64_t> lens(777);
    for (int64_t i = 0; i < 777; ++i) lens[i] = i % 3 ? 1 : 0;
    cases.push_back({"n=1 J=8", FromLens("n=1 777x1", 777, 1, lens, rng, true), 100, false});
  }
  {  // m = 3 < 4: no 16-byte part at all
    Rng rng(13);
    cases.push_back({"tiny 3x5", FromLens("tiny 3x5", 3, 5, {2, 0, 3}, rng, true), 1000, false});
  }
  {  // long slab rows: 4000 x 3, every row of A full, W = 1000: slab rows of 1000 nnz
    Rng rng(14);
    Csr a = FromLens("long 4000x3", 4000, 3, std::vector<int64_t>(4000, 3), rng, true);
    for (int64_t i = 0; i < 4000; ++i)
      for (int j = 0; j < 3; ++j) a.indices[3 * i + j] = j;
    cases.push_back({"long slab rows", a, 1000, false});
  }
  int fails = 0, runs = 0;
  for (const SmallCase& sc : cases) {
    const Csr& a = sc.a;
    const Csr t = Transpose(a);
    Rng rng(15);
    std::vector<float> hu(a.m), hy(a.k);
    for (auto& v : hu) v = static_cast<float>(rng.uniform() * 2 - 1);
    for (auto& v : hy) v = static_cast<float>(rng.uniform() * 2 - 1);
    const std::vector<double> prod = Reference(t, hu);
    const float alpha = 0.75f, beta = -0.5f;
    float *u_buf, *y, *out, *al, *be;
    CHECK(cudaMalloc(&u_buf, (a.m + 4) * 4));
    CHECK(cudaMalloc(&y, std::max<int64_t>(1, a.k) * 4));
    CHECK(cudaMalloc(&out, std::max<int64_t>(1, a.k) * 4));
    CHECK(cudaMalloc(&al, 4));
    CHECK(cudaMalloc(&be, 4));
    float* u = u_buf + (sc.misalign ? 1 : 0);
    CHECK(cudaMemcpy(u, hu.data(), a.m * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, hy.data(), a.k * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(al, &alpha, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(be, &beta, 4, cudaMemcpyHostToDevice));
    DevSlabs ds;
    ds.Upload(sh::BuildSlabsFromA(a.m, a.k, a.indptr.data(), a.indices.data(), a.values.data(), a.nnz(),
                                  std::min(sc.w_max, kSlabWidthMax)));
    for (int64_t items : {int64_t{1}, int64_t{sms} * kSlabCtasPerSm}) {
      ds.SetWork(items);
      for (int g : {4, 8, 16, 32})
        for (int pf = 0; pf < 2; ++pf)
          for (int with_y = 0; with_y < 2; ++with_y) {
            ds.Poison();
            CHECK(cudaMemset(out, 0xFF, std::max<int64_t>(1, a.k) * 4));
            // prefetch: off, or a count that is not a multiple of a line (clamped to the range)
            const SlabArgs<float, float> args = ds.Args(u, al, be, with_y ? y : nullptr, out, g, sms, pf ? 37 : 0);
            CHECK((LaunchSlabSpmv<float, float>(nullptr, args, sms)));
            CHECK(cudaDeviceSynchronize());
            std::vector<float> ho(a.k);
            CHECK(cudaMemcpy(ho.data(), out, a.k * 4, cudaMemcpyDeviceToHost));
            double num = 0, den = 0;
            bool finite = true;
            for (int64_t r = 0; r < a.k; ++r) {
              const double ref = alpha * prod[r] + (with_y ? double(beta) * hy[r] : 0.0);
              finite &= std::isfinite(ho[r]);
              num += (ho[r] - ref) * (ho[r] - ref), den += ref * ref;
            }
            const double err = std::sqrt(num / std::max(den, 1e-300));
            ++runs;
            if (!finite || err > 1e-5) {
              ++fails;
              std::printf("  SLAB SMALL FAIL %s (J=%lld W=%lld items=%lld) G=%d pf=%d y=%d: err %.2e finite %d\n",
                          sc.name.c_str(), (long long)ds.h.j, (long long)ds.h.w, (long long)ds.items, g, pf, with_y,
                          err, int(finite));
            }
          }
    }
    cudaFree(u_buf), cudaFree(y), cudaFree(out), cudaFree(al), cudaFree(be);
  }
  std::printf("slab small checks: %d runs, %d failures\n", runs, fails);
  return fails;
}

struct SlabSummary {
  std::string name, plan;
  double ax = 0, atu = 0, cusp_atu = 0, slab_us = 0;
};
static std::vector<SlabSummary> g_slab;

// Aᵀu of `a` (CSR(A) m x n) through the library's slab kernels with the library's config: the rule's G, one wave
// of work items (SMs * 2), prefetch on; then once more with the epilogue. `ax`/`atu`: RunCase summaries.
static void SlabRun(const Csr& a, const Csr& t, int sms, const Summary& ax, const Summary& atu) {
  Case c;
  c.host = &t;
  c.d.m = t.m;
  c.sms = sms;
  c.hx.resize(t.k);
  Rng rng(77);  // the u of RunCase(t, ...)
  for (auto& v : c.hx) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
  c.ref = Reference(t, c.hx);
  float* u;
  CHECK(cudaMalloc(&u, std::max<int64_t>(1, t.k) * 4));
  CHECK(cudaMalloc(&c.y, std::max<int64_t>(1, t.m) * 4));
  CHECK(cudaMalloc(&c.alpha, 4));
  CHECK(cudaMalloc(&c.beta, 4));
  CHECK(cudaMemcpy(u, c.hx.data(), t.k * 4, cudaMemcpyHostToDevice));
  const float one = 1.0f, zero = 0.0f;
  CHECK(cudaMemcpy(c.alpha, &one, 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(c.beta, &zero, 4, cudaMemcpyHostToDevice));
  DevSlabs ds;
  ds.Upload(sh::BuildSlabsFromA(a.m, a.k, a.indptr.data(), a.indices.data(), a.values.data(), a.nnz(), kSlabWidthMax));
  ds.SetWork(int64_t{sms} * kSlabCtasPerSm);
  const int g = sh::SlabGroup(ds.PerSlabRow());
  c.bytes = double(ds.h.nnz) * 6 + double(ds.h.j * ds.h.rows + 1) * 4 + 2.0 * ds.h.j * ds.h.rows * 4 +
            double(ds.h.cols + ds.h.rows) * 4;
  std::printf(
      "\n== %s  ATu column slabs: rows %lld, u %lld, nnz %lld, J=%lld W=%lld, nnz/(rows*J)=%.1f -> G=%d, "
      "%lld CTAs (CSR(A^T) %.1f us, cuSPARSE %.1f us, Ax %.1f us)\n",
      t.name.c_str(), (long long)t.m, (long long)t.k, (long long)t.nnz(), (long long)ds.h.j, (long long)ds.h.w,
      ds.PerSlabRow(), g, (long long)ds.items, atu.ours, atu.cusp, ax.ours);
  char name[160];
  std::snprintf(name, sizeof name, "slab G=%d J=%lld (%lld CTAs) pf", g, (long long)ds.h.j, (long long)ds.items);
  ds.Poison();
  const SlabArgs<float, float> args = ds.Args(u, c.alpha, c.beta, nullptr, c.y, g, sms);
  const Result r = Measure(c, name, [&] { CHECK((LaunchSlabSpmv<float, float>(nullptr, args, sms))); });
  Print(c, "ATu", r, atu.cusp);
  {  // the same with the epilogue: out = 0.5 * Aᵀu - 2 * y
    std::vector<float> hy(t.m);
    Rng ry(78);
    for (auto& v : hy) v = static_cast<float>(ry.uniform() * 2 - 1);
    float* y;
    CHECK(cudaMalloc(&y, std::max<int64_t>(1, t.m) * 4));
    CHECK(cudaMemcpy(y, hy.data(), t.m * 4, cudaMemcpyHostToDevice));
    const float half = 0.5f, m2 = -2.0f;
    CHECK(cudaMemcpy(c.alpha, &half, 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(c.beta, &m2, 4, cudaMemcpyHostToDevice));
    const std::vector<double> prod = c.ref;
    for (int64_t i = 0; i < t.m; ++i) c.ref[i] = 0.5 * prod[i] - 2.0 * hy[i];
    ds.Poison();
    double err = 0;
    const SlabArgs<float, float> ey = ds.Args(u, c.alpha, c.beta, y, c.y, g, sms);
    const bool ok = Verify(c, [&] { CHECK((LaunchSlabSpmv<float, float>(nullptr, ey, sms))); }, &err);
    std::printf("  with epilogue (0.5 ATu - 2 y): err %.1e%s\n", err, ok ? "" : "  FAIL");
    c.ref = prod;
    cudaFree(y);
  }
  std::printf("  slab: %.1f us: x%.2f our CSR(A^T), x%.2f cuSPARSE, ATu/Ax %.2f\n", r.us, atu.ours / r.us,
              atu.cusp / r.us, r.us / ax.ours);
  g_slab.push_back({t.name, name, ax.ours, atu.ours, atu.cusp, r.ok ? r.us : NAN});
  cudaFree(u), cudaFree(c.y), cudaFree(c.alpha), cudaFree(c.beta);
}

// --small: ragged N = 1 cases of the segmented plan (next to the split): empty rows with one huge row, all rows
// long, rows at the chunk boundary (64), two row classes; y on/off, alpha 0.75, beta -0.5; output poisoned.
template <typename T, typename Acc>
static int TailSmallChecks(const char* dname, double tol, int sms) {
  std::vector<Csr> mats;
  Rng rng(11);
  {
    std::vector<int64_t> lens(200);
    for (int64_t r = 0; r < 200; ++r) lens[r] = r % 5 == 0 ? 0 : r % 3;
    lens[7] = 5000;
    mats.push_back(FromLens("empty rows + one huge row", 200, 300, lens, rng, true));
  }
  {
    std::vector<int64_t> lens(50);
    for (int64_t r = 0; r < 50; ++r) lens[r] = 300 + (r * 37) % 400;
    mats.push_back(FromLens("all rows long", 50, 1000, lens, rng, true));
  }
  {
    const int64_t cyc[7] = {0, 63, 64, 65, 128, 129, 1};
    std::vector<int64_t> lens(120);
    for (int64_t r = 0; r < 120; ++r) lens[r] = cyc[r % 7];
    mats.push_back(FromLens("rows at the chunk boundary", 120, 500, lens, rng, true));
  }
  {
    std::vector<int64_t> lens(3000);
    for (int64_t r = 0; r < 3000; ++r) lens[r] = r < 600 ? 90 + r % 21 : 6 + r % 5;
    mats.push_back(FromLens("two row classes", 3000, 2000, lens, rng, false));
  }
  mats.push_back(FromLens("all rows empty", 100, 50, std::vector<int64_t>(100, 0), rng, true));
  mats.push_back(FromLens("nnz = 0, one row", 1, 10, std::vector<int64_t>(1, 0), rng, true));
  {
    // equal rows of 31 entries: not a multiple of any G these plans use (2-8), every row ends in a partial step
    mats.push_back(FromLens("rows of 31 entries", 700, 900, std::vector<int64_t>(700, 31), rng, true));
    std::vector<int64_t> lens(64, 0);
    lens[5] = 40000;  // one row of many split units (625 at chunk 64) among near-empty rows
    lens[6] = 1, lens[63] = 3;
    mats.push_back(FromLens("one 40000-entry row", 64, 5000, lens, rng, false));
  }
  mats.push_back(SmallPowerLaw(3000, 2500, 3000, 9));  // with columns outside [0, K)
  int fails = 0;
  for (const Csr& mat : mats) {
    const int64_t m = mat.m, k = mat.k, nnz = mat.nnz();
    std::vector<T> hv(nnz), hb(k), hy(m);
    for (int64_t i = 0; i < nnz; ++i) hv[i] = FromF<T>(mat.values[i]);
    for (auto& v : hb) v = FromF<T>(static_cast<float>(rng.uniform() * 2 - 1));
    for (auto& v : hy) v = FromF<T>(static_cast<float>(rng.uniform() * 2 - 1));
    const Acc alpha = Acc(0.75), beta = Acc(-0.5);
    int32_t *ip, *ix, *lr, *lp;
    T *v, *b, *y, *out;
    Acc *al, *be, *ws;
    CHECK(cudaMalloc(&ip, (m + 1) * 4));
    CHECK(cudaMalloc(&ix, std::max<int64_t>(1, nnz) * 4));
    CHECK(cudaMalloc(&v, std::max<int64_t>(1, nnz) * sizeof(T)));
    CHECK(cudaMalloc(&b, k * sizeof(T)));
    CHECK(cudaMalloc(&y, m * sizeof(T)));
    CHECK(cudaMalloc(&out, m * sizeof(T)));
    CHECK(cudaMalloc(&al, sizeof(Acc)));
    CHECK(cudaMalloc(&be, sizeof(Acc)));
    CHECK(cudaMemcpy(ip, mat.indptr.data(), (m + 1) * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ix, mat.indices.data(), nnz * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(v, hv.data(), nnz * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, hb.data(), k * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(y, hy.data(), m * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(al, &alpha, sizeof(Acc), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(be, &beta, sizeof(Acc), cudaMemcpyHostToDevice));
    struct Alg {
      const char* name;
      int32_t code, group;
      int64_t chunk;  // split: nnz per unit; segmented: rows per classification chunk
      double gmul;
    };
    const Alg algs[] = {{"split c64 G8", kSplit, 8, 64, 1},
                        {"segmented r64", kSegmented, 1, 64, 1},
                        {"segmented r256 Gx2", kSegmented, 1, 256, 2},
                        {"segmented r1 Gx0.5", kSegmented, 1, 1, 0.5}};
    for (int with_y = 0; with_y < 2; ++with_y) {
      for (const Alg& alg : algs) {
        std::vector<int32_t> rows, ptr{0};
        int64_t units = 0, num_long = 0, seg_ctas = 0;
        if (alg.code == kSegmented) {
          seg_ctas = Segments(mat, alg.chunk, alg.gmul, &rows, &ptr);
          num_long = static_cast<int64_t>(ptr.size()) - 1;
        } else {
          LongLists(mat, alg.chunk, &rows, &ptr);
          units = ptr.back(), num_long = static_cast<int64_t>(rows.size());
        }
        CHECK(cudaMalloc(&lr, std::max<size_t>(1, rows.size()) * 4));
        CHECK(cudaMalloc(&lp, ptr.size() * 4));
        CHECK(cudaMalloc(&ws, std::max<int64_t>(1, units) * sizeof(Acc)));
        CHECK(cudaMemset(ws, 0x7F, std::max<int64_t>(1, units) * sizeof(Acc)));
        if (!rows.empty()) CHECK(cudaMemcpy(lr, rows.data(), rows.size() * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(lp, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice));
        SpmmArgs<T, Acc> a;
        a.indptr = ip, a.indices = ix, a.values = v, a.b = b, a.alpha = al, a.beta = be, a.y = with_y ? y : nullptr;
        a.out = out, a.ws = ws, a.long_rows = lr, a.long_ptr = lp, a.m = m, a.k = k, a.n = 1, a.nnz = nnz;
        a.num_long = num_long, a.units = units, a.algorithm = alg.code, a.group = alg.group;
        a.chunk = alg.code == kSegmented ? seg_ctas : alg.chunk;
        std::vector<T> ho(m);
        CHECK(cudaMemset(out, 0xFF, m * sizeof(T)));
        CHECK((LaunchCsrSpmm<T, Acc>(nullptr, a, false, sms)));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(ho.data(), out, m * sizeof(T), cudaMemcpyDeviceToHost));
        double num = 0, den = 0;
        bool finite = true;
        for (int64_t r = 0; r < m; ++r) {
          double sum = 0;
          for (int32_t q = mat.indptr[r]; q < mat.indptr[r + 1]; ++q)
            if (mat.indices[q] >= 0 && mat.indices[q] < k) sum += ToD(hv[q]) * ToD(hb[mat.indices[q]]);
          const double ref = double(alpha) * sum + (with_y ? double(beta) * ToD(hy[r]) : 0.0);
          const double o = ToD(ho[r]);
          finite &= std::isfinite(o);
          num += (o - ref) * (o - ref), den += ref * ref;
        }
        const double err = std::sqrt(num / std::max(den, 1e-300));
        const bool ok = finite && err <= tol;
        if (!ok) {
          ++fails;
          std::printf("  TAIL FAIL %s %s [%s] y=%d: err %.2e finite %d\n", dname, alg.name, mat.name.c_str(), with_y,
                      err, int(finite));
        }
        cudaFree(lr), cudaFree(lp), cudaFree(ws);
      }
    }
    cudaFree(ip), cudaFree(ix), cudaFree(v), cudaFree(b), cudaFree(y), cudaFree(out), cudaFree(al), cudaFree(be);
  }
  std::printf("tail checks %s (split, segmented): %d failures\n", dname, fails);
  return fails;
}

// --tails: the cases issue 3 names (power-law Ax, bundle Ax/ATu, uniform/power-law ATu, LSMR's ba-like matrix):
// cuSPARSE, today's dispatched plan and every new candidate, each checked against float64 (output poisoned).
struct TailRow {
  std::string name, op, cur_plan, best_plan;
  double cusp = 0, cur = 0, best = 0;
  std::vector<std::pair<std::string, double>> all;
};
static std::vector<TailRow> g_tails;

// The common start of a --tails case: the case set up, its header line, then the cuSPARSE row and the
// dispatched plan's row (both printed).
struct Baseline {
  Profile p;
  Result cu, cur;
};
static Baseline StartCase(Case& c, const Csr& mat, const char* op, cusparseHandle_t handle, int sms) {
  SetupCase(c, mat, sms);
  Baseline base;
  const Profile& p = base.p = ProfileOf(mat);
  std::printf("\n== %s  %s: M=%lld K=%lld nnz=%lld avg=%.1f p95=%.0f max=%lld\n", mat.name.c_str(), op,
              (long long)mat.m, (long long)mat.k, (long long)mat.nnz(), p.avg, p.p95, (long long)p.max);
  base.cu = Cusparse(c, handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_SPMV_ALG_DEFAULT, "cuSPARSE default", c.d,
                     kNoPreprocess);
  Print(c, op, base.cu, base.cu.us);
  // the deterministic cuSPARSE algorithm (CSR_ALG2, preprocessed once): a dispatch candidate only if it is fast
  for (auto [prep, nm] :
       {std::pair{kPreprocess, "cuSPARSE CSR_ALG2+pre"}, std::pair{kNoPreprocess, "cuSPARSE CSR_ALG2"},
        std::pair{kPerCall, "cuSPARSE CSR_ALG2 all per call"}})
    Print(c, op, Cusparse(c, handle, CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_SPMV_CSR_ALG2, nm, c.d, prep),
          base.cu.us);
  base.cur = Production(c);
  Print(c, op, base.cur, base.cu.us);
  return base;
}

static void TailsCase(const Csr& mat, const char* op, cusparseHandle_t handle, int sms) {
  Case c;
  const Baseline base = StartCase(c, mat, op, handle, sms);
  const Result &cu = base.cu, &cur = base.cur;
  const Profile& p = base.p;
  TailRow row;
  row.name = mat.name, row.op = op;
  row.cusp = cu.us;
  row.cur_plan = cur.plan, row.cur = cur.ok ? cur.us : 0;
  row.best_plan = cur.plan, row.best = row.cur;
  auto add = [&](const Result& r) {
    Print(c, op, r, cu.us);
    row.all.push_back({r.plan, r.ok ? r.us : -1});
    if (r.ok && (row.best == 0 || r.us < row.best)) row.best = r.us, row.best_plan = r.plan;
  };
  const bool long_rows = p.max > std::max(2048.0, 32 * p.avg);
  const int g0 = RuleGroup(p.avg);
  // vector with G around the rule (library config per G)
  for (int g : {g0 / 2, g0 * 2}) {
    if (g < 1 || g > 32) continue;
    SpmmArgs<float, float> a = BaseArgs(c);
    a.algorithm = kVector, a.group = g;
    add(Measure(c, "vector G=" + std::to_string(g),
                [&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, a, false, sms))); }));
  }
  if (long_rows) {
    const int gs = std::min(32, 2 * RuleGroup(std::min(p.avg, p.p95)));
    for (int64_t chunk : {128, 256, 512}) {
      SetSplit(c, chunk);
      SpmmArgs<float, float> a = BaseArgs(c);
      a.algorithm = kSplit, a.chunk = chunk, a.num_long = c.num_long, a.units = c.units, a.group = gs;
      const std::string nm = "split(3 launches) c=" + std::to_string(chunk) + " G=" + std::to_string(gs);
      add(Measure(c, nm, [&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, a, false, sms))); }));
    }
    SetSplit(c, 1 << 30);
  } else {
    for (int64_t rows : {1024, 4096, 16384}) {
      for (double gmul : {1.0, 2.0, 0.5}) {
        if (rows != 4096 && gmul != 1.0) continue;
        SetSegments(c, rows, gmul);
        SpmmArgs<float, float> a = BaseArgs(c);
        a.algorithm = kSegmented, a.chunk = c.units, a.num_long = c.num_long;
        char nm[96];
        std::snprintf(nm, sizeof nm, "segmented r=%lld Gx%.1f S=%lld", (long long)rows, gmul, (long long)c.num_long);
        add(Measure(c, nm, [&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, a, false, sms))); }));
        if (rows == 4096 && gmul == 1.0) {
          // one row-block launch per segment (rule G, shifted args), for comparison with the one-launch table
          std::vector<int32_t> table, ptr;
          Segments(mat, rows, 1.0, &table, &ptr);
          add(Measure(c, "segmented r=4096 one launch per segment", [&] {
            for (size_t sg = 0; sg + 2 < table.size(); sg += 3) {
              SpmmArgs<float, float> b = BaseArgs(c);
              b.indptr += table[sg], b.out += table[sg], b.m = table[sg + 1] - table[sg], b.group = table[sg + 2];
              CHECK((LaunchCsrSpmm<float, float>(nullptr, b, false, sms)));
            }
          }));
        }
      }
    }
    SetSplit(c, 1 << 30);
  }
  g_tails.push_back(row);
  FreeCase(c);
}

// Ax and ATu of the matrices where the SpMV plans trail cuSPARSE (power-law, bundle-adjustment, LSMR's ba-like).
static void ForBelowTargetMatrices(const std::function<void(const Csr&, const char*)>& run) {
  {
    const Csr a = PowerLaw(1000000, 1000000);
    run(a, "Ax");
    run(Transpose(a), "ATu");
  }
  for (const Csr& a :
       {BundleAdjustment(1000000, 20000, 250000), BundleAdjustment(500000, 2000, 200000, "bundle-adj lsmr ba-like")}) {
    run(a, "Ax");
    run(Transpose(a), "ATu");
  }
}

static int RunTails(int sms) {
  cusparseHandle_t handle;
  CHECK_SP(cusparseCreate(&handle));
  g_repeat_check = true;
  ForBelowTargetMatrices([&](const Csr& a, const char* op) { TailsCase(a, op, handle, sms); });
  TailsCase(Transpose(Uniform(2000000, 2000000, 16)), "ATu", handle, sms);
  cusparseDestroy(handle);
  std::printf("\n--tails summary (us; x = cuSPARSE default / ours)\n%-24s %-4s %8s %8s %6s %8s %6s  %s | %s\n",
              "matrix", "op", "cuSP", "current", "x", "best", "x", "best plan", "current plan");
  double lc = 0, lb = 0;
  int n = 0, below_cur = 0, below_best = 0;
  for (auto& t : g_tails) {
    std::printf("%-24s %-4s %8.1f %8.1f %6.2f %8.1f %6.2f  %s | %s\n", t.name.c_str(), t.op.c_str(), t.cusp, t.cur,
                t.cusp / t.cur, t.best, t.cusp / t.best, t.best_plan.c_str(), t.cur_plan.c_str());
    lc += std::log(t.cusp / t.cur), lb += std::log(t.cusp / t.best), ++n;
    below_cur += t.cusp / t.cur < 0.9, below_best += t.cusp / t.best < 0.9;
  }
  std::printf("geomean x cuSPARSE over these %d: current %.3f, best candidate %.3f; below 0.9x: current %d, best %d\n",
              n, std::exp(lc / n), std::exp(lb / n), below_cur, below_best);
  std::printf("\nevery candidate (x cuSPARSE; -1 = FAILED check):\n");
  for (auto& t : g_tails) {
    std::printf("%s %s:", t.name.c_str(), t.op.c_str());
    for (auto& [nm, us] : t.all) std::printf("  [%s] %.2f", nm.c_str(), us > 0 ? t.cusp / us : -1.0);
    std::printf("\n");
  }
  return 0;
}

// --blocks: the blocks plan (R rows sharing a column list, stored once per block) on the bundle-adjustment
// matrices, whose A has 2 rows per observation with one column list and whose Aᵀ has 9 camera / 3 point rows
// with one list each (R = 3 divides both). cuSPARSE and the dispatched CSR plan first, then the blocks plan with
// the segment rule's lanes per block row and x0.5 / x2 of them.
static bool BlockCsr(const Csr& a, int r, Csr* blocks) {
  if (a.m % r != 0) return false;
  const int64_t mb = a.m / r;
  blocks->name = a.name, blocks->m = mb, blocks->k = a.k;
  blocks->indptr.assign(mb + 1, 0);
  blocks->indices.clear(), blocks->values.clear();
  for (int64_t b = 0; b < mb; ++b) {
    const int32_t s0 = a.indptr[b * r], len = a.indptr[b * r + 1] - s0;
    for (int i = 1; i < r; ++i) {
      const int32_t si = a.indptr[b * r + i];
      if (a.indptr[b * r + i + 1] - si != len || !std::equal(&a.indices[s0], &a.indices[s0] + len, &a.indices[si]))
        return false;
    }
    for (int32_t p = 0; p < len; ++p) {
      blocks->indices.push_back(a.indices[s0 + p]);
      for (int i = 0; i < r; ++i) blocks->values.push_back(a.values[a.indptr[b * r + i] + p]);
    }
    blocks->indptr[b + 1] = static_cast<int32_t>(blocks->indices.size());
  }
  return true;
}

static void BlocksCase(const Csr& mat, const char* op, int r, cusparseHandle_t handle, int sms) {
  Csr blk;
  if (!BlockCsr(mat, r, &blk)) {
    std::printf("\n== %s %s: rows do not come in blocks of %d with one column list\n", mat.name.c_str(), op, r);
    return;
  }
  Case c;
  const Baseline base = StartCase(c, mat, op, handle, sms);
  TailRow row;
  row.name = mat.name, row.op = op, row.cusp = base.cu.us;
  row.cur_plan = row.best_plan = base.cur.plan, row.cur = row.best = base.cur.ok ? base.cur.us : 0;
  int32_t *bptr, *bcol, *table_d, *ptr_d;
  float* bval;
  CHECK(cudaMalloc(&bptr, blk.indptr.size() * 4));
  CHECK(cudaMalloc(&bcol, std::max<size_t>(1, blk.indices.size()) * 4));
  CHECK(cudaMalloc(&bval, std::max<size_t>(1, blk.values.size()) * 4));
  CHECK(cudaMemcpy(bptr, blk.indptr.data(), blk.indptr.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(bcol, blk.indices.data(), blk.indices.size() * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(bval, blk.values.data(), blk.values.size() * 4, cudaMemcpyHostToDevice));
  for (double gmul : {1.0, 0.5, 2.0}) {
    std::vector<int32_t> table, ptr;
    const int64_t ctas = Segments(blk, 4096, gmul, &table, &ptr);
    CHECK(cudaMalloc(&table_d, table.size() * 4));
    CHECK(cudaMalloc(&ptr_d, ptr.size() * 4));
    CHECK(cudaMemcpy(table_d, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ptr_d, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice));
    SpmmArgs<float, float> a = BaseArgs(c);
    a.indptr = bptr, a.indices = bcol, a.values = bval, a.nnz = blk.nnz(), a.r = r;
    a.algorithm = kBlocks, a.long_rows = table_d, a.long_ptr = ptr_d, a.num_long = int64_t(ptr.size()) - 1,
    a.chunk = ctas;
    std::string lanes;
    for (size_t sg = 0; sg + 2 < table.size(); sg += 3) lanes += (sg ? "/" : "") + std::to_string(table[sg + 2]);
    const Result res = Measure(c, "blocks R=" + std::to_string(r) + " L=" + lanes,
                               [&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, a, false, sms))); });
    Print(c, op, res, base.cu.us);
    const int diffs = RepeatDiffs(c, [&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, a, false, sms))); }, 5);
    if (diffs) std::printf("  blocks: %d of 4 repeats differ bitwise\n", diffs);
    row.all.push_back({res.plan, res.ok ? res.us : -1});
    if (res.ok && res.us < row.best) row.best = res.us, row.best_plan = res.plan;
    cudaFree(table_d), cudaFree(ptr_d);
  }
  g_tails.push_back(row);
  cudaFree(bptr), cudaFree(bcol), cudaFree(bval);
  FreeCase(c);
}

// --blocks-small: the blocks kernels on ragged block rows (empty, short, ~300 and one 5000-position block row,
// 64-block-row segments so one launch mixes lane counts, columns outside [0, K) in the lists), R = 2, 3, 4, f32,
// each checked against float64 with the output poisoned; small enough for compute-sanitizer.
static int BlocksSmallChecks(int sms) {
  int fails = 0;
  for (int r = 2; r <= 4; ++r) {
    Rng rng(40 + r);
    const int64_t mb = 900, k = 7000;
    Csr a;
    a.name = "ragged blocks R=" + std::to_string(r);
    a.m = mb * r, a.k = k;
    a.indptr.assign(1, 0);
    for (int64_t b = 0; b < mb; ++b) {
      const int64_t len = b == 17 ? 5000 : b % 9 == 0 ? 0 : b < 300 ? 250 + rng.below(100) : rng.below(12);
      std::vector<int32_t> cols(len);
      for (auto& c : cols) c = rng.below(k);
      if (len > 3) cols[1] = -3, cols[2] = static_cast<int32_t>(k + 7);
      for (int i = 0; i < r; ++i) {
        a.indices.insert(a.indices.end(), cols.begin(), cols.end());
        a.indptr.push_back(static_cast<int32_t>(a.indices.size()));
      }
    }
    FillValues(a, rng);
    Csr blk;
    if (!BlockCsr(a, r, &blk)) {
      std::printf("blocks small R=%d: not blocked  FAIL\n", r);
      ++fails;
      continue;
    }
    Case c;
    SetupCase(c, a, sms);
    std::vector<int32_t> table, ptr;
    const int64_t ctas = Segments(blk, 64, 1.0, &table, &ptr);
    int32_t *bptr, *bcol, *table_d, *ptr_d;
    float* bval;
    CHECK(cudaMalloc(&bptr, blk.indptr.size() * 4));
    CHECK(cudaMalloc(&bcol, blk.indices.size() * 4));
    CHECK(cudaMalloc(&bval, blk.values.size() * 4));
    CHECK(cudaMalloc(&table_d, table.size() * 4));
    CHECK(cudaMalloc(&ptr_d, ptr.size() * 4));
    CHECK(cudaMemcpy(bptr, blk.indptr.data(), blk.indptr.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(bcol, blk.indices.data(), blk.indices.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(bval, blk.values.data(), blk.values.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(table_d, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(ptr_d, ptr.data(), ptr.size() * 4, cudaMemcpyHostToDevice));
    SpmmArgs<float, float> args = BaseArgs(c);
    args.indptr = bptr, args.indices = bcol, args.values = bval, args.nnz = blk.nnz(), args.r = r;
    args.algorithm = kBlocks, args.long_rows = table_d, args.long_ptr = ptr_d;
    args.num_long = static_cast<int64_t>(ptr.size()) - 1, args.chunk = ctas;
    double err = 0;
    const bool ok = Verify(c, [&] { CHECK((LaunchCsrSpmm<float, float>(nullptr, args, false, sms))); }, &err);
    std::string lanes;
    for (size_t sg = 0; sg + 2 < table.size(); sg += 3) lanes += " " + std::to_string(table[sg + 2]);
    std::printf("blocks small R=%d (%lld segments, lanes%s): err %.1e%s\n", r, (long long)(ptr.size() - 1),
                lanes.c_str(), err, ok ? "" : "  FAIL");
    fails += !ok;
    cudaFree(bptr), cudaFree(bcol), cudaFree(bval), cudaFree(table_d), cudaFree(ptr_d);
    FreeCase(c);
  }
  std::printf("blocks small checks: %d failures\n", fails);
  return fails;
}

static int RunBlocks(int sms) {
  cusparseHandle_t handle;
  CHECK_SP(cusparseCreate(&handle));
  for (const Csr& a :
       {BundleAdjustment(1000000, 20000, 250000), BundleAdjustment(500000, 2000, 200000, "bundle-adj lsmr ba-like")}) {
    BlocksCase(a, "Ax", 2, handle, sms);
    BlocksCase(Transpose(a), "ATu", 3, handle, sms);
  }
  cusparseDestroy(handle);
  std::printf("\n--blocks summary (us; x = cuSPARSE default / ours)\n");
  for (auto& t : g_tails)
    std::printf("%-24s %-4s cuSP %8.1f  csr plan %8.1f (%5.2f)  best %8.1f (%5.2f)  %s | %s\n", t.name.c_str(),
                t.op.c_str(), t.cusp, t.cur, t.cusp / t.cur, t.best, t.cusp / t.best, t.best_plan.c_str(),
                t.cur_plan.c_str());
  return 0;
}

int main(int argc, char** argv) {
  bool small_only = false, quick = false, slab_only = false, tails = false, blocks = false, blocks_small = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tails")) tails = true;
    if (!std::strcmp(argv[i], "--blocks")) blocks = true;
    if (!std::strcmp(argv[i], "--blocks-small")) blocks_small = true;
    if (!std::strcmp(argv[i], "--small")) small_only = true;
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    if (!std::strcmp(argv[i], "--slab")) slab_only = quick = true;
    if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) g_csv = std::fopen(argv[++i], "w");
  }
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, sms, prop.l2CacheSize >> 20);
  int fails = 0;
  if (!slab_only && !tails && !blocks && !blocks_small) {
    fails += SmallChecks<float, float>("f32", 1e-5, sms);
    fails += SmallChecks<double, double>("f64", 1e-12, sms);
    fails += SmallChecks<__half, float>("f16", 2e-3, sms);
    fails += SmallChecks<__nv_bfloat16, float>("bf16", 1e-2, sms);
  }
  if (!tails && !blocks && !blocks_small) {
    fails += TailSmallChecks<float, float>("f32", 1e-5, sms);
    fails += TailSmallChecks<double, double>("f64", 1e-12, sms);
    fails += TailSmallChecks<__half, float>("f16", 2e-3, sms);
    fails += TailSmallChecks<__nv_bfloat16, float>("bf16", 1e-2, sms);
  }
  if (tails) return RunTails(sms) + (fails ? 1 : 0);
  if (blocks) return RunBlocks(sms);
  if (blocks_small) return BlocksSmallChecks(sms) ? 1 : 0;
  if (!tails) fails += SlabSmallChecks(sms) + BlocksSmallChecks(sms);
  if (small_only) return fails ? 1 : 0;
  if (g_csv) std::fprintf(g_csv, "matrix,op,plan,us,GBps,err,ok\n");

  {                                      // copy ceiling
    const int64_t n = int64_t{1} << 28;  // 1 GiB each way
    float *in, *out;
    CHECK(cudaMalloc(&in, n * 4));
    CHECK(cudaMalloc(&out, n * 4));
    CHECK(cudaMemset(in, 0, n * 4));
    const double us = MedianUs(
        [&] { CopyKernel<<<sms * 16, 256>>>(reinterpret_cast<float4*>(in), reinterpret_cast<float4*>(out), n / 4); },
        5);
    std::printf("copy: %.0f GB/s (read + write)\n", 2.0 * n * 4 / (us * 1e-6) / 1e9);
    cudaFree(in), cudaFree(out);
  }
  cusparseHandle_t handle;
  CHECK_SP(cusparseCreate(&handle));
  std::vector<std::function<Csr()>> gens = {
      [] { return Uniform(2000000, 2000000, 16); },
      [] { return PowerLaw(1000000, 1000000); },
      [] { return Poisson({2048, 2048}); },
      [] { return Poisson({128, 128, 128}); },
      [] { return Lsq(306136, 6177, 18); },
      [] { return Lsq(936063, 23394, 21); },
      [] { return BundleAdjustment(1000000, 20000, 250000); },
  };
  if (slab_only) gens.erase(gens.begin(), gens.begin() + 4);  // the LSQ and bundle-adjustment matrices only
  for (auto& gen : gens) {
    // --slab: the two tall least-squares matrices (where jax_ops.sparse.slab_model says yes) and the
    // bundle-adjustment matrix (where it says no), Ax and ATu by the dispatched plan and cuSPARSE, then ATu by
    // the library's slab kernels. Without --slab every matrix runs and those three get the slab run too.
    const Csr a = gen();
    const bool slabs = a.name.rfind("lsq", 0) == 0 || a.name.rfind("bundle", 0) == 0;
    if (slab_only && !slabs) continue;
    const Csr t = Transpose(a);
    DevCsr da = Upload(a);
    RunCase(a, nullptr, "Ax", handle, sms, quick);
    RunCase(t, &da, "ATu", handle, sms, quick);
    if (a.name.rfind("power-law", 0) == 0 && !slab_only) SpmmSplitCompare(a, sms);
    Free(da);
    if (slabs) SlabRun(a, t, sms, g_summary[g_summary.size() - 2], g_summary.back());
  }
  std::printf("\n%-20s %-4s %-32s %9s %9s %9s %7s %7s %7s\n", "matrix", "op", "plan", "ours us", "cuSP us", "best us",
              "GB/s", "xcuSP", "xbest");
  double lg = 0, lgb = 0;
  int nax = 0;
  for (auto& s : g_summary) {
    std::printf("%-20s %-4s %-32s %9.1f %9.1f %9.1f %7.0f %7.2f %7.2f\n", s.name.c_str(), s.op.c_str(), s.plan.c_str(),
                s.ours, s.cusp, s.cusp_best, s.gbps, s.cusp / s.ours, s.cusp_best / s.ours);
    if (s.op == "Ax") lg += std::log(s.cusp / s.ours), lgb += std::log(s.cusp_best / s.ours), ++nax;
  }
  for (size_t i = 0; i + 1 < g_summary.size(); i += 2)
    std::printf("ATu/Ax %-20s %.2f\n", g_summary[i].name.c_str(), g_summary[i + 1].ours / g_summary[i].ours);
  if (nax)
    std::printf("Ax geomean vs cuSPARSE default %.2f, vs best cuSPARSE %.2f\n", std::exp(lg / nax),
                std::exp(lgb / nax));
  if (!g_slab.empty()) {
    std::printf(
        "\nATu by column slabs (library kernels, library config) vs CSR(A^T):\n%-22s %8s %9s %9s %9s %8s %8s "
        "%9s  %s\n",
        "matrix", "Ax us", "ATu us", "cuSP ATu", "slab us", "xATu", "xcuSP", "slab/Ax", "plan");
    for (auto& s : g_slab)
      std::printf("%-22s %8.1f %9.1f %9.1f %9.1f %8.2f %8.2f %9.2f  %s\n", s.name.c_str(), s.ax, s.atu, s.cusp_atu,
                  s.slab_us, s.atu / s.slab_us, s.cusp_atu / s.slab_us, s.slab_us / s.ax, s.plan.c_str());
  }
  if (g_csv) std::fclose(g_csv);
  return fails ? 1 : 0;
}
