// The Hopper GEMM's entry points (kernels.h): which problems it runs and the dtype dispatch onto the
// instantiations of gemm_sm90_impl.cuh, compiled in the per-dtype translation units gemm_sm90_<dtype>.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "gemm/gemm_sm90_impl.cuh"
#include "gemm/kernels.h"

namespace jax_ops::gemm {

extern template cudaError_t LaunchSm90Types<__half, __half>(const KernelArgs&, int, cudaStream_t);
extern template cudaError_t LaunchSm90Types<__nv_bfloat16, __nv_bfloat16>(const KernelArgs&, int, cudaStream_t);
extern template cudaError_t LaunchSm90Types<__nv_fp8_e4m3, __nv_fp8_e4m3>(const KernelArgs&, int, cudaStream_t);
extern template cudaError_t LaunchSm90Types<__nv_fp8_e4m3, __nv_fp8_e5m2>(const KernelArgs&, int, cudaStream_t);
extern template cudaError_t LaunchSm90Types<__nv_fp8_e5m2, __nv_fp8_e4m3>(const KernelArgs&, int, cudaStream_t);
extern template cudaError_t LaunchSm90Types<__nv_fp8_e5m2, __nv_fp8_e5m2>(const KernelArgs&, int, cudaStream_t);
extern template cudaError_t LaunchSm90Types<int8_t, int8_t>(const KernelArgs&, int, cudaStream_t);

namespace {

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Whether this binary carries sm_90a code for the kernels (a build for other targets has empty bodies).
bool HasSm90Image() {
  static const bool has = KernelBinaryVersion(reinterpret_cast<const void*>(
                              &GemmSm90Kernel<__nv_bfloat16, __nv_bfloat16, false, WgmmaB::kMNMajor>)) >= 90;
  return has;
}

}  // namespace

bool Sm90Supports(const KernelArgs& args, int sm_major) {
  using ffi::DataType;
  if (sm_major != 9 || !HasSm90Image()) return false;
  if (args.transpose_a || args.tf32 || args.m <= 0 || args.n <= 0 || args.k <= 0) return false;
  const DataType at = args.a_dtype, bt = args.b_dtype;
  int elem = 0;
  if (Is16Bit(at) && bt == at) {
    elem = 2;
  } else if ((IsFp8(at) && IsFp8(bt)) || (at == DataType::S8 && bt == DataType::S8)) {
    elem = 1;
    if (!args.transpose_b) return false;  // 8-bit wgmma reads B K-major only: b must be [N, K]
  } else {
    return false;
  }
  const int64_t b_cols = args.gated == Gated::kPacked ? 2 * args.n : args.n;
  constexpr int64_t kMaxCoord = int64_t{1} << 31;  // TMA coordinates are int32
  if (args.m >= kMaxCoord || b_cols >= kMaxCoord || args.k >= kMaxCoord || args.batch >= kMaxCoord) return false;
  // TMA: 16-byte aligned bases and row strides.
  if ((args.k * elem) % 16 != 0) return false;
  if (!args.transpose_b && (b_cols * elem) % 16 != 0) return false;
  // A packed gated weight's up half starts N columns in: its TMA box start stays 16-byte aligned too.
  if (args.gated == Gated::kPacked && (args.n * elem) % 16 != 0) return false;
  if (!Aligned16(args.a) || !Aligned16(args.b) || (args.b_up && !Aligned16(args.b_up))) return false;
  return true;
}

cudaError_t LaunchSm90(const KernelArgs& args, int num_sms, cudaStream_t stream) {
  using ffi::DataType;
  const DataType at = args.a_dtype, bt = args.b_dtype;
  if (at == DataType::F16) return LaunchSm90Types<__half, __half>(args, num_sms, stream);
  if (at == DataType::BF16) return LaunchSm90Types<__nv_bfloat16, __nv_bfloat16>(args, num_sms, stream);
  if (at == DataType::S8) return LaunchSm90Types<int8_t, int8_t>(args, num_sms, stream);
  const bool a4 = at == DataType::F8E4M3FN, b4 = bt == DataType::F8E4M3FN;
  if (a4 && b4) return LaunchSm90Types<__nv_fp8_e4m3, __nv_fp8_e4m3>(args, num_sms, stream);
  if (a4) return LaunchSm90Types<__nv_fp8_e4m3, __nv_fp8_e5m2>(args, num_sms, stream);
  if (b4) return LaunchSm90Types<__nv_fp8_e5m2, __nv_fp8_e4m3>(args, num_sms, stream);
  return LaunchSm90Types<__nv_fp8_e5m2, __nv_fp8_e5m2>(args, num_sms, stream);
}

}  // namespace jax_ops::gemm
