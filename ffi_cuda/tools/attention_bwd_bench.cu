// Standalone check + timing of the CUDA attention backward kernels (no Python): the Hopper kernels
// (attention_bwd_sm90_impl.cuh, and variants of their tiling) and the portable mma.sync kernels
// (attention_bwd_impl.cuh), against an fp64 CPU reference of dq, dk, dv on fresh random inputs, with outputs
// poisoned (NaN) before every run. Build here, carry the binary, run on the GPU machine:
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -cudart static -I ffi_cuda \
//     -isystem $(python3 -c "import jax.ffi as f; print(f.include_dir())") ffi_cuda/tools/attention_bwd_bench.cu \
//     -o attention_bwd_bench
// Usage: attention_bwd_bench [check|bench|all|small|gqa|gqa-small]   (small / gqa-small: two cases, default
// kernels (J = 1 and the GQA cluster rule) / the cluster variants J = 2 and 4, for compute-sanitizer; gqa: the
// GQA dK/dV cluster variants only, check + determinism + timing). Cases with a boolean mask (Case::mods & 1) run
// the kMods kernels (J = 1, 2, 4 and the rule) and the portable one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <type_traits>
#include <vector>

#include "attention/attention_bwd_impl.cuh"
#include "attention/attention_bwd_sm90_impl.cuh"
#include "attention/attention_fwd_impl.cuh"
#include "tools/attention_bench_case.h"
#include "tools/bench_check.h"

using namespace jax_ops::attention;

template <typename T>
const char* DTypeName() {
  return std::is_same_v<T, __half> ? "f16" : "bf16";
}

// Kernel under test: 0 = portable; 1.. = Hopper variants (kVariantNames). Parts (bit mask) only for timing.
// 1: the default tiling at J = 1 (what the library runs for MHA, or with the bwd_cluster knob at 1).
// 7-9: the GQA dK/dV cluster (kDkDvCluster): J = 2, J = 4 (refused unless J divides the group), and the library's
// default (Sm90BwdDkDvCluster's rule on this device's SM count, J = 1 for MHA; the env var is not read here).
constexpr int kVariants = 10;
const char* kVariantNames[kVariants] = {"sm80",
                                        "sm90 J=1",
                                        "sm90 dkdv 3-stage",
                                        "sm90 dkdv dV-early flipped",
                                        "sm90 dq 3-stage",
                                        "sm90 dq 64-key tiles",
                                        "sm90 ping-pong",
                                        "sm90 gqa cluster 2",
                                        "sm90 gqa cluster 4",
                                        "sm90 gqa rule (default)"};
constexpr int kClusterVariants[] = {1, 7, 8, 9};  // J = 1 and the cluster ones
int NumSms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev))
      return 132;
    return n;
  }();
  return sms;
}
// The J that variant 9 runs (the rule; J = 1 also where no cluster fits, which BenchGqa prints).
int AutoCluster(const AttentionParams& p) { return Sm90BwdDkDvCluster(p, NumSms()); }
template <typename T, int D, int kParts = 7, bool kMods = false>
cudaError_t LaunchVariant(int variant, const AttentionParams& p, const FwdPointers& ptr, const BwdPointers& bp) {
  constexpr bool kEarly = kSm90BwdDvEarly<D>;
  constexpr int kDqN = kSm90BwdDqBlockN<D>;
  if (kMods && variant >= 2 && variant <= 6) return cudaErrorNotSupported;  // tiling experiments: no kMods build
  switch (variant) {
    case 0:
      return LaunchAttentionBwd<T, D>(nullptr, p, ptr, bp);
    case 1:  // J = 1: what LaunchAttentionBwdSm90 runs for MHA
      return LaunchAttentionBwdSm90Variant<T, D, kSm90BwdDkDvStages, kEarly, kDqN, kSm90BwdDqStages, false, kParts, 1,
                                           kMods>(nullptr, p, ptr, bp);
    case 2:
      return LaunchAttentionBwdSm90Variant<T, D, 3, kEarly, kDqN, kSm90BwdDqStages>(nullptr, p, ptr, bp);
    case 3:
      return LaunchAttentionBwdSm90Variant<T, D, kSm90BwdDkDvStages, !kEarly, kDqN, kSm90BwdDqStages>(nullptr, p, ptr,
                                                                                                      bp);
    case 4:
      return LaunchAttentionBwdSm90Variant<T, D, kSm90BwdDkDvStages, kEarly, kDqN, 3>(nullptr, p, ptr, bp);
    case 5:  // 128-key tiles serialise the wgmmas at D = 128 (ptxas: registers), so D = 64 only
      if constexpr (D == 64)
        return LaunchAttentionBwdSm90Variant<T, D, kSm90BwdDkDvStages, kEarly, 64, kSm90BwdDqStages>(nullptr, p, ptr,
                                                                                                     bp);
      return cudaErrorNotSupported;
    case 6:
      return LaunchAttentionBwdSm90Variant<T, D, kSm90BwdDkDvStages, kEarly, kDqN, kSm90BwdDqStages, true>(nullptr, p,
                                                                                                           ptr, bp);
    case 7:
      return LaunchAttentionBwdSm90Variant<T, D, kSm90BwdDkDvStages, kEarly, kDqN, kSm90BwdDqStages, false, kParts, 2,
                                           kMods>(nullptr, p, ptr, bp);
    case 8:
      return LaunchAttentionBwdSm90Variant<T, D, kSm90BwdDkDvStages, kEarly, kDqN, kSm90BwdDqStages, false, kParts, 4,
                                           kMods>(nullptr, p, ptr, bp);
    case 9:  // what LaunchAttentionBwdSm90 runs by default (the rule)
      if constexpr (kParts == 7) return LaunchAttentionBwdSm90Cluster<T, D, kMods>(nullptr, p, ptr, bp, -1, NumSms());
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}
template <typename T, int kParts = 7>
cudaError_t LaunchAny(int variant, const AttentionParams& p, const FwdPointers& ptr, const BwdPointers& bp) {
  if (p.has_mask) {
    if constexpr (kParts != 7) return cudaErrorNotSupported;  // timings run mask-free cases
    return p.head_dim == 64 ? LaunchVariant<T, 64, 7, true>(variant, p, ptr, bp)
                            : LaunchVariant<T, 128, 7, true>(variant, p, ptr, bp);
  }
  return p.head_dim == 64 ? LaunchVariant<T, 64, kParts>(variant, p, ptr, bp)
                          : LaunchVariant<T, 128, kParts>(variant, p, ptr, bp);
}

template <typename T>
struct Buffers {
  T *q, *k, *v, *o, *d_o, *dq, *dk, *dv;
  float* lse;
  int32_t *qsl, *kvsl;
  uint32_t* mask = nullptr;  // Case::mods bit 0: CaseMask [B, 1|H, T, S], bit-packed (PackedCaseMask)
  size_t nq, nk, nl;
};

template <typename T>
Buffers<T> Alloc(const Case& c) {
  if (c.mods & 2) {  // the reference and the buffers carry no bias (nor dbias)
    std::printf("attention_bwd_bench: bias cases are not supported\n");
    std::exit(2);
  }
  Buffers<T> b;
  b.nq = size_t{1} * c.B * c.T * c.H * c.D;
  b.nk = size_t{1} * c.B * c.S * c.K * c.D;
  b.nl = size_t{1} * c.B * c.H * c.T;
  for (T** x : {&b.q, &b.o, &b.d_o, &b.dq}) CHECK(cudaMalloc(x, b.nq * sizeof(T)));
  for (T** x : {&b.k, &b.v, &b.dk, &b.dv}) CHECK(cudaMalloc(x, b.nk * sizeof(T)));
  CHECK(cudaMalloc(&b.lse, b.nl * 4));
  CHECK(cudaMalloc(&b.qsl, 4 * c.B));
  CHECK(cudaMalloc(&b.kvsl, 4 * c.B));
  std::vector<int32_t> ql(c.B, c.q_len), kl(c.B, c.kv_len);
  CHECK(cudaMemcpy(b.qsl, ql.data(), 4 * c.B, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.kvsl, kl.data(), 4 * c.B, cudaMemcpyHostToDevice));
  if (c.mods & 1) {
    const std::vector<uint32_t> packed = PackedCaseMask(c);
    CHECK(cudaMalloc(&b.mask, packed.size() * 4));
    CHECK(cudaMemcpy(b.mask, packed.data(), packed.size() * 4, cudaMemcpyHostToDevice));
  }
  return b;
}
template <typename T>
void Free(Buffers<T>& b) {
  for (void* x :
       {static_cast<void*>(b.q), static_cast<void*>(b.k), static_cast<void*>(b.v), static_cast<void*>(b.o),
        static_cast<void*>(b.d_o), static_cast<void*>(b.dq), static_cast<void*>(b.dk), static_cast<void*>(b.dv),
        static_cast<void*>(b.lse), static_cast<void*>(b.qsl), static_cast<void*>(b.kvsl), static_cast<void*>(b.mask)})
    cudaFree(x);
}
template <typename T>
FwdPointers Ptrs(const Buffers<T>& b) {
  return FwdPointers{b.q, b.k, b.v, nullptr, b.mask, b.qsl, b.kvsl, b.o, b.lse, false};
}
template <typename T>
BwdPointers BwdPtrs(const Buffers<T>& b) {
  return BwdPointers{b.o, b.lse, b.d_o, b.dq, b.dk, b.dv};
}

// fp64 reference of one (batch, head): o and lse (the forward, for the kernel's inputs) and the exact gradients
// (dk_n, dv_n: this head's contribution, [S, D]).
struct RefOut {
  std::vector<double> o, lse, dq, dk, dv;
};
void RefHead(const AttentionParams& p, const Case& c, const std::vector<double>& q, const std::vector<double>& k,
             const std::vector<double>& v, const std::vector<double>& d_o, int b, int n, RefOut& r) {
  const int D = c.D, S = c.S;
  const int kh = n / (c.H / c.K);
  const int64_t ql = c.q_len >= 0 ? std::min(c.q_len, c.T) : c.T, kl = c.kv_len >= 0 ? std::min(c.kv_len, c.S) : c.S;
  r.o.assign(size_t{1} * c.T * D, 0.0);
  r.lse.assign(c.T, -INFINITY);
  r.dq.assign(size_t{1} * c.T * D, 0.0);
  r.dk.assign(size_t{1} * S * D, 0.0);
  r.dv.assign(size_t{1} * S * D, 0.0);
  std::vector<double> pr(S), dp(S);
  for (int t = 0; t < c.T; ++t) {
    const KeyRange kr = AllowedKeys(p, t, ql, kl);
    if (kr.hi <= kr.lo) continue;
    const double* qr = &q[p.QOffset(b, t, n)];
    const double* dor = &d_o[p.QOffset(b, t, n)];
    double mx = -INFINITY;
    for (int64_t s = kr.lo; s < kr.hi; ++s) {
      if ((c.mods & 1) && !CaseMask(c, b, n, t, static_cast<int>(s))) {
        pr[s] = -INFINITY;  // exp gives P = 0: no contribution anywhere below
        continue;
      }
      const double* kr_ = &k[p.KOffset(b, s, kh)];
      double acc = 0;
      for (int d = 0; d < D; ++d) acc += qr[d] * kr_[d];
      pr[s] = acc * p.scale;
      mx = std::max(mx, pr[s]);
    }
    if (mx == -INFINITY) continue;  // every key masked: an empty row
    double l = 0;
    for (int64_t s = kr.lo; s < kr.hi; ++s) l += std::exp(pr[s] - mx);
    const double lse = mx + std::log(l);
    r.lse[t] = lse;
    double delta = 0;
    for (int64_t s = kr.lo; s < kr.hi; ++s) {
      pr[s] = std::exp(pr[s] - lse);
      const double* vr = &v[p.KOffset(b, s, kh)];
      double acc = 0;
      for (int d = 0; d < D; ++d) {
        r.o[size_t{1} * t * D + d] += pr[s] * vr[d];
        acc += dor[d] * vr[d];
      }
      dp[s] = acc;
      delta += pr[s] * acc;
    }
    for (int64_t s = kr.lo; s < kr.hi; ++s) {
      const double ds = pr[s] * (dp[s] - delta) * p.scale;
      const double* kr_ = &k[p.KOffset(b, s, kh)];
      for (int d = 0; d < D; ++d) {
        r.dq[size_t{1} * t * D + d] += ds * kr_[d];
        r.dk[size_t{1} * s * D + d] += ds * qr[d];
        r.dv[size_t{1} * s * D + d] += pr[s] * dor[d];
      }
    }
  }
}

struct Err {
  double max_abs = 0, err2 = 0, ref2 = 0;
  bool nan = false;
  void Add(double got, double ref) {
    if (!std::isfinite(got)) nan = true;
    max_abs = std::max(max_abs, std::abs(got - ref));
    err2 += (got - ref) * (got - ref);
    ref2 += ref * ref;
  }
  double Rel() const { return std::sqrt(err2 / std::max(ref2, 1e-30)); }
};

template <typename T>
struct HostCase {
  std::vector<T> q, k, v, d_o, o;
  std::vector<float> lse;
  std::vector<double> dq, dk, dv;  // fp64 reference gradients
};

// Fresh random inputs (the dtype's values), the fp64 forward for o / lse and the fp64 gradients.
template <typename T>
HostCase<T> MakeHostCase(const Case& c, unsigned seed) {
  const AttentionParams p = ParamsOf<T>(c);
  HostCase<T> h;
  const size_t nq = size_t{1} * c.B * c.T * c.H * c.D, nk = size_t{1} * c.B * c.S * c.K * c.D;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<double> q(nq), k(nk), v(nk), d_o(nq);
  auto fill = [&](std::vector<T>& x, std::vector<double>& xd) {
    x.resize(xd.size());
    for (size_t i = 0; i < xd.size(); ++i) {
      x[i] = FromF<T>(nd(rng));
      xd[i] = ToF(x[i]);
    }
  };
  fill(h.q, q);
  fill(h.k, k);
  fill(h.v, v);
  fill(h.d_o, d_o);
  h.o.resize(nq);
  h.lse.resize(size_t{1} * c.B * c.H * c.T);
  h.dq.assign(nq, 0.0);
  h.dk.assign(nk, 0.0);
  h.dv.assign(nk, 0.0);
  std::vector<RefOut> outs(size_t{1} * c.B * c.H);
  std::vector<std::thread> pool;
  std::atomic<int> next{0};
  const int workers = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&] {
      for (int i; (i = next++) < c.B * c.H;) RefHead(p, c, q, k, v, d_o, i / c.H, i % c.H, outs[i]);
    });
  for (auto& th : pool) th.join();
  for (int b = 0; b < c.B; ++b)
    for (int n = 0; n < c.H; ++n) {
      const RefOut& r = outs[size_t{1} * b * c.H + n];
      const int kh = n / (c.H / c.K);
      for (int t = 0; t < c.T; ++t) {
        h.lse[p.LseOffset(b, n, t)] = static_cast<float>(r.lse[t]);
        for (int d = 0; d < c.D; ++d) {
          h.o[p.QOffset(b, t, n) + d] = FromF<T>(static_cast<float>(r.o[size_t{1} * t * c.D + d]));
          h.dq[p.QOffset(b, t, n) + d] = r.dq[size_t{1} * t * c.D + d];
        }
      }
      for (int s = 0; s < c.S; ++s)
        for (int d = 0; d < c.D; ++d) {
          h.dk[p.KOffset(b, s, kh) + d] += r.dk[size_t{1} * s * c.D + d];
          h.dv[p.KOffset(b, s, kh) + d] += r.dv[size_t{1} * s * c.D + d];
        }
    }
  return h;
}

// Random q, k, v, dO (seeds seed, seed+1, seed+2, seed+3).
template <typename T>
void FillInputs(const Buffers<T>& b, int seed) {
  FillNormal<<<1024, 256>>>(b.q, b.nq, seed);
  FillNormal<<<1024, 256>>>(b.k, b.nk, seed + 1);
  FillNormal<<<1024, 256>>>(b.v, b.nk, seed + 2);
  FillNormal<<<1024, 256>>>(b.d_o, b.nq, seed + 3);
  CHECK(cudaGetLastError());
}

// One kernel variant on one case, outputs poisoned; prints max abs / rel L2 error of dq, dk, dv.
template <typename T>
bool CheckVariant(const Case& c, const HostCase<T>& h, int variant) {
  const AttentionParams p = ParamsOf<T>(c);
  Buffers<T> b = Alloc<T>(c);
  CHECK(cudaMemcpy(b.q, h.q.data(), b.nq * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.k, h.k.data(), b.nk * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.v, h.v.data(), b.nk * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.o, h.o.data(), b.nq * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.d_o, h.d_o.data(), b.nq * sizeof(T), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b.lse, h.lse.data(), b.nl * 4, cudaMemcpyHostToDevice));
  CHECK(cudaMemset(b.dq, 0xff, b.nq * sizeof(T)));  // NaN poison
  CHECK(cudaMemset(b.dk, 0xff, b.nk * sizeof(T)));
  CHECK(cudaMemset(b.dv, 0xff, b.nk * sizeof(T)));
  const cudaError_t err = LaunchAny<T>(variant, p, Ptrs(b), BwdPtrs(b));
  if (err == cudaErrorNotSupported) {  // variant not built for this head dim, or the launcher refused the case
    const bool expected = (variant == 5 && c.D != 64) || (variant == 7 && p.group % 2) ||
                          (variant == 8 && p.group % 4) || (c.mods && variant >= 2 && variant <= 6);
    if (!expected) std::printf("check %-4s %-27s refused: FAIL\n", DTypeName<T>(), kVariantNames[variant]);
    Free(b);
    return expected;  // anything else would let a silent fallback pass the check
  }
  CHECK(err);
  CHECK(cudaDeviceSynchronize());
  std::vector<T> dq(b.nq), dk(b.nk), dv(b.nk);
  CHECK(cudaMemcpy(dq.data(), b.dq, b.nq * sizeof(T), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(dk.data(), b.dk, b.nk * sizeof(T), cudaMemcpyDeviceToHost));
  CHECK(cudaMemcpy(dv.data(), b.dv, b.nk * sizeof(T), cudaMemcpyDeviceToHost));
  Err e[3];
  for (size_t i = 0; i < b.nq; ++i) e[0].Add(ToF(dq[i]), h.dq[i]);
  for (size_t i = 0; i < b.nk; ++i) {
    e[1].Add(ToF(dk[i]), h.dk[i]);
    e[2].Add(ToF(dv[i]), h.dv[i]);
  }
  // bf16 <~ 1e-2, fp16 <~ 2e-3 (ARCHITECTURE.md), doubled for gradients as tests/test_attention_gpu.py does. A
  // gradient that is exactly 0 (dq, dk when every row sees one key: softmax over one key is constant) leaves only
  // rounding (delta from the rounded O): there the absolute error must be below 1e-4.
  const double tol = std::is_same_v<T, __half> ? 4e-3 : 2e-2;
  bool ok = true;
  for (const Err& x : e) ok &= !x.nan && (x.Rel() < tol || (std::sqrt(x.ref2) < 1e-9 && x.max_abs < 1e-4));
  std::printf(
      "check %-4s %-27s B=%d T=%d S=%d H=%d K=%d D=%d causal=%d win=(%lld,%lld) len=(%d,%d) mask=%d: dq %.2e/%.2e dk "
      "%.2e/%.2e dv %.2e/%.2e (max abs/rel l2)%s %s\n",
      DTypeName<T>(), kVariantNames[variant], c.B, c.T, c.S, c.H, c.K, c.D, c.causal, (long long)c.wl, (long long)c.wr,
      c.q_len, c.kv_len, c.mods & 1, e[0].max_abs, e[0].Rel(), e[1].max_abs, e[1].Rel(), e[2].max_abs, e[2].Rel(),
      (e[0].nan || e[1].nan || e[2].nan) ? " NaN" : "", ok ? "OK" : "FAIL");
  Free(b);
  return ok;
}

// Two runs of a variant on the same inputs (outputs re-poisoned in between) must agree bit for bit.
template <typename T>
bool CheckDeterministic(const Case& c, int variant, bool quiet_refusal) {
  const AttentionParams p = MakeParams<T>(c);
  Buffers<T> b = Alloc<T>(c);
  FillInputs(b, 11);
  const cudaError_t fwd_err =
      c.D == 64 ? LaunchAttentionFwd<T, 64>(nullptr, p, Ptrs(b)) : LaunchAttentionFwd<T, 128>(nullptr, p, Ptrs(b));
  CHECK(fwd_err);
  std::vector<T> out[2];
  for (int run = 0; run < 2; ++run) {
    CHECK(cudaMemset(b.dq, 0xff, b.nq * sizeof(T)));
    CHECK(cudaMemset(b.dk, 0xff, b.nk * sizeof(T)));
    CHECK(cudaMemset(b.dv, 0xff, b.nk * sizeof(T)));
    const cudaError_t err = LaunchAny<T>(variant, p, Ptrs(b), BwdPtrs(b));
    if (err == cudaErrorNotSupported) {
      if (!quiet_refusal) std::printf("determinism %-4s %-27s refused\n", DTypeName<T>(), kVariantNames[variant]);
      Free(b);
      return true;
    }
    CHECK(err);
    CHECK(cudaDeviceSynchronize());
    out[run].resize(b.nq + 2 * b.nk);
    CHECK(cudaMemcpy(out[run].data(), b.dq, b.nq * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(out[run].data() + b.nq, b.dk, b.nk * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(out[run].data() + b.nq + b.nk, b.dv, b.nk * sizeof(T), cudaMemcpyDeviceToHost));
  }
  const bool ok = std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(T)) == 0;
  std::printf("determinism %-4s %-27s B=%d T=%d S=%d H=%d K=%d D=%d causal=%d: %s\n", DTypeName<T>(),
              kVariantNames[variant], c.B, c.T, c.S, c.H, c.K, c.D, c.causal, ok ? "bitwise equal OK" : "DIFFER FAIL");
  Free(b);
  return ok;
}

// The GQA dK/dV cluster against the fp64 reference: G = 2, 4, 8 and MQA; causal, windows, seq lengths, ragged
// tails; then two-run bitwise determinism, including the bench shapes. Variants 1 (J = 1) and 7-9.
template <typename T>
bool CheckGqaCluster() {
  bool all_ok = true;
  for (int D : {128, 64}) {
    const Case cases[] = {
        {2, 300, 517, 4, 2, D, true},                     // G = 2, T != S, ragged
        {1, 700, 700, 4, 1, D, true},                     // MQA, G = 4
        {1, 333, 461, 8, 1, D, true},                     // MQA, G = 8, ragged
        {2, 300, 517, 8, 2, D, false, 100, 0},            // G = 4, window (100, 0)
        {1, 513, 1000, 8, 4, D, false, 64, 8},            // G = 2, window (64, 8)
        {1, 640, 640, 16, 2, D, true, -1, -1, 500, 333},  // G = 8, seq lengths
        {1, 200, 300, 8, 2, D, false, -1, -1, 150, 0},    // G = 4, kv_len = 0
        {1, 1, 700, 8, 2, D, false},                      // T = 1
        {1, 1024, 1024, 8, 2, D, true},                   // G = 4, 8 key blocks
        {1, 1000, 1000, 16, 2, D, false},                 // G = 8, full
    };
    unsigned seed = 500;
    for (const Case& c : cases) {
      Progress("reference");
      const HostCase<T> h = MakeHostCase<T>(c, seed++);
      for (int variant : kClusterVariants) {
        Progress(kVariantNames[variant]);
        all_ok &= CheckVariant<T>(c, h, variant);
      }
    }
    const Case det[] = {
        {2, 640, 777, 8, 1, D, true}, {1, 4096, 4096, 32, 8, D, true}, {1, 4096, 4096, 32, 4, D, false}};
    for (const Case& c : det)
      for (int variant : kClusterVariants) {
        Progress("determinism");
        all_ok &= CheckDeterministic<T>(c, variant, variant == 7 || variant == 8);
      }
  }
  return all_ok;
}

// small: one case per head dim (G = 2), default kernels only: J = 1 and the rule's (J = 2) (for compute-sanitizer).
template <typename T>
bool CheckAll(bool small = false) {
  bool all_ok = true;
  if (small) {
    for (int D : {128, 64}) {
      const Case c{2, 300, 517, 4, 2, D, true};
      const HostCase<T> h = MakeHostCase<T>(c, 5);
      for (int variant : {1, 9}) all_ok &= CheckVariant<T>(c, h, variant);
      const Case cm{2, 300, 517, 4, 2, D, false, -1, -1, -1, -1, 1};  // the kMods kernels
      const HostCase<T> hm = MakeHostCase<T>(cm, 6);
      for (int variant : {1, 9}) all_ok &= CheckVariant<T>(cm, hm, variant);
    }
    return all_ok;
  }
  for (int D : {128, 64}) {
    const Case cases[] = {
        {1, 128, 128, 1, 1, D, false},
        {2, 300, 517, 4, 2, D, true},
        {2, 300, 517, 4, 2, D, false},
        {1, 700, 700, 4, 1, D, true},
        {1, 1, 1000, 2, 2, D, false},
        {2, 1000, 1, 2, 2, D, false},
        {1, 777, 777, 2, 2, D, true, 100, 0},
        {1, 500, 700, 2, 1, D, false, 64, 8},
        {2, 640, 640, 2, 2, D, true, -1, -1, 500, 333},
        {1, 200, 300, 2, 1, D, false, -1, -1, 150, 0},
        {1, 2048, 2048, 2, 1, D, true},
        // A boolean mask (the kMods kernels): ragged tails, odd S, causal + window + lengths, GQA (clusters).
        {2, 300, 517, 4, 2, D, false, -1, -1, -1, -1, 1},
        {2, 640, 640, 4, 1, D, true, 100, 0, 500, 333, 1},
        {1, 1, 1000, 2, 2, D, false, -1, -1, -1, -1, 1},
        {1, 1024, 1024, 8, 2, D, true, -1, -1, -1, -1, 1},
        {2, 300, 517, 8, 2, D, false, -1, -1, -1, -1, 5},  // a per-head mask: G = 4 heads per dK/dV CTA
    };
    unsigned seed = 1;
    for (const Case& c : cases) {
      Progress("reference");
      const HostCase<T> h = MakeHostCase<T>(c, 1000 + seed++);
      for (int variant = 0; variant < kVariants; ++variant) {
        Progress(kVariantNames[variant]);
        all_ok &= CheckVariant<T>(c, h, variant);
      }
    }
  }
  return all_ok;
}

// Median time of a launch, repeated so that each timed batch lasts >= 40 ms.
template <typename F>
double TimeMs(F&& launch) {
  const float first = jax_ops::tools::RoundTimesMs(launch, 1, 1, 1)[0];
  const int reps = std::max(1, std::min(200, static_cast<int>(40.f / std::max(first, 1e-3f))));
  return jax_ops::tools::Median(jax_ops::tools::RoundTimesMs(launch, 0, 3, reps));
}

// GQA H=32/K=8 and H=32/K=4: J = 1 vs the dK/dV cluster, whole backward and the dK/dV kernel alone.
void BenchGqa() {
  using T = __nv_bfloat16;
  for (int J : {2, 4}) {
    const int fit = J == 2 ? hopper::DkDvActiveClusters<T, 128, kSm90BwdDkDvStages, kSm90BwdDvEarly<128>, false, 2>()
                           : hopper::DkDvActiveClusters<T, 128, kSm90BwdDkDvStages, kSm90BwdDvEarly<128>, false, 4>();
    std::printf("gqa: D=128 dK/dV clusters of %d resident at once: %d (%d of %d SMs)\n", J, fit, fit * J, NumSms());
  }
  for (int D : {128, 64})
    for (int K : {8, 4})
      for (bool causal : {true, false})
        for (int N : {1024, 4096, 8192}) {
          const Case c{1, N, N, 32, K, D, causal};
          const AttentionParams p = MakeParams<T>(c);
          Buffers<T> b = Alloc<T>(c);
          FillInputs(b, 1);
          const cudaError_t fwd_err = D == 64 ? LaunchAttentionFwd<T, 64>(nullptr, p, Ptrs(b))
                                              : LaunchAttentionFwd<T, 128>(nullptr, p, Ptrs(b));
          CHECK(fwd_err);
          CHECK(cudaDeviceSynchronize());
          const FwdPointers ptr = Ptrs(b);
          const BwdPointers bp = BwdPtrs(b);
          const double flops = 2.5 * (causal ? 2.0 : 4.0) * 32 * double(N) * N * D;
          std::printf("gqa D=%3d H=32/K=%d N=%5d causal=%d (dkdv CTAs at J=1: %d, rule J=%d):", D, K, N, causal,
                      (N + 127) / 128 * K, AutoCluster(p));
          // A refused variant (clusters that do not fit) prints -1 instead of aborting the run.
          auto time_ms = [&](auto launch) { return launch() == cudaErrorNotSupported ? -1.0 : TimeMs(launch); };
          for (int variant : kClusterVariants) {
            Progress(kVariantNames[variant]);
            const double ms = time_ms([&] { return LaunchAny<T>(variant, p, ptr, bp); });
            std::printf(" | %s %6.1f TF/s (%.3f ms)", kVariantNames[variant], flops / ms / 1e9, ms);
          }
          Progress("gqa parts");
          const double t1 = time_ms([&] { return LaunchAny<T, 2>(1, p, ptr, bp); });
          const double t2 = time_ms([&] { return LaunchAny<T, 2>(7, p, ptr, bp); });
          const double t4 = time_ms([&] { return LaunchAny<T, 2>(8, p, ptr, bp); });
          std::printf(" | dkdv alone: J=1 %.3f ms, J=2 %.3f ms, J=4 %.3f ms\n", t1, t2, t4);
          Free(b);
        }
}

void Bench() {
  using T = __nv_bfloat16;
  for (int D : {128, 64})
    for (bool causal : {true, false})
      for (int N : {1024, 4096, 8192, 16384}) {
        const Case c{1, N, N, 32, 32, D, causal};
        const AttentionParams p = MakeParams<T>(c);
        Buffers<T> b = Alloc<T>(c);
        FillInputs(b, 1);
        // o and lse from the (validated) portable forward
        const cudaError_t fwd_err =
            D == 64 ? LaunchAttentionFwd<T, 64>(nullptr, p, Ptrs(b)) : LaunchAttentionFwd<T, 128>(nullptr, p, Ptrs(b));
        CHECK(fwd_err);
        CHECK(cudaDeviceSynchronize());
        const FwdPointers ptr = Ptrs(b);
        const BwdPointers bp = BwdPtrs(b);
        // Backward FLOPs counted as 2.5x the forward's (causal fwd = 2 B H T S D, full = 4 B H T S D).
        const double flops = 2.5 * (causal ? 2.0 : 4.0) * 32 * double(N) * N * D;
        auto tf = [&](double ms) { return flops / ms / 1e9; };
        std::printf("bench D=%3d N=%5d causal=%d:", D, N, causal);
        const bool variants = N == 4096 || N == 16384;
        for (int variant = 0; variant < 7; ++variant) {  // MHA: the cluster variants are J = 1 here
          if (variant >= 2 && !variants) continue;
          if (variant == 5 && D != 64) continue;
          Progress(kVariantNames[variant]);
          const double ms = TimeMs([&] { return LaunchAny<T>(variant, p, ptr, bp); });
          std::printf(" | %s %6.1f TF/s (%.3f ms)", kVariantNames[variant], tf(ms), ms);
        }
        // Default Hopper kernels one at a time (for where the time goes).
        Progress("parts");
        const double t_delta = TimeMs([&] { return LaunchAny<T, 1>(1, p, ptr, bp); });
        const double t_dkdv = TimeMs([&] { return LaunchAny<T, 2>(1, p, ptr, bp); });
        const double t_dq = TimeMs([&] { return LaunchAny<T, 4>(1, p, ptr, bp); });
        // dK/dV kernel: 4 of the 5 backward GEMMs (0.8 of the FLOPs); dQ kernel: 3 GEMMs (0.6).
        std::printf(" | delta %.3f ms, dkdv %.3f ms (%.1f TF/s of its 4 GEMMs), dq %.3f ms (%.1f TF/s of its 3)\n",
                    t_delta, t_dkdv, 0.8 * flops / t_dkdv / 1e9, t_dq, 0.6 * flops / t_dq / 1e9);
        Free(b);
      }
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout kill
  StartWatchdog("ABB_WATCHDOG_S");
  const char* mode = argc > 1 ? argv[1] : "all";
  bool all_ok = true;
  if (!std::strcmp(mode, "check") || !std::strcmp(mode, "all")) {
    all_ok &= CheckAll<__nv_bfloat16>();
    all_ok &= CheckAll<__half>();
    all_ok &= CheckGqaCluster<__nv_bfloat16>();
    all_ok &= CheckGqaCluster<__half>();
  }
  if (!std::strcmp(mode, "small")) all_ok &= CheckAll<__nv_bfloat16>(/*small=*/true);
  if (!std::strcmp(mode, "gqa-small"))  // the cluster variants on one GQA case per head dim (compute-sanitizer)
    for (int D : {128, 64}) {
      const Case c{2, 300, 517, 8, 2, D, true};
      const HostCase<__nv_bfloat16> h = MakeHostCase<__nv_bfloat16>(c, 7);
      for (int variant : {7, 8}) all_ok &= CheckVariant<__nv_bfloat16>(c, h, variant);
    }
  if (!std::strcmp(mode, "gqa")) {
    all_ok &= CheckGqaCluster<__nv_bfloat16>();
    all_ok &= CheckGqaCluster<__half>();
  }
  if (!std::strcmp(mode, "bench") || !std::strcmp(mode, "all")) Bench();
  if (!std::strcmp(mode, "bench") || !std::strcmp(mode, "all") || !std::strcmp(mode, "gqa")) BenchGqa();
  std::printf(all_ok ? "ALL OK\n" : "SOME FAILED\n");
  return all_ok ? 0 : 1;
}
