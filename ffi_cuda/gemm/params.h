// FFI contract of the GEMM family, shared by the CPU twin (gemm_cpu.cc) and the CUDA handlers (gemm_cuda.cu); the
// per-element epilogue math both compile is in epilogue.h, the bindings in bindings.h.
//
// Target (same name for "cpu" and "CUDA"):
//
//   jax_ops_gemm
//     args   a        [B, M, K]   ([B, K, M] when transpose_a)
//            b        [Bb, K, N]  ([Bb, N, K] when transpose_b); Bb is 1 (shared weights) or B.
//                                  gated == kPacked: [Bb, K, 2N], gate columns [0, N), up columns [N, 2N)
//                                  (tokamax's [K, 2, N] weight reshaped; not with transpose_b)
//            b_up     b's shape when gated == kSeparate (the up projection), else 0 elements
//            bias     f32 [N] (gated: [2N], gate then up; f64 for an f64 GEMM), or 0 elements
//            c        [B, M, N] of the out dtype, or 0 elements (read only when beta != 0; not with gated)
//            residual [B, M, N] of the out dtype, or 0 elements
//            a_scale  f32, 0 elements (none), 1 (per tensor) or M (per row of op(a))
//            b_scale  f32, 0 elements (none), 1 (per tensor) or N (per column of op(b); gated: 2N)
//     attrs  alpha, beta (f64); activation (s64, Activation); gated (s64, Gated); transpose_a, transpose_b,
//            write_preact, tf32 (bool); plan (s64, Plan: kAuto = the dispatch rule in heuristics.h, anything
//            else forces that kernel and fails with InvalidArgument when it cannot run the problem)
//     rets   out      [B, M, N] out dtype
//            preact   [B, M, N] (gated: [B, M, 2N]) out dtype when write_preact, else 0 elements: z below, what
//                     the backward needs
//            workspace u8 [W]: scratch of the cublaslt plan (W = 0 for every other plan: unused)
//
// Dtypes (a, b; out): f16/bf16 -> f16, bf16 or f32; f32 -> f32 (exact fp32 products unless tf32); f64 -> f64;
// f8e4m3fn/f8e5m2 (any pair) -> f16, bf16 or f32; s8 x s8 (int32 accumulate) -> f16, bf16 or f32 and needs both
// scales. b_up is b's dtype. All buffers are dense row-major; element offsets are int64.
//
// Math, per output element (b, m, n), in the accumulator type (f64 for f64, else f32; s8 accumulates in int32,
// converted to f32 before scaling):
//   acc  = sum_k op(a)[b, m, k] * op(b)[b % Bb, k, n]
//   s    = acc * a_scale[m or 0] * b_scale[n or 0]                          (each scale when present)
//   z    = alpha * s + beta * c[b, m, n] + bias[n]                           (c when present and beta != 0)
//   y    = act(z)                 gated: act(z_gate) * z_up (each z with its own columns of b, bias, b_scale)
//   out  = round(y + residual[b, m, n])                                      (residual when present)
//   preact = round(z)             gated: z_gate at [.., n], z_up at [.., N + n]
// round() is one round-to-nearest-even into the out dtype. NaN and Inf propagate as in jnp.
#pragma once

#include <cstdint>

#include "common/ffi_helpers.h"

namespace jax_ops::gemm {

// Activation ids, in the order of kActivationNames (Python reads both through constants(): one list).
enum class Activation : int64_t { kIdentity = 0, kRelu = 1, kGeluTanh = 2, kGelu = 3, kSilu = 4 };
inline constexpr const char* kActivationNames[] = {"identity", "relu", "gelu_tanh", "gelu", "silu"};
inline constexpr int64_t kNumActivations = 5;

enum class Gated : int64_t { kNone = 0, kSeparate = 1, kPacked = 2 };

// Kernels a call can be forced onto (the `plan` attribute); kAuto lets heuristics.h choose.
// kCublasLt runs cuBLASLt with its native epilogues (a candidate of the tuning table, never of the rules).
enum class Plan : int64_t { kAuto = 0, kSm90 = 1, kSkinny = 2, kSimt = 3, kCublasLt = 4 };
inline constexpr const char* kPlanNames[] = {"auto", "sm90", "skinny", "simt", "cublaslt"};
inline constexpr int64_t kNumPlans = 5;

// The skinny (decode) kernel's row limits, here so that Python can read them (ffi.py keeps an 8-bit b [K, N] for
// it up to kSkinnyMaxMFp8 rows and makes it K-major above, for the Hopper kernel).
inline constexpr int64_t kSkinnyMaxM = 64;     // its accumulators hold at most 64 rows of op(a) (8 mma token tiles)
inline constexpr int64_t kSkinnyMaxMFp8 = 16;  // fp8: twice the columns per lane; more rows would spill

// The checked problem both twins run: sizes, strides (elements) and which optional operands are present.
struct Problem {
  int64_t batch = 1, batch_b = 1, m = 0, n = 0, k = 0;
  bool transpose_a = false, transpose_b = false;
  Gated gated = Gated::kNone;
  Activation activation = Activation::kIdentity;
  double alpha = 1.0, beta = 0.0;
  bool has_bias = false, has_c = false, has_residual = false, write_preact = false, tf32 = false;
  int64_t a_scale_len = 0, b_scale_len = 0;  // 0, 1, M / N (or 2N for gated b_scale)
  Plan plan = Plan::kAuto;
  ffi::DataType a_dtype{}, b_dtype{}, out_dtype{};

  // Columns of b per output column block: N, or 2N for a packed gated weight.
  int64_t b_cols() const { return gated == Gated::kPacked ? 2 * n : n; }
  // Element strides of the operands (row-major, per batch).
  int64_t a_batch_stride() const { return m * k; }
  int64_t b_batch_stride() const { return batch_b == 1 ? 0 : k * b_cols(); }
  int64_t lda() const { return transpose_a ? m : k; }
  int64_t ldb() const { return transpose_b ? k : b_cols(); }
  int64_t out_batch_stride() const { return m * n; }
  int64_t preact_cols() const { return gated == Gated::kNone ? n : 2 * n; }
};

inline bool IsFp8(ffi::DataType dt) { return dt == ffi::DataType::F8E4M3FN || dt == ffi::DataType::F8E5M2; }
inline bool Is16Bit(ffi::DataType dt) { return dt == ffi::DataType::F16 || dt == ffi::DataType::BF16; }

// Re-checks what Python validated (ranks, shapes, dtypes, attribute ranges) and fills `p`. Both twins call it first.
inline ffi::Error MakeProblem(const ffi::AnyBuffer& a, const ffi::AnyBuffer& b, const ffi::AnyBuffer& b_up,
                              const ffi::AnyBuffer& bias, const ffi::AnyBuffer& c, const ffi::AnyBuffer& residual,
                              const ffi::AnyBuffer& a_scale, const ffi::AnyBuffer& b_scale, double alpha, double beta,
                              int64_t activation, int64_t gated, bool transpose_a, bool transpose_b, bool write_preact,
                              bool tf32, int64_t plan, const ffi::AnyBuffer& out, const ffi::AnyBuffer& preact,
                              Problem* p) {
  using ffi::DataType;
  const auto ad = a.dimensions(), bd = b.dimensions(), od = out.dimensions();
  JAX_OPS_CHECK_ARG(ad.size() == 3, "a must have rank 3 [B, M, K], got " << ShapeString(ad));
  JAX_OPS_CHECK_ARG(bd.size() == 3, "b must have rank 3 [Bb, K, N], got " << ShapeString(bd));
  JAX_OPS_CHECK_ARG(od.size() == 3, "out must have rank 3 [B, M, N], got " << ShapeString(od));
  JAX_OPS_CHECK_ARG(activation >= 0 && activation < kNumActivations, "activation id " << activation << " unknown");
  JAX_OPS_CHECK_ARG(gated >= 0 && gated <= 2, "gated id " << gated << " unknown");
  JAX_OPS_CHECK_ARG(plan >= 0 && plan < kNumPlans, "plan id " << plan << " unknown");
  p->gated = static_cast<Gated>(gated);
  p->activation = static_cast<Activation>(activation);
  p->plan = static_cast<Plan>(plan);
  p->alpha = alpha;
  p->beta = beta;
  p->transpose_a = transpose_a;
  p->transpose_b = transpose_b;
  p->write_preact = write_preact;
  p->tf32 = tf32;
  p->batch = ad[0];
  p->m = transpose_a ? ad[2] : ad[1];
  p->k = transpose_a ? ad[1] : ad[2];
  p->batch_b = bd[0];
  const int64_t b_k = transpose_b ? bd[2] : bd[1];
  const int64_t b_n = transpose_b ? bd[1] : bd[2];
  JAX_OPS_CHECK_ARG(!(p->gated == Gated::kPacked && transpose_b), "a packed gated weight cannot be transposed");
  JAX_OPS_CHECK_ARG(p->gated != Gated::kPacked || b_n % 2 == 0,
                    "a packed gated b needs an even column count, got " << b_n);
  p->n = p->gated == Gated::kPacked ? b_n / 2 : b_n;
  JAX_OPS_CHECK_ARG(b_k == p->k, "a has K = " << p->k << " but b has K = " << b_k);
  JAX_OPS_CHECK_ARG(p->batch_b == 1 || p->batch_b == p->batch,
                    "b's batch " << p->batch_b << " is neither 1 nor a's batch " << p->batch);
  JAX_OPS_CHECK_ARG(
      od[0] == p->batch && od[1] == p->m && od[2] == p->n,
      "out has shape " << ShapeString(od) << ", expected [" << p->batch << ", " << p->m << ", " << p->n << "]");
  p->a_dtype = a.element_type();
  p->b_dtype = b.element_type();
  p->out_dtype = out.element_type();
  const DataType at = p->a_dtype, bt = p->b_dtype, ot = p->out_dtype;
  const bool float_out = ot == DataType::F16 || ot == DataType::BF16 || ot == DataType::F32;
  if (Is16Bit(at)) {
    JAX_OPS_CHECK_ARG(bt == at, "a is " << DTypeName(at) << " but b is " << DTypeName(bt));
    JAX_OPS_CHECK_ARG(ot == at || ot == DataType::F32, "a " << DTypeName(at) << " GEMM writes " << DTypeName(at)
                                                            << " or float32, not " << DTypeName(ot));
  } else if (at == DataType::F32 || at == DataType::F64) {
    JAX_OPS_CHECK_ARG(bt == at && ot == at, "a " << DTypeName(at) << " GEMM needs b and out of the same dtype");
  } else if (IsFp8(at)) {
    JAX_OPS_CHECK_ARG(IsFp8(bt), "a is " << DTypeName(at) << " but b is " << DTypeName(bt));
    JAX_OPS_CHECK_ARG(float_out, "an fp8 GEMM writes float16, bfloat16 or float32, not " << DTypeName(ot));
  } else if (at == DataType::S8) {
    JAX_OPS_CHECK_ARG(bt == DataType::S8, "a is int8 but b is " << DTypeName(bt));
    JAX_OPS_CHECK_ARG(float_out, "an int8 GEMM writes float16, bfloat16 or float32, not " << DTypeName(ot));
  } else {
    JAX_OPS_CHECK_ARG(false, "a has dtype " << DTypeName(at) << ", which the GEMM does not support");
  }
  JAX_OPS_CHECK_ARG(!tf32 || at == DataType::F32, "tf32 applies to float32 inputs only");
  const bool has_gate_up = p->gated == Gated::kSeparate;
  const int64_t up_elements = NumElements(b_up.dimensions());
  if (has_gate_up) {
    JAX_OPS_RETURN_IF_ERROR(CheckSameShape(b_up, "b_up", b, "b"));
  } else {
    JAX_OPS_CHECK_ARG(up_elements == 0, "b_up is given but gated is not kSeparate");
  }
  const int64_t gate_cols = p->gated == Gated::kNone ? p->n : 2 * p->n;
  const int64_t bias_len = NumElements(bias.dimensions());
  p->has_bias = bias_len > 0;
  const DataType bias_dtype = at == DataType::F64 ? DataType::F64 : DataType::F32;
  JAX_OPS_CHECK_ARG(!p->has_bias || (bias_len == gate_cols && bias.element_type() == bias_dtype),
                    "bias must be " << DTypeName(bias_dtype) << " with " << gate_cols << " elements, got " << bias_len
                                    << " of " << DTypeName(bias.element_type()));
  const int64_t mn = p->batch * p->m * p->n;
  p->has_c = NumElements(c.dimensions()) > 0;
  JAX_OPS_CHECK_ARG(!p->has_c || p->gated == Gated::kNone, "c is not supported with a gated GEMM");
  JAX_OPS_CHECK_ARG(!p->has_c || (NumElements(c.dimensions()) == mn && c.element_type() == ot),
                    "c must be [B, M, N] of the out dtype, got " << ShapeString(c.dimensions()));
  p->has_residual = NumElements(residual.dimensions()) > 0;
  JAX_OPS_CHECK_ARG(!p->has_residual || (NumElements(residual.dimensions()) == mn && residual.element_type() == ot),
                    "residual must be [B, M, N] of the out dtype, got " << ShapeString(residual.dimensions()));
  p->a_scale_len = NumElements(a_scale.dimensions());
  p->b_scale_len = NumElements(b_scale.dimensions());
  JAX_OPS_CHECK_ARG(p->a_scale_len == 0 || a_scale.element_type() == DataType::F32, "a_scale must be float32");
  JAX_OPS_CHECK_ARG(p->b_scale_len == 0 || b_scale.element_type() == DataType::F32, "b_scale must be float32");
  JAX_OPS_CHECK_ARG(p->a_scale_len == 0 || p->a_scale_len == 1 || p->a_scale_len == p->m,
                    "a_scale must have 1 or M = " << p->m << " elements, got " << p->a_scale_len);
  JAX_OPS_CHECK_ARG(p->b_scale_len == 0 || p->b_scale_len == 1 || p->b_scale_len == gate_cols,
                    "b_scale must have 1 or " << gate_cols << " elements, got " << p->b_scale_len);
  JAX_OPS_CHECK_ARG(at != DataType::S8 || (p->a_scale_len > 0 && p->b_scale_len > 0),
                    "an int8 GEMM needs a_scale and b_scale");
  const int64_t preact_len = NumElements(preact.dimensions());
  JAX_OPS_CHECK_ARG(
      preact_len == (write_preact ? p->batch * p->m * p->preact_cols() : 0),
      "preact has " << preact_len << " elements, expected " << (write_preact ? p->batch * p->m * p->preact_cols() : 0));
  JAX_OPS_CHECK_ARG(!write_preact || preact.element_type() == ot, "preact must have the out dtype");
  return ffi::Error::Success();
}

// The workspace result: bytes (u8, rank 1), any length (0 when the plan needs none).
inline ffi::Error CheckWorkspace(const ffi::AnyBuffer& workspace) {
  JAX_OPS_CHECK_ARG(workspace.element_type() == ffi::DataType::U8 && workspace.dimensions().size() == 1,
                    "workspace must be a rank-1 uint8 buffer, got " << DTypeName(workspace.element_type()) << " "
                                                                    << ShapeString(workspace.dimensions()));
  return ffi::Error::Success();
}

}  // namespace jax_ops::gemm
