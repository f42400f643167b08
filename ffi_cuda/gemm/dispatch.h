// The CUDA handler's body, shared with the standalone harness (ffi_cuda/tools/gemm_bench.cu) so that it runs exactly
// what the library runs: check the problem (MakeProblem, as the CPU twin), flatten it into KernelArgs, fold a
// shared-weight batch into M, pick the kernel (heuristics.h), launch it. A launcher returns cudaErrorNotSupported when
// it refuses before launching anything (e.g. the skinny kernel's shared memory does not fit this device): the auto plan
// then runs the SIMT kernel, a forced plan reports the error.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_helpers.h"
#include "gemm/heuristics.h"
#include "gemm/kernels.h"
#include "gemm/params.h"

namespace jax_ops::gemm {

inline cudaError_t LaunchPlan(Plan plan, const KernelArgs& args, int num_sms, cudaStream_t stream) {
  switch (plan) {
    case Plan::kSm90:
      return LaunchSm90(args, num_sms, stream);
    case Plan::kSkinny:
      return LaunchSkinny(args, num_sms, stream);
    case Plan::kCublasLt:
      return cudaErrorNotSupported;  // not a kernel of ours: Dispatch calls RunCublasLt
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
  if (chosen == Plan::kCublasLt) {
    if (ran) *ran = chosen;
    return RunCublasLt(args, stream);
  }
  cudaError_t err = LaunchPlan(chosen, args, num_sms, stream);
  if (err == cudaErrorNotSupported && requested == Plan::kAuto && chosen != Plan::kSimt) {
    chosen = Plan::kSimt;
    err = LaunchSimt(args, stream);
  }
  if (ran) *ran = chosen;
  JAX_OPS_RETURN_IF_CUDA_ERROR(err);
  return ffi::Error::Success();
}

// jax_ops_gemm on `stream` (the handler's arguments, then the device's compute capability major and SM count).
inline ffi::Error RunGemm(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& b_up,
                          const ffi::AnyBuffer& bias, const ffi::AnyBuffer& c, const ffi::AnyBuffer& residual,
                          const ffi::AnyBuffer& a_scale, const ffi::AnyBuffer& b_scale, double alpha, double beta,
                          int64_t activation, int64_t gated, bool transpose_a, bool transpose_b, bool write_preact,
                          bool tf32, int64_t plan, const ffi::AnyBuffer& out, const ffi::AnyBuffer& preact,
                          const ffi::AnyBuffer& workspace, int sm_major, int num_sms, cudaStream_t stream) {
  Problem p;
  JAX_OPS_RETURN_IF_ERROR(MakeProblem(a, b, b_up, bias, c, residual, a_scale, b_scale, alpha, beta, activation, gated,
                                      transpose_a, transpose_b, write_preact, tf32, plan, out, preact, &p));
  JAX_OPS_RETURN_IF_ERROR(CheckWorkspace(workspace));
  if (p.batch == 0 || p.m == 0 || p.n == 0) return ffi::Error::Success();  // nothing to write
  KernelArgs args = MakeKernelArgs(p, a, b, b_up, bias, c, residual, a_scale, b_scale, out, preact);
  args.workspace = workspace.untyped_data();
  args.workspace_bytes = workspace.size_bytes();
  return Dispatch(args, p.plan, sm_major, num_sms, stream);
}

}  // namespace jax_ops::gemm
