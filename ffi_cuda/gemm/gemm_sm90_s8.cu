// The Hopper GEMM's int8_t instantiations (gemm_sm90_impl.cuh; dispatched from gemm_sm90.cu).
#include "gemm/gemm_sm90_impl.cuh"

namespace jax_ops::gemm {
template cudaError_t LaunchSm90Types<int8_t, int8_t>(const KernelArgs&, int, cudaStream_t);
}  // namespace jax_ops::gemm
