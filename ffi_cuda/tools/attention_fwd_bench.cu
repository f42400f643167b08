// Standalone check + timing of the CUDA attention forward kernels (no Python): the Hopper kernel
// (attention_fwd_sm90_impl.cuh) against the sm_80 mma.sync kernel and a CPU fp64 reference on sampled rows.
// Build here, carry the binary, run on the GPU machine:
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -cudart static -I ffi_cuda \
//     -isystem $(python3 -c "import jax.ffi as f; print(f.include_dir())") ffi_cuda/tools/attention_fwd_bench.cu \
//     -o attention_fwd_bench
// Usage: attention_fwd_bench [check|small|bench|persist|all]
//   check: every case with each Hopper variant (2 and 3 stages, 176-key tiles, persistent with one CTA per SM,
//          with 3 CTAs and with 1 CTA), persistent outputs also compared bitwise with the one-CTA-per-block kernel;
//          cases with a mask and/or bias run the 3-stage kMods variant and the sm_80 kernel;
//   small: the check cases up to 700 x 700 (for compute-sanitizer; AFB_WATCHDOG_S=300 there);
//   mods-small: only the mask/bias cases of small;
//   bench: TF/s of the variants, and of the kMods variant with a mask, a bias and both;
//   persist: only the shipped 3-stage kernel against its persistent variant, and which of the two the library's
//          rule (Sm90FwdUsePersistent) picks.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attention/attention_fwd_impl.cuh"
#include "attention/attention_fwd_sm90_impl.cuh"
#include "tools/attention_bench_case.h"
#include "tools/bench_check.h"

using namespace jax_ops::attention;
using T = __nv_bfloat16;

int g_stages = 2;    // Hopper kernel pipeline depth under test
int g_diag = 0;      // Hopper timing experiment (kDiag of attention_fwd_sm90_impl.cuh), with 3 stages
int g_persist = -1;  // Hopper persistent variant (g_stages stages): -1 off, 0 one CTA per SM, k > 0 k CTAs
template <int D>
cudaError_t Launch(bool hopper, const AttentionParams& p, const FwdPointers& ptr) {
  if (hopper && HasScoreMods(p)) return LaunchAttentionFwdSm90<T, D, 3, 0, 128, false, true>(nullptr, p, ptr);
  if (hopper && g_persist >= 0)
    return g_stages == 3 ? LaunchAttentionFwdSm90<T, D, 3, 0, 128, true>(nullptr, p, ptr, g_persist)
                         : LaunchAttentionFwdSm90<T, D, 2, 0, 128, true>(nullptr, p, ptr, g_persist);
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
  uint32_t* mask = nullptr;  // Case::mods bit 0: [B, 1, T, S], bit-packed (PackedCaseMask)
  T* bias = nullptr;         // Case::mods bit 1: [1, H, T, S]
  std::vector<T> hq, hk, hv, hbias;
  std::vector<char> hmask;
};

// The tool mask [B, 1, T, S] packed on the device (one thread per word), for sizes a host loop would make slow.
__global__ void FillPackedToolMask(uint32_t* mask, int B, int T, int S, int words) {
  const size_t n = size_t{1} * B * T * words;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const int b = static_cast<int>(i / (size_t{1} * T * words)), t = static_cast<int>(i / words % T);
    const int s0 = static_cast<int>(i % words) * 32;
    uint32_t w = 0;
    for (int j = 0; j < 32 && s0 + j < S; ++j) w |= uint32_t{ToolMask(b, t, s0 + j)} << j;
    mask[i] = w;
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
  const size_t nm = size_t{1} * c.B * c.T * c.S, nb = size_t{1} * c.H * c.T * c.S;
  if (c.mods & 1) {
    const int words = static_cast<int>(jax_ops::attention::MaskWords(c.S));
    const size_t nw = size_t{1} * c.B * c.T * words;
    CHECK(cudaMalloc(&b.mask, nw * 4));
    if (host_copy) {
      b.hmask.resize(nm);
      for (int bb = 0; bb < c.B; ++bb)
        for (int t = 0; t < c.T; ++t)
          for (int s = 0; s < c.S; ++s) b.hmask[(size_t{1} * bb * c.T + t) * c.S + s] = ToolMask(bb, t, s);
      const std::vector<uint32_t> packed = PackedCaseMask(c);
      CHECK(cudaMemcpy(b.mask, packed.data(), nw * 4, cudaMemcpyHostToDevice));
    } else {
      FillPackedToolMask<<<1024, 256>>>(b.mask, c.B, c.T, c.S, words);
    }
  }
  if (c.mods & 2) {
    CHECK(cudaMalloc(&b.bias, nb * 2));
    if (host_copy) {
      std::mt19937 rng(seed + 3);
      std::normal_distribution<float> nd(0.f, 1.f);
      b.hbias.resize(nb);
      for (auto& x : b.hbias) x = __float2bfloat16(nd(rng));
      CHECK(cudaMemcpy(b.bias, b.hbias.data(), nb * 2, cudaMemcpyHostToDevice));
    } else {
      FillNormal<<<1024, 256>>>(b.bias, nb, seed + 3);
    }
  }
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
                  static_cast<void*>(b.lse), static_cast<void*>(b.qsl), static_cast<void*>(b.kvsl),
                  static_cast<void*>(b.mask), static_cast<void*>(b.bias)})
    cudaFree(p);
}

FwdPointers Ptrs(const Buffers& b) {
  return FwdPointers{b.q, b.k, b.v, b.bias, b.mask, b.qsl, b.kvsl, b.o, b.lse, false};
}

std::string Label(bool hopper, int mods = 0) {
  if (!hopper) return "sm80";
  if (mods) return "sm90 mods";
  if (g_diag == 3) return "sm90 176k";
  std::string l = g_persist >= 0 ? "pers" : "sm90";
  l += g_stages == 3 ? " 3st" : " 2st";
  if (g_persist > 0) l += " " + std::to_string(g_persist) + "cta";
  return l;
}

// Runs the kernel with poisoned outputs; compares sampled rows with an fp64 CPU reference, and checks that every
// output element was written (no NaN anywhere; lse may be -inf). o_out/lse_out: the outputs, when given.
bool Check(const Case& c, bool hopper, std::vector<T>* o_out = nullptr, std::vector<float>* lse_out = nullptr) {
  Progress();
  AttentionParams p = ParamsOf<T>(c);
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
  for (const T& x : ho) nan |= std::isnan(__bfloat162float(x));
  for (float x : hl) nan |= std::isnan(x);
  std::mt19937 rng(7);
  const int samples = 48;
  for (int si = 0; si < samples; ++si) {
    const int bb = rng() % c.B, n = rng() % c.H;
    int t = si < 8 ? (si < 4 ? si : c.T - 1 - (si - 4)) : static_cast<int>(rng() % c.T);
    t = std::clamp(t, 0, c.T - 1);
    const int kh = n / (c.H / c.K);
    const int64_t ql = c.q_len >= 0 ? std::min(c.q_len, c.T) : c.T, kl = c.kv_len >= 0 ? std::min(c.kv_len, c.S) : c.S;
    const KeyRange r = AllowedKeys(p, t, ql, kl);
    std::vector<double> logit(c.S, -INFINITY);
    double mx = -INFINITY;
    for (int64_t s = r.lo; s < r.hi; ++s) {
      if ((c.mods & 1) && !b.hmask[(size_t{1} * bb * c.T + t) * c.S + s]) continue;
      double acc = 0;
      for (int d = 0; d < c.D; ++d)
        acc +=
            double(__bfloat162float(b.hq[p.QOffset(bb, t, n) + d])) * __bfloat162float(b.hk[p.KOffset(bb, s, kh) + d]);
      logit[s] = acc * p.scale;
      if (c.mods & 2) logit[s] += __bfloat162float(b.hbias[(size_t{1} * n * c.T + t) * c.S + s]);
      mx = std::max(mx, logit[s]);
    }
    double l = 0;
    std::vector<double> out(c.D, 0.0);
    for (int64_t s = r.lo; s < r.hi; ++s) {
      if (logit[s] == -INFINITY) continue;
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
      "check %-14s B=%d T=%d S=%d H=%d K=%d D=%d causal=%d win=(%lld,%lld) len=(%d,%d) mods=%d: max_abs %.3e rel_l2 "
      "%.3e lse %.2e %s\n",
      Label(hopper, c.mods).c_str(), c.B, c.T, c.S, c.H, c.K, c.D, c.causal, (long long)c.wl, (long long)c.wr, c.q_len,
      c.kv_len, c.mods, max_err, rel, lse_err, ok ? "OK" : "FAIL");
  Free(b);
  if (o_out) *o_out = std::move(ho);
  if (lse_out) *lse_out = std::move(hl);
  return ok;
}

// Bitwise equality of two runs' outputs (the persistent kernel computes each block exactly as the other one).
bool SameBits(const std::vector<T>& o, const std::vector<float>& lse, const std::vector<T>& o_ref,
              const std::vector<float>& lse_ref) {
  const bool same = o.size() == o_ref.size() && lse.size() == lse_ref.size() &&
                    !std::memcmp(o.data(), o_ref.data(), o.size() * sizeof(T)) &&
                    !std::memcmp(lse.data(), lse_ref.data(), lse.size() * sizeof(float));
  std::printf("      %-14s bitwise equal to the one-CTA-per-block kernel: %s\n", Label(true).c_str(),
              same ? "OK" : "FAIL");
  return same;
}

double TimeMs(const Case& c, bool hopper) {
  Progress();
  AttentionParams p = ParamsOf<T>(c);
  Buffers b = Alloc(c, 99, /*host_copy=*/false);
  const FwdPointers ptr = Ptrs(b);
  const int reps = c.T <= 2048 ? 50 : 10;
  const double ms =
      jax_ops::tools::Median(jax_ops::tools::RoundTimesMs([&] { return LaunchAny(hopper, p, ptr); }, 3, 5, reps));
  Free(b);
  return ms;
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a timeout kill
  const char* mode = argc > 1 ? argv[1] : "all";
  StartWatchdog("AFB_WATCHDOG_S");
  bool all_ok = true;
  // small: the check cases up to 700 x 700 (seq lengths with empty blocks, kv_len = 0, tails, T = 1, S = 1), for
  // compute-sanitizer.
  const bool mods_only = !std::strcmp(mode, "mods-small");
  const bool small = !std::strcmp(mode, "small") || mods_only;
  if (!std::strcmp(mode, "check") || !std::strcmp(mode, "all") || small) {
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
        // Persistent-schedule stress: every block without keys (kv_len = 0), and many blocks per CTA with GQA.
        {3, 520, 400, 4, 2, 128, true, -1, -1, 520, 0},
        {4, 1024, 1024, 16, 4, 64, true},
    };
    // Mask, bias and both (the kMods variant): ragged tails, odd S (unaligned rows), causal + window + lengths, GQA.
    const Case mods_cases[] = {
        {2, 300, 517, 4, 2, 128, false, -1, -1, -1, -1, 1}, {2, 300, 517, 4, 2, 128, true, -1, -1, -1, -1, 2},
        {2, 640, 640, 4, 2, 64, true, 100, 0, 500, 333, 3}, {2, 1000, 1, 2, 2, 128, false, -1, -1, -1, -1, 3},
        {1, 1, 1000, 2, 1, 64, false, -1, -1, -1, -1, 3},   {2, 1024, 1024, 8, 2, 128, false, -1, -1, -1, -1, 3},
    };
    for (const Case& c : mods_cases) {
      if (small && int64_t{c.T} * c.S > 700 * 700) continue;
      all_ok &= Check(c, true);
      all_ok &= Check(c, false);
    }
    for (const Case& c : cases) {
      if (mods_only || (small && int64_t{c.T} * c.S > 700 * 700)) continue;
      std::vector<T> o2, o3, o;
      std::vector<float> l2, l3, l;
      all_ok &= Check(c, true, &o2, &l2);
      g_stages = 3;
      all_ok &= Check(c, true, &o3, &l3);
      g_stages = 2;
      g_diag = 3;  // 176-key tiles (a correct variant, unlike 1 and 2)
      all_ok &= Check(c, true);
      g_diag = 0;
      // Persistent: one CTA per SM (the launch the library would make), 3 CTAs and 1 CTA (many blocks per CTA:
      // the K/V ring and the Q barriers wrap across blocks), against the reference and bitwise against the
      // one-CTA-per-block kernel of the same depth.
      for (const auto [stages, ctas] : {std::pair{3, 0}, std::pair{3, 3}, std::pair{2, 1}}) {
        g_stages = stages;
        g_persist = ctas;
        all_ok &= Check(c, true, &o, &l);
        all_ok &= stages == 3 ? SameBits(o, l, o3, l3) : SameBits(o, l, o2, l2);
      }
      g_persist = -1;
      g_stages = 2;
    }
  }
  // B=1 H=32: D=128 at N = 1024..16384 and D=64 at N = 4096, causal and full; then B=4 H=16 N=1024 causal, where
  // the causal tail of the last wave weighs most.
  std::vector<Case> bench_cases;
  for (int D : {128, 64})
    for (bool causal : {true, false})
      for (int N : {1024, 4096, 8192, 16384})
        if (D == 128 || N == 4096) bench_cases.push_back(Case{1, N, N, 32, 32, D, causal});
  for (int D : {128, 64}) bench_cases.push_back(Case{4, 1024, 1024, 16, 16, D, true});
  auto flops_of = [](const Case& c) { return (c.causal ? 2.0 : 4.0) * c.B * c.H * double(c.T) * c.S * c.D; };
  if (!std::strcmp(mode, "persist")) {
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (const Case& c : bench_cases) {
      g_stages = 3;
      const double t93 = TimeMs(c, true);
      g_persist = 0;
      const double tp = TimeMs(c, true);
      g_persist = -1;
      // What the library's dispatch (attention_cuda.cu) would launch for this shape on this device.
      const AttentionParams p = MakeParams<T>(c);
      const int64_t blocks = (c.T + 127) / 128 * int64_t{c.B} * c.H;
      std::printf(
          "persist B=%d H=%d D=%d N=%5d causal=%d: sm90 3-stage %6.1f TF/s | persistent %6.1f TF/s (%.3fx) | %lld "
          "blocks, %d SMs: rule picks %s\n",
          c.B, c.H, c.D, c.T, c.causal, flops_of(c) / t93 / 1e9, flops_of(c) / tp / 1e9, t93 / tp, (long long)blocks,
          sms, Sm90FwdUsePersistent(p, sms) ? "persistent" : "one CTA per block");
    }
    g_stages = 2;
  }
  if (!std::strcmp(mode, "bench") || !std::strcmp(mode, "all")) {
    for (const Case& c : bench_cases) {
      const int D = c.D, N = c.T;
      const bool causal = c.causal;
      const double flops = flops_of(c);
      // The Hopper kernel with (stages, kDiag, persistent CTAs) as given.
      auto hopper_ms = [&](int stages, int diag, int persist) {
        g_stages = stages, g_diag = diag, g_persist = persist;
        const double ms = TimeMs(c, true);
        g_stages = 2, g_diag = 0, g_persist = -1;
        return ms;
      };
      const double t80 = TimeMs(c, false);
      const double t90 = hopper_ms(2, 0, -1);
      const double t93 = hopper_ms(3, 0, -1);
      const double t_noload = hopper_ms(3, 1, -1);
      const double t_nosoftmax = hopper_ms(3, 2, -1);
      const double t176 = hopper_ms(3, 3, -1);  // kDiag 3 selects the 2-stage 176-key tiles
      const double tp = hopper_ms(3, 0, 0);     // one CTA per SM
      // The kMods variant on the same shape with a mask, a bias, both (its own data: mods-free flops).
      double t_mods[3];
      for (int m = 1; m <= 3; ++m) {
        Case cm = c;
        cm.mods = m;
        t_mods[m - 1] = TimeMs(cm, true);
      }
      std::printf(
          "bench B=%d H=%d D=%d N=%5d causal=%d: sm80 %6.1f TF/s | sm90 2-stage %6.1f | 3-stage %6.1f | 3-stage "
          "without K/V loads %6.1f | 3-stage without softmax %6.1f | 2-stage 176-key tiles %6.1f | persistent "
          "3-stage %6.1f | mask %6.1f | bias %6.1f | mask+bias %6.1f TF/s\n",
          c.B, c.H, D, N, causal, flops / t80 / 1e9, flops / t90 / 1e9, flops / t93 / 1e9, flops / t_noload / 1e9,
          flops / t_nosoftmax / 1e9, flops / t176 / 1e9, flops / tp / 1e9, flops / t_mods[0] / 1e9,
          flops / t_mods[1] / 1e9, flops / t_mods[2] / 1e9);
    }
  }
  std::printf(all_ok ? "ALL OK\n" : "SOME FAILED\n");
  return all_ok ? 0 : 1;
}
