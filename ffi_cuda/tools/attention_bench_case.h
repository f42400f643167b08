// What the standalone attention tools (attention_fwd_bench, attention_bwd_bench) share: one attention problem and
// its kernel parameters (dense [B, T|S, heads, D] layouts, scale 1/sqrt(D)), a hang watchdog, dtype conversions
// and a device-side random fill.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <type_traits>
#include <vector>

#include "attention/params.h"

struct Case {
  int B, T, S, H, K, D;
  bool causal;
  int64_t wl = -1, wr = -1;
  int q_len = -1, kv_len = -1;  // >= 0: seq lengths for every batch
  int mods = 0;  // bit 0: a boolean mask [B, 1, T, S] ([B, H, T, S] with bit 2); bit 1: a bias [1, H, T, S]
};

template <typename T>
constexpr xla::ffi::DataType DTypeOf() {
  return std::is_same_v<T, __half> ? xla::ffi::DataType::F16 : xla::ffi::DataType::BF16;
}

template <typename T>
jax_ops::attention::AttentionParams MakeParams(const Case& c) {
  jax_ops::attention::AttentionParams p;
  p.batch = c.B;
  p.seqlen_q = c.T;
  p.seqlen_k = c.S;
  p.num_heads = c.H;
  p.num_kv_heads = c.K;
  p.group = c.H / c.K;
  p.head_dim = c.D;
  p.q_row_stride = int64_t{c.H} * c.D;
  p.q_batch_stride = c.T * p.q_row_stride;
  p.k_row_stride = int64_t{c.K} * c.D;
  p.k_batch_stride = c.S * p.k_row_stride;
  p.scale = 1.f / std::sqrt(static_cast<float>(c.D));
  p.is_causal = c.causal;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.has_q_seqlen = c.q_len >= 0;
  p.has_kv_seqlen = c.kv_len >= 0;
  p.dtype = DTypeOf<T>();
  return p;
}

// The tools' mask ([B, 1, T, S] when Case::mods & 1): ~70 % of the keys, every key of query rows t % 7 == 3 masked
// (empty rows), all keys of the first 64 rows of batch 1 allowed (whole tiles true).
__host__ __device__ inline bool ToolMask(int b, int t, int s) {
  if (t % 7 == 3) return false;
  if (b == 1 && t < 64) return true;
  const uint32_t h = (uint32_t(b) * 73856093u) ^ (uint32_t(t) * 19349663u) ^ (uint32_t(s) * 83492791u);
  return (h >> 7) % 10 < 7;
}

// The case's mask at (b, n, t, s): ToolMask of (b, t, s), or with a per-head mask (Case::mods bit 2) of
// (b * H + n, t, s).
inline bool CaseMask(const Case& c, int b, int n, int t, int s) {
  return ToolMask((c.mods & 4) ? b * c.H + n : b, t, s);
}

// The case's mask as the contract takes it: [B, 1|H, T, MaskWords(S)] words, bit-packed along the keys.
inline std::vector<uint32_t> PackedCaseMask(const Case& c) {
  const int heads = (c.mods & 4) ? c.H : 1;
  const int64_t words = jax_ops::attention::MaskWords(c.S);
  std::vector<uint32_t> packed(size_t{1} * c.B * heads * c.T * words, 0u);
  for (int b = 0; b < c.B; ++b)
    for (int n = 0; n < heads; ++n)
      for (int t = 0; t < c.T; ++t)
        for (int s = 0; s < c.S; ++s)
          if (CaseMask(c, b, n, t, s))
            packed[((size_t{1} * b * heads + n) * c.T + t) * words + s / 32] |= 1u << (s % 32);
  return packed;
}

// MakeParams with the case's mask [B, 1|H, T, S] (packed: PackedCaseMask) and bias [1, H, T, S] (Case::mods).
template <typename T>
jax_ops::attention::AttentionParams ParamsOf(const Case& c) {
  jax_ops::attention::AttentionParams p = MakeParams<T>(c);
  p.has_mask = c.mods & 1;
  const int64_t mask_heads = (c.mods & 4) ? c.H : 1, words = jax_ops::attention::MaskWords(c.S);
  p.mask_strides = {mask_heads * c.T * words, (c.mods & 4) ? int64_t{c.T} * words : 0, words, 0};
  p.has_bias = c.mods & 2;
  p.bias_strides = {0, int64_t{c.T} * c.S, c.S, 1};
  p.bias_dtype = p.dtype;
  return p;
}

// A hung kernel (a barrier phase out of step) would hold the GPU: every step bumps this clock and a watchdog exits
// when one takes longer than $<env_var> seconds (default 20; more under compute-sanitizer).
inline std::atomic<int64_t> g_progress_ms{0};
inline const char* g_step = nullptr;
inline int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
inline void Progress(const char* step = nullptr) {
  g_step = step;
  g_progress_ms = NowMs();
}
inline void StartWatchdog(const char* env_var) {
  Progress();
  const char* env = std::getenv(env_var);
  const int limit_s = env ? std::atoi(env) : 20;
  std::thread([limit_s] {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (NowMs() - g_progress_ms.load() > 1000 * limit_s) {
        const char* step = g_step;
        if (step)
          std::printf("WATCHDOG: no progress for %d s in step '%s' (hang?)\n", limit_s, step);
        else
          std::printf("WATCHDOG: no progress for %d s (hang?)\n", limit_s);
        std::fflush(stdout);
        std::_Exit(3);
      }
    }
  }).detach();
}

template <typename T>
__host__ __device__ T FromF(float x) {
  if constexpr (std::is_same_v<T, __half>)
    return __float2half(x);
  else
    return __float2bfloat16(x);
}
template <typename T>
float ToF(T x) {
  if constexpr (std::is_same_v<T, __half>)
    return __half2float(x);
  else
    return __bfloat162float(x);
}

// Pseudo-normal fill on the device (sum of 4 hashed uniforms, variance 1): timing inputs without a host copy.
template <typename T>
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
    x[i] = FromF<T>(acc * 1.7320508f);
  }
}
