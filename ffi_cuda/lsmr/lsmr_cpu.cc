// CPU twin of the fused LSMR recurrences: the same FFI contract as lsmr_cuda.cu, plain loops.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "lsmr/bindings.h"
#include "lsmr/iteration_calls.h"
#include "lsmr/params.h"

namespace jax_ops::lsmr {
namespace {

// The typed data pointers of an update's input and output buffers, and the update of one element.
template <typename Update, typename T>
struct TypedBuffers {
  static constexpr int kOutN = Update::kOut > 0 ? Update::kOut : 1;
  const T* in[Update::kIn];
  T* out[kOutN];
  TypedBuffers(const ffi::AnyBuffer* const* ins, ffi::AnyBuffer* const* outs) {
    for (int k = 0; k < Update::kIn; ++k) in[k] = static_cast<const T*>(ins[k]->untyped_data());
    for (int k = 0; k < Update::kOut; ++k) out[k] = static_cast<T*>(outs[k]->untyped_data());
  }
  // Update::Apply at element i with coefficients c; the squared norm input/output goes into `squares`.
  template <typename Coef>
  void ApplyAt(const Coef& c, int64_t i, CompensatedSum& squares) const {
    T x[Update::kIn], y[kOutN];
    for (int k = 0; k < Update::kIn; ++k) x[k] = in[k][i];
    Update::Apply(c, x, y);
    for (int k = 0; k < Update::kOut; ++k) out[k][i] = y[k];
    if constexpr (Update::kNormOut >= 0) squares.Add(static_cast<double>(y[Update::kNormOut]) * y[Update::kNormOut]);
    if constexpr (Update::kNormIn >= 0) squares.Add(static_cast<double>(x[Update::kNormIn]) * x[Update::kNormIn]);
  }
};

// Runs Update over `shape` after the caller's checks (the CUDA handler's Launch, as plain loops). `ins`/`outs`/
// `coefs` have Update::kIn/kOut/kCoef entries; `partials` is Update's partial-norm output (or null); fill_state
// fills the ColumnState of a kCoefFromState update.
template <typename Update, typename FillState>
ffi::Error RunRows(ffi::DataType dtype, const char* name, const RowShape& shape, const ffi::AnyBuffer* const* ins,
                   ffi::AnyBuffer* const* outs, const ffi::AnyBuffer* const* coefs, ffi::AnyBuffer* partials,
                   FillState fill_state) {
  constexpr int kCoefN = Update::kCoef > 0 ? Update::kCoef : 1;
  constexpr bool kNorms = Update::kNormOut >= 0 || Update::kNormIn >= 0;
  const int64_t num_partials =
      partials != nullptr ? NormPartials(shape.n, dtype == ffi::DataType::F64 ? 8 : 4, Update::kUnroll) : 0;
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(dtype, name, [&](auto tag) -> ffi::Error {
    using T = ffi::NativeType<decltype(tag)::value>;
    const TypedBuffers<Update, T> buf(ins, outs);
    ColumnState<T> state;
    fill_state(state);
    const int64_t rows = shape.rows, n = shape.n;  // locals: lets the compiler keep them in registers
    // Partial norms: partial p of a row covers its elements [p*n/P, (p+1)*n/P) (the CUDA kernel assigns them to
    // CTAs differently; only the norm of the row's partials is part of the contract).
    T* part = partials != nullptr ? static_cast<T*>(partials->untyped_data()) : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      T c[kCoefN];
      if constexpr (Update::kCoefFromState) {
        const double squares =
            SumOfSquaresHost(state.norm_partials + r * state.num_norm_partials, state.num_norm_partials);
        Update::Coefficients(state, r, squares, /*first_cta=*/true, c);
      } else {
        for (int k = 0; k < Update::kCoef; ++k) c[k] = static_cast<const T*>(coefs[k]->untyped_data())[r];
      }
      for (int64_t p = 0; p < std::max<int64_t>(num_partials, 1); ++p) {
        const int64_t begin = r * n + (num_partials ? p * n / num_partials : 0);
        const int64_t end = r * n + (num_partials ? (p + 1) * n / num_partials : n);
        CompensatedSum squares;
        for (int64_t i = begin; i < end; ++i) {
          buf.ApplyAt(c, i, squares);
        }
        if (kNorms && part != nullptr) part[r * num_partials + p] = static_cast<T>(std::sqrt(squares.Value()));
      }
    }
    return ffi::Error::Success();
  });
}

template <typename Update, size_t NV, size_t NC>
ffi::Error RunOnHost(const ffi::AnyBuffer* const (&ins)[Update::kIn], ffi::AnyBuffer* const (&outs)[Update::kOut],
                     const ffi::AnyBuffer* const (&coefs)[NC], const ffi::AnyBuffer* const (&vectors)[NV],
                     const char* const (&vector_names)[NV], const char* const (&coef_names)[NC],
                     ffi::AnyBuffer* partials = nullptr) {
  auto shape = CheckRecurrenceArgs(vectors, vector_names, coefs, coef_names);
  if (shape.has_error()) return shape.error();
  if (partials != nullptr) {
    ffi::Error e = CheckPartials(*partials, *vectors[0], NormPartialsFor(vectors[0]->element_type(), shape->n));
    if (!e.success()) return e;
  }
  return RunRows<Update>(ins[0]->element_type(), vector_names[0], *shape, ins, outs, coefs, partials, kNoState);
}

ffi::Error HbarXCpu(ffi::AnyBuffer h, ffi::AnyBuffer hbar, ffi::AnyBuffer x, ffi::AnyBuffer c_h, ffi::AnyBuffer c_x,
                    ffi::Result<ffi::AnyBuffer> hbar_out, ffi::Result<ffi::AnyBuffer> x_out) {
  return RunOnHost<HbarXUpdate>({&h, &hbar, &x}, {&*hbar_out, &*x_out}, {&c_h, &c_x},
                                {&h, &hbar, &x, &*hbar_out, &*x_out}, {"h", "hbar", "x", "hbar_out", "x_out"},
                                {"c_h", "c_x"});
}

ffi::Error HCpu(ffi::AnyBuffer v, ffi::AnyBuffer h, ffi::AnyBuffer c_v, ffi::Result<ffi::AnyBuffer> h_out) {
  return RunOnHost<HUpdate>({&v, &h}, {&*h_out}, {&c_v}, {&v, &h, &*h_out}, {"v", "h", "h_out"}, {"c_v"});
}

ffi::Error StepCpu(ffi::AnyBuffer vb, ffi::AnyBuffer v, ffi::AnyBuffer h, ffi::AnyBuffer hbar, ffi::AnyBuffer x,
                   ffi::AnyBuffer s_v, ffi::AnyBuffer keep_v, ffi::AnyBuffer c_h, ffi::AnyBuffer c_x,
                   ffi::AnyBuffer c_v, ffi::Result<ffi::AnyBuffer> v_out, ffi::Result<ffi::AnyBuffer> h_out,
                   ffi::Result<ffi::AnyBuffer> hbar_out, ffi::Result<ffi::AnyBuffer> x_out,
                   ffi::Result<ffi::AnyBuffer> partials) {
  return RunOnHost<LsmrStepUpdate>({&vb, &v, &h, &hbar, &x}, {&*v_out, &*h_out, &*hbar_out, &*x_out},
                                   {&s_v, &keep_v, &c_h, &c_x, &c_v},
                                   {&vb, &v, &h, &hbar, &x, &*v_out, &*h_out, &*hbar_out, &*x_out},
                                   {"vb", "v", "h", "hbar", "x", "v_out", "h_out", "hbar_out", "x_out"},
                                   {"s_v", "keep_v", "c_h", "c_x", "c_v"}, &*partials);
}

// ---- The fused iteration (params.h: PartialNormsUpdate, NormalizeUpdate, LsmrIterationUpdate, scalars).
// `columns` picks the layout of the vectors (BlockShape): rows [rows..., n] or a block solve's columns [n, cols].

// RunRows for either layout. In the column layout, column c's coefficients come from Update::Coefficients on the
// state (kCoefFromState), its partial p covers rows [p * R, (p + 1) * R) (R = ColumnsRowsPerCta, the CUDA CTAs').
template <typename Update, typename FillState>
ffi::Error RunBlock(ffi::DataType dtype, const char* name, const BlockShape& shape, const ffi::AnyBuffer* const* ins,
                    ffi::AnyBuffer* const* outs, ffi::AnyBuffer* partials, ffi::AnyBuffer* /*coef_ws: CUDA only*/,
                    FillState fill_state) {
  if (!shape.columns)
    return RunRows<Update>(dtype, name, RowShape{shape.rows, shape.n}, ins, outs, nullptr, partials, fill_state);
  constexpr int kCoefN = Update::kCoef > 0 ? Update::kCoef : 1;
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(dtype, name, [&](auto tag) -> ffi::Error {
    using T = ffi::NativeType<decltype(tag)::value>;
    const TypedBuffers<Update, T> buf(ins, outs);
    ColumnState<T> state;
    fill_state(state);
    const int64_t cols = shape.cols, n = shape.n;
    const int64_t per_part = ColumnsRowsPerCta(cols), num_partials = ColumnsPartials(n, cols);
    T* part = partials != nullptr ? static_cast<T*>(partials->untyped_data()) : nullptr;
    for (int64_t b = 0; b < shape.batch; ++b) {
      for (int64_t col = 0; col < cols; ++col) {
        const int64_t row = b * cols + col;  // the state row
        T c[kCoefN] = {};
        if constexpr (Update::kCoefFromState)
          Update::Coefficients(
              state, row,
              SumOfSquaresHost(state.norm_partials + row * state.num_norm_partials, state.num_norm_partials),
              /*first_cta=*/true, c);
        for (int64_t p = 0; p < num_partials; ++p) {
          CompensatedSum squares;
          for (int64_t r = p * per_part; r < std::min(n, (p + 1) * per_part); ++r) {
            const int64_t i = (b * n + r) * cols + col;
            buf.ApplyAt(c, i, squares);
          }
          if (part != nullptr) part[row * num_partials + p] = static_cast<T>(std::sqrt(squares.Value()));
        }
      }
    }
    return ffi::Error::Success();
  });
}

// iteration_calls.h's bodies with RunBlock.
constexpr auto kOnHost = [](auto tag, auto&&... args) {
  return RunBlock<typename decltype(tag)::type>(std::forward<decltype(args)>(args)...);
};

ffi::Error PartialNormsCpu(ffi::AnyBuffer vec, ffi::Result<ffi::AnyBuffer> partials, int32_t columns) {
  return PartialNormsCall(vec, *partials, columns, kOnHost);
}

ffi::Error NormalizeCpu(ffi::AnyBuffer ub, ffi::AnyBuffer ub_partials, ffi::Result<ffi::AnyBuffer> u,
                        ffi::Result<ffi::AnyBuffer> beta, ffi::Result<ffi::AnyBuffer> vb_coef,
                        ffi::Result<ffi::AnyBuffer> coef_ws, int32_t columns) {
  return NormalizeCall(ub, ub_partials, *u, *beta, *vb_coef, *coef_ws, columns, kOnHost);
}

ffi::Error IterationStepCpu(ffi::AnyBuffer vb, ffi::AnyBuffer h, ffi::AnyBuffer hbar, ffi::AnyBuffer x,
                            ffi::AnyBuffer vb_partials, ffi::AnyBuffer sc, ffi::AnyBuffer ints, ffi::AnyBuffer beta,
                            ffi::AnyBuffer params, ffi::Result<ffi::AnyBuffer> v_out, ffi::Result<ffi::AnyBuffer> h_out,
                            ffi::Result<ffi::AnyBuffer> hbar_out, ffi::Result<ffi::AnyBuffer> x_out,
                            ffi::Result<ffi::AnyBuffer> x_partials, ffi::Result<ffi::AnyBuffer> coef_ws,
                            int32_t columns) {
  return IterationStepCall(vb, h, hbar, x, vb_partials, sc, ints, beta, params, *v_out, *h_out, *hbar_out, *x_out,
                           *x_partials, *coef_ws, columns, kOnHost);
}

ffi::Error ScalarsCpu(ffi::AnyBuffer sc, ffi::AnyBuffer ints, ffi::AnyBuffer neg_alpha, ffi::AnyBuffer beta,
                      ffi::AnyBuffer params, ffi::AnyBuffer maxiter, ffi::AnyBuffer vb_partials,
                      ffi::AnyBuffer x_partials, ffi::Result<ffi::AnyBuffer> sc_out,
                      ffi::Result<ffi::AnyBuffer> ints_out, ffi::Result<ffi::AnyBuffer> neg_alpha_out) {
  return ScalarsCall(sc, ints, neg_alpha, beta, params, maxiter, vb_partials, x_partials, *sc_out, *ints_out,
                     *neg_alpha_out, [](const auto& a) -> ffi::Error {
                       for (int64_t r = 0; r < a.rows; ++r)
                         LsmrScalarStep(a, r, SumOfSquaresHost(a.v_partials + r * a.num_v_partials, a.num_v_partials),
                                        SumOfSquaresHost(a.x_partials + r * a.num_x_partials, a.num_x_partials));
                       return ffi::Error::Success();
                     });
}

}  // namespace
}  // namespace jax_ops::lsmr

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHbarXCpu, jax_ops::lsmr::HbarXCpu,
                              JAX_OPS_LSMR_HBAR_X_BINDING(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHCpu, jax_ops::lsmr::HCpu, JAX_OPS_LSMR_H_BINDING(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrStepCpu, jax_ops::lsmr::StepCpu,
                              JAX_OPS_LSMR_STEP_BINDING(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrPartialNormsCpu, jax_ops::lsmr::PartialNormsCpu,
                              JAX_OPS_LSMR_PARTIAL_NORMS_BINDING(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrNormalizeCpu, jax_ops::lsmr::NormalizeCpu,
                              JAX_OPS_LSMR_NORMALIZE_BINDING(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrIterationStepCpu, jax_ops::lsmr::IterationStepCpu,
                              JAX_OPS_LSMR_ITERATION_STEP_BINDING(xla::ffi::Ffi::Bind()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrScalarsCpu, jax_ops::lsmr::ScalarsCpu,
                              JAX_OPS_LSMR_SCALARS_BINDING(xla::ffi::Ffi::Bind()));
