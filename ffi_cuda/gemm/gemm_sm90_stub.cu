// TEMPORARY (branch gemm-cuda only): stands in for the coordinator's gemm_sm90.cu so the module links; the Hopper
// kernel refuses every problem here. Delete this file and its sources.cmake line when gemm_sm90.cu lands.
#include "gemm/kernels.h"

namespace jax_ops::gemm {

bool Sm90Supports(const KernelArgs& args, int sm_major) { return false; }
cudaError_t LaunchSm90(const KernelArgs& args, int num_sms, cudaStream_t stream) { return cudaErrorNotSupported; }

}  // namespace jax_ops::gemm
