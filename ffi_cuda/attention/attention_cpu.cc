// CPU twin of the attention targets (contract in params.h): a blocked online-softmax forward and a
// recompute-P backward, fp32 math for every input dtype. Single-threaded and meant for correctness, not speed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/bindings.h"
#include "attention/params.h"
#include "common/dtype_traits.h"

namespace jax_ops::attention {
namespace {

constexpr int64_t kKeyTile = 64;  // keys per online-softmax step
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Whole buffer -> float vector, and back.
std::vector<float> ToFloat(const ffi::AnyBuffer& x) {
  const int64_t n = static_cast<int64_t>(x.element_count());
  std::vector<float> out(n);
  const void* p = x.untyped_data();
  switch (x.element_type()) {
    case ffi::DataType::F32:
      std::memcpy(out.data(), p, n * sizeof(float));
      break;
    case ffi::DataType::F16:
      for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(static_cast<const uint16_t*>(p)[i]);
      break;
    case ffi::DataType::BF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
      break;
    default:  // rejected by CheckAttentionArgs before we get here
      break;
  }
  return out;
}

void FromFloat(const std::vector<float>& x, ffi::AnyBuffer& out) {
  const int64_t n = static_cast<int64_t>(out.element_count());
  void* p = out.untyped_data();
  switch (out.element_type()) {
    case ffi::DataType::F32:
      std::memcpy(p, x.data(), n * sizeof(float));
      break;
    case ffi::DataType::F16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(p)[i] = FloatToHalf(x[i]);
      break;
    case ffi::DataType::BF16:
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(p)[i] = FloatToBf16(x[i]);
      break;
    default:
      break;
  }
}

float Dot(const float* a, const float* b, int64_t d) {
  float acc = 0.f;
  for (int64_t i = 0; i < d; ++i) acc += a[i] * b[i];
  return acc;
}

// Read-only views shared by forward and backward.
struct Inputs {
  const AttentionParams& p;
  std::vector<float> q, k, v, bias;
  const uint32_t* mask = nullptr;  // bit-packed along the keys (params.h)
  const int32_t* q_seqlen = nullptr;
  const int32_t* kv_seqlen = nullptr;

  Inputs(const AttentionParams& params, const ffi::AnyBuffer& qb, const ffi::AnyBuffer& kb, const ffi::AnyBuffer& vb,
         const ffi::AnyBuffer& biasb, const ffi::AnyBuffer& maskb, const ffi::AnyBuffer& qs, const ffi::AnyBuffer& kvs)
      : p(params), q(ToFloat(qb)), k(ToFloat(kb)), v(ToFloat(vb)) {
    if (p.has_bias) bias = ToFloat(biasb);
    if (p.has_mask) mask = static_cast<const uint32_t*>(maskb.untyped_data());
    if (p.has_q_seqlen) q_seqlen = static_cast<const int32_t*>(qs.untyped_data());
    if (p.has_kv_seqlen) kv_seqlen = static_cast<const int32_t*>(kvs.untyped_data());
  }

  KeyRange Keys(int64_t b, int64_t t) const {
    const int64_t q_len = q_seqlen ? q_seqlen[b] : p.seqlen_q;
    const int64_t kv_len = kv_seqlen ? kv_seqlen[b] : p.seqlen_k;
    return AllowedKeys(p, t, q_len, kv_len);
  }

  // The logit of (b, n, t, s) for s inside the row's KeyRange; -inf when the mask drops it.
  float Logit(int64_t b, int64_t n, int64_t t, int64_t s, const float* qrow) const {
    if (mask && !MaskBit(mask + p.mask_strides.Offset(b, n, t, 0), s)) return kNegInf;
    float x = p.scale * Dot(qrow, &k[p.KOffset(b, s, n / p.group)], p.head_dim);
    if (p.has_bias) x += bias[p.bias_strides.Offset(b, n, t, s)];
    return x;
  }
};

// ---------------------------------------------------------------- forward
ffi::Error AttentionFwdCpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer bias,
                           ffi::AnyBuffer mask, ffi::AnyBuffer q_seqlen, ffi::AnyBuffer kv_seqlen, float scale,
                           bool is_causal, int64_t window_left, int64_t window_right, bool has_bias, bool has_mask,
                           bool has_q_seqlen, bool has_kv_seqlen, bool /*portable*/, int64_t /*fwd_persistent*/,
                           ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse) {
  auto params = CheckFwdCall(q, k, v, bias, mask, q_seqlen, kv_seqlen, scale, is_causal, window_left, window_right,
                             has_bias, has_mask, has_q_seqlen, has_kv_seqlen, *o, *lse);
  if (params.has_error()) return params.error();
  const AttentionParams& p = *params;
  const Inputs in(p, q, k, v, bias, mask, q_seqlen, kv_seqlen);
  const int64_t D = p.head_dim;

  std::vector<float> out(static_cast<size_t>(o->element_count()), 0.f);
  float* lse_out = static_cast<float*>(lse->untyped_data());
  std::vector<float> acc(D), s_tile(kKeyTile);

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t n = 0; n < p.num_heads; ++n) {
      const int64_t kh = n / p.group;
      for (int64_t t = 0; t < p.seqlen_q; ++t) {
        const float* qrow = &in.q[p.QOffset(b, t, n)];
        const KeyRange r = in.Keys(b, t);
        float m = kNegInf, l = 0.f;  // running max and sum of exp(logit - m)
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t s0 = r.lo; s0 < r.hi; s0 += kKeyTile) {
          const int64_t len = std::min(kKeyTile, r.hi - s0);
          float m_tile = kNegInf;
          for (int64_t j = 0; j < len; ++j) {  // masked before the max
            s_tile[j] = in.Logit(b, n, t, s0 + j, qrow);
            m_tile = std::max(m_tile, s_tile[j]);
          }
          // std::max drops NaN logits from the max; their exp below is NaN, so l and the row stay NaN.
          const float m_new = std::max(m, m_tile);
          const float offset = m_new == kNegInf ? 0.f : m_new;  // nothing allowed yet: no exp(-inf - -inf)
          const float corr = std::exp(m - offset);              // m = -inf -> 0
          l *= corr;
          for (int64_t d = 0; d < D; ++d) acc[d] *= corr;
          for (int64_t j = 0; j < len; ++j) {
            const float pj = std::exp(s_tile[j] - offset);  // -inf -> 0
            if (pj == 0.f) continue;                        // masked keys: their v is never read
            l += pj;
            const float* vrow = &in.v[p.KOffset(b, s0 + j, kh)];
            for (int64_t d = 0; d < D; ++d) acc[d] += pj * vrow[d];
          }
          m = m_new;
        }
        float* orow = &out[p.QOffset(b, t, n)];
        if (l != 0.f) {  // a NaN l (NaN or +inf logit) is not empty: NaN reaches o and lse, as in jax.nn
          const float inv = 1.f / l;
          for (int64_t d = 0; d < D; ++d) orow[d] = acc[d] * inv;
          lse_out[p.LseOffset(b, n, t)] = m + std::log(l);
        } else {  // empty row: o = 0, lse = -inf
          lse_out[p.LseOffset(b, n, t)] = kNegInf;
        }
      }
    }
  }
  FromFloat(out, *o);
  return ffi::Error::Success();
}

// ---------------------------------------------------------------- backward
ffi::Error AttentionBwdCpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer bias,
                           ffi::AnyBuffer mask, ffi::AnyBuffer q_seqlen, ffi::AnyBuffer kv_seqlen, ffi::AnyBuffer o,
                           ffi::AnyBuffer lse, ffi::AnyBuffer d_o, float scale, bool is_causal, int64_t window_left,
                           int64_t window_right, bool has_bias, bool has_mask, bool has_q_seqlen, bool has_kv_seqlen,
                           bool /*portable*/, int64_t /*bwd_cluster*/, ffi::Result<ffi::AnyBuffer> dq,
                           ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                           ffi::Result<ffi::AnyBuffer> dbias) {
  auto params = CheckBwdCall(q, k, v, bias, mask, q_seqlen, kv_seqlen, o, lse, d_o, scale, is_causal, window_left,
                             window_right, has_bias, has_mask, has_q_seqlen, has_kv_seqlen, *dq, *dk, *dv, *dbias);
  if (params.has_error()) return params.error();
  const AttentionParams& p = *params;
  const Inputs in(p, q, k, v, bias, mask, q_seqlen, kv_seqlen);
  const std::vector<float> of = ToFloat(o), dof = ToFloat(d_o);
  const float* lse_in = static_cast<const float*>(lse.untyped_data());
  const int64_t D = p.head_dim;

  std::vector<float> dqf(in.q.size(), 0.f), dkf(in.k.size(), 0.f), dvf(in.v.size(), 0.f);
  std::vector<float> dbf(p.has_bias ? static_cast<size_t>(dbias->element_count()) : 0, 0.f);

  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t n = 0; n < p.num_heads; ++n) {
      const int64_t kh = n / p.group;  // dK/dV of the G heads of a group land in one kv head
      for (int64_t t = 0; t < p.seqlen_q; ++t) {
        const float row_lse = lse_in[p.LseOffset(b, n, t)];
        if (row_lse == kNegInf) continue;  // empty row: no gradient; a NaN lse makes the row's gradients NaN
        const KeyRange r = in.Keys(b, t);
        const int64_t qo = p.QOffset(b, t, n);
        const float* qrow = &in.q[qo];
        const float* dorow = &dof[qo];
        const float delta = Dot(dorow, &of[qo], D);  // rowsum(dO * O)
        float* dqrow = &dqf[qo];
        for (int64_t s = r.lo; s < r.hi; ++s) {
          const float x = in.Logit(b, n, t, s, qrow);
          if (x == kNegInf) continue;
          const float pr = std::exp(x - row_lse);
          const int64_t ko = p.KOffset(b, s, kh);
          const float dp = Dot(dorow, &in.v[ko], D);
          const float ds = pr * (dp - delta);
          const float sds = p.scale * ds;
          for (int64_t d = 0; d < D; ++d) {
            dqrow[d] += sds * in.k[ko + d];
            dkf[ko + d] += sds * qrow[d];
            dvf[ko + d] += pr * dorow[d];
          }
          if (p.has_bias) dbf[p.DbiasOffset(b, n, t, s)] += ds;
        }
      }
    }
  }
  FromFloat(dqf, *dq);
  FromFloat(dkf, *dk);
  FromFloat(dvf, *dv);
  if (p.has_bias) {
    FromFloat(dbf, *dbias);
  } else {
    std::memset(dbias->untyped_data(), 0, dbias->size_bytes());
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_ops::attention

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsAttentionFwdCpu, jax_ops::attention::AttentionFwdCpu,
                              JAX_OPS_ATTENTION_FWD_BINDING(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsAttentionBwdCpu, jax_ops::attention::AttentionBwdCpu,
                              JAX_OPS_ATTENTION_BWD_BINDING(xla::ffi::Ffi::Bind()));
