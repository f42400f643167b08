// One attention problem of the standalone tools (attention_fwd_bench, attention_bwd_bench) and its kernel
// parameters: dense [B, T|S, heads, D] layouts, scale 1/sqrt(D).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "attention/params.h"

struct Case {
  int B, T, S, H, K, D;
  bool causal;
  int64_t wl = -1, wr = -1;
  int q_len = -1, kv_len = -1;  // >= 0: seq lengths for every batch
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
