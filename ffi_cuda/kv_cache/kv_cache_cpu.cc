// CPU twin of jax_ops_kv_cache_append and jax_ops_kv_cache_decode (contract in params.h): plain loops, the decode
// in double precision per (request, query token, query head, split). Single-threaded; written for contract tests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "common/dtype_traits.h"
#include "kv_cache/bindings.h"
#include "kv_cache/params.h"

namespace jax_ops::kv_cache {
namespace {

bool RequestFits(const Shape& s, const int32_t* table, int64_t length) {
  if (length < 0 || length + s.tokens > s.capacity()) return false;
  for (int64_t pos = length; pos < length + s.tokens; ++pos) {
    const int32_t page = table[pos / s.page_size];
    if (page < 0 || page >= s.num_pages) return false;
  }
  return true;
}

// max that returns NaN when either side is NaN (jnp.maximum's rule; std::fmax would drop it).
float NanMax(float a, float b) { return a != a || b != b ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b); }

// x stored as e4m3 under a power-of-two scale (params.h).
uint8_t Quantize(float x, float scale) { return FloatToE4m3fn(x * InverseFp8Scale(scale)); }

// One pool's float8 append for a request that fits (rules in params.h): per page the chunk writes and kv head,
// the new scale, the page's earlier rows re-quantised where it grew, then the new rows.
template <ffi::DataType DT>
void AppendQuantized(const Shape& s, const int32_t* table_row, int64_t length, const void* src_all, int64_t b,
                     uint8_t* pages, float* scales) {
  using Tr = CpuDType<DT>;
  const auto* src = static_cast<const typename Tr::T*>(src_all) + b * s.tokens * s.num_kv_heads * s.head_dim;
  const int64_t D = s.head_dim, end = length + s.tokens;
  for (int64_t slot = length / s.page_size; slot * s.page_size < end; ++slot) {
    const int64_t page = table_row[slot], base = slot * s.page_size;
    const int64_t r0 = std::max<int64_t>(length - base, 0), r1 = std::min<int64_t>(s.page_size, end - base);
    for (int64_t h = 0; h < s.num_kv_heads; ++h) {
      auto x = [&](int64_t r, int64_t d) {
        return float{Tr::Load(src[((base + r - length) * s.num_kv_heads + h) * D + d])};
      };
      float amax = 0.f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t d = 0; d < D; ++d) amax = NanMax(amax, std::fabs(x(r, d)));
      float& scale = scales[page * s.num_kv_heads + h];
      const float old = r0 > 0 ? scale : 0.f, grown = NanMax(old, Fp8Scale(amax));
      if (r0 > 0 && grown > old)
        for (int64_t r = 0; r < r0; ++r)
          for (int64_t d = 0; d < D; ++d) {
            uint8_t& v = pages[s.PageOffset(page, r, h) + d];
            v = Quantize(E4m3fnToFloat(v) * old, grown);  // exact but for values pushed below e4m3's range
          }
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t d = 0; d < D; ++d) pages[s.PageOffset(page, r, h) + d] = Quantize(x(r, d), grown);
      scale = grown;
    }
  }
}

ffi::Error AppendCpu(JAX_OPS_KV_APPEND_PARAMS) {
  Shape s;
  JAX_OPS_RETURN_IF_ERROR(CheckAppend(k_pages, v_pages, k_scales, v_scales, block_table, lengths, k_new, v_new, s));
  auto* k_out = static_cast<char*>(k_pages_out->untyped_data());
  auto* v_out = static_cast<char*>(v_pages_out->untyped_data());
  auto* ks_out = static_cast<float*>(k_scales_out->untyped_data());
  auto* vs_out = static_cast<float*>(v_scales_out->untyped_data());
  // The pools and scales are aliased in place (input_output_aliases); a caller that did not alias gets a copy.
  for (auto [out, in] :
       {std::pair{static_cast<void*>(k_out), &k_pages}, std::pair{static_cast<void*>(v_out), &v_pages},
        std::pair{static_cast<void*>(ks_out), &k_scales}, std::pair{static_cast<void*>(vs_out), &v_scales}})
    if (out != in->untyped_data() && in->size_bytes()) std::memcpy(out, in->untyped_data(), in->size_bytes());
  const auto* table = static_cast<const int32_t*>(block_table.untyped_data());
  const auto* len = static_cast<const int32_t*>(lengths.untyped_data());
  const auto* k_src = static_cast<const char*>(k_new.untyped_data());
  const auto* v_src = static_cast<const char*>(v_new.untyped_data());
  auto* len_out = static_cast<int32_t*>(lengths_out->untyped_data());
  auto* stat = static_cast<int32_t*>(status->untyped_data());
  const int64_t row_bytes = s.head_dim * static_cast<int64_t>(ffi::ByteWidth(s.dtype));
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* row = table + b * s.max_pages;
    const bool fits = RequestFits(s, row, len[b]);
    stat[b] = fits ? kStatusOk : kStatusPastAllocatedPages;
    len_out[b] = fits ? static_cast<int32_t>(len[b] + s.tokens) : len[b];
    if (!fits) continue;
    if (s.quantized()) {
      const ffi::Error err =
          DispatchDType<ffi::DataType::F16, ffi::DataType::BF16, ffi::DataType::F32>(s.dtype, "k_new", [&](auto tag) {
            constexpr ffi::DataType DT = decltype(tag)::value;
            AppendQuantized<DT>(s, row, len[b], k_src, b, reinterpret_cast<uint8_t*>(k_out), ks_out);
            AppendQuantized<DT>(s, row, len[b], v_src, b, reinterpret_cast<uint8_t*>(v_out), vs_out);
            return ffi::Error::Success();
          });
      if (err.failure()) return err;
      continue;
    }
    for (int64_t t = 0; t < s.tokens; ++t) {
      const int64_t pos = len[b] + t;
      for (int64_t h = 0; h < s.num_kv_heads; ++h) {
        const int64_t dst = s.PageOffset(row[pos / s.page_size], pos % s.page_size, h) / s.head_dim * row_bytes;
        const int64_t src = ((b * s.tokens + t) * s.num_kv_heads + h) * row_bytes;
        std::memcpy(k_out + dst, k_src + src, row_bytes);
        std::memcpy(v_out + dst, v_src + src, row_bytes);
      }
    }
  }
  return ffi::Error::Success();
}

// Queries of dtype DT over pages of dtype PageDT (DT, or f8e4m3fn with k_scales / v_scales).
template <ffi::DataType DT, ffi::DataType PageDT>
void DecodeTyped(const Shape& s, const ffi::AnyBuffer& q_buf, const ffi::AnyBuffer& k_buf, const ffi::AnyBuffer& v_buf,
                 const float* k_scales, const float* v_scales, const int32_t* table_all, const int32_t* lengths,
                 double scale, double softcap, int64_t splits, void* o_raw, float* o_parts, float* lse_parts) {
  using Tr = CpuDType<DT>;
  using PageTr = CpuDType<PageDT>;
  using T = typename Tr::T;
  using PageT = typename PageTr::T;
  const T* q = static_cast<const T*>(q_buf.untyped_data());
  const PageT* kp = static_cast<const PageT*>(k_buf.untyped_data());
  const PageT* vp = static_cast<const PageT*>(v_buf.untyped_data());
  auto page_scale = [&](const float* scales, int64_t page, int64_t head) {
    return s.quantized() ? double{scales[page * s.num_kv_heads + head]} : 1.0;
  };
  T* o = static_cast<T*>(o_raw);
  const int64_t D = s.head_dim, G = s.group();
  const int64_t rows_total = s.batch * s.tokens * s.num_q_heads;
  std::vector<double> logits, acc(D);
  for (int64_t b = 0; b < s.batch; ++b) {
    const int32_t* table = table_all + b * s.max_pages;
    const int64_t length = std::clamp<int64_t>(lengths[b], 0, s.capacity());
    const int64_t chunk = SplitChunk(length, splits);
    for (int64_t t = 0; t < s.tokens; ++t) {
      const int64_t visible = std::clamp<int64_t>(length - s.tokens + t + 1, 0, length);
      for (int64_t hq = 0; hq < s.num_q_heads; ++hq) {
        const int64_t kvh = hq / G, row = (b * s.tokens + t) * s.num_q_heads + hq;
        const T* qrow = q + row * D;
        for (int64_t split = 0; split < splits; ++split) {
          const int64_t lo = split * chunk, hi = std::min(visible, lo + chunk);
          logits.clear();
          double top = -std::numeric_limits<double>::infinity();
          for (int64_t key = lo; key < hi; ++key) {
            const int64_t page = std::clamp<int64_t>(table[key / s.page_size], 0, s.num_pages - 1);
            const PageT* krow = kp + s.PageOffset(page, key % s.page_size, kvh);
            double dot = 0.0;
            for (int64_t d = 0; d < D; ++d) dot += double{Tr::Load(qrow[d])} * double{PageTr::Load(krow[d])};
            double x = dot * page_scale(k_scales, page, kvh) * scale;
            if (softcap > 0.0) x = softcap * std::tanh(x / softcap);
            logits.push_back(x);
            top = std::fmax(top, x);
          }
          const double offset = std::isinf(top) && top < 0 ? 0.0 : top;
          std::fill(acc.begin(), acc.end(), 0.0);
          double total = 0.0;
          for (int64_t key = lo; key < hi; ++key) {
            const double p = std::exp(logits[key - lo] - offset);
            total += p;
            const int64_t page = std::clamp<int64_t>(table[key / s.page_size], 0, s.num_pages - 1);
            const PageT* vrow = vp + s.PageOffset(page, key % s.page_size, kvh);
            const double pv = p * page_scale(v_scales, page, kvh);
            for (int64_t d = 0; d < D; ++d) acc[d] += pv * double{PageTr::Load(vrow[d])};
          }
          const bool empty = total == 0.0;  // a NaN total is not empty: the NaN reaches o and lse
          if (splits == 1) {
            for (int64_t d = 0; d < D; ++d)
              o[row * D + d] = Tr::Store(static_cast<typename Tr::Acc>(empty ? 0.0 : acc[d] / total));
          } else {
            for (int64_t d = 0; d < D; ++d)
              o_parts[(split * rows_total + row) * D + d] = static_cast<float>(empty ? 0.0 : acc[d] / total);
            lse_parts[split * rows_total + row] =
                empty ? -std::numeric_limits<float>::infinity() : static_cast<float>(offset + std::log(total));
          }
        }
      }
    }
  }
}

ffi::Error DecodeCpu(JAX_OPS_KV_DECODE_PARAMS) {
  Shape s;
  JAX_OPS_RETURN_IF_ERROR(CheckDecode(q, k_pages, v_pages, k_scales, v_scales, block_table, lengths, splits,
                                      merge_in_kernel, *o, *o_parts, *lse_parts, s));
  (void)tma_load;                   // a CUDA load-path choice
  if (merge_in_kernel) splits = 1;  // the merged result: the unsplit softmax, in double as every split
  const auto* table = static_cast<const int32_t*>(block_table.untyped_data());
  const auto* len = static_cast<const int32_t*>(lengths.untyped_data());
  auto* parts = static_cast<float*>(o_parts->untyped_data());
  auto* lse = static_cast<float*>(lse_parts->untyped_data());
  const auto* ks = static_cast<const float*>(k_scales.untyped_data());
  const auto* vs = static_cast<const float*>(v_scales.untyped_data());
  return DispatchDType<ffi::DataType::F16, ffi::DataType::BF16, ffi::DataType::F32>(s.dtype, "q", [&](auto tag) {
    constexpr ffi::DataType DT = decltype(tag)::value;
    if (s.quantized())
      DecodeTyped<DT, ffi::DataType::F8E4M3FN>(s, q, k_pages, v_pages, ks, vs, table, len, scale, softcap, splits,
                                               o->untyped_data(), parts, lse);
    else
      DecodeTyped<DT, DT>(s, q, k_pages, v_pages, ks, vs, table, len, scale, softcap, splits, o->untyped_data(), parts,
                          lse);
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_ops::kv_cache

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsKvCacheAppendCpu, jax_ops::kv_cache::AppendCpu,
                              JAX_OPS_KV_APPEND_BINDING(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsKvCacheDecodeCpu, jax_ops::kv_cache::DecodeCpu,
                              JAX_OPS_KV_DECODE_BINDING(xla::ffi::Ffi::Bind()));
