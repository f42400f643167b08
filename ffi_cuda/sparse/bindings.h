// The sparse family's FFI bindings (argument, result and attribute lists), shared by the CPU twins and the CUDA
// handlers so the two platforms' contracts cannot drift. The contracts themselves: spmm_params.h and
// slab_spmv_params.h.
#pragma once

#include "common/ffi_helpers.h"

// FFI binding of jax_ops_sparse_csr_spmm for both platforms (the CUDA handler passes a Bind() with the stream):
// inputs indptr, indices, values, b, alpha, beta, y, long_rows, long_ptr; results out, workspace; attributes.
#define JAX_OPS_CSR_SPMM_BINDING(BIND) \
  BIND.Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Arg<xla::ffi::AnyBuffer>()      \
      .Ret<xla::ffi::AnyBuffer>()      \
      .Ret<xla::ffi::AnyBuffer>()      \
      .Attr<int32_t>("algorithm")      \
      .Attr<int32_t>("group")          \
      .Attr<int64_t>("chunk")

// FFI binding of jax_ops_sparse_slab_spmv for both platforms: inputs ptr, col, val, work, u, alpha, beta, y;
// results out, workspace; attributes width, group.
#define JAX_OPS_SLAB_SPMV_BINDING(BIND) \
  BIND.Arg<xla::ffi::AnyBuffer>()       \
      .Arg<xla::ffi::AnyBuffer>()       \
      .Arg<xla::ffi::AnyBuffer>()       \
      .Arg<xla::ffi::AnyBuffer>()       \
      .Arg<xla::ffi::AnyBuffer>()       \
      .Arg<xla::ffi::AnyBuffer>()       \
      .Arg<xla::ffi::AnyBuffer>()       \
      .Arg<xla::ffi::AnyBuffer>()       \
      .Ret<xla::ffi::AnyBuffer>()       \
      .Ret<xla::ffi::AnyBuffer>()       \
      .Attr<int64_t>("width")           \
      .Attr<int32_t>("group")
