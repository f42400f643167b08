// The device side of the GEMM epilogue shared by the SIMT and skinny kernels: element conversions for every dtype of
// params.h (fp8 and int8 included), and the per-element store that loads one output element's epilogue operands
// from KernelArgs, applies epilogue.h's formula and writes out (and preact). Kernels call StorePlain / StoreGated
// once per output element with its accumulator(s).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "common/dtype_traits.h"
#include "gemm/epilogue.h"
#include "gemm/kernels.h"

namespace jax_ops::gemm {

// The value of one input element in the compute domain: float (16-bit, f32, fp8: exact), double (f64) or int32 (s8).
__device__ __forceinline__ float Widen(float v) { return v; }
__device__ __forceinline__ double Widen(double v) { return v; }
__device__ __forceinline__ float Widen(__half v) { return __half2float(v); }
__device__ __forceinline__ float Widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float Widen(__nv_fp8_e4m3 v) { return static_cast<float>(v); }
__device__ __forceinline__ float Widen(__nv_fp8_e5m2 v) { return static_cast<float>(v); }
__device__ __forceinline__ int32_t Widen(int8_t v) { return v; }

// The epilogue's arithmetic type for a compute type: double for f64, float otherwise (int32 sums convert to float).
template <typename C>
using EpilogueAcc = std::conditional_t<std::is_same_v<C, double>, double, float>;

template <typename Acc>
__device__ __forceinline__ Acc ScaleAt(const KernelArgs& p, int64_t m, int64_t col) {
  Acc s = Acc(1);
  if (p.a_scale) s = Acc(p.a_scale[p.a_scale_len == 1 ? 0 : m]);
  if (p.b_scale) s *= Acc(p.b_scale[p.b_scale_len == 1 ? 0 : col]);
  return s;
}

// bias[col]: float32, or float64 for an f64 GEMM (params.h; KernelArgs carries the pointer untyped as float*).
template <typename Acc>
__device__ __forceinline__ Acc BiasAt(const KernelArgs& p, int64_t col) {
  if (!p.bias) return Acc(0);
  if constexpr (std::is_same_v<Acc, double>)
    return reinterpret_cast<const double*>(p.bias)[col];
  else
    return p.bias[col];
}

template <typename TO>
__device__ __forceinline__ auto LoadOut(const void* base, int64_t i) {
  return ToAcc(static_cast<const TO*>(base)[i]);
}

// Output element (batch, m, n) of a non-gated GEMM from its accumulator (params.h's formula).
template <typename TO, typename Acc>
__device__ __forceinline__ void StorePlain(const KernelArgs& p, int64_t batch, int64_t m, int64_t n, Acc acc) {
  const int64_t i = (batch * p.m + m) * p.n + n;
  EpilogueScalars<Acc> s;
  s.scale = ScaleAt<Acc>(p, m, n);
  s.bias = BiasAt<Acc>(p, n);
  if (p.c) s.c = LoadOut<TO>(p.c, i);
  if (p.residual) s.residual = LoadOut<TO>(p.residual, i);
  const Acc z = PreActivation(acc, Acc(p.alpha), Acc(p.beta), s);
  static_cast<TO*>(p.out)[i] = FromAcc<TO>(Output(p.activation, z, s.residual));
  if (p.preact) static_cast<TO*>(p.preact)[i] = FromAcc<TO>(z);
}

// Output element (batch, m, n) of a gated GEMM from its gate and up accumulators: the up column's bias and b_scale
// are at n + N, its preact at [.., N + n].
template <typename TO, typename Acc>
__device__ __forceinline__ void StoreGated(const KernelArgs& p, int64_t batch, int64_t m, int64_t n, Acc gate, Acc up) {
  const int64_t i = (batch * p.m + m) * p.n + n;
  EpilogueScalars<Acc> sg, su;
  sg.scale = ScaleAt<Acc>(p, m, n);
  su.scale = ScaleAt<Acc>(p, m, p.n + n);
  sg.bias = BiasAt<Acc>(p, n);
  su.bias = BiasAt<Acc>(p, p.n + n);
  const Acc residual = p.residual ? Acc(LoadOut<TO>(p.residual, i)) : Acc(0);
  const Acc zg = PreActivation(gate, Acc(p.alpha), Acc(0), sg);
  const Acc zu = PreActivation(up, Acc(p.alpha), Acc(0), su);
  static_cast<TO*>(p.out)[i] = FromAcc<TO>(GatedOutput(p.activation, zg, zu, residual));
  if (p.preact) {
    TO* pre = static_cast<TO*>(p.preact) + (batch * p.m + m) * 2 * p.n;
    pre[n] = FromAcc<TO>(zg);
    pre[p.n + n] = FromAcc<TO>(zu);
  }
}

// A dtype as a type, for the launchers' dtype dispatch.
template <typename T>
struct TypeTag {
  using type = T;
};

}  // namespace jax_ops::gemm
