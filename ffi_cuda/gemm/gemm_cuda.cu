// CUDA FFI handler of jax_ops_gemm (contract in params.h): check the problem (MakeProblem, as the CPU twin), flatten
// it into KernelArgs, fold a shared-weight batch into M, pick the kernel (heuristics.h: a forced plan or the auto
// rule) and launch it. Enqueues only (no allocation, no synchronisation): CUDA-graph compatible.
#include "common/cuda_helpers.h"
#include "gemm/bindings.h"
#include "gemm/heuristics.h"
#include "gemm/kernels.h"
#include "gemm/params.h"

namespace jax_ops::gemm {
namespace {

cudaError_t LaunchPlan(Plan plan, const KernelArgs& args, const DeviceProps& dev, cudaStream_t stream) {
  switch (plan) {
    case Plan::kSm90:
      return LaunchSm90(args, dev.sm_count, stream);
    case Plan::kSkinny:
      return LaunchSkinny(args, dev.sm_count, stream);
    default:
      return LaunchSimt(args, stream);
  }
}

ffi::Error GemmCuda(cudaStream_t stream, JAX_OPS_GEMM_HANDLER_PARAMS) {
  Problem p;
  JAX_OPS_RETURN_IF_ERROR(MakeProblem(a, b, b_up, bias, c, residual, a_scale, b_scale, alpha, beta, activation, gated,
                                      transpose_a, transpose_b, write_preact, tf32, plan, *out, *preact, &p));
  if (p.batch == 0 || p.m == 0 || p.n == 0) return ffi::Error::Success();  // nothing to write
  KernelArgs args = MakeKernelArgs(p, a, b, b_up, bias, c, residual, a_scale, b_scale, *out, *preact);
  FoldBatch(&args);
  auto dev = CurrentDeviceProps();
  if (dev.has_error()) return dev.error();
  Plan chosen = Plan::kSimt;
  JAX_OPS_RETURN_IF_ERROR(ChoosePlan(args, p.plan, (*dev)->cc_major, &chosen));
  JAX_OPS_RETURN_IF_CUDA_ERROR(LaunchPlan(chosen, args, **dev, stream));
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_ops::gemm

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsGemmCuda, jax_ops::gemm::GemmCuda, JAX_OPS_GEMM_BINDING);
