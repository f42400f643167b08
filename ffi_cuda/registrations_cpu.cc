// The CPU module: registrations() returns {target name: handler capsule} for platform "cpu"; constants()
// returns the facts Python and C++ share ({"<family>_<name>": value}), so Python never retypes them.
#include <nanobind/nanobind.h>

#include "attention/instantiations/support.h"
#include "attention/params.h"
#include "common/registration.h"
#include "gemm/params.h"
#include "kv_cache/params.h"
#include "lsmr/params.h"
#include "sparse/heuristics.h"
#include "sparse/slab_spmv_params.h"
#include "sparse/spmm_params.h"

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
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsGemmCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsKvCacheAppendCpu);
XLA_FFI_DECLARE_HANDLER_SYMBOL(JaxOpsKvCacheDecodeCpu);

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
    targets["jax_ops_gemm"] = jax_ops::HandlerCapsule(JaxOpsGemmCpu);
    targets["jax_ops_kv_cache_append"] = jax_ops::HandlerCapsule(JaxOpsKvCacheAppendCpu);
    targets["jax_ops_kv_cache_decode"] = jax_ops::HandlerCapsule(JaxOpsKvCacheDecodeCpu);
    return targets;
  });
  m.def("constants", []() {
    nb::dict constants;
    // One line per shared fact, grouped by family: constants["<family>_<name>"] = <C++ constant>;

    // attention
    constants["attention_max_head_dim"] = jax_ops::attention::kMaxHeadDim;
    {
      namespace at = jax_ops::attention;
      auto list = [](const auto& values) {
        nb::list out;
        for (const auto& v : values) out.append(v);
        return out;
      };
      constants["attention_cuda_dtypes"] = list(at::kCudaDTypeNames);
      constants["attention_cuda_fwd_head_dims"] = list(at::kFwdHeadDims);
      constants["attention_cuda_bwd_head_dims"] = list(at::kBwdHeadDims);
      constants["attention_cuda_sm90_fwd_head_dims"] = list(at::kSm90FwdHeadDims);
      constants["attention_cuda_sm90_bwd_head_dims"] = list(at::kSm90BwdHeadDims);
    }

    // sparse
    {
      namespace sp = jax_ops::sparse;
      constants["sparse_algorithm_vector"] = int{sp::kVector};
      constants["sparse_algorithm_cta"] = int{sp::kCta};
      constants["sparse_algorithm_split"] = int{sp::kSplit};
      constants["sparse_algorithm_stream"] = int{sp::kStream};
      constants["sparse_algorithm_segmented"] = int{sp::kSegmented};
      constants["sparse_algorithm_cusparse"] = int{sp::kCusparse};
      constants["sparse_algorithm_blocks"] = int{sp::kBlocks};
      constants["sparse_max_block_rows"] = sp::kMaxBlockRows;
      constants["sparse_cusparse_zero_bytes"] = sp::kCusparseZeroBytes;
      constants["sparse_stream_min_rows"] = sp::kStreamMinRows;
      constants["sparse_stream_max_rows"] = sp::kStreamMaxRows;
      constants["sparse_stream_cap"] = sp::kStreamCap;
      constants["sparse_max_dim"] = sp::kMaxDim;
      constants["sparse_segment_rows_per_cta"] =
          nb::make_tuple(sp::SegmentRowsPerCta(1), sp::SegmentRowsPerCta(2), sp::SegmentRowsPerCta(4),
                         sp::SegmentRowsPerCta(8), sp::SegmentRowsPerCta(16), sp::SegmentRowsPerCta(32));
      constants["sparse_slab_ctas_per_sm"] = sp::kSlabCtasPerSm;
      constants["sparse_slab_smem_bytes"] = sp::kSlabSmemBytes;
      constants["sparse_slab_max_width"] = sp::kSlabMaxWidth;
      constants["sparse_slots_min_avg"] = nb::make_tuple(sp::kSlotsMinAvg2, sp::kSlotsMinAvg4, sp::kSlotsMinAvg8);
      auto names = [](const auto& array) {
        nb::list out;
        for (const char* name : array) out.append(nb::str(name));
        return out;
      };
      constants["sparse_spmm_dtypes"] = names(sp::kSpmmDTypeNames);
      constants["sparse_slab_spmv_dtypes"] = names(sp::kSlabSpmvDTypeNames);
      constants["sparse_cusparse_dtypes"] = names(sp::kCusparseDTypeNames);
    }

    // lsmr
    auto names = [](const auto& array) {
      nb::list out;
      for (const char* name : array) out.append(nb::str(name));
      return out;
    };
    constants["lsmr_scalars"] = names(jax_ops::lsmr::kScalarNames);
    constants["lsmr_ints"] = names(jax_ops::lsmr::kIntNames);
    constants["lsmr_params"] = names(jax_ops::lsmr::kParamNames);
    constants["lsmr_norm_threads"] = jax_ops::lsmr::kThreads;
    constants["lsmr_norm_vector_bytes"] = jax_ops::lsmr::kVectorBytes;
    constants["lsmr_partial_norms_unroll"] = jax_ops::lsmr::PartialNormsUpdate::kUnroll;
    constants["lsmr_columns_cta_elems"] = jax_ops::lsmr::kColumnsCtaElems;

    // gemm
    {
      namespace gm = jax_ops::gemm;
      constants["gemm_activations"] = names(gm::kActivationNames);
      constants["gemm_plans"] = names(gm::kPlanNames);
      constants["gemm_skinny_max_m_fp8"] = gm::kSkinnyMaxMFp8;
      constants["gemm_gated_none"] = static_cast<int64_t>(gm::Gated::kNone);
      constants["gemm_gated_separate"] = static_cast<int64_t>(gm::Gated::kSeparate);
      constants["gemm_gated_packed"] = static_cast<int64_t>(gm::Gated::kPacked);
    }

    // kv_cache
    {
      namespace kv = jax_ops::kv_cache;
      nb::list head_dims;
      for (auto d : kv::kCudaDecodeHeadDims) head_dims.append(d);
      constants["kv_cache_cuda_decode_head_dims"] = head_dims;
      constants["kv_cache_cuda_dtypes"] = names(kv::kCudaDTypeNames);
      constants["kv_cache_split_key_align"] = kv::kSplitKeyAlign;
      constants["kv_cache_max_kernel_merge_splits"] = kv::kMaxKernelMergeSplits;
      constants["kv_cache_status_ok"] = kv::kStatusOk;
      constants["kv_cache_status_past_allocated_pages"] = kv::kStatusPastAllocatedPages;
    }

    return constants;
  });
}
