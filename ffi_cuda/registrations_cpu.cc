// The CPU module: registrations() returns {target name: handler capsule} for platform "cpu"; constants()
// returns the facts Python and C++ share ({"<family>_<name>": value}), so Python never retypes them.
#include <nanobind/nanobind.h>

#include "common/registration.h"
#include "lsmr/params.h"

XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrHbarXCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrHCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrStepCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrPartialNormsCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrNormalizeCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrIterationStepCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsLsmrScalarsCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsSparseCsrSpmmCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsSparseSlabSpmvCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsAttentionFwdCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsAttentionBwdCpu);

namespace nb = nanobind;

NB_MODULE(_jax_ops_cpu, m) {
  m.def("registrations", []() {
    nb::dict targets;
    targets["jax_ops_lsmr_hbar_x"] = jax_ops::HandlerCapsule(JaxOpsLsmrHbarXCpu);
    targets["jax_ops_lsmr_h"] = jax_ops::HandlerCapsule(JaxOpsLsmrHCpu);
    targets["jax_ops_lsmr_step"] = jax_ops::HandlerCapsule(JaxOpsLsmrStepCpu);
    targets["jax_ops_lsmr_partial_norms"] = jax_ops::HandlerCapsule(JaxOpsLsmrPartialNormsCpu);
    targets["jax_ops_lsmr_normalize"] = jax_ops::HandlerCapsule(JaxOpsLsmrNormalizeCpu);
    targets["jax_ops_lsmr_iteration_step"] = jax_ops::HandlerCapsule(JaxOpsLsmrIterationStepCpu);
    targets["jax_ops_lsmr_scalars"] = jax_ops::HandlerCapsule(JaxOpsLsmrScalarsCpu);
    targets["jax_ops_sparse_csr_spmm"] = jax_ops::HandlerCapsule(JaxOpsSparseCsrSpmmCpu);
    targets["jax_ops_sparse_slab_spmv"] = jax_ops::HandlerCapsule(JaxOpsSparseSlabSpmvCpu);
    targets["jax_ops_attention_fwd"] = jax_ops::HandlerCapsule(JaxOpsAttentionFwdCpu);
    targets["jax_ops_attention_bwd"] = jax_ops::HandlerCapsule(JaxOpsAttentionBwdCpu);
    return targets;
  });
  m.def("constants", []() {
    nb::dict constants;
    // One line per shared fact, grouped by family: constants["<family>_<name>"] = <C++ constant>;

    // attention

    // sparse

    // lsmr
    auto names = [](const auto& array) {
      nb::list out;
      for (const char* name : array) out.append(nb::str(name));
      return out;
    };
    constants["lsmr_scalars"] = names(jax_ops::lsmr::kScalarNames);
    constants["lsmr_ints"] = names(jax_ops::lsmr::kIntNames);
    constants["lsmr_params"] = names(jax_ops::lsmr::kParamNames);
    constants["lsmr_norm_threads"] = jax_ops::lsmr::kNormThreads;
    constants["lsmr_norm_vector_bytes"] = jax_ops::lsmr::kNormVectorBytes;
    constants["lsmr_partial_norms_unroll"] = jax_ops::lsmr::PartialNormsUpdate::kUnroll;
    constants["lsmr_columns_cta_elems"] = jax_ops::lsmr::kColumnsCtaElems;

    return constants;
  });
}
