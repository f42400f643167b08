// Every dispatch rule of the CUDA GEMM, each a short function or constant with its reason in one line (the numbers
// behind them, from ffi_cuda/tools/gemm_bench.cu's time mode, are in docs/design/gemm.md). dispatch.h applies them
// for the CUDA handler and the harness alike.
#pragma once

#include <cstdint>

#include "gemm/kernels.h"
#include "gemm/params.h"

namespace jax_ops::gemm {

// ---------------------------------------------------------------------------------------- problem shape
// A weight shared by every batch (Bb = 1) with a row-major a is one GEMM with B * M rows (a, c, residual, out and
// preact are contiguous over [B, M]): decode batches then reach the skinny kernel. Not with a per-row a_scale (its
// index is the row within a batch).
inline bool CanFoldBatch(const KernelArgs& args) {
  return args.batch > 1 && args.b_batch_stride == 0 && !args.transpose_a && args.a_scale_len <= 1;
}
inline void FoldBatch(KernelArgs* args) {
  if (!CanFoldBatch(*args)) return;
  args->m *= args->batch;
  args->batch = 1;
  args->a_batch_stride = args->m * args->k;
}

// ---------------------------------------------------------------------------------------- skinny kernel
// kSkinnyMaxM / kSkinnyMaxMFp8 (its row limits) are in params.h: Python reads the fp8 one through constants().
inline constexpr int kSkinnyMaxSplit = 8;  // CTAs per cluster sharing a column tile's K (the portable cluster size)
// Fewest K chunks (one mma deep) per warp when splitting K over more CTAs: below that a CTA's time goes to its
// reduction.
inline constexpr int64_t kSkinnyMinChunksPerWarp = 4;

// Why the skinny kernel cannot run `args` (nullptr: it can). It streams b [K, N] along N (a transposed b has K
// contiguous: the SIMT kernel takes it) through mma.sync on 16-bit or fp8 operands, and keeps at most kSkinnyMaxM
// (fp8: kSkinnyMaxMFp8) rows.
inline const char* SkinnyRefusal(const KernelArgs& args) {
  const bool half = args.a_dtype == ffi::DataType::F16 || args.a_dtype == ffi::DataType::BF16;
  const bool fp8 = IsFp8(args.a_dtype) && IsFp8(args.b_dtype);
  if (!fp8 && (!half || args.b_dtype != args.a_dtype)) return "it takes float16, bfloat16 or fp8 a and b";
  if (half && args.out_dtype != args.a_dtype && args.out_dtype != ffi::DataType::F32)
    return "it writes the input dtype or float32";
  if (args.transpose_b) return "it streams b with N contiguous (transpose_b=False)";
  if (args.m > (fp8 ? kSkinnyMaxMFp8 : kSkinnyMaxM))
    return fp8 ? "it takes at most 16 rows of op(a) with fp8 (after folding the batch)"
               : "it takes at most 64 rows of op(a) (after folding the batch)";
  return nullptr;
}

// The cluster split S of the skinny kernel's K range (1, 2, 4 or 8 CTAs per column tile, reduced in fixed order
// through distributed shared memory): the largest whose grid of ctas * S CTAs fits in one wave of resident clusters
// of S (a second, partial wave leaves bandwidth idle) and gives every warp kSkinnyMinChunksPerWarp chunks. ctas: the
// grid without splitting; warps_per_split: the warps that share one CTA's K range; resident_ctas[i]: the CTAs this
// device holds at once in clusters of 2^i (a GPC places whole clusters, so fewer than the SMs' slots; 0: that size
// does not run).
inline constexpr int kSkinnySplitSizes = 4;  // 1, 2, 4, 8 = kSkinnyMaxSplit
inline int SkinnySplit(int64_t ctas, int64_t k_chunks, int warps_per_split,
                       const int64_t (&resident_ctas)[kSkinnySplitSizes]) {
  int i = 0;
  while (i + 1 < kSkinnySplitSizes && ctas * (int64_t{2} << i) <= resident_ctas[i + 1] &&
         k_chunks >= (int64_t{2} << i) * warps_per_split * kSkinnyMinChunksPerWarp)
    ++i;
  return 1 << i;
}

// ---------------------------------------------------------------------------------------- plan choice
// Decode shapes: the skinny kernel streams the weights once at copy bandwidth, where a tiled kernel would idle
// most of its rows.
inline bool UseSkinny(const KernelArgs& args) { return SkinnyRefusal(args) == nullptr; }
// Everything else the Hopper kernel takes runs on its tensor cores.
inline bool UseSm90(const KernelArgs& args, int sm_major) { return Sm90Supports(args, sm_major); }

inline Plan AutoPlan(const KernelArgs& args, int sm_major) {
  if (UseSkinny(args)) return Plan::kSkinny;
  if (UseSm90(args, sm_major)) return Plan::kSm90;
  return Plan::kSimt;  // every dtype, layout and size
}

// The kernel for `requested` (kAuto: AutoPlan); a forced plan that cannot run the problem is an InvalidArgument
// naming the plan and the reason.
inline ffi::Error ChoosePlan(const KernelArgs& args, Plan requested, int sm_major, Plan* chosen) {
  switch (requested) {
    case Plan::kAuto:
      *chosen = AutoPlan(args, sm_major);
      return ffi::Error::Success();
    case Plan::kSkinny: {
      const char* why = SkinnyRefusal(args);
      JAX_OPS_CHECK_ARG(why == nullptr, "plan \"skinny\" cannot run this GEMM: " << why);
      break;
    }
    case Plan::kSm90:
      JAX_OPS_CHECK_ARG(Sm90Supports(args, sm_major),
                        "plan \"sm90\" cannot run this GEMM: it needs an sm_90 GPU (this one is sm_"
                            << sm_major << "x) and the dtypes and 16-byte-aligned rows of gemm/kernels.h");
      break;
    case Plan::kCublasLt: {
      const char* why = CublasLtRefusal(args);
      JAX_OPS_CHECK_ARG(why == nullptr, "plan \"cublaslt\" cannot run this GEMM: " << why);
      break;
    }
    case Plan::kSimt:
      break;
  }
  *chosen = requested;
  return ffi::Error::Success();
}

}  // namespace jax_ops::gemm
