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
// code in the build, or a TMA tensor map the driver rejects): the caller falls back (attention_cuda.cu).
inline constexpr cudaError_t kSm90Refused = cudaErrorNotSupported;
// Persistent Hopper forward (kPersistent): one CTA per SM, each looping over 128-row query blocks in a static
// heavy-first (longest-processing-time) order, instead of one CTA per block; bitwise the same results. The build
// instantiates both; Sm90FwdUsePersistent picks one per call.
// num_ctas: kPersistent only, the CTAs to launch (0: one per SM, asked of the driver; the library passes its cached
// SM count); the checks use a few to give each CTA many blocks.
template <typename T, int kHeadDim, int kStages, int kDiag = 0, int kBlockN = 128, bool kPersistent = false>
cudaError_t LaunchAttentionFwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   int num_ctas = 0);
inline bool Sm90FwdSupports(const AttentionParams& p, int cc_major, int cc_minor) {
  // scale > 0: the kernel takes the row max of the raw scores (one FFMA per probability).
  return cc_major == 9 && cc_minor == 0 && (p.head_dim == 64 || p.head_dim == 128) && !p.has_bias && !p.has_mask &&
         p.scale > 0.f && p.seqlen_q < (int64_t{1} << 31) && p.seqlen_k < (int64_t{1} << 31);
}

// Whether the Hopper forward runs persistent: when the grid is at most 8 waves of 128-row query blocks
// (ceil(T / 128) * B * H <= 8 * SMs), except non-causal grids (no causal mask, no window) of at most 2 waves,
// whose blocks all cost the same and already balance as one CTA per block.
// Measured (H200, 132 SMs; standalone attention_fwd_bench persist, 2026-11-29; TF/s of the persistent 3-stage kernel
// over the one-CTA-per-block 3-stage kernel; [blocks] and the rule's pick in brackets):
//   B1 H32 D128 causal      N=1024 1.243x [256 P]  4096 1.085x [1024 P]  8192 0.949x [2048 -]  16384 0.930x [4096 -]
//   B1 H32 D128 non-causal  N=1024 0.974x [256 -]  4096 1.159x [1024 P]  8192 0.951x [2048 -]  16384 0.906x [4096 -]
//   B1 H32 D64  N=4096      causal 1.121x [1024 P]  non-causal 0.991x [1024 P: the one row the rule gets wrong]
//   B4 H16 N=1024 causal    D128 1.198x [512 P]  D64 1.181x [512 P]
// It gains from the last wave's tail (causal blocks are uneven; few waves leave SMs idle) and loses on long grids,
// likely because the schedule takes the (batch, head) pairs fastest, so concurrent CTAs stream different heads' K/V
// and share less of L2 (not measured). The shape only, so one call site always gets the same kernel.
inline bool Sm90FwdUsePersistent(const AttentionParams& p, int num_sms) {
  if (num_sms <= 0) return false;
  const int64_t blocks = (p.seqlen_q + 127) / 128 * p.batch * p.num_heads;
  const bool masked = p.is_causal || p.window_left >= 0 || p.window_right >= 0;
  return blocks <= 8 * int64_t{num_sms} && (masked || blocks > 2 * int64_t{num_sms});
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
