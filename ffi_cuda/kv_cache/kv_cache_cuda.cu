// CUDA FFI handlers of jax_ops_kv_cache_append and jax_ops_kv_cache_decode (contract in params.h): the contract
// checks, then the launchers of kernels.cu. Enqueues only (no allocation, no synchronisation): CUDA-graph
// compatible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#include "common/cuda_helpers.h"
#include "common/dtype_traits.h"
#include "kv_cache/bindings.h"
#include "kv_cache/kernels.h"
#include "kv_cache/params.h"

namespace jax_ops::kv_cache {
namespace {

ffi::Error AppendCuda(cudaStream_t stream, JAX_OPS_KV_APPEND_PARAMS) {
  Shape s;
  JAX_OPS_RETURN_IF_ERROR(CheckAppend(k_pages, v_pages, k_scales, v_scales, block_table, lengths, k_new, v_new, s));
  AppendArgs a;
  a.shape = s;
  a.elem_bytes = ffi::ByteWidth(s.dtype);
  a.k_pages = k_pages_out->untyped_data();
  a.v_pages = v_pages_out->untyped_data();
  a.k_scales = static_cast<float*>(k_scales_out->untyped_data());
  a.v_scales = static_cast<float*>(v_scales_out->untyped_data());
  // The pools and scales are aliased in place (input_output_aliases); a caller that did not alias gets a copy.
  for (auto [out, in] :
       {std::pair{static_cast<void*>(a.k_pages), &k_pages}, std::pair{static_cast<void*>(a.v_pages), &v_pages},
        std::pair{static_cast<void*>(a.k_scales), &k_scales}, std::pair{static_cast<void*>(a.v_scales), &v_scales}})
    if (out != in->untyped_data() && in->size_bytes())
      JAX_OPS_RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(out, in->untyped_data(), in->size_bytes(), cudaMemcpyDeviceToDevice, stream));
  a.block_table = static_cast<const int32_t*>(block_table.untyped_data());
  a.lengths = static_cast<const int32_t*>(lengths.untyped_data());
  a.k_new = k_new.untyped_data();
  a.v_new = v_new.untyped_data();
  a.lengths_out = static_cast<int32_t*>(lengths_out->untyped_data());
  a.status = static_cast<int32_t*>(status->untyped_data());
  JAX_OPS_RETURN_IF_CUDA_ERROR(LaunchAppend(stream, a));
  return ffi::Error::Success();
}

template <typename T, bool kFp8>
ffi::Error DecodeHeadDim(cudaStream_t stream, const DecodeArgs& a) {
  switch (a.shape.head_dim) {
    case 64:
      JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchDecode<T, 64, kFp8>(stream, a)));
      return ffi::Error::Success();
    case 128:
      JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchDecode<T, 128, kFp8>(stream, a)));
      return ffi::Error::Success();
    case 256:
      JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchDecode<T, 256, kFp8>(stream, a)));
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("the CUDA paged decode supports head dims 64, 128 and 256, not " +
                                         std::to_string(a.shape.head_dim));
  }
}

ffi::Error DecodeCuda(cudaStream_t stream, JAX_OPS_KV_DECODE_PARAMS) {
  Shape s;
  JAX_OPS_RETURN_IF_ERROR(CheckDecode(q, k_pages, v_pages, k_scales, v_scales, block_table, lengths, splits,
                                      merge_in_kernel, *o, *o_parts, *lse_parts, s));
  JAX_OPS_CHECK_ARG(s.capacity() + kSplitKeyAlign < (int64_t{1} << 31),
                    "the CUDA paged decode indexes keys in int32: max_pages * page_size = " << s.capacity());
  DecodeArgs a;
  a.shape = s;
  if ((s.page_size & (s.page_size - 1)) == 0)
    while ((int64_t{1} << (a.page_shift + 1)) <= s.page_size) ++a.page_shift;
  a.scale = scale;
  a.softcap = softcap;
  a.splits = splits;
  a.merge_in_cluster = merge_in_kernel;
  a.load = tma_load ? DecodeLoad::kTmaWhereItApplies : DecodeLoad::kCpAsync;
  a.q = q.untyped_data();
  a.k_pages = k_pages.untyped_data();
  a.v_pages = v_pages.untyped_data();
  a.k_scales = static_cast<const float*>(k_scales.untyped_data());
  a.v_scales = static_cast<const float*>(v_scales.untyped_data());
  a.block_table = static_cast<const int32_t*>(block_table.untyped_data());
  a.lengths = static_cast<const int32_t*>(lengths.untyped_data());
  a.o = o->untyped_data();
  a.o_parts = static_cast<float*>(o_parts->untyped_data());
  a.lse_parts = static_cast<float*>(lse_parts->untyped_data());
  return DispatchDType<ffi::DataType::F16, ffi::DataType::BF16>(s.dtype, "q", [&](auto tag) {
    using T = typename CudaDType<decltype(tag)::value>::T;
    return s.quantized() ? DecodeHeadDim<T, true>(stream, a) : DecodeHeadDim<T, false>(stream, a);
  });
}

}  // namespace
}  // namespace jax_ops::kv_cache

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsKvCacheAppendCuda, jax_ops::kv_cache::AppendCuda, JAX_OPS_KV_APPEND_BINDING);
JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsKvCacheDecodeCuda, jax_ops::kv_cache::DecodeCuda, JAX_OPS_KV_DECODE_BINDING);
