// CPU twin of the fused LSMR recurrences: the same FFI contract as recurrence_cuda.cu, plain loops.
#include "lsmr/recurrence_params.h"

namespace jax_ops::lsmr {
namespace {

template <typename Update, size_t NV, size_t NC>
ffi::Error RunOnHost(const ffi::AnyBuffer* const (&ins)[Update::kIn], ffi::AnyBuffer* const (&outs)[Update::kOut],
                     const ffi::AnyBuffer* const (&coefs)[NC], const ffi::AnyBuffer* const (&vectors)[NV],
                     const char* const (&vector_names)[NV], const char* const (&coef_names)[NC]) {
  auto shape = CheckRecurrenceArgs(vectors, vector_names, coefs, coef_names);
  if (shape.has_error()) return shape.error();
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(
      ins[0]->element_type(), vector_names[0], [&](auto tag) -> ffi::Error {
        using T = ffi::NativeType<decltype(tag)::value>;
        const T* in_ptr[Update::kIn];
        T* out_ptr[Update::kOut];
        for (int k = 0; k < Update::kIn; ++k) in_ptr[k] = static_cast<const T*>(ins[k]->untyped_data());
        for (int k = 0; k < Update::kOut; ++k) out_ptr[k] = static_cast<T*>(outs[k]->untyped_data());
        const int64_t rows = shape->rows, n = shape->n;  // locals: lets the compiler keep them in registers
        for (int64_t r = 0; r < rows; ++r) {
          T c[Update::kCoef];
          for (int k = 0; k < Update::kCoef; ++k) c[k] = static_cast<const T*>(coefs[k]->untyped_data())[r];
          const int64_t end = (r + 1) * n;
          for (int64_t i = r * n; i < end; ++i) {
            T in[Update::kIn], out[Update::kOut];
            for (int k = 0; k < Update::kIn; ++k) in[k] = in_ptr[k][i];
            Update::Apply(c, in, out);
            for (int k = 0; k < Update::kOut; ++k) out_ptr[k][i] = out[k];
          }
        }
        return ffi::Error::Success();
      });
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

ffi::Error HHbarXCpu(ffi::AnyBuffer v, ffi::AnyBuffer h, ffi::AnyBuffer hbar, ffi::AnyBuffer x, ffi::AnyBuffer c_h,
                     ffi::AnyBuffer c_x, ffi::AnyBuffer c_v, ffi::Result<ffi::AnyBuffer> h_out,
                     ffi::Result<ffi::AnyBuffer> hbar_out, ffi::Result<ffi::AnyBuffer> x_out) {
  return RunOnHost<HHbarXUpdate>({&v, &h, &hbar, &x}, {&*h_out, &*hbar_out, &*x_out}, {&c_h, &c_x, &c_v},
                                 {&v, &h, &hbar, &x, &*h_out, &*hbar_out, &*x_out},
                                 {"v", "h", "hbar", "x", "h_out", "hbar_out", "x_out"}, {"c_h", "c_x", "c_v"});
}

}  // namespace
}  // namespace jax_ops::lsmr

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHbarXCpu, jax_ops::lsmr::HbarXCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHCpu, jax_ops::lsmr::HCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrHHbarXCpu, jax_ops::lsmr::HHbarXCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>());
