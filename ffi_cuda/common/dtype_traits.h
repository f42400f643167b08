// The dtype traits every family shares: XLA FFI DataType -> storage and accumulator types, and the float <->
// f16/bf16 conversions. The host part (CpuDType, bit conversions) needs no CUDA headers, so the CPU module uses
// it; the device part (CudaDType, ToAcc/FromAcc) is compiled only by nvcc (__CUDACC__).
#pragma once

#include <cstdint>
#include <cstring>

#include "xla/ffi/api/ffi.h"

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace jax_ops {

// ---------------------------------------------------------------- host: bit-exact conversions (storage uint16_t)
// Round to nearest even, NaN kept quiet, overflow to infinity, f16 subnormals handled.
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// A non-negative float below 2^24 rounded to the nearest integer, ties to even: a subnormal's mantissa.
inline int32_t RoundHalfEven(float x) {
  int32_t r = static_cast<int32_t>(x);
  const float frac = x - static_cast<float>(r);
  if (frac > 0.5f || (frac == 0.5f && (r & 1))) ++r;
  return r;
}
inline uint32_t FloatToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);
    // subnormal: mant * 2^-24
    float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                        // below the smallest normal (2^-14): subnormal or 0
    // value * 2^24 rounded to nearest even, as an integer mantissa.
    return sign | static_cast<uint16_t>(RoundHalfEven(BitsToFloat(abs) * 16777216.0f));
  }
  // normal: rebias exponent, round mantissa from 23 to 10 bits (nearest even)
  uint32_t v = abs - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return sign | static_cast<uint16_t>(v >> 13);
}

// float8 e4m3fn (no infinity; 0x7f / 0xff are NaN): exact decoding, and encoding with nearest even that saturates
// at +-448 (infinities included), as CUDA's __NV_SATFINITE conversion does.
inline float E4m3fnToFloat(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  if (exp == 0xfu && mant == 0x7u) return BitsToFloat(sign | 0x7fc00000u);
  if (exp == 0) {
    const float sub = static_cast<float>(mant) * 0.001953125f;  // mant * 2^-9
    return sign ? -sub : sub;
  }
  return BitsToFloat(sign | ((exp + 120u) << 23) | (mant << 20));
}
inline uint8_t FloatToE4m3fn(float f) {
  const uint32_t u = FloatToBits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (abs >= 0x43e00000u) return sign | 0x7eu;  // >= 448: saturate
  if (abs < 0x3c800000u)  // below the smallest normal (2^-6): value * 2^9, nearest even (8: the smallest normal)
    return sign | static_cast<uint8_t>(RoundHalfEven(BitsToFloat(abs) * 512.0f));
  uint32_t v = abs - (120u << 23);  // rebias, then round the mantissa from 23 to 3 bits (nearest even)
  v += 0x7ffffu + ((v >> 20) & 1u);
  const uint32_t bits = v >> 20;
  return sign | static_cast<uint8_t>(bits > 0x7eu ? 0x7eu : bits);
}

// ---------------------------------------------------------------- host: CPU storage / accumulator per dtype
// T: the element type on the CPU (XLA FFI's NativeType: uint16_t bits for F16/BF16); Acc: the accumulator
// (float for 16-bit types, else T); Load/Store: T <-> Acc.
template <xla::ffi::DataType DT>
struct CpuDType;
template <>
struct CpuDType<xla::ffi::DataType::F32> {
  using T = float;
  using Acc = float;
  static Acc Load(T v) { return v; }
  static T Store(Acc v) { return v; }
};
template <>
struct CpuDType<xla::ffi::DataType::F64> {
  using T = double;
  using Acc = double;
  static Acc Load(T v) { return v; }
  static T Store(Acc v) { return v; }
};
template <>
struct CpuDType<xla::ffi::DataType::F16> {
  using T = uint16_t;
  using Acc = float;
  static Acc Load(T v) { return HalfToFloat(v); }
  static T Store(Acc v) { return FloatToHalf(v); }
};
template <>
struct CpuDType<xla::ffi::DataType::BF16> {
  using T = uint16_t;
  using Acc = float;
  static Acc Load(T v) { return Bf16ToFloat(v); }
  static T Store(Acc v) { return FloatToBf16(v); }
};
template <>
struct CpuDType<xla::ffi::DataType::F8E4M3FN> {
  using T = uint8_t;
  using Acc = float;
  static Acc Load(T v) { return E4m3fnToFloat(v); }
  static T Store(Acc v) { return FloatToE4m3fn(v); }
};

#ifdef __CUDACC__
// ---------------------------------------------------------------- device: CUDA storage / accumulator per dtype
// T: the element type in CUDA code (__half / __nv_bfloat16 for F16 / BF16); Acc as for CpuDType.
template <xla::ffi::DataType DT>
struct CudaDType;
template <>
struct CudaDType<xla::ffi::DataType::F32> {
  using T = float;
  using Acc = float;
};
template <>
struct CudaDType<xla::ffi::DataType::F64> {
  using T = double;
  using Acc = double;
};
template <>
struct CudaDType<xla::ffi::DataType::F16> {
  using T = __half;
  using Acc = float;
};
template <>
struct CudaDType<xla::ffi::DataType::BF16> {
  using T = __nv_bfloat16;
  using Acc = float;
};

// Device conversions: ToAcc(T) widens to the accumulator, FromAcc<T>(Acc) rounds back (nearest even).
__device__ __forceinline__ float ToAcc(float v) { return v; }
__device__ __forceinline__ double ToAcc(double v) { return v; }
__device__ __forceinline__ float ToAcc(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToAcc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromAcc(float v);
template <>
__device__ __forceinline__ float FromAcc<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromAcc<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 FromAcc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <typename T>
__device__ __forceinline__ T FromAcc(double v) {
  return v;
}
#endif  // __CUDACC__

}  // namespace jax_ops
