// The fused LSMR iteration's FFI handler bodies (partial norms, normalize, iteration step, scalars), shared by the CPU
// twin and the CUDA handlers: argument checks, then `run(UpdateTag<Update>{}, dtype, name, shape, ins, outs, partials,
// coef_ws, fill_state)`, which is RunBlock (lsmr_cpu.cc) or LaunchBlock (lsmr_cuda.cu). fill_state fills
// the ColumnState of a kCoefFromState update. `columns` picks the vectors' layout (BlockShape).
#pragma once

#include <type_traits>

#include "lsmr/params.h"

namespace jax_ops::lsmr {

template <typename Update>
struct UpdateTag {
  using type = Update;
};

template <typename T>
const T* Data(const ffi::AnyBuffer& b) {
  return static_cast<const T*>(b.untyped_data());
}
template <typename T>
T* Data(ffi::AnyBuffer& b) {
  return static_cast<T*>(b.untyped_data());
}

constexpr auto kNoState = [](auto&) {};

// The element type T of a ColumnState<T> (fill_state lambdas are generic over it).
template <typename State>
using StateType = std::remove_const_t<std::remove_pointer_t<decltype(std::declval<State&>().sc)>>;

template <typename Run>
ffi::Error PartialNormsCall(const ffi::AnyBuffer& vec, ffi::AnyBuffer& partials, int32_t columns, Run&& run) {
  auto shape = CheckBlock({&vec}, {"vec"}, columns != 0);
  if (shape.has_error()) return shape.error();
  const ffi::DataType dt = vec.element_type();
  JAX_OPS_RETURN_IF_ERROR(
      CheckRowArray(partials, "partials", dt, shape->lead, shape->Partials(dt, PartialNormsUpdate::kUnroll)));
  const ffi::AnyBuffer* ins[] = {&vec};
  return run(UpdateTag<PartialNormsUpdate>{}, dt, "vec", *shape, ins, nullptr, &partials, nullptr, kNoState);
}

template <typename Run>
ffi::Error NormalizeCall(const ffi::AnyBuffer& ub, const ffi::AnyBuffer& ub_partials, ffi::AnyBuffer& u,
                         ffi::AnyBuffer& beta, ffi::AnyBuffer& vb_coef, ffi::AnyBuffer& coef_ws, int32_t columns,
                         Run&& run) {
  auto shape = CheckBlock({&ub, &u}, {"ub", "u"}, columns != 0);
  if (shape.has_error()) return shape.error();
  const ffi::DataType dt = ub.element_type();
  const int64_t parts = shape->Partials(dt, PartialNormsUpdate::kUnroll);
  JAX_OPS_RETURN_IF_ERROR(CheckRowArray(ub_partials, "ub_partials", dt, shape->lead, parts));
  JAX_OPS_RETURN_IF_ERROR(CheckRowArray(beta, "beta", dt, shape->lead, -1));
  JAX_OPS_RETURN_IF_ERROR(CheckRowArray(vb_coef, "vb_coef", dt, shape->lead, -1));
  JAX_OPS_RETURN_IF_ERROR(CheckCoefWorkspace(coef_ws, dt, *shape, NormalizeUpdate::kCoef));
  const ffi::AnyBuffer* ins[] = {&ub};
  ffi::AnyBuffer* outs[] = {&u};
  return run(UpdateTag<NormalizeUpdate>{}, dt, "ub", *shape, ins, outs, nullptr, &coef_ws, [&](auto& st) {
    using T = StateType<decltype(st)>;
    st.norm_partials = Data<T>(ub_partials);
    st.num_norm_partials = parts;
    st.beta_out = Data<T>(beta);
    st.vb_coef_out = Data<T>(vb_coef);
  });
}

template <typename Run>
ffi::Error IterationStepCall(const ffi::AnyBuffer& vb, const ffi::AnyBuffer& h, const ffi::AnyBuffer& hbar,
                             const ffi::AnyBuffer& x, const ffi::AnyBuffer& vb_partials, const ffi::AnyBuffer& sc,
                             const ffi::AnyBuffer& ints, const ffi::AnyBuffer& beta, const ffi::AnyBuffer& params,
                             ffi::AnyBuffer& v_out, ffi::AnyBuffer& h_out, ffi::AnyBuffer& hbar_out,
                             ffi::AnyBuffer& x_out, ffi::AnyBuffer& x_partials, ffi::AnyBuffer& coef_ws,
                             int32_t columns, Run&& run) {
  auto shape = CheckBlock({&vb, &h, &hbar, &x, &v_out, &h_out, &hbar_out, &x_out},
                          {"vb", "h", "hbar", "x", "v_out", "h_out", "hbar_out", "x_out"}, columns != 0);
  if (shape.has_error()) return shape.error();
  const ffi::DataType dt = vb.element_type();
  const int64_t parts = shape->Partials(dt, PartialNormsUpdate::kUnroll);
  JAX_OPS_RETURN_IF_ERROR(CheckRowArray(vb_partials, "vb_partials", dt, shape->lead, parts));
  JAX_OPS_RETURN_IF_ERROR(CheckColumnState(dt, shape->lead, sc, ints, params, beta));
  JAX_OPS_RETURN_IF_ERROR(CheckRowArray(x_partials, "x_partials", dt, shape->lead, shape->Partials(dt, 1)));
  JAX_OPS_RETURN_IF_ERROR(CheckCoefWorkspace(coef_ws, dt, *shape, LsmrIterationUpdate::kCoef));
  const ffi::AnyBuffer* ins[] = {&vb, &h, &hbar, &x};
  ffi::AnyBuffer* outs[] = {&v_out, &h_out, &hbar_out, &x_out};
  return run(UpdateTag<LsmrIterationUpdate>{}, dt, "vb", *shape, ins, outs, &x_partials, &coef_ws, [&](auto& st) {
    using T = StateType<decltype(st)>;
    st.norm_partials = Data<T>(vb_partials);
    st.num_norm_partials = parts;
    st.sc = Data<T>(sc);
    st.ints = Data<int32_t>(ints);
    st.params = Data<T>(params);
    st.beta = Data<T>(beta);
  });
}

// The scalars handler's body: argument checks, then `run(const ScalarsArgs<T>&)` for the dtype of sc (the host
// loop over columns, or the CUDA launch).
template <typename Run>
ffi::Error ScalarsCall(ffi::AnyBuffer& sc, ffi::AnyBuffer& ints, ffi::AnyBuffer& neg_alpha, const ffi::AnyBuffer& beta,
                       const ffi::AnyBuffer& params, const ffi::AnyBuffer& maxiter, const ffi::AnyBuffer& vb_partials,
                       const ffi::AnyBuffer& x_partials, ffi::AnyBuffer& sc_out, ffi::AnyBuffer& ints_out,
                       ffi::AnyBuffer& neg_alpha_out, Run&& run) {
  auto args = CheckScalarsArgs(sc, ints, neg_alpha, beta, params, maxiter, vb_partials, x_partials, sc_out, ints_out,
                               neg_alpha_out);
  if (args.has_error()) return args.error();
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(sc.element_type(), "sc", [&](auto tag) -> ffi::Error {
    using T = ffi::NativeType<decltype(tag)::value>;
    return run(args->Typed<T>());
  });
}

}  // namespace jax_ops::lsmr
