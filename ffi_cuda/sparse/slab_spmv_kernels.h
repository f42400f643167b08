// Launcher for the column-slab Aᵀu kernels (slab_spmv_kernels_impl.cuh, one dtype per slab_spmv_kernels_<dtype>.cu).
#pragma once

#include <cuda_runtime.h>

#include "sparse/slab_spmv_params.h"

namespace jax_ops::sparse {

// Pass 1 (a.items CTAs, a.w * sizeof(T) bytes of dynamic shared memory) and pass 2 on `stream`; group in
// {4, 8, 16, 32}. Opts the pass-1 kernel into its shared memory once per device. Never synchronises.
template <typename T, typename Acc>
cudaError_t LaunchSlabSpmv(cudaStream_t stream, const SlabArgs<T, Acc>& a, int sm_count);

// Slab kernel config (one, measured best on the H200, 2026-11-29): 512 threads, 2 CTAs per SM (the slab width
// is chosen in Python so that two CTAs' u[slab] fit in an SM's shared memory), 4 loads in flight per lane.
constexpr int kSlabThreads = 512;
constexpr int kSlabCtasPerSm = 2;
constexpr int kSlabSteps = 4;

// Entries each CTA prefetches into L2 while it stages u[slab]: at most W, and ~2M entries over one wave of CTAs
// (about what DRAM delivers while the wave's staging comes out of L2).
inline int32_t SlabPrefetchNnz(int64_t w, int sm_count) {
  const int64_t wave = int64_t{sm_count > 0 ? sm_count : 1} * kSlabCtasPerSm;
  const int64_t v = w < 2000000 / wave ? w : 2000000 / wave;
  return static_cast<int32_t>(v > 0 ? v : 0);
}

}  // namespace jax_ops::sparse
