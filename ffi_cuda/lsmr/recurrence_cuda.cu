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
                       const char* const (&coef_names)[NC]) {
  auto shape = CheckRecurrenceArgs(vectors, vector_names, coefs, coef_names);
  if (shape.has_error()) return shape.error();
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

ffi::Error HHbarXCuda(cudaStream_t stream, ffi::AnyBuffer v, ffi::AnyBuffer h, ffi::AnyBuffer hbar, ffi::AnyBuffer x,
                      ffi::AnyBuffer c_h, ffi::AnyBuffer c_x, ffi::AnyBuffer c_v, ffi::Result<ffi::AnyBuffer> h_out,
                      ffi::Result<ffi::AnyBuffer> hbar_out, ffi::Result<ffi::AnyBuffer> x_out) {
  return RunOnDevice<HHbarXUpdate>(stream, {&v, &h, &hbar, &x}, {&*h_out, &*hbar_out, &*x_out}, {&c_h, &c_x, &c_v},
                                   {&v, &h, &hbar, &x, &*h_out, &*hbar_out, &*x_out},
                                   {"v", "h", "hbar", "x", "h_out", "hbar_out", "x_out"}, {"c_h", "c_x", "c_v"});
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHHbarXCuda, jax_ops::lsmr::HHbarXCuda,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>(),
                              {xla::ffi::Traits::kCmdBufferCompatible});
