// The FFI binding of jax_ops_gemm (the same list for the CPU twin and the CUDA handler; the CUDA one passes a
// `Bind()` with the stream context first). Order as in params.h: inputs a, b, b_up, bias, c, residual, a_scale,
// b_scale; the attributes; results out, preact, workspace.
#pragma once

#include "common/ffi_helpers.h"

#define JAX_OPS_GEMM_ARG .Arg<xla::ffi::AnyBuffer>()
#define JAX_OPS_GEMM_RET .Ret<xla::ffi::AnyBuffer>()
#define JAX_OPS_GEMM_ATTRS         \
  .Attr<double>("alpha")           \
      .Attr<double>("beta")        \
      .Attr<int64_t>("activation") \
      .Attr<int64_t>("gated")      \
      .Attr<bool>("transpose_a")   \
      .Attr<bool>("transpose_b")   \
      .Attr<bool>("write_preact")  \
      .Attr<bool>("tf32")          \
      .Attr<int64_t>("plan")
#define JAX_OPS_GEMM_BINDING(BIND)                                                                           \
  BIND JAX_OPS_GEMM_ARG JAX_OPS_GEMM_ARG JAX_OPS_GEMM_ARG JAX_OPS_GEMM_ARG JAX_OPS_GEMM_ARG JAX_OPS_GEMM_ARG \
      JAX_OPS_GEMM_ARG JAX_OPS_GEMM_ARG JAX_OPS_GEMM_ATTRS JAX_OPS_GEMM_RET JAX_OPS_GEMM_RET JAX_OPS_GEMM_RET

// The handler signature both twins implement (after the stream argument on CUDA).
#define JAX_OPS_GEMM_HANDLER_PARAMS                                                                                  \
  xla::ffi::AnyBuffer a, xla::ffi::AnyBuffer b, xla::ffi::AnyBuffer b_up, xla::ffi::AnyBuffer bias,                  \
      xla::ffi::AnyBuffer c, xla::ffi::AnyBuffer residual, xla::ffi::AnyBuffer a_scale, xla::ffi::AnyBuffer b_scale, \
      double alpha, double beta, int64_t activation, int64_t gated, bool transpose_a, bool transpose_b,              \
      bool write_preact, bool tf32, int64_t plan, xla::ffi::Result<xla::ffi::AnyBuffer> out,                         \
      xla::ffi::Result<xla::ffi::AnyBuffer> preact, xla::ffi::Result<xla::ffi::AnyBuffer> workspace
