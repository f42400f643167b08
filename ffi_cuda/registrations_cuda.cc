// The CUDA module: registrations() returns {target name: handler capsule} for platform "CUDA". Imported only
// when JAX has a CUDA backend (it links cuBLASLt and cuSPARSE).
#include <nanobind/nanobind.h>

#include "common/registration.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrHbarXCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrHCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrStepCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrPartialNormsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrNormalizeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrIterationStepCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrScalarsCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsSparseCsrSpmmCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsSparseSlabSpmvCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsAttentionFwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsAttentionBwdCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsGemmCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsKvCacheAppendCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsKvCacheDecodeCuda);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsRuntimeInfoCuda);

namespace nb = nanobind;

NB_MODULE(_jax_ops_cuda, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets["jax_ops_lsmr_hbar_x"] = jax_ops::HandlerCapsule(JaxOpsLsmrHbarXCuda);
    targets["jax_ops_lsmr_h"] = jax_ops::HandlerCapsule(JaxOpsLsmrHCuda);
    targets["jax_ops_lsmr_step"] = jax_ops::HandlerCapsule(JaxOpsLsmrStepCuda);
    targets["jax_ops_lsmr_partial_norms"] = jax_ops::HandlerCapsule(JaxOpsLsmrPartialNormsCuda);
    targets["jax_ops_lsmr_normalize"] = jax_ops::HandlerCapsule(JaxOpsLsmrNormalizeCuda);
    targets["jax_ops_lsmr_iteration_step"] = jax_ops::HandlerCapsule(JaxOpsLsmrIterationStepCuda);
    targets["jax_ops_lsmr_scalars"] = jax_ops::HandlerCapsule(JaxOpsLsmrScalarsCuda);
    targets["jax_ops_sparse_csr_spmm"] = jax_ops::HandlerCapsule(JaxOpsSparseCsrSpmmCuda);
    targets["jax_ops_sparse_slab_spmv"] = jax_ops::HandlerCapsule(JaxOpsSparseSlabSpmvCuda);
    targets["jax_ops_attention_fwd"] = jax_ops::HandlerCapsule(JaxOpsAttentionFwdCuda);
    targets["jax_ops_attention_bwd"] = jax_ops::HandlerCapsule(JaxOpsAttentionBwdCuda);
    targets["jax_ops_gemm"] = jax_ops::HandlerCapsule(JaxOpsGemmCuda);
    targets["jax_ops_kv_cache_append"] = jax_ops::HandlerCapsule(JaxOpsKvCacheAppendCuda);
    targets["jax_ops_kv_cache_decode"] = jax_ops::HandlerCapsule(JaxOpsKvCacheDecodeCuda);
    targets["jax_ops_runtime_info"] = jax_ops::HandlerCapsule(JaxOpsRuntimeInfoCuda);
    return targets;
  });
}
