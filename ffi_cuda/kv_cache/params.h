// FFI contract of the kv_cache family, shared by the CPU twin (kv_cache_cpu.cc) and the CUDA handlers
// (kv_cache_cuda.cu); the bindings are in bindings.h.
//
// Targets (same names for "cpu" and "CUDA"):
//
//   jax_ops_kv_cache_append
//     args   k_pages, v_pages [P, page, Hkv, D]   f16, bf16 or f32 (stored as given), or f8e4m3fn (quantised)
//            k_scales, v_scales [P, Hkv]          f32 with f8e4m3fn pages (element (p, r, h, d) means
//                                                 pages[p, r, h, d] * scales[p, h]), else 0 elements
//            block_table      [B, max_pages]      s32: page id of each request's slot, -1 (or anything outside
//                                                 [0, P)) for a slot with no page
//            lengths          [B]                 s32: tokens each request holds
//            k_new, v_new     [B, T, Hkv, D]      the new tokens, written at positions lengths[b] + t: the pages'
//                                                 dtype, or f16 / bf16 / f32 over f8e4m3fn pages
//     rets   k_pages, v_pages, k_scales, v_scales (aliased to args 0-3: only what the new tokens touch is
//            written, the rest is kept), lengths [B] s32 (lengths + T where written), status [B] s32 (kStatusOk or
//            kStatusPastAllocatedPages: a request whose chunk reaches a slot >= max_pages or without a page in
//            range writes nothing and keeps its length)
//     f8e4m3fn: per (request, page the chunk writes, kv head): scale = max(old, Fp8Scale(amax(new rows))) where
//            old is the page's scale when the write starts past its row 0, else 0; when scale > old the page's
//            rows before the write are re-scaled to it; a value x is stored as FloatToE4m3fn(x / scale) (0 when
//            scale is 0 or not finite). Scales are powers of two, so every step but the final rounding is exact
//            and all implementations store the same bytes. amax propagates NaN: a NaN (or inf) scale stores
//            zeros, and every query that sees the page reads NaN.
//
//   jax_ops_kv_cache_decode
//     args   q [B, T, Hq, D] (the pages' dtype, or f16 / bf16 / f32 over f8e4m3fn pages), k_pages, v_pages,
//            k_scales, v_scales, block_table, lengths as above
//     attrs  scale (f32), softcap (f32; 0 = none), splits (s64, >= 1),
//            tma_load (bool: CUDA loads key tiles with the TMA engine where it applies; the twin ignores it),
//            merge_in_kernel (bool, splits in [2, kMaxKernelMergeSplits]: the kernel merges the splits itself)
//     rets   o        [B, T, Hq, D] q dtype when splits == 1 or merge_in_kernel, else 0 elements
//            o_parts  [splits, B, T, Hq, D] f32 when splits > 1 and not merge_in_kernel, else 0 elements
//            lse_parts [splits, B, T, Hq] f32 likewise
//
// Decode math: with L = lengths[b] clamped to [0, max_pages * page], query t sits at position L - T + t and sees
// the keys s < L with s <= L - T + t (causal within the chunk); query head h reads kv head h / (Hq / Hkv) (GQA by
// index mapping). Token s of request b is row s % page of page block_table[b, s / page] (a used slot's entry
// outside [0, P) is clamped into it; Python rejects such tables outside jit), dequantised by its page's scale for
// f8e4m3fn pages. logit = scale * q.k, then
// softcap * tanh(logit / softcap) when softcap > 0; fp32 softmax state. A query with no visible key gets o = 0.
// Split s of request b covers the keys [s * chunk, (s + 1) * chunk) with chunk = SplitChunk(L, splits): o_parts
// is each split's normalised output and lse_parts its natural-log sum of exp (-inf and o_parts 0 for a split with
// no visible key); Python merges them by log-sum-exp (the attention family's merge), or the kernel does when
// merge_in_kernel (CUDA: the splits of a query block run as one thread-block cluster; the twin computes o unsplit).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/ffi_helpers.h"

namespace jax_ops::kv_cache {

inline constexpr int32_t kStatusOk = 0;
inline constexpr int32_t kStatusPastAllocatedPages = 1;
inline constexpr int64_t kMaxKernelMergeSplits = 8;  // the CUDA cluster merge: the portable cluster size

// Head dims of the CUDA decode kernel (f16 / bf16 queries over pages of their dtype or f8e4m3fn); other inputs run
// the jnp path (Python says why).
inline constexpr int64_t kCudaDecodeHeadDims[] = {64, 128, 256};
inline constexpr const char* kCudaDTypeNames[] = {"float16", "bfloat16"};

// Keys per split are a multiple of this (the CUDA decode kernel's key tile), so splits never share a tile.
inline constexpr int64_t kSplitKeyAlign = 64;

#if defined(__CUDACC__)
#define JAX_OPS_KV_HD __host__ __device__
#else
#define JAX_OPS_KV_HD
#endif

// The scale of a (page, kv head) whose largest magnitude is `amax`: the smallest power of two p with
// amax <= 448 p (448: the largest finite e4m3), so amax / p lands in (224, 448]; p kept in [2^-126, 2^118] (a
// normal float whose 448 multiple is finite); 0 for amax 0, amax itself when it is NaN or infinite.
JAX_OPS_KV_HD inline float Fp8Scale(float amax) {
  if (!(amax > 0.f) || amax > 3.4028235e38f) return amax;
  int k = 0;
  const float m = frexpf(amax, &k);  // amax = m 2^k, m in [0.5, 1); 448 = 0.875 2^9
  const int j = m <= 0.875f ? k - 9 : k - 8;
  return ldexpf(1.f, j < -126 ? -126 : j > 118 ? 118 : j);
}

// 1 / scale for a power-of-two scale from Fp8Scale, by its exponent bits (exact); 0 when the scale is 0 or not
// finite (nothing is stored then).
JAX_OPS_KV_HD inline float InverseFp8Scale(float scale) {
  if (!(scale > 0.f) || scale > 3.4028235e38f) return 0.f;
  uint32_t bits = 0;
  memcpy(&bits, &scale, 4);
  bits = (254u << 23) - bits;
  float inv = 0.f;
  memcpy(&inv, &bits, 4);
  return inv;
}

// Keys per split of a request holding `length` tokens: ceil(length / splits) rounded up to kSplitKeyAlign.
JAX_OPS_KV_HD inline int64_t SplitChunk(int64_t length, int64_t splits) {
  const int64_t per = (length + splits - 1) / splits;
  return (per + kSplitKeyAlign - 1) / kSplitKeyAlign * kSplitKeyAlign;
}

// The checked sizes of one call.
struct Shape {
  int64_t num_pages = 0, page_size = 0, num_kv_heads = 0, head_dim = 0;
  int64_t batch = 0, max_pages = 0;
  int64_t tokens = 0;       // T: new tokens per request (append) or query tokens per request (decode)
  int64_t num_q_heads = 0;  // decode only
  ffi::DataType page_dtype{};
  ffi::DataType dtype{};  // of the tokens (append) or queries (decode)
  JAX_OPS_KV_HD bool quantized() const { return page_dtype == ffi::DataType::F8E4M3FN; }
  JAX_OPS_KV_HD int64_t group() const { return num_q_heads / num_kv_heads; }
  JAX_OPS_KV_HD int64_t capacity() const { return max_pages * page_size; }
  // Element offset of (page, row, head) in a page pool.
  JAX_OPS_KV_HD int64_t PageOffset(int64_t page, int64_t row, int64_t head) const {
    return ((page * page_size + row) * num_kv_heads + head) * head_dim;
  }
};

// Token and query dtypes, and the page dtypes stored as they are.
inline bool SupportedDType(ffi::DataType dt) {
  return dt == ffi::DataType::F16 || dt == ffi::DataType::BF16 || dt == ffi::DataType::F32;
}

// Pools, scales, table and lengths: shapes, dtypes, and that both pools agree.
inline ffi::Error CheckCache(const ffi::AnyBuffer& k_pages, const ffi::AnyBuffer& v_pages,
                             const ffi::AnyBuffer& k_scales, const ffi::AnyBuffer& v_scales,
                             const ffi::AnyBuffer& block_table, const ffi::AnyBuffer& lengths, Shape& s) {
  const auto kd = k_pages.dimensions();
  JAX_OPS_CHECK_ARG(kd.size() == 4, "k_pages must be [P, page, Hkv, D], got " << ShapeString(kd));
  JAX_OPS_RETURN_IF_ERROR(CheckSameShape(k_pages, "k_pages", v_pages, "v_pages"));
  s.page_dtype = k_pages.element_type();
  JAX_OPS_CHECK_ARG(SupportedDType(s.page_dtype) || s.quantized(),
                    "k_pages has dtype " << DTypeName(s.page_dtype) << ": float16, bfloat16, float32 or float8_e4m3fn");
  s.num_pages = kd[0], s.page_size = kd[1], s.num_kv_heads = kd[2], s.head_dim = kd[3];
  JAX_OPS_CHECK_ARG(s.page_size > 0 && s.num_kv_heads > 0 && s.head_dim > 0, "k_pages has an empty dimension");
  const int64_t scale_count = s.quantized() ? s.num_pages * s.num_kv_heads : 0;
  for (const auto* scales : {&k_scales, &v_scales})
    JAX_OPS_CHECK_ARG(static_cast<int64_t>(scales->element_count()) == scale_count &&
                          scales->element_type() == ffi::DataType::F32 &&
                          (!s.quantized() || scales->dimensions().size() == 2),
                      (scales == &k_scales ? "k_scales" : "v_scales")
                          << " must be [P, Hkv] = [" << s.num_pages << ", " << s.num_kv_heads
                          << "] float32 with float8_e4m3fn pages, else 0 elements; got "
                          << ShapeString(scales->dimensions()) << " " << DTypeName(scales->element_type()));
  const auto td = block_table.dimensions();
  JAX_OPS_CHECK_ARG(td.size() == 2 && block_table.element_type() == ffi::DataType::S32,
                    "block_table must be [B, max_pages] int32, got " << ShapeString(td) << " "
                                                                     << DTypeName(block_table.element_type()));
  s.batch = td[0], s.max_pages = td[1];
  const auto ld = lengths.dimensions();
  JAX_OPS_CHECK_ARG(ld.size() == 1 && ld[0] == s.batch && lengths.element_type() == ffi::DataType::S32,
                    "lengths must be [" << s.batch << "] int32, got " << ShapeString(ld));
  return ffi::Error::Success();
}

// A [B, T, H, D] buffer of the pages' dtype (any of SupportedDType over f8e4m3fn pages); sets s.tokens and
// s.dtype, and returns H through `heads`.
inline ffi::Error CheckTokens(const ffi::AnyBuffer& x, const char* name, Shape& s, int64_t& heads) {
  const auto d = x.dimensions();
  JAX_OPS_CHECK_ARG(d.size() == 4 && d[0] == s.batch && d[3] == s.head_dim,
                    name << " must be [" << s.batch << ", T, H, " << s.head_dim << "], got " << ShapeString(d));
  JAX_OPS_CHECK_ARG(
      s.quantized() ? SupportedDType(x.element_type()) : x.element_type() == s.page_dtype,
      name << " is " << DTypeName(x.element_type()) << " but the pages are "
           << (s.quantized() ? "float8_e4m3fn (float16, bfloat16 or float32 tokens)" : DTypeName(s.page_dtype)));
  s.dtype = x.element_type();
  s.tokens = d[1];
  heads = d[2];
  return ffi::Error::Success();
}

inline ffi::Error CheckAppend(const ffi::AnyBuffer& k_pages, const ffi::AnyBuffer& v_pages,
                              const ffi::AnyBuffer& k_scales, const ffi::AnyBuffer& v_scales,
                              const ffi::AnyBuffer& block_table, const ffi::AnyBuffer& lengths,
                              const ffi::AnyBuffer& k_new, const ffi::AnyBuffer& v_new, Shape& s) {
  JAX_OPS_RETURN_IF_ERROR(CheckCache(k_pages, v_pages, k_scales, v_scales, block_table, lengths, s));
  int64_t heads = 0;
  JAX_OPS_RETURN_IF_ERROR(CheckTokens(k_new, "k_new", s, heads));
  JAX_OPS_CHECK_ARG(heads == s.num_kv_heads, "k_new has " << heads << " heads, the pages " << s.num_kv_heads);
  JAX_OPS_RETURN_IF_ERROR(CheckSameShape(k_new, "k_new", v_new, "v_new"));
  return ffi::Error::Success();
}

inline ffi::Error CheckDecode(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k_pages, const ffi::AnyBuffer& v_pages,
                              const ffi::AnyBuffer& k_scales, const ffi::AnyBuffer& v_scales,
                              const ffi::AnyBuffer& block_table, const ffi::AnyBuffer& lengths, int64_t splits,
                              bool merge_in_kernel, const ffi::AnyBuffer& o, const ffi::AnyBuffer& o_parts,
                              const ffi::AnyBuffer& lse_parts, Shape& s) {
  JAX_OPS_RETURN_IF_ERROR(CheckCache(k_pages, v_pages, k_scales, v_scales, block_table, lengths, s));
  JAX_OPS_RETURN_IF_ERROR(CheckTokens(q, "q", s, s.num_q_heads));
  JAX_OPS_CHECK_ARG(s.num_q_heads % s.num_kv_heads == 0,
                    "q's " << s.num_q_heads << " heads are not a multiple of the " << s.num_kv_heads << " kv heads");
  JAX_OPS_CHECK_ARG(splits >= 1, "splits must be >= 1, got " << splits);
  JAX_OPS_CHECK_ARG(!merge_in_kernel || (splits >= 2 && splits <= kMaxKernelMergeSplits),
                    "merge_in_kernel needs 2.." << kMaxKernelMergeSplits << " splits, got " << splits);
  const int64_t rows = s.batch * s.tokens * s.num_q_heads;
  const bool split = splits > 1 && !merge_in_kernel;  // partial outputs for Python to merge
  JAX_OPS_CHECK_ARG(
      static_cast<int64_t>(o.element_count()) == (split ? 0 : rows * s.head_dim) && o.element_type() == s.dtype,
      "o must be q's shape and dtype (0 elements when splits > 1 without merge_in_kernel)");
  JAX_OPS_CHECK_ARG(static_cast<int64_t>(o_parts.element_count()) == (split ? splits * rows * s.head_dim : 0) &&
                        o_parts.element_type() == ffi::DataType::F32,
                    "o_parts must be [splits, B, T, Hq, D] float32 (0 elements when o is written)");
  JAX_OPS_CHECK_ARG(static_cast<int64_t>(lse_parts.element_count()) == (split ? splits * rows : 0) &&
                        lse_parts.element_type() == ffi::DataType::F32,
                    "lse_parts must be [splits, B, T, Hq] float32 (0 elements when o is written)");
  return ffi::Error::Success();
}

}  // namespace jax_ops::kv_cache
