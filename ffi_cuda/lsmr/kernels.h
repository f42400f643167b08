// Launchers for the fused LSMR recurrences (kernels.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lsmr/params.h"

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

// Column layout (heuristics.h, ColumnsRowsPerCta): vectors [batch, rows, cols]; column c of batch b is state
// row s = b * cols + c, its coefficients at coef[s * NCoef ...], its partial norms at partials[s * P ...] with
// P = ColumnsPartials(rows, cols).
template <typename T, int NIn, int NOut, int NCoef>
struct ColumnsArgs {
  const T* in[NIn];
  T* out[NOut > 0 ? NOut : 1];
  const T* coef = nullptr;  // [batch * cols, NCoef]
  int64_t batch = 1;
  int64_t rows = 0;
  int64_t cols = 0;
  T* partials = nullptr;
};

// Launches Update (an update of params.h) over rows x n elements. Never synchronises.
template <typename Update, typename T>
cudaError_t LaunchRowwise(cudaStream_t stream, const RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef>& args,
                          int sm_count);

// Launches Update over a column-layout block. For a kCoefFromState update, first one CTA per column derives the
// column's coefficients from `state` (Update::Coefficients, the row kernel's code) into coef_ws [cols, NCoef], which
// the elementwise pass then reads (args.coef is ignored). Never synchronises.
template <typename Update, typename T>
cudaError_t LaunchColumns(cudaStream_t stream, ColumnsArgs<T, Update::kIn, Update::kOut, Update::kCoef> args,
                          const ColumnState<T>& state, T* coef_ws);

// Launches the scalars kernel (LsmrScalarStep per row). Never synchronises.
template <typename T>
cudaError_t LaunchScalars(cudaStream_t stream, const ScalarsArgs<T>& args);

}  // namespace jax_ops::lsmr
