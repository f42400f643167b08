// What the CUDA handler (gemm_cuda.cu) hands the GEMM kernels: the checked Problem flattened into device
// pointers, sizes and strides (KernelArgs), and one launcher per kernel family. Each `*Supports` says whether that
// kernel can run the problem (dtype, alignment, size); heuristics.h picks among the ones that can.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemm/params.h"

namespace jax_ops::gemm {

struct KernelArgs {
  // Sizes and element strides (row-major; params.h's layout).
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int64_t a_batch_stride = 0, b_batch_stride = 0;  // b_batch_stride 0: one weight shared by every batch
  int64_t lda = 0, ldb = 0;                        // row strides of a and b as stored
  // Element offset from a gate column of b to its up column: n for a packed gated weight, 0 otherwise (a
  // separate up weight lives at b_up with b's strides).
  int64_t up_offset = 0;
  bool transpose_a = false, transpose_b = false;
  Gated gated = Gated::kNone;
  Activation activation = Activation::kIdentity;
  double alpha = 1.0, beta = 0.0;
  bool tf32 = false;
  // Device pointers; nullptr where the operand is absent.
  const void* a = nullptr;
  const void* b = nullptr;
  const void* b_up = nullptr;
  const float* bias = nullptr;  // n (gated: 2n) elements
  const void* c = nullptr;      // read only when beta != 0
  const void* residual = nullptr;
  const float* a_scale = nullptr;  // a_scale_len elements: 1 or m
  const float* b_scale = nullptr;  // b_scale_len elements: 1 or n (gated 2n)
  int64_t a_scale_len = 0, b_scale_len = 0;
  void* out = nullptr;
  void* preact = nullptr;     // [batch, m, n] (gated [batch, m, 2n]) when written
  void* workspace = nullptr;  // the cublaslt plan's scratch (workspace_bytes; the other plans take none)
  uint64_t workspace_bytes = 0;
  ffi::DataType a_dtype{}, b_dtype{}, out_dtype{};
};

inline KernelArgs MakeKernelArgs(const Problem& p, const ffi::AnyBuffer& a, const ffi::AnyBuffer& b,
                                 const ffi::AnyBuffer& b_up, const ffi::AnyBuffer& bias, const ffi::AnyBuffer& c,
                                 const ffi::AnyBuffer& residual, const ffi::AnyBuffer& a_scale,
                                 const ffi::AnyBuffer& b_scale, const ffi::AnyBuffer& out,
                                 const ffi::AnyBuffer& preact) {
  KernelArgs args;
  args.batch = p.batch;
  args.m = p.m;
  args.n = p.n;
  args.k = p.k;
  args.a_batch_stride = p.a_batch_stride();
  args.b_batch_stride = p.b_batch_stride();
  args.lda = p.lda();
  args.ldb = p.ldb();
  args.up_offset = p.gated == Gated::kPacked ? p.n : 0;
  args.transpose_a = p.transpose_a;
  args.transpose_b = p.transpose_b;
  args.gated = p.gated;
  args.activation = p.activation;
  args.alpha = p.alpha;
  args.beta = p.beta;
  args.tf32 = p.tf32;
  args.a = a.untyped_data();
  args.b = b.untyped_data();
  args.b_up = p.gated == Gated::kSeparate ? b_up.untyped_data() : nullptr;
  args.bias = p.has_bias ? static_cast<const float*>(bias.untyped_data()) : nullptr;
  args.c = p.has_c && p.beta != 0.0 ? c.untyped_data() : nullptr;
  args.residual = p.has_residual ? residual.untyped_data() : nullptr;
  args.a_scale = p.a_scale_len ? static_cast<const float*>(a_scale.untyped_data()) : nullptr;
  args.b_scale = p.b_scale_len ? static_cast<const float*>(b_scale.untyped_data()) : nullptr;
  args.a_scale_len = p.a_scale_len;
  args.b_scale_len = p.b_scale_len;
  args.out = out.untyped_data();
  args.preact = p.write_preact ? preact.untyped_data() : nullptr;
  args.a_dtype = p.a_dtype;
  args.b_dtype = p.b_dtype;
  args.out_dtype = p.out_dtype;
  return args;
}

// Hopper TMA + wgmma kernel (gemm_sm90.cu): f16/bf16/fp8/int8 inputs with 16-byte-aligned rows.
bool Sm90Supports(const KernelArgs& args, int sm_major);
cudaError_t LaunchSm90(const KernelArgs& args, int num_sms, cudaStream_t stream);

// Decode / skinny kernel (M <= 64): streams the weights at copy bandwidth (gemm_skinny.cu).
bool SkinnySupports(const KernelArgs& args);
cudaError_t LaunchSkinny(const KernelArgs& args, int num_sms, cudaStream_t stream);

// cuBLASLt with its native epilogues (gemm_cublaslt.cu): why it cannot run `args` (nullptr: it can), and the run.
const char* CublasLtRefusal(const KernelArgs& args);
ffi::Error RunCublasLt(const KernelArgs& args, cudaStream_t stream);

// Portable SIMT kernel: every dtype, layout and size (exact fp32 / fp64; the fallback of the others).
cudaError_t LaunchSimt(const KernelArgs& args, cudaStream_t stream);

}  // namespace jax_ops::gemm
