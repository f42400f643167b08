// The Hopper GEMM's fp8 instantiations, every e4m3 / e5m2 pair (gemm_sm90_impl.cuh; dispatched from gemm_sm90.cu).
#include "gemm/gemm_sm90_impl.cuh"

namespace jax_ops::gemm {
template cudaError_t LaunchSm90Types<__nv_fp8_e4m3, __nv_fp8_e4m3>(const KernelArgs&, int, cudaStream_t);
template cudaError_t LaunchSm90Types<__nv_fp8_e4m3, __nv_fp8_e5m2>(const KernelArgs&, int, cudaStream_t);
template cudaError_t LaunchSm90Types<__nv_fp8_e5m2, __nv_fp8_e4m3>(const KernelArgs&, int, cudaStream_t);
template cudaError_t LaunchSm90Types<__nv_fp8_e5m2, __nv_fp8_e5m2>(const KernelArgs&, int, cudaStream_t);
}  // namespace jax_ops::gemm
