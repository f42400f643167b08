// CUDA FFI handlers of jax_ops_attention_fwd / _bwd: decode, validate (the contract's shared checks), dispatch on
// dtype and head dim (heuristics.h), launch. float32 and head dims the build does not instantiate
// (instantiations/support.h) have no CUDA kernel: the handler refuses them and jax_ops.dot_product_attention
// routes them to its documented fallback before lowering.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

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
                     static_cast<const bool*>(mask.untyped_data()),
                     static_cast<const int32_t*>(q_seqlen.untyped_data()),
                     static_cast<const int32_t*>(kv_seqlen.untyped_data()),
                     nullptr,
                     nullptr,
                     bias.element_type() == ffi::DataType::F32};
}

// Grid dims y/z carry heads and batches.
ffi::Error CheckGridLimits(const AttentionParams& p) {
  JAX_OPS_CHECK_ARG(
      p.num_heads <= 65535 && p.batch <= 65535,
      "the CUDA attention kernel supports up to 65535 heads and batches; got N=" << p.num_heads << " B=" << p.batch);
  return ffi::Error::Success();
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

template <typename T, bool kPersistent>
cudaError_t LaunchSm90Fwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr, int num_sms) {
  return p.head_dim == 64
             ? LaunchAttentionFwdSm90<T, 64, kSm90FwdStages, 0, 128, kPersistent>(stream, p, ptr, num_sms)
             : LaunchAttentionFwdSm90<T, 128, kSm90FwdStages, 0, 128, kPersistent>(stream, p, ptr, num_sms);
}

// The Hopper kernel where it applies (UseSm90Fwd), persistent or one CTA per block (FwdPersistent), else the
// portable mma.sync kernel. The Hopper launcher refuses before launching when the build has no sm_90a
// code or a TMA tensor map cannot be encoded (the persistent one also past 2^30 blocks, reachable only when
// forced): the next kernel in that order then runs instead.
template <typename T>
cudaError_t LaunchForHeadDim(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                             const DeviceProps& dev, bool portable, int64_t fwd_persistent) {
  if (UseSm90Fwd(p, dev.cc_major, dev.cc_minor, portable)) {
    const bool persistent = FwdPersistent(p, dev.sm_count, fwd_persistent);
    cudaError_t err = kSm90Refused;
    if (persistent) err = LaunchSm90Fwd<T, true>(stream, p, ptr, dev.sm_count);
    if (err == kSm90Refused) err = LaunchSm90Fwd<T, false>(stream, p, ptr, 0);
    if (err != kSm90Refused) return err;
  }
  switch (p.head_dim) {
#define JAX_OPS_CASE(D) \
  case D:               \
    return LaunchAttentionFwd<T, D>(stream, p, ptr);
    JAX_OPS_ATTENTION_FWD_HEAD_DIMS(JAX_OPS_CASE)
#undef JAX_OPS_CASE
    default:
      return cudaErrorInvalidValue;  // unreachable: checked by the handler
  }
}

ffi::Error AttentionFwdCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer bias, ffi::AnyBuffer mask, ffi::AnyBuffer q_seqlen, ffi::AnyBuffer kv_seqlen,
                            float scale, bool is_causal, int64_t window_left, int64_t window_right, bool has_bias,
                            bool has_mask, bool has_q_seqlen, bool has_kv_seqlen, bool portable, int64_t fwd_persistent,
                            ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse) {
  auto params = CheckAttentionArgs(q, k, v, bias, mask, q_seqlen, kv_seqlen, scale, is_causal, window_left,
                                   window_right, has_bias, has_mask, has_q_seqlen, has_kv_seqlen);
  if (params.has_error()) return params.error();
  const AttentionParams& p = *params;
  JAX_OPS_RETURN_IF_ERROR(CheckFwdOutputs(p, *o, *lse));
  const int64_t hd = p.head_dim;
  JAX_OPS_CHECK_ARG(FwdHeadDimSupported(hd),
                    "the CUDA attention kernel supports head dims " << DimsList(kFwdHeadDims) << "; got " << hd);
  JAX_OPS_RETURN_IF_ERROR(CheckGridLimits(p));
  auto dev = CurrentDeviceProps();
  if (dev.has_error()) return dev.error();
  FwdPointers ptr = InputPointers(q, k, v, bias, mask, q_seqlen, kv_seqlen);
  ptr.o = o->untyped_data();
  ptr.lse = static_cast<float*>(lse->untyped_data());
  return WithHalfType(p.dtype, [&](auto tag) {
    return LaunchForHeadDim<typename decltype(tag)::type>(stream, p, ptr, **dev, portable, fwd_persistent);
  });
}

// As the forward: the Hopper kernels where they apply (UseSm90Bwd) unless refused, else the portable ones.
template <typename T>
cudaError_t LaunchBwdForHeadDim(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                const BwdPointers& bp, const DeviceProps& dev, bool portable, int bwd_cluster) {
  if (UseSm90Bwd(p, dev.cc_major, dev.cc_minor, portable)) {
    const cudaError_t err = p.head_dim == 64
                                ? LaunchAttentionBwdSm90<T, 64>(stream, p, ptr, bp, bwd_cluster, dev.sm_count)
                                : LaunchAttentionBwdSm90<T, 128>(stream, p, ptr, bp, bwd_cluster, dev.sm_count);
    if (err != kSm90Refused) return err;
  }
  switch (p.head_dim) {
#define JAX_OPS_CASE(D) \
  case D:               \
    return LaunchAttentionBwd<T, D>(stream, p, ptr, bp);
    JAX_OPS_ATTENTION_BWD_HEAD_DIMS(JAX_OPS_CASE)
#undef JAX_OPS_CASE
    default:
      return cudaErrorInvalidValue;  // unreachable: checked by the handler
  }
}

// Backward: dq, dk, dv (no bias gradient: the handler refuses has_bias and jax_ops routes that case to the
// reference backward). dbias is the [1,1,1,1] f32 dummy and is written as 0, as the contract says.
ffi::Error AttentionBwdCuda(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v,
                            ffi::AnyBuffer bias, ffi::AnyBuffer mask, ffi::AnyBuffer q_seqlen, ffi::AnyBuffer kv_seqlen,
                            ffi::AnyBuffer o, ffi::AnyBuffer lse, ffi::AnyBuffer d_o, float scale, bool is_causal,
                            int64_t window_left, int64_t window_right, bool has_bias, bool has_mask, bool has_q_seqlen,
                            bool has_kv_seqlen, bool portable, int64_t bwd_cluster, ffi::Result<ffi::AnyBuffer> dq,
                            ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                            ffi::Result<ffi::AnyBuffer> dbias) {
  auto params = CheckAttentionArgs(q, k, v, bias, mask, q_seqlen, kv_seqlen, scale, is_causal, window_left,
                                   window_right, has_bias, has_mask, has_q_seqlen, has_kv_seqlen);
  if (params.has_error()) return params.error();
  const AttentionParams& p = *params;
  JAX_OPS_RETURN_IF_ERROR(CheckBwdBuffers(p, o, lse, d_o, *dq, *dk, *dv, *dbias));
  JAX_OPS_CHECK_ARG(!has_bias,
                    "the CUDA attention backward has no bias gradient (jax_ops uses the reference "
                    "backward when a bias is given)");
  const int64_t hd = p.head_dim;
  JAX_OPS_CHECK_ARG(BwdHeadDimSupported(hd),
                    "the CUDA attention backward supports head dims " << DimsList(kBwdHeadDims) << "; got " << hd);
  JAX_OPS_RETURN_IF_ERROR(CheckGridLimits(p));
  auto dev = CurrentDeviceProps();
  if (dev.has_error()) return dev.error();
  const FwdPointers ptr = InputPointers(q, k, v, bias, mask, q_seqlen, kv_seqlen);
  BwdPointers bp{o.untyped_data(),   static_cast<const float*>(lse.untyped_data()),
                 d_o.untyped_data(), dq->untyped_data(),
                 dk->untyped_data(), dv->untyped_data()};
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
