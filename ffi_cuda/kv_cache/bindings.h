// The FFI bindings of the kv_cache targets (the same lists for the CPU twin and the CUDA handlers; the CUDA ones
// pass a `Bind()` with the stream context first). Order as in params.h.
#pragma once

#include "common/ffi_helpers.h"

#define JAX_OPS_KV_ARG .Arg<xla::ffi::AnyBuffer>()
#define JAX_OPS_KV_RET .Ret<xla::ffi::AnyBuffer>()
// k_pages, v_pages, k_scales, v_scales, block_table, lengths, k_new, v_new
//   -> k_pages, v_pages, k_scales, v_scales, lengths, status
#define JAX_OPS_KV_APPEND_BINDING(BIND)                                                                         \
  BIND JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG \
      JAX_OPS_KV_ARG JAX_OPS_KV_RET JAX_OPS_KV_RET JAX_OPS_KV_RET JAX_OPS_KV_RET JAX_OPS_KV_RET JAX_OPS_KV_RET
#define JAX_OPS_KV_APPEND_PARAMS                                                                               \
  xla::ffi::AnyBuffer k_pages, xla::ffi::AnyBuffer v_pages, xla::ffi::AnyBuffer k_scales,                      \
      xla::ffi::AnyBuffer v_scales, xla::ffi::AnyBuffer block_table, xla::ffi::AnyBuffer lengths,              \
      xla::ffi::AnyBuffer k_new, xla::ffi::AnyBuffer v_new, xla::ffi::Result<xla::ffi::AnyBuffer> k_pages_out, \
      xla::ffi::Result<xla::ffi::AnyBuffer> v_pages_out, xla::ffi::Result<xla::ffi::AnyBuffer> k_scales_out,   \
      xla::ffi::Result<xla::ffi::AnyBuffer> v_scales_out, xla::ffi::Result<xla::ffi::AnyBuffer> lengths_out,   \
      xla::ffi::Result<xla::ffi::AnyBuffer> status
// q, k_pages, v_pages, k_scales, v_scales, block_table, lengths; scale, softcap, splits, tma_load,
// merge_in_kernel -> o, o_parts, lse_parts
#define JAX_OPS_KV_DECODE_BINDING(BIND)                                                                         \
  BIND JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG JAX_OPS_KV_ARG \
      .Attr<float>("scale")                                                                                     \
      .Attr<float>("softcap")                                                                                   \
      .Attr<int64_t>("splits")                                                                                  \
      .Attr<bool>("tma_load")                                                                                   \
      .Attr<bool>("merge_in_kernel") JAX_OPS_KV_RET JAX_OPS_KV_RET JAX_OPS_KV_RET
#define JAX_OPS_KV_DECODE_PARAMS                                                                                   \
  xla::ffi::AnyBuffer q, xla::ffi::AnyBuffer k_pages, xla::ffi::AnyBuffer v_pages, xla::ffi::AnyBuffer k_scales,   \
      xla::ffi::AnyBuffer v_scales, xla::ffi::AnyBuffer block_table, xla::ffi::AnyBuffer lengths, float scale,     \
      float softcap, int64_t splits, bool tma_load, bool merge_in_kernel, xla::ffi::Result<xla::ffi::AnyBuffer> o, \
      xla::ffi::Result<xla::ffi::AnyBuffer> o_parts, xla::ffi::Result<xla::ffi::AnyBuffer> lse_parts
