// CPU twin of jax_ops_kv_cache_append and jax_ops_kv_cache_decode (contract in params.h): plain loops, the decode
// in double precision per (request, query token, query head, split). Single-threaded; written for contract tests.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

ffi::Error AppendCpu(JAX_OPS_KV_APPEND_PARAMS) {
  Shape s;
  JAX_OPS_RETURN_IF_ERROR(CheckAppend(k_pages, v_pages, block_table, lengths, k_new, v_new, s));
  auto* k_out = static_cast<char*>(k_pages_out->untyped_data());
  auto* v_out = static_cast<char*>(v_pages_out->untyped_data());
  // The pools are aliased in place (input_output_aliases); a caller that did not alias gets a copy first.
  if (k_out != k_pages.untyped_data()) std::memcpy(k_out, k_pages.untyped_data(), k_pages.size_bytes());
  if (v_out != v_pages.untyped_data()) std::memcpy(v_out, v_pages.untyped_data(), v_pages.size_bytes());
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

template <ffi::DataType DT>
void DecodeTyped(const Shape& s, const ffi::AnyBuffer& q_buf, const ffi::AnyBuffer& k_buf, const ffi::AnyBuffer& v_buf,
                 const int32_t* table_all, const int32_t* lengths, double scale, double softcap, int64_t splits,
                 void* o_raw, float* o_parts, float* lse_parts) {
  using Tr = CpuDType<DT>;
  using T = typename Tr::T;
  const T* q = static_cast<const T*>(q_buf.untyped_data());
  const T* kp = static_cast<const T*>(k_buf.untyped_data());
  const T* vp = static_cast<const T*>(v_buf.untyped_data());
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
            const T* krow = kp + s.PageOffset(page, key % s.page_size, kvh);
            double dot = 0.0;
            for (int64_t d = 0; d < D; ++d) dot += double{Tr::Load(qrow[d])} * double{Tr::Load(krow[d])};
            double x = dot * scale;
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
            const T* vrow = vp + s.PageOffset(page, key % s.page_size, kvh);
            for (int64_t d = 0; d < D; ++d) acc[d] += p * double{Tr::Load(vrow[d])};
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
  JAX_OPS_RETURN_IF_ERROR(
      CheckDecode(q, k_pages, v_pages, block_table, lengths, splits, merge_in_kernel, *o, *o_parts, *lse_parts, s));
  (void)tma_load;                   // a CUDA load-path choice
  if (merge_in_kernel) splits = 1;  // the merged result: the unsplit softmax, in double as every split
  const auto* table = static_cast<const int32_t*>(block_table.untyped_data());
  const auto* len = static_cast<const int32_t*>(lengths.untyped_data());
  auto* parts = static_cast<float*>(o_parts->untyped_data());
  auto* lse = static_cast<float*>(lse_parts->untyped_data());
  return DispatchDType<ffi::DataType::F16, ffi::DataType::BF16, ffi::DataType::F32>(s.dtype, "k_pages", [&](auto tag) {
    DecodeTyped<decltype(tag)::value>(s, q, k_pages, v_pages, table, len, scale, softcap, splits, o->untyped_data(),
                                      parts, lse);
    return ffi::Error::Success();
  });
}

}  // namespace
}  // namespace jax_ops::kv_cache

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsKvCacheAppendCpu, jax_ops::kv_cache::AppendCpu,
                              JAX_OPS_KV_APPEND_BINDING(xla::ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsKvCacheDecodeCpu, jax_ops::kv_cache::DecodeCpu,
                              JAX_OPS_KV_DECODE_BINDING(xla::ffi::Ffi::Bind()));
