// Launchers for the CSR SpMV/SpMM kernels (spmm_kernels_impl.cuh, one dtype per spmm_kernels_<dtype>.cu).
#pragma once

#include <cuda_runtime.h>

#include "sparse/spmm_params.h"

namespace jax_ops::sparse {

// Runs the plan in `a` (algorithm, group, split lists): 1 launch (vector, cta) or 3 (split). `vec16` says
// b, y and out rows may use 16-byte vector accesses (N a multiple of 16/sizeof(T) and 16-byte aligned bases).
// Never synchronises.
template <typename T, typename Acc>
cudaError_t LaunchCsrSpmm(cudaStream_t stream, const SpmmArgs<T, Acc>& a, bool vec16, int sm_count);

}  // namespace jax_ops::sparse
