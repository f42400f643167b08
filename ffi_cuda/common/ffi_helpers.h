// Helpers shared by every FFI handler, CPU and CUDA: error returns with file:line, shape checks and the
// dtype dispatch. Host-only code; no CUDA headers here so the CPU module builds without a toolkit.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace jax_ops {

namespace ffi = xla::ffi;

#define JAX_OPS_STRINGIFY_INNER(x) #x
#define JAX_OPS_STRINGIFY(x) JAX_OPS_STRINGIFY_INNER(x)
#define JAX_OPS_WHERE __FILE__ ":" JAX_OPS_STRINGIFY(__LINE__)

// Propagate a failed ffi::Error from a helper.
#define JAX_OPS_RETURN_IF_ERROR(expr)                 \
  do {                                                \
    ::xla::ffi::Error jax_ops_err_ = (expr);          \
    if (!jax_ops_err_.success()) return jax_ops_err_; \
  } while (0)

// Return InvalidArgument("<file:line>: message") when `cond` is false. The message is streamed:
// JAX_OPS_CHECK_ARG(a == b, "h has " << a << " elements, x has " << b);
#define JAX_OPS_CHECK_ARG(cond, msg)                                 \
  do {                                                               \
    if (!(cond)) {                                                   \
      std::ostringstream jax_ops_os_;                                \
      jax_ops_os_ << msg << " [" << JAX_OPS_WHERE << ": " #cond "]"; \
      return ::xla::ffi::Error::InvalidArgument(jax_ops_os_.str());  \
    }                                                                \
  } while (0)

inline const char* DTypeName(ffi::DataType dt) {
  switch (dt) {
    case ffi::DataType::F16:
      return "float16";
    case ffi::DataType::BF16:
      return "bfloat16";
    case ffi::DataType::F32:
      return "float32";
    case ffi::DataType::F64:
      return "float64";
    case ffi::DataType::S32:
      return "int32";
    case ffi::DataType::S64:
      return "int64";
    case ffi::DataType::PRED:
      return "bool";
    case ffi::DataType::F8E4M3FN:
      return "float8_e4m3fn";
    case ffi::DataType::F8E5M2:
      return "float8_e5m2";
    case ffi::DataType::S8:
      return "int8";
    default:
      return "unsupported dtype";
  }
}

// "[3, 4]" for messages.
template <typename Dims>
std::string ShapeString(const Dims& dims) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? ", " : "") << dims[i];
  os << ']';
  return os.str();
}

template <typename Dims>
int64_t NumElements(const Dims& dims) {
  int64_t n = 1;
  for (auto d : dims) n *= static_cast<int64_t>(d);
  return n;
}

// A compile-time dtype passed to the dispatch callback.
template <ffi::DataType DT>
struct DTypeTag {
  static constexpr ffi::DataType value = DT;
};

// Call fn(DTypeTag<dt>{}) for dt among `Allowed`, else InvalidArgument naming `what`.
// One dispatch point per handler; the callback turns the tag into native types.
template <ffi::DataType... Allowed, typename Fn>
ffi::Error DispatchDType(ffi::DataType dt, std::string_view what, Fn&& fn) {
  ffi::Error result = ffi::Error::Success();
  const bool matched = ((dt == Allowed ? (result = fn(DTypeTag<Allowed>{}), true) : false) || ...);
  if (!matched) {
    std::ostringstream os;
    os << what << " has dtype " << DTypeName(dt) << ", which this kernel does not support";
    return ffi::Error::InvalidArgument(os.str());
  }
  return result;
}

// Shape checks used by handlers to re-validate what Python already checked.
inline ffi::Error CheckSameShape(const ffi::AnyBuffer& a, std::string_view a_name, const ffi::AnyBuffer& b,
                                 std::string_view b_name) {
  auto da = a.dimensions();
  auto db = b.dimensions();
  bool same = da.size() == db.size();
  for (size_t i = 0; same && i < da.size(); ++i) same = da[i] == db[i];
  JAX_OPS_CHECK_ARG(
      same, a_name << " has shape " << ShapeString(da) << " but " << b_name << " has shape " << ShapeString(db));
  JAX_OPS_CHECK_ARG(a.element_type() == b.element_type(), a_name << " is " << DTypeName(a.element_type()) << " but "
                                                                 << b_name << " is " << DTypeName(b.element_type()));
  return ffi::Error::Success();
}

}  // namespace jax_ops
