// The Hopper GEMM's __nv_bfloat16 instantiations (gemm_sm90_impl.cuh; dispatched from gemm_sm90.cu).
#include "gemm/gemm_sm90_impl.cuh"

namespace jax_ops::gemm {
template cudaError_t LaunchSm90Types<__nv_bfloat16, __nv_bfloat16>(const KernelArgs&, int, cudaStream_t);
}  // namespace jax_ops::gemm
