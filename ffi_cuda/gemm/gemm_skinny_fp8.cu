// The skinny (decode) GEMM's fp8 kernels: e4m3fn / e5m2 weights and tokens in any pair, m16n8k32 mma (sm_89+; the
// launcher refuses older machine code), at most 16 rows (kernel template and design: skinny_impl.cuh).
#include <cuda_fp8.h>

#include "gemm/skinny_impl.cuh"

namespace jax_ops::gemm::skinny {

// Weights are b (the mma's A operand), tokens op(a) (its B operand).
cudaError_t LaunchFp8(const KernelArgs& p, int num_sms, int split, cudaStream_t stream, int* used_split) {
  const bool w_e4 = p.b_dtype == ffi::DataType::F8E4M3FN, x_e4 = p.a_dtype == ffi::DataType::F8E4M3FN;
  if (w_e4 && x_e4) return LaunchFor<__nv_fp8_e4m3, __nv_fp8_e4m3, 2>(p, num_sms, split, stream, used_split);
  if (w_e4) return LaunchFor<__nv_fp8_e4m3, __nv_fp8_e5m2, 2>(p, num_sms, split, stream, used_split);
  if (x_e4) return LaunchFor<__nv_fp8_e5m2, __nv_fp8_e4m3, 2>(p, num_sms, split, stream, used_split);
  return LaunchFor<__nv_fp8_e5m2, __nv_fp8_e5m2, 2>(p, num_sms, split, stream, used_split);
}

}  // namespace jax_ops::gemm::skinny
