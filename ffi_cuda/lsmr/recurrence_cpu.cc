// CPU twin of the fused LSMR recurrences: the same FFI contract as recurrence_cuda.cu, plain loops.
#include <algorithm>
#include <cmath>

#include "lsmr/recurrence_params.h"

namespace jax_ops::lsmr {
namespace {

template <typename Update, size_t NV, size_t NC>
ffi::Error RunOnHost(const ffi::AnyBuffer* const (&ins)[Update::kIn], ffi::AnyBuffer* const (&outs)[Update::kOut],
                     const ffi::AnyBuffer* const (&coefs)[NC], const ffi::AnyBuffer* const (&vectors)[NV],
                     const char* const (&vector_names)[NV], const char* const (&coef_names)[NC],
                     ffi::AnyBuffer* partials = nullptr) {
  auto shape = CheckRecurrenceArgs(vectors, vector_names, coefs, coef_names);
  if (shape.has_error()) return shape.error();
  int64_t num_partials = 0;
  if (partials != nullptr) {
    num_partials = NormPartialsFor(vectors[0]->element_type(), shape->n);
    ffi::Error e = CheckPartials(*partials, *vectors[0], num_partials);
    if (!e.success()) return e;
  }
  return DispatchDType<ffi::DataType::F32, ffi::DataType::F64>(
      ins[0]->element_type(), vector_names[0], [&](auto tag) -> ffi::Error {
        using T = ffi::NativeType<decltype(tag)::value>;
        const T* in_ptr[Update::kIn];
        T* out_ptr[Update::kOut];
        for (int k = 0; k < Update::kIn; ++k) in_ptr[k] = static_cast<const T*>(ins[k]->untyped_data());
        for (int k = 0; k < Update::kOut; ++k) out_ptr[k] = static_cast<T*>(outs[k]->untyped_data());
        const int64_t rows = shape->rows, n = shape->n;  // locals: lets the compiler keep them in registers
        // Partial norms: partial p of a row covers its elements [p*n/P, (p+1)*n/P) (the CUDA kernel assigns
        // them to CTAs differently; only the norm of the row's partials is part of the contract).
        T* part = partials != nullptr ? static_cast<T*>(partials->untyped_data()) : nullptr;
        for (int64_t r = 0; r < rows; ++r) {
          T c[Update::kCoef];
          for (int k = 0; k < Update::kCoef; ++k) c[k] = static_cast<const T*>(coefs[k]->untyped_data())[r];
          for (int64_t p = 0; p < std::max<int64_t>(num_partials, 1); ++p) {
            const int64_t begin = r * n + (num_partials ? p * n / num_partials : 0);
            const int64_t end = r * n + (num_partials ? (p + 1) * n / num_partials : n);
            double squares = 0;
            for (int64_t i = begin; i < end; ++i) {
              T in[Update::kIn], out[Update::kOut];
              for (int k = 0; k < Update::kIn; ++k) in[k] = in_ptr[k][i];
              Update::Apply(c, in, out);
              for (int k = 0; k < Update::kOut; ++k) out_ptr[k][i] = out[k];
              if constexpr (Update::kNormOut >= 0)
                squares += static_cast<double>(out[Update::kNormOut]) * out[Update::kNormOut];
            }
            if (part != nullptr) part[r * num_partials + p] = static_cast<T>(std::sqrt(squares));
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

XLA_FFI_DEFINE_HANDLER_SYMBOL(JaxOpsLsmrStepCpu, jax_ops::lsmr::StepCpu,
                              xla::ffi::Ffi::Bind()
                                  .Arg<xla::ffi::AnyBuffer>()    // vb
                                  .Arg<xla::ffi::AnyBuffer>()    // v
                                  .Arg<xla::ffi::AnyBuffer>()    // h
                                  .Arg<xla::ffi::AnyBuffer>()    // hbar
                                  .Arg<xla::ffi::AnyBuffer>()    // x
                                  .Arg<xla::ffi::AnyBuffer>()    // s_v
                                  .Arg<xla::ffi::AnyBuffer>()    // keep_v
                                  .Arg<xla::ffi::AnyBuffer>()    // c_h
                                  .Arg<xla::ffi::AnyBuffer>()    // c_x
                                  .Arg<xla::ffi::AnyBuffer>()    // c_v
                                  .Ret<xla::ffi::AnyBuffer>()    // v'
                                  .Ret<xla::ffi::AnyBuffer>()    // h'
                                  .Ret<xla::ffi::AnyBuffer>()    // hbar'
                                  .Ret<xla::ffi::AnyBuffer>()    // x'
                                  .Ret<xla::ffi::AnyBuffer>());  // partials
