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
  T* out[NOut > 0 ? NOut : 1];
  const T* coef[NCoef > 0 ? NCoef : 1];
  int64_t rows;
  int64_t n;
  // Update::kNormOut/kNormIn >= 0: [rows, NormPartials(n, sizeof(T), Update::kUnroll)], each CTA's norm of its
  // elements of that output / input
  T* partials = nullptr;
  ColumnState<T> state;  // Update::kCoefFromState: where the coefficients come from
};

// Launches Update (an update of recurrence_params.h) over rows x n elements. Never synchronises.
template <typename Update, typename T>
cudaError_t LaunchRowwise(cudaStream_t stream, const RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef>& args,
                          int sm_count);

// Launches the scalars kernel (LsmrScalarStep per row). Never synchronises.
template <typename T>
cudaError_t LaunchScalars(cudaStream_t stream, const ScalarsArgs<T>& args);

}  // namespace jax_ops::lsmr
