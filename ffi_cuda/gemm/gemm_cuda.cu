// CUDA FFI handler of jax_ops_gemm (contract in params.h): the device's properties, then dispatch.h's RunGemm (the
// contract checks, batch folding, the plan rules of heuristics.h, the launch). Enqueues only (no allocation, no
// synchronisation): CUDA-graph compatible.
#include "common/cuda_helpers.h"
#include "gemm/bindings.h"
#include "gemm/dispatch.h"

namespace jax_ops::gemm {
namespace {

ffi::Error GemmCuda(cudaStream_t stream, JAX_OPS_GEMM_HANDLER_PARAMS) {
  auto dev = CurrentDeviceProps();
  if (dev.has_error()) return dev.error();
  return RunGemm(a, b, b_up, bias, c, residual, a_scale, b_scale, alpha, beta, activation, gated, transpose_a,
                 transpose_b, write_preact, tf32, plan, *out, *preact, *workspace, (*dev)->cc_major, (*dev)->sm_count,
                 stream);
}

}  // namespace
}  // namespace jax_ops::gemm

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsGemmCuda, jax_ops::gemm::GemmCuda, JAX_OPS_GEMM_BINDING);
