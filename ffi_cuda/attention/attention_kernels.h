// Launchers of the CUDA attention kernels (contract in params.h, dispatch rules in heuristics.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "attention/heuristics.h"
#include "attention/params.h"

namespace jax_ops::attention {

// Device pointers of one forward call. `bias` is f32 when `bias_is_f32`, else the q dtype.
struct FwdPointers {
  const void* q;
  const void* k;
  const void* v;
  const void* bias;
  const uint32_t* mask;  // bit-packed along the keys (params.h)
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
  float* dbias = nullptr;  // with a bias: dS as [B, N, T, S] f32 (the contract's dbias_full form), zeroed first
};

// T: __half or __nv_bfloat16; kHeadDim: 32, 64, 96, 128 or 256 (one instantiation per .cu file).
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionFwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr);

// Hopper (sm_90a only) forward: TMA + wgmma + warp specialisation; head dims 64 and 128 (Sm90FwdSupports in
// heuristics.h). kStages: K/V pipeline depth (the build instantiates kSm90FwdStages). kMods: the variant for calls
// with a boolean mask or a bias (refused for the others, and the others' variants refuse these calls).
//
// What LaunchAttentionFwdSm90 returns, before launching anything, when it cannot run here (no sm_90a machine
// code in the build, or a TMA tensor map the driver rejects): the caller falls back (attention_cuda.cu).
inline constexpr cudaError_t kSm90Refused = cudaErrorNotSupported;
// Persistent Hopper forward (kPersistent): one CTA per SM, each looping over 128-row query blocks in a static
// heavy-first (longest-processing-time) order, instead of one CTA per block; bitwise the same results. The build
// instantiates both; Sm90FwdUsePersistent picks one per call.
// num_ctas: kPersistent only, the CTAs to launch (0: one per SM, asked of the driver; the library passes its cached
// SM count); the checks use a few to give each CTA many blocks.
template <typename T, int kHeadDim, int kStages, int kDiag = 0, int kBlockN = 128, bool kPersistent = false,
          bool kMods = false>
cudaError_t LaunchAttentionFwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   int num_ctas = 0);

// Backward without bias gradient: dq, dk, dv. kHeadDim: 32, 64, 96, 128 (256 would spill the accumulators).
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwd(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                               const BwdPointers& bp);

// Hopper (sm_90a only) backward: TMA + wgmma + warp specialisation (attention_bwd_sm90_impl.cuh); head dims 64
// and 128; a boolean mask and a bias (with dS into bp.dbias) run its kMods kernels. Deterministic, like the
// portable one; uses dq as its delta workspace. Returns kSm90Refused before launching anything when it cannot run
// here.
// cluster: the GQA dK/dV cluster size (1, 2 or 4 where it divides the group; -1 or a non-divisor:
// Sm90BwdDkDvCluster's rule). num_sms: the SM count for that rule (0: asked of the driver; the library passes its
// cached count).
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   const BwdPointers& bp, int cluster = -1, int num_sms = 0);

}  // namespace jax_ops::attention
