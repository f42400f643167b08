// The cublaslt plan: one cublasLtMatmul with cuBLASLt's own epilogues (bias, relu, tanh-GELU, GELU with its input
// kept as the pre-activation, beta * c), for the problems those express. It is a candidate of the tuning table
// (jax_ops/_src/gemm/tuning.py), which picks it per shape class where it measured faster; the rules in
// heuristics.h never choose it.
//
// Row-major D [M, N] = op(a) @ op(b) is column-major D' [N, M] = op(b)' @ op(a)': cuBLASLt's A is our b and its B
// our a, each with its stored leading dimension, so no operand is copied or transposed. cuBLASLt's bias runs along
// D's rows, i.e. our columns. Its bias for a 16-bit output has the output's dtype, so the contract's f32 bias is
// rounded once into the workspace's tail (the only difference from the contract: z adds a rounded bias).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "common/handle_pool.h"
#include "gemm/kernels.h"

namespace jax_ops::gemm {
namespace {

cudaDataType_t CudaType(ffi::DataType dt) {
  switch (dt) {
    case ffi::DataType::F16:
      return CUDA_R_16F;
    case ffi::DataType::BF16:
      return CUDA_R_16BF;
    case ffi::DataType::F64:
      return CUDA_R_64F;
    case ffi::DataType::F8E4M3FN:
      return CUDA_R_8F_E4M3;
    case ffi::DataType::F8E5M2:
      return CUDA_R_8F_E5M2;
    default:
      return CUDA_R_32F;
  }
}

cublasLtEpilogue_t EpilogueOf(const KernelArgs& args) {
  const bool bias = args.bias != nullptr;
  switch (args.activation) {
    case Activation::kRelu:
      return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    case Activation::kGeluTanh:
      if (args.preact) return bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
      return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    default:
      return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
}

// The largest power of two (<= 256) dividing the address: cuBLASLt's heuristic assumes 256-byte-aligned operands
// unless told.
uint32_t Alignment(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && addr % align) align /= 2;
  return align;
}

// The bias rounded to the 16-bit output dtype (cuBLASLt's bias type for it).
template <typename T>
__global__ void RoundBias(const float* __restrict__ bias, T* __restrict__ out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<T>(bias[i]);
}

// RAII owners of the per-call descriptors.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descriptors() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

template <typename V>
cublasStatus_t SetOp(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
}
template <typename V>
cublasStatus_t SetLayout(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr, const V& value) {
  return cublasLtMatrixLayoutSetAttribute(layout, attr, &value, sizeof(value));
}

// A column-major layout of `rows` x `cols` (leading dimension ld) with `batch` matrices `stride` elements apart.
cublasStatus_t MakeLayout(cublasLtMatrixLayout_t* layout, ffi::DataType dt, int64_t rows, int64_t cols, int64_t ld,
                          int64_t batch, int64_t stride) {
  cublasStatus_t s = cublasLtMatrixLayoutCreate(layout, CudaType(dt), rows, cols, ld);
  if (s != CUBLAS_STATUS_SUCCESS || batch == 1) return s;
  const int32_t count = static_cast<int32_t>(batch);
  s = SetLayout(*layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, count);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return SetLayout(*layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
}

// Everything the heuristic's choice depends on: one cached algorithm per key (the heuristic query costs host time
// on every call outside a CUDA graph).
using AlgoKey = std::tuple<int, int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int, int,
                           bool, uint32_t, uint32_t, uint32_t, uint64_t>;

}  // namespace

const char* CublasLtRefusal(const KernelArgs& args) {
  using DT = ffi::DataType;
  if (args.k == 0) return "cuBLASLt needs K > 0";
  if (args.gated != Gated::kNone) return "cuBLASLt has no gated epilogue";
  if (args.residual) return "cuBLASLt adds no residual after the activation";
  if (args.activation != Activation::kIdentity && args.activation != Activation::kRelu &&
      args.activation != Activation::kGeluTanh)
    return "cuBLASLt's epilogues apply relu or tanh-GELU only";
  if (args.preact && args.activation == Activation::kRelu)
    return "cuBLASLt keeps a relu's sign bits, not its pre-activation";
  if (args.preact && args.activation == Activation::kGeluTanh && args.n % 8)
    return "cuBLASLt writes a GELU pre-activation only with N divisible by 8";
  const DT a = args.a_dtype, b = args.b_dtype;
  if (IsFp8(a) && IsFp8(b)) {
    if (a == DT::F8E5M2 && b == DT::F8E5M2) return "cuBLASLt has no e5m2 x e5m2 GEMM";
    if (args.transpose_a || !args.transpose_b)
      return "cuBLASLt's fp8 GEMM reads both operands K-major (a [M, K], b [N, K] with transpose_b)";
    if (args.a_scale_len > 1 || args.b_scale_len > 1) return "cuBLASLt's fp8 GEMM takes per-tensor scales only";
    if (args.k % 16 || args.n % 16) return "cuBLASLt's fp8 GEMM needs K and N divisible by 16";
    if (args.bias && args.out_dtype == DT::F32) return "cuBLASLt's fp8 GEMM into float32 takes no float32 bias";
    return nullptr;
  }
  if (b != a || !(Is16Bit(a) || a == DT::F32 || a == DT::F64))
    return "cuBLASLt runs float16, bfloat16, float32, float64 and fp8 GEMMs here (not int8)";
  if (args.a_scale_len || args.b_scale_len) return "cuBLASLt takes scales for fp8 GEMMs only";
  if ((a == DT::F32 || a == DT::F64) && (args.activation != Activation::kIdentity || args.bias || args.preact))
    return "the cublaslt plan runs float32 / float64 GEMMs without bias or activation";
  return nullptr;
}

ffi::Error RunCublasLt(const KernelArgs& args, cudaStream_t stream) {
  using DT = ffi::DataType;
  if (const char* why = CublasLtRefusal(args)) return ffi::Error::InvalidArgument(std::string("cublaslt: ") + why);
  auto handle = CublasLtHandleFor(stream);
  if (handle.has_error()) return handle.error();

  // The workspace: cuBLASLt's scratch, then (16-bit out with a bias) the rounded bias at its 256-byte-aligned tail.
  char* workspace = static_cast<char*>(args.workspace);
  uint64_t workspace_bytes = args.workspace_bytes;
  const void* bias = args.bias;
  const bool round_bias = args.bias && Is16Bit(args.out_dtype);
  if (round_bias) {
    const uint64_t bias_bytes = (static_cast<uint64_t>(args.n) * 2 + 255) / 256 * 256;
    if (workspace_bytes < bias_bytes)
      return ffi::Error::InvalidArgument("cublaslt: the workspace has " + std::to_string(workspace_bytes) +
                                         " bytes, the rounded bias needs " + std::to_string(bias_bytes));
    workspace_bytes = (workspace_bytes - bias_bytes) / 256 * 256;
    void* rounded = workspace + workspace_bytes;
    const int blocks = static_cast<int>(std::min<int64_t>((args.n + 255) / 256, 1024));
    if (args.out_dtype == DT::BF16)
      RoundBias<<<blocks, 256, 0, stream>>>(args.bias, static_cast<__nv_bfloat16*>(rounded), args.n);
    else
      RoundBias<<<blocks, 256, 0, stream>>>(args.bias, static_cast<__half*>(rounded), args.n);
    JAX_OPS_RETURN_IF_LAUNCH_ERROR();
    bias = rounded;
  }

  const bool f64 = args.a_dtype == DT::F64;
  const cublasComputeType_t compute =
      f64 ? CUBLAS_COMPUTE_64F : (args.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
  const cudaDataType_t scale_type = f64 ? CUDA_R_64F : CUDA_R_32F;
  const cublasOperation_t op_a = args.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
  const cublasOperation_t op_b = args.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // and its B our a
  const cublasLtEpilogue_t epilogue = EpilogueOf(args);
  const bool with_c = args.c != nullptr && args.beta != 0.0;

  Descriptors desc;
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulDescCreate(&desc.op, compute, scale_type));
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, op_a));
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, op_b));
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue));
  if (bias) JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
  if (args.preact && args.activation == Activation::kGeluTanh) {
    const int64_t aux_ld = args.n, aux_stride = args.m * args.n;
    JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, args.preact));
    JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld));
    if (args.batch > 1)
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE, aux_stride));
  }
  if (IsFp8(args.a_dtype)) {  // per-tensor scales, device pointers (cuBLASLt's A scale is b's)
    if (args.b_scale)
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, args.b_scale));
    if (args.a_scale)
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(SetOp(desc.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, args.a_scale));
  }

  // cuBLASLt's A = op(b)' stored as b is: [K, N] row-major is column-major N x K (ld = ldb); [N, K] is K x N.
  const int64_t a_rows = args.transpose_b ? args.k : args.n, a_cols = args.transpose_b ? args.n : args.k;
  const int64_t b_rows = args.transpose_a ? args.m : args.k, b_cols = args.transpose_a ? args.k : args.m;
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(
      MakeLayout(&desc.a, args.b_dtype, a_rows, a_cols, args.ldb, args.batch, args.b_batch_stride));
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(
      MakeLayout(&desc.b, args.a_dtype, b_rows, b_cols, args.lda, args.batch, args.a_batch_stride));
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(
      MakeLayout(&desc.d, args.out_dtype, args.n, args.m, args.n, args.batch, args.m * args.n));

  const uint32_t align_a = Alignment(args.b), align_b = Alignment(args.a), align_d = Alignment(args.out);
  const uint32_t align_c = with_c ? Alignment(args.c) : align_d;
  const uint32_t align_cd = std::min(align_c, align_d);
  const AlgoKey key{static_cast<int>(args.a_dtype),
                    static_cast<int>(args.b_dtype),
                    static_cast<int>(args.out_dtype),
                    static_cast<int>(compute),
                    args.batch,
                    args.m,
                    args.n,
                    args.k,
                    args.b_batch_stride,
                    static_cast<int>(op_a),
                    static_cast<int>(op_b),
                    static_cast<int>(epilogue),
                    with_c,
                    bias != nullptr,
                    args.tf32,
                    align_a,
                    align_b,
                    align_cd,
                    workspace_bytes};
  static std::mutex algo_mu;
  static std::map<std::pair<int, AlgoKey>, cublasLtMatmulAlgo_t> algos;
  int device = 0;
  JAX_OPS_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  cublasLtMatmulAlgo_t algo;
  {
    std::lock_guard<std::mutex> lock(algo_mu);
    auto it = algos.find({device, key});
    if (it != algos.end()) {
      algo = it->second;
    } else {
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(cublasLtMatmulPreferenceCreate(&desc.pref));
      cublasLtMatmulPreference_t pref = desc.pref;
      auto set_pref = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
        return cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
      };
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes));
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a));
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b));
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_cd));
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(set_pref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_cd));
      cublasLtMatmulHeuristicResult_t result;
      std::memset(&result, 0, sizeof(result));
      int found = 0;
      JAX_OPS_RETURN_IF_CUBLAS_ERROR(
          cublasLtMatmulAlgoGetHeuristic(*handle, desc.op, desc.a, desc.b, desc.d, desc.d, pref, 1, &result, &found));
      if (found == 0 || result.state != CUBLAS_STATUS_SUCCESS)
        return ffi::Error::InvalidArgument("cublaslt: cuBLASLt has no algorithm for this GEMM");
      algo = result.algo;
      algos.emplace(std::make_pair(device, key), algo);
    }
  }

  // Host scalars in the scale type (read at enqueue: CUDA-graph safe).
  const float alpha32 = static_cast<float>(args.alpha), beta32 = static_cast<float>(with_c ? args.beta : 0.0);
  const double alpha64 = args.alpha, beta64 = with_c ? args.beta : 0.0;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = f64 ? static_cast<const void*>(&beta64) : &beta32;
  // Without c, C aliases D with beta = 0 (cuBLASLt then does not read it).
  const void* c = with_c ? args.c : args.out;
  JAX_OPS_RETURN_IF_CUBLAS_ERROR(cublasLtMatmul(*handle, desc.op, alpha, args.b, desc.a, args.a, desc.b, beta, c,
                                                desc.d, args.out, desc.d, &algo, workspace, workspace_bytes, stream));
  // Identity with the pre-activation asked for: z is the output itself (same rounding, no residual here).
  if (args.preact && args.activation == Activation::kIdentity) {
    const size_t bytes = static_cast<size_t>(args.batch * args.m * args.n) * (args.out_dtype == DT::F64   ? 8
                                                                              : args.out_dtype == DT::F32 ? 4
                                                                                                          : 2);
    JAX_OPS_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(args.preact, args.out, bytes, cudaMemcpyDeviceToDevice, stream));
  }
  return ffi::Error::Success();
}

}  // namespace jax_ops::gemm
