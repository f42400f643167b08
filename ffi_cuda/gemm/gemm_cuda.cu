// CUDA FFI handler of jax_ops_gemm (contract in params.h): check the problem (MakeProblem, as the CPU twin), flatten
// it into KernelArgs and run it through dispatch.h (batch folding, the plan rules of heuristics.h, the launch).
// Enqueues only (no allocation, no synchronisation): CUDA-graph compatible.
#include "common/cuda_helpers.h"
#include "gemm/bindings.h"
#include "gemm/dispatch.h"
#include "gemm/kernels.h"
#include "gemm/params.h"

namespace jax_ops::gemm {
namespace {

ffi::Error GemmCuda(cudaStream_t stream, JAX_OPS_GEMM_HANDLER_PARAMS) {
  Problem p;
  JAX_OPS_RETURN_IF_ERROR(MakeProblem(a, b, b_up, bias, c, residual, a_scale, b_scale, alpha, beta, activation, gated,
                                      transpose_a, transpose_b, write_preact, tf32, plan, *out, *preact, &p));
  if (p.batch == 0 || p.m == 0 || p.n == 0) return ffi::Error::Success();  // nothing to write
  auto dev = CurrentDeviceProps();
  if (dev.has_error()) return dev.error();
  return Dispatch(MakeKernelArgs(p, a, b, b_up, bias, c, residual, a_scale, b_scale, *out, *preact), p.plan,
                  (*dev)->cc_major, (*dev)->sm_count, stream);
}

}  // namespace
}  // namespace jax_ops::gemm

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsGemmCuda, jax_ops::gemm::GemmCuda, JAX_OPS_GEMM_BINDING);
