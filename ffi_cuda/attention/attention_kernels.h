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
// GQA: the dK/dV kernel splits the G query heads of a group over a thread-block cluster of J CTAs (kCluster in
// attention_bwd_sm90_impl.cuh), whose partial dK/dV are summed in a fixed order through distributed shared memory
// (deterministic run to run; not bitwise equal across J): J times the CTAs, each with G / J heads of work.
// Measured on the H200 (132 SMs; attention_bwd_bench gqa, bf16, B = 1, H = 32; whole backward in ms at
// J = 1 / 2 / 4; dK/dV CTAs at J = 1 = N / 128 x K, i.e. 32-512; clusters of 2 fit 66 at once, of 4 only 30 = 120 SMs):
//   D   K mask   N = 1024          N = 4096           N = 8192
//   128 8 causal .166/.117/.123    1.088/.989/.993    3.664/3.441/3.603
//   128 8 full   .172/.122/.165    1.678/1.642/1.794  6.708/6.545/6.926
//   128 4 causal .268/.167/.118    1.240/1.047/.968   3.895/3.342/3.514
//   128 4 full   .283/.172/.183    1.712/1.633/1.857  6.707/6.534/7.006
//   64  8 causal .118/.081/.083    .756/.652/.649     2.336/2.191/2.457
//   64  8 full   .120/.083/.114    1.273/1.161/1.394  4.529/4.073/4.654
//   64  4 causal .195/.119/.081    .878/.736/.669     2.715/2.215/2.391
//   64  4 full   .199/.124/.127    1.252/1.285/1.442  4.942/4.704/4.777
// Rule (replaces an unmeasured "4 waves" target): MHA or odd G: J = 1; J = 4 when the mask is causal or a
// window (uneven work per key block; windows were not timed), 4 divides G and the J = 1 grid is at most one wave
// (CTAs <= SMs); else J = 2. On the table every pick beats J = 1 (1.02-2.41x, geomean 1.26x) except D 64 K 4
// N 4096 full (1.285 vs 1.252 ms), and is within 5.1 % of the best J. JAX_OPS_ATTENTION_BWD_CLUSTER overrides it
// (Sm90BwdClusterSetting); the launcher falls back to J = 1 when the device cannot hold a cluster.
inline int Sm90BwdDkDvCluster(const AttentionParams& p, int num_sms) {
  if (p.group <= 1 || p.group % 2 != 0) return 1;
  const bool uneven = p.is_causal || p.window_left >= 0 || p.window_right >= 0;
  const int64_t ctas = (p.seqlen_k + 127) / 128 * p.num_kv_heads * p.batch;  // dK/dV CTAs at J = 1 (128 keys each)
  return uneven && p.group % 4 == 0 && ctas <= num_sms ? 4 : 2;
}
// num_sms: the SM count for Sm90BwdDkDvCluster (0: asked of the driver; the library passes its cached count).
template <typename T, int kHeadDim>
cudaError_t LaunchAttentionBwdSm90(cudaStream_t stream, const AttentionParams& p, const FwdPointers& ptr,
                                   const BwdPointers& bp, int num_sms = 0);
inline bool Sm90BwdSupports(const AttentionParams& p, int cc_major, int cc_minor) {
  return cc_major == 9 && cc_minor == 0 && (p.head_dim == 64 || p.head_dim == 128) && !p.has_bias && !p.has_mask &&
         p.scale > 0.f && p.seqlen_q < (int64_t{1} << 31) && p.seqlen_k < (int64_t{1} << 31);
}

}  // namespace jax_ops::attention
