// The GEMM epilogue's per-element math (params.h's formula), written once for the CPU twin and the CUDA kernels:
// the activations and the composition acc -> z -> out. Kernels load the operands of one element and call Apply;
// how they load (vectorised, from shared memory, ...) is theirs.
#pragma once

#include <cmath>
#include <cstdint>

#include "gemm/params.h"

#ifdef __CUDACC__
#define JAX_OPS_GEMM_HD __host__ __device__ __forceinline__
#else
#define JAX_OPS_GEMM_HD inline
#endif

namespace jax_ops::gemm {

// act(z) in Acc (float or double). NaN propagates through every activation (relu included, as jax.nn.relu).
template <typename Acc>
JAX_OPS_GEMM_HD Acc Activate(Activation act, Acc z) {
  switch (act) {
    case Activation::kRelu:
      return z > Acc(0) ? z : (z != z ? z : Acc(0));
    case Activation::kGeluTanh: {
      const Acc kSqrt2OverPi = Acc(0.7978845608028654);
      return Acc(0.5) * z * (Acc(1) + tanh(kSqrt2OverPi * (z + Acc(0.044715) * z * z * z)));
    }
    case Activation::kGelu:
      return Acc(0.5) * z * (Acc(1) + erf(z * Acc(0.7071067811865476)));
    case Activation::kSilu:
      return z / (Acc(1) + exp(-z));
    case Activation::kIdentity:
    default:
      return z;
  }
}

// The operands of one output element's epilogue, as loaded by the caller (absent ones keep their neutral value).
template <typename Acc>
struct EpilogueScalars {
  Acc scale = Acc(1);     // a_scale[m] * b_scale[n] (1 without scales)
  Acc c = Acc(0);         // c[b, m, n] (read only when beta != 0)
  Acc bias = Acc(0);      // bias[n]
  Acc residual = Acc(0);  // residual[b, m, n]
};

// z = alpha * acc * scale + beta * c + bias (the pre-activation).
template <typename Acc>
JAX_OPS_GEMM_HD Acc PreActivation(Acc acc, Acc alpha, Acc beta, const EpilogueScalars<Acc>& s) {
  Acc z = alpha * (acc * s.scale) + s.bias;
  if (beta != Acc(0)) z += beta * s.c;
  return z;
}

// out = act(z) + residual (non-gated) ...
template <typename Acc>
JAX_OPS_GEMM_HD Acc Output(Activation act, Acc z, Acc residual) {
  return Activate(act, z) + residual;
}
// ... and act(z_gate) * z_up + residual (gated).
template <typename Acc>
JAX_OPS_GEMM_HD Acc GatedOutput(Activation act, Acc z_gate, Acc z_up, Acc residual) {
  return Activate(act, z_gate) * z_up + residual;
}

}  // namespace jax_ops::gemm
