// FFI contract of the attention family, shared by the CPU twin (attention_cpu.cc) and the CUDA handlers
// (attention_cuda.cu); the bindings of the targets are in bindings.h.
//
// Targets (same names for "cpu" and "CUDA"):
//
//   jax_ops_attention_fwd
//     args   q        [B, T, N, D]      f16 | bf16 | f32
//            k, v     [B, S, K, D]      q's dtype; N % K == 0 (G = N / K query heads per kv head)
//            bias     [bB, bN, bT, bS]  q's dtype or f32; each dim 1 (broadcast) or full (B, N, T, S)
//            mask     [mB, mN, mT, W]   u32, the boolean mask bit-packed along the keys: key s of line (b, n, t) is
//                                       bit s % 32 of word s / 32; W = MaskWords(S) (whole 128-key groups, the
//                                       bits past S zero); mB, mN, mT each 1 (broadcast) or full; set = the key
//                                       takes part
//            q_seqlen [B]               s32: query rows t >= q_seqlen[b] are padding
//            kv_seqlen[B]               s32: keys s >= kv_seqlen[b] are padding
//     attrs  scale (f32), is_causal (bool), window_left, window_right (s64, -1 = unbounded),
//            has_bias, has_mask, has_q_seqlen, has_kv_seqlen (bool);
//            tuning (the knobs of jax_ops._src.attention.config; the CPU twin ignores them): portable (bool),
//            fwd_persistent (s64: 1 on, 0 off, -1 the rule)
//     rets   o   [B, T, N, D]  q's dtype
//            lse [B, N, T]     f32   natural-log sum of exp over the row's allowed logits
//
//   jax_ops_attention_bwd
//     args   q, k, v, bias, mask, q_seqlen, kv_seqlen (as above), o [B,T,N,D], lse [B,N,T] f32, do [B,T,N,D]
//     attrs  as the forward, but the tuning attributes are portable (bool) and bwd_cluster (s64: the GQA dK/dV
//            cluster size 1, 2 or 4; -1 the rule)
//     rets   dq [B,T,N,D], dk [B,S,K,D], dv [B,S,K,D] (q's dtype), dbias: the bias's shape and dtype (dS summed
//            over the bias's broadcast dims), or [B,N,T,S] f32 (dS itself, no sum: the only form the CUDA
//            backward writes; jax_ops sums it); when has_bias is false a [1,1,1,1] f32 dummy written as 0
//
// Absent optional inputs (has_* = false) are passed as dummy buffers: bias [1,1,1,1] f32, mask [1,1,1,1] u32,
// seq lengths [1] s32; the kernel must not read them. All buffers are dense row-major.
//
// Semantics (those of jax.nn.dot_product_attention, with one documented difference for empty rows):
//   logit[b,n,t,s] = scale * <q[b,t,n,:], k[b,s,n/G,:]> + bias[b%, n%, t%, s%]      (% = 0 on broadcast dims)
//   allowed(b,n,t,s) = bit s of mask[b%,n%,t%]                        (when has_mask)
//                      && t < q_seqlen[b] && s < kv_seqlen[b]         (when has_*_seqlen)
//                      && s <= t                                      (when is_causal: top-left aligned, as
//                                                                      jax.nn's tril(ones(T, S)) even if T != S)
//                      && s >= t - window_left && s <= t + window_right   (each side when >= 0)
//   p = softmax over the allowed s of logit;  o[b,t,n,:] = sum_s p * v[b,s,n/G,:];
//   lse[b,n,t] = log(sum over allowed s of exp(logit)).
//   Empty rows (no allowed key, or every allowed logit is -inf because of the bias): o = 0, lse = -inf, and
//   every gradient contribution of the row is 0. (jax.nn's XLA path instead averages V uniformly there, except
//   for padded query rows, which it zeroes too.) Never NaN from -inf - (-inf): kernels clamp the running max.
//   NaN / Inf inputs propagate as in jax.nn: a NaN or +inf allowed logit makes the row's o and lse NaN (empty
//   means sum of exp == 0, so a NaN sum is not empty), a -inf one drops the key; masked keys' k and bias are
//   never read (docs/attention.md, "NaN and Inf").
//   Math is fp32 (m, l, O accumulators, dS, dK/dV accumulation); outputs are rounded once to their dtype.
//
// Backward: P = exp(logit - lse) recomputed from q, k (and bias), masked before the exp;
//   dP = dO V^T;  delta[t] = rowsum(dO * O);  dS = P * (dP - delta);
//   dq = scale * dS K;  dk = scale * dS^T Q;  dv = P^T dO;  dbias = dS summed over the bias's broadcast dims.
//   GQA: kv head = n / G, never copies of K/V; dk/dv sum the G query heads of a group inside the kernel.
//
// Offsets are int64 (B*T*N*D can pass 2^31).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/ffi_helpers.h"

namespace jax_ops::attention {

// Head dims the contract supports (both platforms; a CUDA kernel may specialise on 64/128/256 and pad).
inline constexpr int64_t kMaxHeadDim = 256;

#ifdef __CUDACC__
#define JAX_OPS_ATTN_HD __host__ __device__
#else
#define JAX_OPS_ATTN_HD
#endif

// Element strides of a rank-4 broadcastable operand (bias, mask) against [B, N, T, S]: 0 on broadcast dims. The
// packed mask's are word strides of its lines (s = 0: a key is a bit of the line, MaskBit).
struct BroadcastStrides {
  int64_t b = 0, n = 0, t = 0, s = 0;
  JAX_OPS_ATTN_HD int64_t Offset(int64_t ib, int64_t in, int64_t it, int64_t is) const {
    return ib * b + in * n + it * t + is * s;
  }
};

// Words per line of the packed mask for S keys: whole groups of 128 keys (16-byte lines; a 128-key tile's four
// words always exist).
JAX_OPS_ATTN_HD inline int64_t MaskWords(int64_t seqlen_k) { return (seqlen_k + 127) / 128 * 4; }

// Key s of a packed mask line (`line` = the line's first word).
JAX_OPS_ATTN_HD inline bool MaskBit(const uint32_t* line, int64_t s) { return (line[s >> 5] >> (s & 31)) & 1u; }

struct AttentionParams {
  int64_t batch = 0;         // B
  int64_t seqlen_q = 0;      // T
  int64_t seqlen_k = 0;      // S
  int64_t num_heads = 0;     // N
  int64_t num_kv_heads = 0;  // K
  int64_t group = 1;         // G = N / K
  int64_t head_dim = 0;      // D

  // Dense strides (elements) of q/o/do/dq [B,T,N,D] and k/v/dk/dv [B,S,K,D]; lse [B,N,T].
  int64_t q_batch_stride = 0, q_row_stride = 0;  // T*N*D, N*D (head stride D)
  int64_t k_batch_stride = 0, k_row_stride = 0;  // S*K*D, K*D (head stride D)

  BroadcastStrides bias_strides, mask_strides;
  int64_t bias_dims[4] = {1, 1, 1, 1};  // [bB, bN, bT, bS]
  bool dbias_full = false;              // backward: dbias is [B, N, T, S] f32 (dS unsummed), not the bias's shape

  float scale = 1.f;
  bool is_causal = false;
  int64_t window_left = -1;   // -1: unbounded
  int64_t window_right = -1;  // -1: unbounded
  bool has_bias = false, has_mask = false, has_q_seqlen = false, has_kv_seqlen = false;

  ffi::DataType dtype = ffi::DataType::F32;       // q, k, v, o, do, dq, dk, dv
  ffi::DataType bias_dtype = ffi::DataType::F32;  // bias, dbias

  JAX_OPS_ATTN_HD int64_t QOffset(int64_t b, int64_t t, int64_t n) const {
    return b * q_batch_stride + t * q_row_stride + n * head_dim;
  }
  JAX_OPS_ATTN_HD int64_t KOffset(int64_t b, int64_t s, int64_t kh) const {
    return b * k_batch_stride + s * k_row_stride + kh * head_dim;
  }
  JAX_OPS_ATTN_HD int64_t LseOffset(int64_t b, int64_t n, int64_t t) const {
    return (b * num_heads + n) * seqlen_q + t;
  }
  // Element (b, n, t, s) of dbias: of [B, N, T, S] (dbias_full) or of the bias's shape.
  JAX_OPS_ATTN_HD int64_t DbiasOffset(int64_t b, int64_t n, int64_t t, int64_t s) const {
    return dbias_full ? LseOffset(b, n, t) * seqlen_k + s : bias_strides.Offset(b, n, t, s);
  }
};

// The keys [lo, hi) that the position-only rules (seq lengths, causal, window) allow for query row t of batch
// b; hi <= lo means an empty row. The boolean mask and -inf bias entries are applied per element on top.
// `q_len`/`kv_len` are q_seqlen[b]/kv_seqlen[b] (or T/S when absent). Kernels use it to skip whole tiles.
struct KeyRange {
  int64_t lo, hi;
};
JAX_OPS_ATTN_HD inline KeyRange AllowedKeys(const AttentionParams& p, int64_t t, int64_t q_len, int64_t kv_len) {
  int64_t lo = 0, hi = p.seqlen_k < kv_len ? p.seqlen_k : kv_len;
  if (t >= q_len) return {0, 0};
  if (p.is_causal && t + 1 < hi) hi = t + 1;
  if (p.window_right >= 0 && t + p.window_right + 1 < hi) hi = t + p.window_right + 1;
  if (p.window_left >= 0 && t - p.window_left > lo) lo = t - p.window_left;
  if (hi < lo) hi = lo;
  return {lo, hi};
}

// The keys of the query block [m0, m0 + rows): `any` = keys some row may see (AllowedKeys' lo and hi are
// nondecreasing in t, so the block's first and last live rows bound the union; empty when no row is live) and
// `all` = keys every row may see (empty unless every row is live). Tiles inside `all` skip the position test.
struct BlockKeyRanges {
  KeyRange any, all;
};
JAX_OPS_ATTN_HD inline BlockKeyRanges BlockKeys(const AttentionParams& p, int64_t m0, int64_t rows, int64_t q_len,
                                                int64_t kv_len) {
  const int64_t live_end = q_len < p.seqlen_q ? q_len : p.seqlen_q;
  const int64_t last = (m0 + rows < live_end ? m0 + rows : live_end) - 1;
  BlockKeyRanges r{{0, 0}, {0, 0}};
  if (last >= m0) r.any = {AllowedKeys(p, m0, q_len, kv_len).lo, AllowedKeys(p, last, q_len, kv_len).hi};
  if (last == m0 + rows - 1) r.all = {AllowedKeys(p, last, q_len, kv_len).lo, AllowedKeys(p, m0, q_len, kv_len).hi};
  return r;
}

// The tiles [lo, hi) of `block` keys that cover `keys` (none for an empty range).
struct TileRange {
  int lo, hi;
};
JAX_OPS_ATTN_HD inline TileRange KeyTiles(KeyRange keys, int64_t block) {
  if (keys.hi <= keys.lo) return {0, 0};
  return {static_cast<int>(keys.lo / block), static_cast<int>((keys.hi + block - 1) / block)};
}

namespace detail {

template <size_t R>
std::string Dims(const int64_t (&d)[R]) {
  return ShapeString(std::vector<int64_t>(d, d + R));
}

inline BroadcastStrides BroadcastStridesOf(ffi::Span<const int64_t> dims) {
  BroadcastStrides st;
  const int64_t s_s = 1, s_t = dims[3], s_n = dims[2] * dims[3], s_b = dims[1] * dims[2] * dims[3];
  st.b = dims[0] == 1 ? 0 : s_b;
  st.n = dims[1] == 1 ? 0 : s_n;
  st.t = dims[2] == 1 ? 0 : s_t;
  st.s = dims[3] == 1 ? 0 : s_s;
  return st;
}

inline ffi::Error CheckBroadcast4(const ffi::AnyBuffer& x, const char* name, const int64_t (&full)[4]) {
  auto d = x.dimensions();
  JAX_OPS_CHECK_ARG(d.size() == 4, name << " must have rank 4 [1|B, 1|N, 1|T, 1|S], got " << ShapeString(d));
  for (int i = 0; i < 4; ++i)
    JAX_OPS_CHECK_ARG(
        d[i] == 1 || d[i] == full[i],
        name << " has shape " << ShapeString(d) << ", which does not broadcast to [B, N, T, S] = " << Dims(full));
  return ffi::Error::Success();
}

inline ffi::Error CheckSeqlen(const ffi::AnyBuffer& x, const char* name, bool present, int64_t batch) {
  JAX_OPS_CHECK_ARG(x.element_type() == ffi::DataType::S32,
                    name << " must be int32, got " << DTypeName(x.element_type()));
  if (present)
    JAX_OPS_CHECK_ARG(x.dimensions().size() == 1 && x.dimensions()[0] == batch,
                      name << " must have shape [B] = [" << batch << "], got " << ShapeString(x.dimensions()));
  return ffi::Error::Success();
}

inline bool IsAttentionDType(ffi::DataType dt) {
  return dt == ffi::DataType::F16 || dt == ffi::DataType::BF16 || dt == ffi::DataType::F32;
}

}  // namespace detail

// Validates the forward inputs and attributes and fills the params. Both platforms call it first.
inline ffi::ErrorOr<AttentionParams> CheckAttentionArgs(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                                        const ffi::AnyBuffer& v, const ffi::AnyBuffer& bias,
                                                        const ffi::AnyBuffer& mask, const ffi::AnyBuffer& q_seqlen,
                                                        const ffi::AnyBuffer& kv_seqlen, float scale, bool is_causal,
                                                        int64_t window_left, int64_t window_right, bool has_bias,
                                                        bool has_mask, bool has_q_seqlen, bool has_kv_seqlen) {
  auto run = [&](AttentionParams& p) -> ffi::Error {
    auto qd = q.dimensions(), kd = k.dimensions();
    JAX_OPS_CHECK_ARG(qd.size() == 4, "q must have rank 4 [B, T, N, D], got " << ShapeString(qd));
    JAX_OPS_CHECK_ARG(kd.size() == 4, "k must have rank 4 [B, S, K, D], got " << ShapeString(kd));
    JAX_OPS_RETURN_IF_ERROR(CheckSameShape(v, "v", k, "k"));
    JAX_OPS_CHECK_ARG(detail::IsAttentionDType(q.element_type()),
                      "q has dtype " << DTypeName(q.element_type()) << "; supported: float16, bfloat16, float32");
    JAX_OPS_CHECK_ARG(k.element_type() == q.element_type(),
                      "k is " << DTypeName(k.element_type()) << " but q is " << DTypeName(q.element_type()));
    p.batch = qd[0];
    p.seqlen_q = qd[1];
    p.num_heads = qd[2];
    p.head_dim = qd[3];
    p.seqlen_k = kd[1];
    p.num_kv_heads = kd[2];
    JAX_OPS_CHECK_ARG(kd[0] == p.batch, "k has batch " << kd[0] << " but q has batch " << p.batch);
    JAX_OPS_CHECK_ARG(kd[3] == p.head_dim, "k has head dim " << kd[3] << " but q has head dim " << p.head_dim);
    JAX_OPS_CHECK_ARG(p.head_dim >= 1 && p.head_dim <= kMaxHeadDim,
                      "head dim " << p.head_dim << " is outside [1, " << kMaxHeadDim << "]");
    JAX_OPS_CHECK_ARG(p.num_kv_heads >= 1 && p.num_heads % p.num_kv_heads == 0,
                      "q has " << p.num_heads << " heads, not a multiple of k's " << p.num_kv_heads);
    p.group = p.num_heads / p.num_kv_heads;
    p.q_row_stride = p.num_heads * p.head_dim;
    p.q_batch_stride = p.seqlen_q * p.q_row_stride;
    p.k_row_stride = p.num_kv_heads * p.head_dim;
    p.k_batch_stride = p.seqlen_k * p.k_row_stride;

    const int64_t full[4] = {p.batch, p.num_heads, p.seqlen_q, p.seqlen_k};
    p.has_bias = has_bias;
    p.has_mask = has_mask;
    p.has_q_seqlen = has_q_seqlen;
    p.has_kv_seqlen = has_kv_seqlen;
    p.bias_dtype = bias.element_type();
    if (has_bias) {
      JAX_OPS_RETURN_IF_ERROR(detail::CheckBroadcast4(bias, "bias", full));
      JAX_OPS_CHECK_ARG(
          p.bias_dtype == q.element_type() || p.bias_dtype == ffi::DataType::F32,
          "bias must be float32 or q's dtype " << DTypeName(q.element_type()) << ", got " << DTypeName(p.bias_dtype));
      p.bias_strides = detail::BroadcastStridesOf(bias.dimensions());
      for (int i = 0; i < 4; ++i) p.bias_dims[i] = bias.dimensions()[i];
    }
    if (has_mask) {
      const int64_t words[4] = {p.batch, p.num_heads, p.seqlen_q, MaskWords(p.seqlen_k)};
      const auto md = mask.dimensions();
      JAX_OPS_CHECK_ARG(md.size() == 4 && md[3] == words[3], "mask (bit-packed) must have "
                                                                 << words[3] << " words per line for " << p.seqlen_k
                                                                 << " keys, [1|B, 1|N, 1|T, " << words[3] << "], got "
                                                                 << ShapeString(md));
      JAX_OPS_RETURN_IF_ERROR(detail::CheckBroadcast4(mask, "mask (bit-packed)", words));
      JAX_OPS_CHECK_ARG(mask.element_type() == ffi::DataType::U32,
                        "mask (bit-packed) must be uint32, got " << DTypeName(mask.element_type()));
      p.mask_strides = detail::BroadcastStridesOf(mask.dimensions());
      p.mask_strides.s = 0;
    }
    JAX_OPS_RETURN_IF_ERROR(detail::CheckSeqlen(q_seqlen, "q_seqlen", has_q_seqlen, p.batch));
    JAX_OPS_RETURN_IF_ERROR(detail::CheckSeqlen(kv_seqlen, "kv_seqlen", has_kv_seqlen, p.batch));
    JAX_OPS_CHECK_ARG(window_left >= -1 && window_right >= -1, "window sizes must be >= 0 or -1 (unbounded), got ("
                                                                   << window_left << ", " << window_right << ")");
    JAX_OPS_CHECK_ARG(std::isfinite(scale), "scale must be finite, got " << scale);
    p.scale = scale;
    p.is_causal = is_causal;
    p.window_left = window_left;
    p.window_right = window_right;
    p.dtype = q.element_type();
    return ffi::Error::Success();
  };
  AttentionParams p;
  ffi::Error e = run(p);
  if (!e.success()) return ffi::Unexpected(std::move(e));
  return p;
}

// Checks an output/extra buffer against an expected shape and dtype.
template <size_t R>
inline ffi::Error CheckBuffer(const ffi::AnyBuffer& x, const char* name, const int64_t (&dims)[R], ffi::DataType dt) {
  auto d = x.dimensions();
  bool ok = d.size() == R;
  for (size_t i = 0; ok && i < R; ++i) ok = d[i] == dims[i];
  JAX_OPS_CHECK_ARG(ok, name << " has shape " << ShapeString(d) << ", expected " << detail::Dims(dims));
  JAX_OPS_CHECK_ARG(x.element_type() == dt,
                    name << " has dtype " << DTypeName(x.element_type()) << ", expected " << DTypeName(dt));
  return ffi::Error::Success();
}

inline ffi::Error CheckFwdOutputs(const AttentionParams& p, const ffi::AnyBuffer& o, const ffi::AnyBuffer& lse) {
  const int64_t od[4] = {p.batch, p.seqlen_q, p.num_heads, p.head_dim};
  const int64_t ld[3] = {p.batch, p.num_heads, p.seqlen_q};
  JAX_OPS_RETURN_IF_ERROR(CheckBuffer(o, "o", od, p.dtype));
  return CheckBuffer(lse, "lse", ld, ffi::DataType::F32);
}

// o, lse, do (inputs) and dq, dk, dv, dbias (results) of the backward target; sets p.dbias_full from dbias's form.
inline ffi::Error CheckBwdBuffers(AttentionParams& p, const ffi::AnyBuffer& o, const ffi::AnyBuffer& lse,
                                  const ffi::AnyBuffer& d_o, const ffi::AnyBuffer& dq, const ffi::AnyBuffer& dk,
                                  const ffi::AnyBuffer& dv, const ffi::AnyBuffer& dbias) {
  JAX_OPS_RETURN_IF_ERROR(CheckFwdOutputs(p, o, lse));
  const int64_t qd[4] = {p.batch, p.seqlen_q, p.num_heads, p.head_dim};
  const int64_t kd[4] = {p.batch, p.seqlen_k, p.num_kv_heads, p.head_dim};
  JAX_OPS_RETURN_IF_ERROR(CheckBuffer(d_o, "do", qd, p.dtype));
  JAX_OPS_RETURN_IF_ERROR(CheckBuffer(dq, "dq", qd, p.dtype));
  JAX_OPS_RETURN_IF_ERROR(CheckBuffer(dk, "dk", kd, p.dtype));
  JAX_OPS_RETURN_IF_ERROR(CheckBuffer(dv, "dv", kd, p.dtype));
  if (!p.has_bias) return ffi::Error::Success();
  const int64_t full[4] = {p.batch, p.num_heads, p.seqlen_q, p.seqlen_k};
  const auto d = dbias.dimensions();
  p.dbias_full = dbias.element_type() == ffi::DataType::F32 && d.size() == 4 && d[0] == full[0] && d[1] == full[1] &&
                 d[2] == full[2] && d[3] == full[3];
  if (p.dbias_full) return ffi::Error::Success();  // a full f32 bias has both forms: the same values
  return CheckBuffer(dbias, "dbias (the bias's shape and dtype, or [B, N, T, S] float32)", p.bias_dims, p.bias_dtype);
}

namespace detail {
// `params`, or its error, or the error of check(*params).
template <typename Check>
ffi::ErrorOr<AttentionParams> Then(ffi::ErrorOr<AttentionParams> params, Check&& check) {
  if (params.has_error()) return params;
  ffi::Error e = check(*params);
  if (!e.success()) return ffi::Unexpected(std::move(e));
  return params;
}
}  // namespace detail

// Every handler's preamble (both platforms): the inputs and attributes (CheckAttentionArgs), then the forward
// target's outputs o and lse.
inline ffi::ErrorOr<AttentionParams> CheckFwdCall(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k,
                                                  const ffi::AnyBuffer& v, const ffi::AnyBuffer& bias,
                                                  const ffi::AnyBuffer& mask, const ffi::AnyBuffer& q_seqlen,
                                                  const ffi::AnyBuffer& kv_seqlen, float scale, bool is_causal,
                                                  int64_t window_left, int64_t window_right, bool has_bias,
                                                  bool has_mask, bool has_q_seqlen, bool has_kv_seqlen,
                                                  const ffi::AnyBuffer& o, const ffi::AnyBuffer& lse) {
  return detail::Then(CheckAttentionArgs(q, k, v, bias, mask, q_seqlen, kv_seqlen, scale, is_causal, window_left,
                                         window_right, has_bias, has_mask, has_q_seqlen, has_kv_seqlen),
                      [&](const AttentionParams& p) { return CheckFwdOutputs(p, o, lse); });
}

// The same for the backward target: then o, lse, do, dq, dk, dv and dbias (CheckBwdBuffers).
inline ffi::ErrorOr<AttentionParams> CheckBwdCall(
    const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v, const ffi::AnyBuffer& bias,
    const ffi::AnyBuffer& mask, const ffi::AnyBuffer& q_seqlen, const ffi::AnyBuffer& kv_seqlen,
    const ffi::AnyBuffer& o, const ffi::AnyBuffer& lse, const ffi::AnyBuffer& d_o, float scale, bool is_causal,
    int64_t window_left, int64_t window_right, bool has_bias, bool has_mask, bool has_q_seqlen, bool has_kv_seqlen,
    const ffi::AnyBuffer& dq, const ffi::AnyBuffer& dk, const ffi::AnyBuffer& dv, const ffi::AnyBuffer& dbias) {
  return detail::Then(CheckAttentionArgs(q, k, v, bias, mask, q_seqlen, kv_seqlen, scale, is_causal, window_left,
                                         window_right, has_bias, has_mask, has_q_seqlen, has_kv_seqlen),
                      [&](AttentionParams& p) { return CheckBwdBuffers(p, o, lse, d_o, dq, dk, dv, dbias); });
}

}  // namespace jax_ops::attention
