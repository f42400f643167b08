// CUDA FFI handlers of jax_ops_attention_fwd / _bwd: decode, validate (the contract's shared checks), dispatch on
// dtype and head dim (heuristics.h), launch. float32 and head dims the build does not instantiate
// (instantiations/support.h) have no CUDA kernel: the handler refuses them and jax_ops.dot_product_attention
// routes them to its documented fallback before lowering.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <type_traits>
#include <utility>

#include "attention/attention_kernels.h"
#include "attention/bindings.h"
#include "attention/heuristics.h"
#include "attention/params.h"
#include "common/cuda_helpers.h"
#include "common/dtype_traits.h"

namespace jax_ops::attention {
namespace {

// The forward inputs' device pointers (outputs left null for the caller to set).
FwdPointers InputPointers(const ffi::AnyBuffer& q, const ffi::AnyBuffer& k, const ffi::AnyBuffer& v,
                          const ffi::AnyBuffer& bias, const ffi::AnyBuffer& mask, const ffi::AnyBuffer& q_seqlen,
                          const ffi::AnyBuffer& kv_seqlen) {
  return FwdPointers{q.untyped_data(),
                     k.untyped_data(),
                     v.untyped_data(),
                     bias.untyped_data(),
                     static_cast<const uint32_t*>(mask.untyped_data()),
                     static_cast<const int32_t*>(q_seqlen.untyped_data()),
                     static_cast<const int32_t*>(kv_seqlen.untyped_data()),
                     nullptr,
                     nullptr,
                     bias.element_type() == ffi::DataType::F32};
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls launch(TypeTag<__half | __nv_bfloat16>) for the kernel's two dtypes; CUDA errors become ffi::Error.
template <typename Launch>
ffi::Error WithHalfType(ffi::DataType dtype, Launch&& launch) {
  return DispatchDType<ffi::DataType::F16, ffi::DataType::BF16>(
      dtype, "q (the CUDA attention kernel takes float16 or bfloat16)", [&](auto tag) -> ffi::Error {
        using T = typename CudaDType<decltype(tag)::value>::T;
        JAX_OPS_RETURN_IF_CUDA_ERROR(launch(TypeTag<T>{}));
        return ffi::Error::Success();
      });
}

// "32, 64, ..." for the handlers' messages.
template <size_t N>
std::string DimsList(const int64_t (&dims)[N]) {
  std::string out;
  for (int64_t d : dims) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return out;
}

// The CUDA handlers' checks beyond the contract: a head dim with a kernel (`supported`; `dims`, the instantiated
// ones, for the message, which names the kernel `what`), and the grid limits (grid dims y/z carry heads, batches).
template <size_t N>
ffi::Error CheckKernelFits(const AttentionParams& p, bool supported, const int64_t (&dims)[N], const char* what) {
  JAX_OPS_CHECK_ARG(
      supported, "the CUDA attention " << what << " supports head dims " << DimsList(dims) << "; got " << p.head_dim);
  JAX_OPS_CHECK_ARG(
      p.num_heads <= 65535 && p.batch <= 65535,
      "the CUDA attention kernel supports up to 65535 heads and batches; got N=" << p.num_heads << " B=" << p.batch);
  return ffi::Error::Success();
}

// Calls launch(std::integral_constant<int, D>) for d == D, one of kDims (the X-macro lists of
// instantiations/support.h); cudaErrorInvalidValue for any other d (the handlers check d first).
template <int... kDims, typename Launch>
cudaError_t WithHeadDim(std::integer_sequence<int, kDims...>, int64_t d, Launch&& launch) {
  cudaError_t err = cudaErrorInvalidValue;
  (void)((d == kDims && ((err = launch(std::integral_constant<int, kDims>{})), true)) || ...);
  return err;
}
#define JAX_OPS_COMMA_DIM(D) , D
using FwdHeadDims = std::integer_sequence<int JAX_OPS_ATTENTION_FWD_HEAD_DIMS(JAX_OPS_COMMA_DIM)>;
using BwdHeadDims = std::integer_sequence<int JAX_OPS_ATTENTION_BWD_HEAD_DIMS(JAX_OPS_COMMA_DIM)>;
using Sm90FwdHeadDims = std::integer_sequence<int JAX_OPS_ATTENTION_SM90_FWD_HEAD_DIMS(JAX_OPS_COMMA_DIM)>;
using Sm90BwdHeadDims = std::integer_sequence<int JAX_OPS_ATTENTION_SM90_BWD_HEAD_DIMS(JAX_OPS_COMMA_DIM)>;
#undef JAX_OPS_COMMA_DIM

template <typename T, bool kPersistent, bool kMods = false>
cudaError_t LaunchSm90Fwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr, int num_sms) {
  return WithHeadDim(Sm90FwdHeadDims{}, p.head_dim, [&](auto d) {
    return LaunchAttentionFwdSm90<T, decltype(d)::value, kSm90FwdStages, 0, 128, kPersistent, kMods>(stream, p, ptr,
                                                                                                     num_sms);
  });
}

// The Hopper kernel where it applies (UseSm90Fwd), persistent or one CTA per block (FwdPersistent), else the
// portable mma.sync kernel. The Hopper launcher refuses before launching when the build has no sm_90a
// code or a TMA tensor map cannot be encoded (the persistent one also past 2^30 blocks, reachable only when
// forced): the next kernel in that order then runs instead.
template <typename T>
cudaError_t LaunchForHeadDim(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                             const DeviceProps& dev, bool portable, int64_t fwd_persistent) {
  if (UseSm90Fwd(p, dev.cc_major, dev.cc_minor, portable)) {
    cudaError_t err = kSm90Refused;
    if (HasScoreMods(p)) {
      err = LaunchSm90Fwd<T, false, true>(stream, p, ptr, 0);
    } else {
      if (FwdPersistent(p, dev.sm_count, fwd_persistent)) err = LaunchSm90Fwd<T, true>(stream, p, ptr, dev.sm_count);
      if (err == kSm90Refused) err = LaunchSm90Fwd<T, false>(stream, p, ptr, 0);
    }
    if (err != kSm90Refused) return err;
  }
  return WithHeadDim(FwdHeadDims{}, p.head_dim,
                     [&](auto d) { return LaunchAttentionFwd<T, decltype(d)::value>(stream, p, ptr); });
}

ffi::Error AttentionFwdCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer bias, ffi::AnyBuffer mask, ffi::AnyBuffer q_seqlen, ffi::AnyBuffer kv_seqlen,
                            float scale, bool is_causal, int64_t window_left, int64_t window_right, bool has_bias,
                            bool has_mask, bool has_q_seqlen, bool has_kv_seqlen, bool portable, int64_t fwd_persistent,
                            ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse) {
  auto params = CheckFwdCall(q, k, v, bias, mask, q_seqlen, kv_seqlen, scale, is_causal, window_left, window_right,
                             has_bias, has_mask, has_q_seqlen, has_kv_seqlen, *o, *lse);
  if (params.has_error()) return params.error();
  const AttentionParams& p = *params;
  JAX_OPS_RETURN_IF_ERROR(CheckKernelFits(p, FwdHeadDimSupported(p.head_dim), kFwdHeadDims, "kernel"));
  auto dev = CurrentDeviceProps();
  if (dev.has_error()) return dev.error();
  FwdPointers ptr = InputPointers(q, k, v, bias, mask, q_seqlen, kv_seqlen);
  ptr.o = o->untyped_data();
  ptr.lse = static_cast<float*>(lse->untyped_data());
  return WithHalfType(p.dtype, [&](auto tag) {
    return LaunchForHeadDim<typename decltype(tag)::type>(stream, p, ptr, **dev, portable, fwd_persistent);
  });
}

// As the forward: the Hopper kernels where they apply (UseSm90Bwd) unless refused, else the portable ones. With a
// bias only the Hopper kernels (the portable ones compute no bias gradient): a refusal is the call's error.
template <typename T>
cudaError_t LaunchBwdForHeadDim(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                const BwdPointers& bp, const DeviceProps& dev, bool portable, int bwd_cluster) {
  if (UseSm90Bwd(p, dev.cc_major, dev.cc_minor, portable)) {
    const cudaError_t err = WithHeadDim(Sm90BwdHeadDims{}, p.head_dim, [&](auto d) {
      return LaunchAttentionBwdSm90<T, decltype(d)::value>(stream, p, ptr, bp, bwd_cluster, dev.sm_count);
    });
    if (err != kSm90Refused || p.has_bias) return err;
  }
  return WithHeadDim(BwdHeadDims{}, p.head_dim,
                     [&](auto d) { return LaunchAttentionBwd<T, decltype(d)::value>(stream, p, ptr, bp); });
}

// Backward: dq, dk, dv, and with a bias dbias as dS [B, N, T, S] f32 (the Hopper kernels only; jax_ops sums it over
// the bias's broadcast dims and routes the other bias cases to the reference backward). Without a bias dbias is
// the [1,1,1,1] f32 dummy, written as 0 as the contract says.
ffi::Error AttentionBwdCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer bias, ffi::AnyBuffer mask, ffi::AnyBuffer q_seqlen, ffi::AnyBuffer kv_seqlen,
                            ffi::AnyBuffer o, ffi::AnyBuffer lse, ffi::AnyBuffer d_o, float scale, bool is_causal,
                            int64_t window_left, int64_t window_right, bool has_bias, bool has_mask, bool has_q_seqlen,
                            bool has_kv_seqlen, bool portable, int64_t bwd_cluster, ffi::Result<ffi::AnyBuffer> dq,
                            ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                            ffi::Result<ffi::AnyBuffer> dbias) {
  auto params = CheckBwdCall(q, k, v, bias, mask, q_seqlen, kv_seqlen, o, lse, d_o, scale, is_causal, window_left,
                             window_right, has_bias, has_mask, has_q_seqlen, has_kv_seqlen, *dq, *dk, *dv, *dbias);
  if (params.has_error()) return params.error();
  const AttentionParams& p = *params;
  JAX_OPS_CHECK_ARG(!has_bias || p.dbias_full,
                    "the CUDA attention backward writes dbias as [B, N, T, S] float32 (dS; jax_ops sums it over the "
                    "bias's broadcast dims)");
  JAX_OPS_RETURN_IF_ERROR(CheckKernelFits(p, BwdHeadDimSupported(p.head_dim), kBwdHeadDims, "backward"));
  auto dev = CurrentDeviceProps();
  if (dev.has_error()) return dev.error();
  JAX_OPS_CHECK_ARG(!has_bias || UseSm90Bwd(p, (*dev)->cc_major, (*dev)->cc_minor, portable),
                    "the CUDA attention backward computes a bias gradient only in its Hopper (sm_90a) kernels, head "
                    "dims 64 and 128 (jax_ops uses the reference backward elsewhere)");
  const FwdPointers ptr = InputPointers(q, k, v, bias, mask, q_seqlen, kv_seqlen);
  BwdPointers bp{o.untyped_data(),
                 static_cast<const float*>(lse.untyped_data()),
                 d_o.untyped_data(),
                 dq->untyped_data(),
                 dk->untyped_data(),
                 dv->untyped_data(),
                 has_bias ? static_cast<float*>(dbias->untyped_data()) : nullptr};
  JAX_OPS_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(dbias->untyped_data(), 0, dbias->size_bytes(), stream));
  return WithHalfType(p.dtype, [&](auto tag) {
    return LaunchBwdForHeadDim<typename decltype(tag)::type>(stream, p, ptr, bp, **dev, portable,
                                                             static_cast<int>(bwd_cluster));
  });
}

}  // namespace
}  // namespace jax_ops::attention

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsAttentionFwdCuda, jax_ops::attention::AttentionFwdCuda,
                            JAX_OPS_ATTENTION_FWD_BINDING);

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsAttentionBwdCuda, jax_ops::attention::AttentionBwdCuda,
                            JAX_OPS_ATTENTION_BWD_BINDING);
