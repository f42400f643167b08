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

// Merge-path (nnz-balanced) SpMV, N == 1 (contract and workspace layout: MergeWorkspaceElems in spmm_params.h):
// tiles of 32 * tile_warps * ipt path items (tile_warps 1: a warp per tile, 8: a CTA per tile; ipt 4, 8 or 16),
// then a fix-up launch for rows spanning tiles. a.units: workspace capacity in Acc elements. Deterministic.
template <typename T, typename Acc>
cudaError_t LaunchSpmvMerge(cudaStream_t stream, const SpmmArgs<T, Acc>& a, int ipt, int tile_warps);

}  // namespace jax_ops::sparse
