// The FFI binding macros of the attention targets (the same list for the CPU twin and the CUDA handlers).
#pragma once

#include "common/ffi_helpers.h"

// FFI bindings of the two targets, shared by the CPU twin and the CUDA handlers (the CUDA ones pass a `Bind()`
// with the stream context first). Order as in the contract (params.h):
//   inputs q, k, v, bias, mask, q_seqlen, kv_seqlen [, o, lse, do]; the attributes (the contract's, then the
//   tuning ones); results o, lse | dq, dk, dv, dbias.
#define JAX_OPS_FFI_BUFFER_ARG .Arg<xla::ffi::AnyBuffer>()
#define JAX_OPS_FFI_BUFFER_RET .Ret<xla::ffi::AnyBuffer>()
#define JAX_OPS_ATTENTION_INPUTS                                                                                     \
  JAX_OPS_FFI_BUFFER_ARG JAX_OPS_FFI_BUFFER_ARG JAX_OPS_FFI_BUFFER_ARG JAX_OPS_FFI_BUFFER_ARG JAX_OPS_FFI_BUFFER_ARG \
      JAX_OPS_FFI_BUFFER_ARG JAX_OPS_FFI_BUFFER_ARG
#define JAX_OPS_ATTENTION_ATTRS      \
  .Attr<float>("scale")              \
      .Attr<bool>("is_causal")       \
      .Attr<int64_t>("window_left")  \
      .Attr<int64_t>("window_right") \
      .Attr<bool>("has_bias")        \
      .Attr<bool>("has_mask")        \
      .Attr<bool>("has_q_seqlen")    \
      .Attr<bool>("has_kv_seqlen")
#define JAX_OPS_ATTENTION_FWD_TUNING .Attr<bool>("portable").Attr<int64_t>("fwd_persistent")
#define JAX_OPS_ATTENTION_BWD_TUNING .Attr<bool>("portable").Attr<int64_t>("bwd_cluster")
#define JAX_OPS_ATTENTION_FWD_BINDING(BIND)                                                                 \
  BIND JAX_OPS_ATTENTION_INPUTS JAX_OPS_ATTENTION_ATTRS JAX_OPS_ATTENTION_FWD_TUNING JAX_OPS_FFI_BUFFER_RET \
      JAX_OPS_FFI_BUFFER_RET
#define JAX_OPS_ATTENTION_BWD_BINDING(BIND)                                                              \
  BIND JAX_OPS_ATTENTION_INPUTS JAX_OPS_FFI_BUFFER_ARG JAX_OPS_FFI_BUFFER_ARG JAX_OPS_FFI_BUFFER_ARG     \
      JAX_OPS_ATTENTION_ATTRS JAX_OPS_ATTENTION_BWD_TUNING JAX_OPS_FFI_BUFFER_RET JAX_OPS_FFI_BUFFER_RET \
          JAX_OPS_FFI_BUFFER_RET JAX_OPS_FFI_BUFFER_RET
