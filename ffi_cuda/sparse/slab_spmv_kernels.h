// Launcher for the column-slab Aᵀu kernels (slab_spmv_kernels_impl.cuh, one dtype per slab_spmv_kernels_<dtype>.cu).
#pragma once

#include <cuda_runtime.h>

#include "sparse/heuristics.h"
#include "sparse/slab_spmv_params.h"

namespace jax_ops::sparse {

// Pass 1 (a.items CTAs, a.w * sizeof(T) bytes of dynamic shared memory) and pass 2 on `stream`; group in
// {4, 8, 16, 32}. Opts the pass-1 kernel into its shared memory once per device. Never synchronises.
template <typename T, typename Acc>
cudaError_t LaunchSlabSpmv(cudaStream_t stream, const SlabArgs<T, Acc>& a, int sm_count);

}  // namespace jax_ops::sparse
