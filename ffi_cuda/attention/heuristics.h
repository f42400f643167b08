// Every dispatch rule of the CUDA attention kernels, each a short function or constant with its reason in one
// line. The measurements behind them are in docs/design/attention.md. The Python-side rules (split-KV, GQA
// packing) are in jax_ops/_src/attention/heuristics.py. Host code only (no CUDA types).
#pragma once

#include <cstdint>

#include "attention/instantiations/support.h"
#include "attention/params.h"

namespace jax_ops::attention {

// ---------------------------------------------------------------------------------------- support
// The head dims with a portable kernel (instantiations/support.h).
inline bool FwdHeadDimSupported(int64_t d) { return Contains(kFwdHeadDims, d); }
// No head dim 256 backward: its dK/dV accumulators would spill.
inline bool BwdHeadDimSupported(int64_t d) { return Contains(kBwdHeadDims, d); }

// Hopper kernels: sm_90 only, their head dims, scale > 0 (the unmasked forward takes the row max over the raw
// scores), 32-bit sequence coordinates (TMA). Both apply a boolean mask and a bias per element (their kMods
// variants); the backward writes the bias gradient as dS [B, N, T, S] f32 (the portable one has none).
inline bool Sm90Eligible(const AttentionParams& p, int cc_major, int cc_minor) {
  return cc_major == 9 && cc_minor == 0 && p.scale > 0.f && p.seqlen_q < (int64_t{1} << 31) &&
         p.seqlen_k < (int64_t{1} << 31);
}
inline bool Sm90FwdSupports(const AttentionParams& p, int cc_major, int cc_minor) {
  return Contains(kSm90FwdHeadDims, p.head_dim) && Sm90Eligible(p, cc_major, cc_minor);
}
inline bool Sm90BwdSupports(const AttentionParams& p, int cc_major, int cc_minor) {
  return Contains(kSm90BwdHeadDims, p.head_dim) && Sm90Eligible(p, cc_major, cc_minor) && (!p.has_bias || p.dbias_full);
}
// Calls that run the Hopper kernels' kMods variants (per-element mask and bias reads; the forward's runs one CTA
// per block, never persistent).
inline bool HasScoreMods(const AttentionParams& p) { return p.has_mask || p.has_bias; }

// The portable knob forces the mma.sync kernels (tests run both paths).
inline bool UseSm90Fwd(const AttentionParams& p, int cc_major, int cc_minor, bool portable) {
  return !portable && Sm90FwdSupports(p, cc_major, cc_minor);
}
inline bool UseSm90Bwd(const AttentionParams& p, int cc_major, int cc_minor, bool portable) {
  return !portable && Sm90BwdSupports(p, cc_major, cc_minor);
}

// ---------------------------------------------------------------------------------------- forward
inline constexpr int kSm90FwdStages = 3;  // K/V pipeline depth: 3 stages are faster than 2

// Persistent Hopper forward when the grid is at most 8 waves of 128-row query blocks, except unmasked grids of at
// most 2 waves: it gains from the last wave's tail (uneven causal blocks, idle SMs) and loses on long grids.
inline bool Sm90FwdUsePersistent(const AttentionParams& p, int num_sms) {
  if (num_sms <= 0) return false;
  const int64_t blocks = (p.seqlen_q + 127) / 128 * p.batch * p.num_heads;
  const bool masked = p.is_causal || p.window_left >= 0 || p.window_right >= 0;
  return blocks <= 8 * int64_t{num_sms} && (masked || blocks > 2 * int64_t{num_sms});
}
// The fwd_persistent knob (1 on, 0 off) overrides the rule; -1 keeps it.
inline bool FwdPersistent(const AttentionParams& p, int num_sms, int64_t forced) {
  return forced >= 0 ? forced == 1 : Sm90FwdUsePersistent(p, num_sms);
}

// ---------------------------------------------------------------------------------------- backward
inline constexpr int kSm90BwdDkDvStages = 2;  // Q/dO pipeline depth of the dK/dV kernel: 3 stages are slower
inline constexpr int kSm90BwdDqStages = 2;    // K/V pipeline depth of the dQ kernel: 3 stages are slower
// Keys per K/V tile of the dQ kernel: 128 at D = 64 is faster; at D = 128 they would serialise the wgmmas.
template <int kHeadDim>
inline constexpr int kSm90BwdDqBlockN = kHeadDim == 64 ? 128 : 64;
// dK/dV kernel: issue dV += P^T dO before computing dS^T (overlap) at D = 64; after it at D = 128 (faster there).
template <int kHeadDim>
inline constexpr bool kSm90BwdDvEarly = kHeadDim < 128;

// GQA dK/dV cluster size J (the G query heads of a group split over J CTAs, partial dK/dV summed through
// distributed shared memory): MHA or odd G: 1; J = 4 for uneven work per key block (causal/window) when 4 | G and
// the J = 1 grid fits one wave; else 2. The launcher falls back to J = 1 when no cluster fits the device.
inline int Sm90BwdDkDvCluster(const AttentionParams& p, int num_sms) {
  if (p.group <= 1 || p.group % 2 != 0) return 1;
  const bool uneven = p.is_causal || p.window_left >= 0 || p.window_right >= 0;
  const int64_t ctas = (p.seqlen_k + 127) / 128 * p.num_kv_heads * p.batch;  // dK/dV CTAs at J = 1 (128 keys each)
  return uneven && p.group % 4 == 0 && ctas <= num_sms ? 4 : 2;
}

}  // namespace jax_ops::attention
