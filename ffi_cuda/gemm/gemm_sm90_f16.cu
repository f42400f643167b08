// The Hopper GEMM's __half instantiations (gemm_sm90_impl.cuh; dispatched from gemm_sm90.cu).
#include "gemm/gemm_sm90_impl.cuh"

namespace jax_ops::gemm {
template cudaError_t LaunchSm90Types<__half, __half>(const KernelArgs&, int, cudaStream_t);
}  // namespace jax_ops::gemm
