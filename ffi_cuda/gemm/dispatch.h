// The CUDA handler's launch path after the contract checks, shared with the standalone harness
// (ffi_cuda/tools/gemm_bench.cu) so that it runs exactly what the library runs: fold a shared-weight batch into M,
// pick the kernel (heuristics.h), launch it. A launcher returns cudaErrorNotSupported when it refuses before
// launching anything (e.g. the skinny kernel's shared memory does not fit this device): the auto plan then runs the
// SIMT kernel, a forced plan reports the error.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_helpers.h"
#include "gemm/heuristics.h"
#include "gemm/kernels.h"

namespace jax_ops::gemm {

inline cudaError_t LaunchPlan(Plan plan, const KernelArgs& args, int num_sms, cudaStream_t stream) {
  switch (plan) {
    case Plan::kSm90:
      return LaunchSm90(args, num_sms, stream);
    case Plan::kSkinny:
      return LaunchSkinny(args, num_sms, stream);
    default:
      return LaunchSimt(args, stream);
  }
}

// Runs `args` (a problem with batch * m * n > 0) with the `requested` plan; *ran (when given) is the kernel launched.
inline ffi::Error Dispatch(KernelArgs args, Plan requested, int sm_major, int num_sms, cudaStream_t stream,
                           Plan* ran = nullptr) {
  FoldBatch(&args);
  Plan chosen = Plan::kSimt;
  JAX_OPS_RETURN_IF_ERROR(ChoosePlan(args, requested, sm_major, &chosen));
  cudaError_t err = LaunchPlan(chosen, args, num_sms, stream);
  if (err == cudaErrorNotSupported && requested == Plan::kAuto && chosen != Plan::kSimt) {
    chosen = Plan::kSimt;
    err = LaunchSimt(args, stream);
  }
  if (ran) *ran = chosen;
  JAX_OPS_RETURN_IF_CUDA_ERROR(err);
  return ffi::Error::Success();
}

}  // namespace jax_ops::gemm
