// CUDA FFI handlers for the fused LSMR recurrences: decode, validate, dispatch on dtype, launch.
#include "common/cuda_helpers.h"
#include "lsmr/recurrence_kernels.h"
#include "lsmr/recurrence_params.h"

namespace jax_ops::lsmr {
namespace {

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
  auto props = CurrentDeviceProps();
  if (props.has_error()) return props.error();
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(
      ins[0]->element_type(), vector_names[0], [&](auto tag) -> ffi::Error {
        using T = ffi::NativeType<decltype(tag)::value>;
        RowwiseArgs<T, Update::kIn, Update::kOut, Update::kCoef> args;
        for (int k = 0; k < Update::kIn; ++k) args.in[k] = static_cast<const T*>(ins[k]->untyped_data());
        for (int k = 0; k < Update::kOut; ++k) args.out[k] = static_cast<T*>(outs[k]->untyped_data());
        for (int k = 0; k < Update::kCoef; ++k) args.coef[k] = static_cast<const T*>(coefs[k]->untyped_data());
        args.rows = shape->rows;
        args.n = shape->n;
        if (partials != nullptr) args.partials = static_cast<T*>(partials->untyped_data());
        JAX_OPS_RETURN_IF_CUDA_ERROR((LaunchRowwise<Update, T>(stream, args, (*props)->sm_count)));
        return ffi::Error::Success();
      });
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

}  // namespace
}  // namespace jax_ops::lsmr

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHbarXCuda, jax_ops::lsmr::HbarXCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHCuda, jax_ops::lsmr::HCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrStepCuda, jax_ops::lsmr::StepCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()   // vb
                                  .Arg<xla::ffi::AnyBuffer>()   // v
                                  .Arg<xla::ffi::AnyBuffer>()   // h
                                  .Arg<xla::ffi::AnyBuffer>()   // hbar
                                  .Arg<xla::ffi::AnyBuffer>()   // x
                                  .Arg<xla::ffi::AnyBuffer>()   // s_v
                                  .Arg<xla::ffi::AnyBuffer>()   // keep_v
                                  .Arg<xla::ffi::AnyBuffer>()   // c_h
                                  .Arg<xla::ffi::AnyBuffer>()   // c_x
                                  .Arg<xla::ffi::AnyBuffer>()   // c_v
                                  .Ret<xla::ffi::AnyBuffer>()   // v'
                                  .Ret<xla::ffi::AnyBuffer>()   // h'
                                  .Ret<xla::ffi::AnyBuffer>()   // hbar'
                                  .Ret<xla::ffi::AnyBuffer>()   // x'
                                  .Ret<xla::ffi::AnyBuffer>(),  // partials
                              {xla::ffi::Traits::kCmdBufferCompatible});
