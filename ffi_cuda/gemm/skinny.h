// The skinny kernel's launcher with its cluster split exposed, for the standalone harness (ffi_cuda/tools/
// gemm_bench.cu: every split checked and timed). The library calls LaunchSkinny (kernels.h), which takes the split
// from heuristics.h's SkinnySplit.
#pragma once

#include <cuda_runtime.h>

#include "gemm/kernels.h"

namespace jax_ops::gemm {

// split 0: the rule's; 1, 2, 4 or 8: that many CTAs per cluster (cudaErrorNotSupported where that does not fit this
// device or build). *used_split (when given) receives the split launched.
cudaError_t LaunchSkinnyWithSplit(const KernelArgs& args, int num_sms, int split, cudaStream_t stream, int* used_split);

}  // namespace jax_ops::gemm
