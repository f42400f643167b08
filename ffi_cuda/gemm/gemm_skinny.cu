// The skinny (decode) GEMM's 16-bit kernels and its entry points (kernel template and design: skinny_impl.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "gemm/heuristics.h"
#include "gemm/kernels.h"
#include "gemm/skinny.h"
#include "gemm/skinny_impl.cuh"

namespace jax_ops::gemm {

bool SkinnySupports(const KernelArgs& args) { return SkinnyRefusal(args) == nullptr; }

cudaError_t LaunchSkinnyWithSplit(const KernelArgs& p, int num_sms, int split, cudaStream_t stream, int* used_split) {
  if (!SkinnySupports(p)) return cudaErrorNotSupported;
  if (p.batch == 0 || p.m == 0 || p.n == 0) return cudaSuccess;
  switch (p.a_dtype) {
    case ffi::DataType::F16:
      return skinny::LaunchFor<__half, __half, 8>(p, num_sms, split, stream, used_split);
    case ffi::DataType::BF16:
      return skinny::LaunchFor<__nv_bfloat16, __nv_bfloat16, 8>(p, num_sms, split, stream, used_split);
    default:  // fp8 (SkinnyRefusal admits no other dtype)
      return skinny::LaunchFp8(p, num_sms, split, stream, used_split);
  }
}

cudaError_t LaunchSkinny(const KernelArgs& p, int num_sms, cudaStream_t stream) {
  return LaunchSkinnyWithSplit(p, num_sms, 0, stream, nullptr);
}

}  // namespace jax_ops::gemm
