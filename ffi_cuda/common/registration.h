// Wraps an FFI handler symbol in the capsule jax.ffi.register_ffi_target expects.
#pragma once

#include <nanobind/nanobind.h>

#include "xla/ffi/api/api.h"

namespace jax_ops {

inline nanobind::capsule HandlerCapsule(XLA_FFI_Error* (*fn)(XLA_FFI_CallFrame*)) {
  return nanobind::capsule(reinterpret_cast<void*>(fn), "xla._CUSTOM_CALL_TARGET");
}

}  // namespace jax_ops
