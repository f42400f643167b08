// The lsmr family's launch rules, each with its reason; the measurements behind them are in docs/design/lsmr.md.
// The CPU twin uses the same functions, and Python the same constants (constants()["lsmr_..."]), to size the
// partial-norm outputs.
#pragma once

#include <cstdint>

namespace jax_ops::lsmr {

// Threads per CTA of every lsmr kernel: enough for a memory-bound pass, and the CTA sum is one warp over the warps.
inline constexpr int kThreads = 256;

// Bytes per vector access of the row kernel: 16-byte loads/stores, the widest single memory instruction.
inline constexpr int kVectorBytes = 16;

// 16-byte vectors per thread of PartialNormsUpdate: 4 gives its consumers a quarter of the partials to sum.
inline constexpr int kPartialNormsUnroll = 4;

// Row-layout grid cap per SM: none (one step per thread); an uncapped grid keeps the DRAM queues deepest.
inline constexpr int kRowBlocksPerSm = 0;

// CUDA's grid limits: y walks rows (or batches) up to 65535; x stays far below 2^31.
inline constexpr int64_t kMaxGridY = 65535;
inline constexpr int64_t kMaxGridX = int64_t{1} << 30;

// Column layout: elements (rows x columns) per CTA, so each CTA streams a long run of whole [.., cols] rows.
inline constexpr int64_t kColumnsCtaElems = 16384;

// Column layout: rows per thread whose loads issue before any math (memory-level parallelism).
inline constexpr int kColumnsRowUnroll = 4;

// Row layout: CTAs per row of n elements (`unroll` kVectorBytes-byte vectors per thread) = the length of a row of an
// update's `partials` (one partial norm per CTA); n = 0 still takes one CTA.
constexpr int64_t NormPartials(int64_t n, int64_t itemsize, int64_t unroll = 1) {
  const int64_t elems_per_cta = kThreads * (kVectorBytes / itemsize) * unroll;
  return n == 0 ? 1 : (n + elems_per_cta - 1) / elems_per_cta;
}

// Column layout [L, k]: rows per CTA (at least one), and CTAs (= partial norms per column) over L rows.
constexpr int64_t ColumnsRowsPerCta(int64_t k) {
  return k >= kColumnsCtaElems ? 1 : kColumnsCtaElems / (k > 0 ? k : 1);
}
constexpr int64_t ColumnsPartials(int64_t rows, int64_t k) {
  const int64_t per_cta = ColumnsRowsPerCta(k);
  return rows == 0 ? 1 : (rows + per_cta - 1) / per_cta;
}

}  // namespace jax_ops::lsmr
