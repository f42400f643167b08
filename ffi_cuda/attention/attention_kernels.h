// Launchers for the CUDA attention kernels (contract in attention_params.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/attention_params.h"

namespace jax_ops::attention {

// Device pointers of one forward call. `bias` is f32 when `bias_is_f32`, else the q dtype.
struct FwdPointers {
  const void* q;
  const void* k;
  const void* v;
  const void* bias;
  const bool* mask;
  const int32_t* q_seqlen;
  const int32_t* kv_seqlen;
  void* o;
  float* lse;
  bool bias_is_f32;
};

// Device pointers of the backward call beyond the forward's inputs.
struct BwdPointers {
  const void* o;
  const float* lse;
  const void* d_o;
  void* dq;
  void* dk;
  void* dv;
};

// T: __half or __nv_bfloat16; kHeadDim: 32, 64, 96, 128 or 256 (one instantiation per .cu file).
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionFwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr);

// Hopper (sm_90a only) forward: TMA + wgmma + warp specialisation; head dims 64 and 128, no bias or boolean
// mask (Sm90FwdSupports). kStages: K/V pipeline depth (the build instantiates kSm90FwdStages).
inline constexpr int kSm90FwdStages = 3;  // measured: +3-12% over 2 stages at D=128 (H200)
// What LaunchAttentionFwdSm90 returns, before launching anything, when it cannot run here (no sm_90a machine
// code in the build, or a TMA tensor map the driver rejects): the caller runs the portable kernel instead.
inline constexpr cudaError_t kSm90Refused = cudaErrorNotSupported;
// Persistent Hopper forward (kPersistent): one CTA per SM, each looping over query blocks in a static heavy-first
// (longest-processing-time) order, instead of one CTA per 128-row block; bitwise the same results. Off in the
// library until the GPU numbers (ffi_cuda/tools/attention_fwd_bench.cu, "persistent" column) say it wins.
inline constexpr bool kSm90FwdPersistent = false;
// num_ctas: kPersistent only, the CTAs to launch (0: one per SM); the checks use a few to give each CTA many blocks.
template <typename T, int kHeadDim, int kStages, int kDiag = 0, int kBlockN = 128, bool kPersistent = false>
cudaError_t LaunchAttentionFwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   int num_ctas = 0);
inline bool Sm90FwdSupports(const AttentionParams& p, int cc_major, int cc_minor) {
  // scale > 0: the kernel takes the row max of the raw scores (one FFMA per probability).
  return cc_major == 9 && cc_minor == 0 && (p.head_dim == 64 || p.head_dim == 128) && !p.has_bias && !p.has_mask &&
         p.scale > 0.f && p.seqlen_q < (int64_t{1} << 31) && p.seqlen_k < (int64_t{1} << 31);
}

// Backward without bias gradient: dq, dk, dv. kHeadDim: 32, 64, 96, 128 (256 would spill the accumulators).
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                               const BwdPointers& bp);

// Hopper (sm_90a only) backward: TMA + wgmma + warp specialisation (attention_bwd_sm90_impl.cuh); head dims 64
// and 128, no bias or boolean mask. Deterministic, like the portable one; uses dq as its delta workspace. Returns
// kSm90Refused before launching anything when it cannot run here.
// Tiling defaults, measured on an H200 (ffi_cuda/tools/attention_bwd_bench.cu; 3 stages were 0-4% slower):
inline constexpr int kSm90BwdDkDvStages = 2;  // Q/dO pipeline depth of the dK/dV kernel
inline constexpr int kSm90BwdDqStages = 2;    // K/V pipeline depth of the dQ kernel
// Keys per K/V tile of the dQ kernel: 128 at D = 64 (+4-5%); at D = 128 they would serialise the wgmmas (registers).
template <int kHeadDim>
inline constexpr int kSm90BwdDqBlockN = kHeadDim == 64 ? 128 : 64;
// dK/dV kernel: issue dV += P^T dO before computing dS^T (overlap) at D = 64; at D = 128 after (1-3% faster).
template <int kHeadDim>
inline constexpr bool kSm90BwdDvEarly = kHeadDim < 128;
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   const BwdPointers& bp);
inline bool Sm90BwdSupports(const AttentionParams& p, int cc_major, int cc_minor) {
  return cc_major == 9 && cc_minor == 0 && (p.head_dim == 64 || p.head_dim == 128) && !p.has_bias && !p.has_mask &&
         p.scale > 0.f && p.seqlen_q < (int64_t{1} << 31) && p.seqlen_k < (int64_t{1} << 31);
}

}  // namespace jax_ops::attention
