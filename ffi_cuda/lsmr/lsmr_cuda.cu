// CUDA FFI handlers for the fused LSMR recurrences: decode, validate, dispatch on dtype, launch.
#include <type_traits>
#include <utility>

#include "common/cuda_helpers.h"
#include "lsmr/bindings.h"
#include "lsmr/iteration_calls.h"
#include "lsmr/kernels.h"
#include "lsmr/params.h"

namespace jax_ops::lsmr {
namespace {

// Launches Update over `shape` after the caller's checks. `ins`/`outs` have Update::kIn/kOut entries, `coefs`
// kCoef (none for a kCoefFromState update); `partials` is Update's partial-norm output (or null); fill_state(state,
// tag) fills the ColumnState of a kCoefFromState update.
template <typename Update, typename FillState>
ffi::Error Launch(cudaStream_t stream, ffi::DataType dtype, const char* name, const RowShape& shape,
                  const ffi::AnyBuffer* const* ins, ffi::AnyBuffer* const* outs, const ffi::AnyBuffer* const* coefs,
                  ffi::AnyBuffer* partials, FillState fill_state) {
  auto props = CurrentDeviceProps();
  if (props.has_error()) return props.error();
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(dtype, name, [&](auto tag) -> ffi::Error {
    using T = ffi::NativeType<decltype(tag)::value>;
    RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef> args;
    for (int k = 0; k < Update::kIn; ++k) args.in[k] = static_cast<const T*>(ins[k]->untyped_data());
    for (int k = 0; k < Update::kOut; ++k) args.out[k] = static_cast<T*>(outs[k]->untyped_data());
    if constexpr (!Update::kCoefFromState)
      for (int k = 0; k < Update::kCoef; ++k) args.coef[k] = static_cast<const T*>(coefs[k]->untyped_data());
    args.rows = shape.rows;
    args.n = shape.n;
    if (partials != nullptr) args.partials = static_cast<T*>(partials->untyped_data());
    fill_state(args.state);
    JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchRowwise<Update, T>(stream, args, (*props)->sm_count)));
    return ffi::Error::Success();
  });
}

template <typename Update, size_t NV, size_t NC>
ffi::Error RunOnDevice(cudaStream_t stream, const ffi::AnyBuffer* const (&ins)[Update::kIn],
                       ffi::AnyBuffer* const (&outs)[Update::kOut], const ffi::AnyBuffer* const (&coefs)[NC],
                       const ffi::AnyBuffer* const (&vectors)[NV], const char* const (&vector_names)[NV],
                       const char* const (&coef_names)[NC], ffi::AnyBuffer* partials = nullptr) {
  auto shape = CheckRecurrenceArgs(vectors, vector_names, coefs, coef_names);
  if (shape.has_error()) return shape.error();
  if (partials != nullptr) {
    ffi::Error e = CheckPartials(*partials, *vectors[0], NormPartialsFor(vectors[0]->element_type(), shape->n));
    if (!e.success()) return e;
  }
  return Launch<Update>(stream, ins[0]->element_type(), vector_names[0], *shape, ins, outs, coefs, partials, kNoState);
}

ffi::Error HbarXCuda(cudaStream_t stream, ffi::AnyBuffer h, ffi::AnyBuffer hbar, ffi::AnyBuffer x, ffi::AnyBuffer c_h,
                     ffi::AnyBuffer c_x, ffi::Result<ffi::AnyBuffer> hbar_out, ffi::Result<ffi::AnyBuffer> x_out) {
  return RunOnDevice<HbarXUpdate>(stream, {&h, &hbar, &x}, {&*hbar_out, &*x_out}, {&c_h, &c_x},
                                  {&h, &hbar, &x, &*hbar_out, &*x_out}, {"h", "hbar", "x", "hbar_out", "x_out"},
                                  {"c_h", "c_x"});
}

ffi::Error HCuda(cudaStream_t stream, ffi::AnyBuffer v, ffi::AnyBuffer h, ffi::AnyBuffer c_v,
                 ffi::Result<ffi::AnyBuffer> h_out) {
  return RunOnDevice<HUpdate>(stream, {&v, &h}, {&*h_out}, {&c_v}, {&v, &h, &*h_out}, {"v", "h", "h_out"}, {"c_v"});
}

ffi::Error StepCuda(cudaStream_t stream, ffi::AnyBuffer vb, ffi::AnyBuffer v, ffi::AnyBuffer h, ffi::AnyBuffer hbar,
                    ffi::AnyBuffer x, ffi::AnyBuffer s_v, ffi::AnyBuffer keep_v, ffi::AnyBuffer c_h, ffi::AnyBuffer c_x,
                    ffi::AnyBuffer c_v, ffi::Result<ffi::AnyBuffer> v_out, ffi::Result<ffi::AnyBuffer> h_out,
                    ffi::Result<ffi::AnyBuffer> hbar_out, ffi::Result<ffi::AnyBuffer> x_out,
                    ffi::Result<ffi::AnyBuffer> partials) {
  return RunOnDevice<LsmrStepUpdate>(stream, {&vb, &v, &h, &hbar, &x}, {&*v_out, &*h_out, &*hbar_out, &*x_out},
                                     {&s_v, &keep_v, &c_h, &c_x, &c_v},
                                     {&vb, &v, &h, &hbar, &x, &*v_out, &*h_out, &*hbar_out, &*x_out},
                                     {"vb", "v", "h", "hbar", "x", "v_out", "h_out", "hbar_out", "x_out"},
                                     {"s_v", "keep_v", "c_h", "c_x", "c_v"}, &*partials);
}

// ---- The fused iteration (params.h: PartialNormsUpdate, NormalizeUpdate, LsmrIterationUpdate, scalars).
// `columns` picks the layout of the vectors (BlockShape): rows [rows..., n] or a block solve's columns [n, cols].

// The fused-iteration launch for either layout: Launch (rows) or LaunchColumns (columns; coef_ws holds the
// per-column coefficients of a kCoefFromState update).
template <typename Update, typename FillState>
ffi::Error LaunchBlock(cudaStream_t stream, ffi::DataType dtype, const char* name, const BlockShape& shape,
                       const ffi::AnyBuffer* const* ins, ffi::AnyBuffer* const* outs, ffi::AnyBuffer* partials,
                       ffi::AnyBuffer* coef_ws, FillState fill_state) {
  if (!shape.columns)
    return Launch<Update>(stream, dtype, name, RowShape{shape.rows, shape.n}, ins, outs, nullptr, partials, fill_state);
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(dtype, name, [&](auto tag) -> ffi::Error {
    using T = ffi::NativeType<decltype(tag)::value>;
    ColumnsArgs<T, Update::kIn, Update::kOut, Update::kCoef> args;
    for (int k = 0; k < Update::kIn; ++k) args.in[k] = static_cast<const T*>(ins[k]->untyped_data());
    for (int k = 0; k < Update::kOut; ++k) args.out[k] = static_cast<T*>(outs[k]->untyped_data());
    args.batch = shape.batch;
    args.rows = shape.n;
    args.cols = shape.cols;
    if (partials != nullptr) args.partials = static_cast<T*>(partials->untyped_data());
    ColumnState<T> state;
    fill_state(state);
    T* ws = coef_ws != nullptr ? static_cast<T*>(coef_ws->untyped_data()) : nullptr;
    JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchColumns<Update, T>(stream, args, state, ws)));
    return ffi::Error::Success();
  });
}

// iteration_calls.h's bodies with LaunchBlock on `stream`.
auto OnDevice(cudaStream_t stream) {
  return [stream](auto tag, auto&&... args) {
    return LaunchBlock<typename decltype(tag)::type>(stream, std::forward<decltype(args)>(args)...);
  };
}

ffi::Error PartialNormsCuda(cudaStream_t stream, ffi::AnyBuffer vec, ffi::Result<ffi::AnyBuffer> partials,
                            int32_t columns) {
  return PartialNormsCall(vec, *partials, columns, OnDevice(stream));
}

ffi::Error NormalizeCuda(cudaStream_t stream, ffi::AnyBuffer ub, ffi::AnyBuffer ub_partials,
                         ffi::Result<ffi::AnyBuffer> u, ffi::Result<ffi::AnyBuffer> beta,
                         ffi::Result<ffi::AnyBuffer> vb_coef, ffi::Result<ffi::AnyBuffer> coef_ws, int32_t columns) {
  return NormalizeCall(ub, ub_partials, *u, *beta, *vb_coef, *coef_ws, columns, OnDevice(stream));
}

ffi::Error IterationStepCuda(cudaStream_t stream, ffi::AnyBuffer vb, ffi::AnyBuffer h, ffi::AnyBuffer hbar,
                             ffi::AnyBuffer x, ffi::AnyBuffer vb_partials, ffi::AnyBuffer sc, ffi::AnyBuffer ints,
                             ffi::AnyBuffer beta, ffi::AnyBuffer params, ffi::Result<ffi::AnyBuffer> v_out,
                             ffi::Result<ffi::AnyBuffer> h_out, ffi::Result<ffi::AnyBuffer> hbar_out,
                             ffi::Result<ffi::AnyBuffer> x_out, ffi::Result<ffi::AnyBuffer> x_partials,
                             ffi::Result<ffi::AnyBuffer> coef_ws, int32_t columns) {
  return IterationStepCall(vb, h, hbar, x, vb_partials, sc, ints, beta, params, *v_out, *h_out, *hbar_out, *x_out,
                           *x_partials, *coef_ws, columns, OnDevice(stream));
}

ffi::Error ScalarsCuda(cudaStream_t stream, ffi::AnyBuffer sc, ffi::AnyBuffer ints, ffi::AnyBuffer neg_alpha,
                       ffi::AnyBuffer beta, ffi::AnyBuffer params, ffi::AnyBuffer maxiter, ffi::AnyBuffer vb_partials,
                       ffi::AnyBuffer x_partials, ffi::Result<ffi::AnyBuffer> sc_out,
                       ffi::Result<ffi::AnyBuffer> ints_out, ffi::Result<ffi::AnyBuffer> neg_alpha_out) {
  return ScalarsCall(sc, ints, neg_alpha, beta, params, maxiter, vb_partials, x_partials, *sc_out, *ints_out,
                     *neg_alpha_out, [&](const auto& a) -> ffi::Error {
                       JAX_OPS_RETURN_IF_CUDA_ERROR(LaunchScalars(stream, a));
                       return ffi::Error::Success();
                     });
}

}  // namespace
}  // namespace jax_ops::lsmr

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsLsmrHbarXCuda, jax_ops::lsmr::HbarXCuda, JAX_OPS_LSMR_HBAR_X_BINDING);

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsLsmrHCuda, jax_ops::lsmr::HCuda, JAX_OPS_LSMR_H_BINDING);

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsLsmrStepCuda, jax_ops::lsmr::StepCuda, JAX_OPS_LSMR_STEP_BINDING);

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsLsmrPartialNormsCuda, jax_ops::lsmr::PartialNormsCuda,
                            JAX_OPS_LSMR_PARTIAL_NORMS_BINDING);

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsLsmrNormalizeCuda, jax_ops::lsmr::NormalizeCuda, JAX_OPS_LSMR_NORMALIZE_BINDING);

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsLsmrIterationStepCuda, jax_ops::lsmr::IterationStepCuda,
                            JAX_OPS_LSMR_ITERATION_STEP_BINDING);

JAX_OPS_DEFINE_CUDA_HANDLER(JaxOpsLsmrScalarsCuda, jax_ops::lsmr::ScalarsCuda, JAX_OPS_LSMR_SCALARS_BINDING);
