// FFI bindings of the LSMR targets for both platforms: the CPU twin passes xla::ffi::Ffi::Bind(), the CUDA
// handlers a Bind() with the stream context (as JAX_OPS_CSR_SPMM_BINDING does for the sparse target). One list per
// target, in the handlers' argument order (contracts in params.h).
#pragma once

#include "xla/ffi/api/ffi.h"

#define JAX_OPS_LSMR_BUF xla::ffi::AnyBuffer

// hbar_x: h, hbar, x, c_h, c_x -> hbar', x'
#define JAX_OPS_LSMR_HBAR_X_BINDING(BIND) \
  BIND.Arg<JAX_OPS_LSMR_BUF>()            \
      .Arg<JAX_OPS_LSMR_BUF>()            \
      .Arg<JAX_OPS_LSMR_BUF>()            \
      .Arg<JAX_OPS_LSMR_BUF>()            \
      .Arg<JAX_OPS_LSMR_BUF>()            \
      .Ret<JAX_OPS_LSMR_BUF>()            \
      .Ret<JAX_OPS_LSMR_BUF>()

// h: v, h, c_v -> h'
#define JAX_OPS_LSMR_H_BINDING(BIND) \
  BIND.Arg<JAX_OPS_LSMR_BUF>().Arg<JAX_OPS_LSMR_BUF>().Arg<JAX_OPS_LSMR_BUF>().Ret<JAX_OPS_LSMR_BUF>()

// step: vb, v, h, hbar, x, s_v, keep_v, c_h, c_x, c_v -> v', h', hbar', x', partials
#define JAX_OPS_LSMR_STEP_BINDING(BIND) \
  BIND.Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Arg<JAX_OPS_LSMR_BUF>()          \
      .Ret<JAX_OPS_LSMR_BUF>()          \
      .Ret<JAX_OPS_LSMR_BUF>()          \
      .Ret<JAX_OPS_LSMR_BUF>()          \
      .Ret<JAX_OPS_LSMR_BUF>()          \
      .Ret<JAX_OPS_LSMR_BUF>()

// partial_norms: vec -> partials; attr columns
#define JAX_OPS_LSMR_PARTIAL_NORMS_BINDING(BIND) \
  BIND.Arg<JAX_OPS_LSMR_BUF>().Ret<JAX_OPS_LSMR_BUF>().Attr<int32_t>("columns")

// normalize: ub, ub_partials -> u, beta, vb_coef, coef_ws; attr columns
#define JAX_OPS_LSMR_NORMALIZE_BINDING(BIND) \
  BIND.Arg<JAX_OPS_LSMR_BUF>()               \
      .Arg<JAX_OPS_LSMR_BUF>()               \
      .Ret<JAX_OPS_LSMR_BUF>()               \
      .Ret<JAX_OPS_LSMR_BUF>()               \
      .Ret<JAX_OPS_LSMR_BUF>()               \
      .Ret<JAX_OPS_LSMR_BUF>()               \
      .Attr<int32_t>("columns")

// iteration_step: vb, h, hbar, x, vb_partials, sc, ints, beta, params -> v', h', hbar', x', x_partials, coef_ws;
// attr columns
#define JAX_OPS_LSMR_ITERATION_STEP_BINDING(BIND) \
  BIND.Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Arg<JAX_OPS_LSMR_BUF>()                    \
      .Ret<JAX_OPS_LSMR_BUF>()                    \
      .Ret<JAX_OPS_LSMR_BUF>()                    \
      .Ret<JAX_OPS_LSMR_BUF>()                    \
      .Ret<JAX_OPS_LSMR_BUF>()                    \
      .Ret<JAX_OPS_LSMR_BUF>()                    \
      .Ret<JAX_OPS_LSMR_BUF>()                    \
      .Attr<int32_t>("columns")

// scalars: sc, ints, neg_alpha, beta, params, maxiter, vb_partials, x_partials -> sc', ints', -alpha
#define JAX_OPS_LSMR_SCALARS_BINDING(BIND) \
  BIND.Arg<JAX_OPS_LSMR_BUF>()             \
      .Arg<JAX_OPS_LSMR_BUF>()             \
      .Arg<JAX_OPS_LSMR_BUF>()             \
      .Arg<JAX_OPS_LSMR_BUF>()             \
      .Arg<JAX_OPS_LSMR_BUF>()             \
      .Arg<JAX_OPS_LSMR_BUF>()             \
      .Arg<JAX_OPS_LSMR_BUF>()             \
      .Arg<JAX_OPS_LSMR_BUF>()             \
      .Ret<JAX_OPS_LSMR_BUF>()             \
      .Ret<JAX_OPS_LSMR_BUF>()             \
      .Ret<JAX_OPS_LSMR_BUF>()
