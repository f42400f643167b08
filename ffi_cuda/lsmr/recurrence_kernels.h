// Launchers for the fused LSMR recurrences (recurrence_kernels.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lsmr/recurrence_params.h"

namespace jax_ops::lsmr {

// Pointers for one call: inputs, outputs (may alias inputs), per-row coefficients (device memory).
template <typename T, int NIn, int NOut, int NCoef>
struct RowwiseArgs {
  const T* in[NIn];
  T* out[NOut];
  const T* coef[NCoef];
  int64_t rows;
  int64_t n;
  // Update::kNormOut >= 0: [rows, NormPartials(n, sizeof(T))], each CTA's norm of its elements of that output
  T* partials = nullptr;
};

// Launches Update (HbarXUpdate or HUpdate) over rows x n elements. Never synchronises.
template <typename Update, typename T>
cudaError_t LaunchRowwise(cudaStream_t stream, const RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef>& args,
                          int sm_count);

}  // namespace jax_ops::lsmr
