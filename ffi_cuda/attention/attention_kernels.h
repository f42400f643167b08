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
template <typename T, int kHeadDim, int kStages, int kDiag = 0, int kBlockN = 128>
cudaError_t LaunchAttentionFwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr);
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
// GQA: the dK/dV kernel can split the G query heads of a group over a thread-block cluster of J CTAs, whose
// partial dK/dV are summed in a fixed order through distributed shared memory (deterministic; kCluster in
// attention_bwd_sm90_impl.cuh): J times the CTAs for grids too small or too unevenly loaded for 132 SMs.
// EXPERIMENTAL, OFF by default (not yet run on a GPU): JAX_OPS_ATTENTION_BWD_CLUSTER=auto picks J below,
// =2 / =4 forces it where it divides G; unset or 0 keeps J = 1. MHA (G = 1) always runs J = 1.
// J: the smallest of 1, 2, 4 dividing G that gives at least kSm90BwdClusterMinWaves waves of dK/dV CTAs (ctas:
// the count at J = 1), else the largest that divides G. The wave target is a guess, to be set from the bench.
inline constexpr int kSm90BwdClusterMinWaves = 4;
inline int Sm90BwdDkDvCluster(int64_t group, int64_t ctas, int num_sms) {
  int cluster = 1;
  for (int j = 1; j <= 4; j *= 2) {
    if (group % j != 0) continue;
    cluster = j;
    if (ctas * j >= int64_t{kSm90BwdClusterMinWaves} * num_sms) break;
  }
  return cluster;
}
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   const BwdPointers& bp);
inline bool Sm90BwdSupports(const AttentionParams& p, int cc_major, int cc_minor) {
  return cc_major == 9 && cc_minor == 0 && (p.head_dim == 64 || p.head_dim == 128) && !p.has_bias && !p.has_mask &&
         p.scale > 0.f && p.seqlen_q < (int64_t{1} << 31) && p.seqlen_k < (int64_t{1} << 31);
}

}  // namespace jax_ops::attention
