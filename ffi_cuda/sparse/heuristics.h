// The sparse family's native dispatch rules (the Python plan rules are in jax_ops/_src/sparse/plan.py; the
// measurements behind every number are in docs/design/sparse.md). Included by both modules: no CUDA types.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define JAX_OPS_SPARSE_HD __host__ __device__
#else
#define JAX_OPS_SPARSE_HD
#endif

namespace jax_ops::sparse {

// Slab kernel config: 512 threads, 2 CTAs per SM (Python sizes the slab so two CTAs' u[slab] fit in an SM's
// shared memory), 4 loads in flight per lane: the fastest config of sparse_spmv_bench --slab (docs/design/sparse.md).
constexpr int kSlabThreads = 512;
constexpr int kSlabCtasPerSm = 2;
constexpr int kSlabSteps = 4;
// Shared memory per slab CTA for u[slab]: 2 CTAs per SM on H100/H200 (228 KB per SM, 1 KB reserved).
constexpr int64_t kSlabSmemBytes = 115712;

// Entries each slab CTA prefetches into L2 while it stages u[slab]: at most W, and ~2M entries over one wave
// of CTAs (about what DRAM delivers while the wave's staging comes out of L2).
inline int32_t SlabPrefetchNnz(int64_t w, int sm_count) {
  const int64_t wave = int64_t{sm_count > 0 ? sm_count : 1} * kSlabCtasPerSm;
  const int64_t v = w < 2000000 / wave ? w : 2000000 / wave;
  return static_cast<int32_t>(v > 0 ? v : 0);
}

// Slots per team of the 16-byte SpMM kernel: long rows get more slots (more gathers in flight), short rows one.
// Items averaging >= kSlotsMinAvg[i] nnz get 2^(i+1) slots, capped so the team (G * S lanes) fits in a warp.
constexpr int kSlotsMinAvg2 = 64;
constexpr int kSlotsMinAvg4 = 128;
constexpr int kSlotsMinAvg8 = 256;
JAX_OPS_SPARSE_HD inline int SlotsFor(double avg, int g) {
  const int s = avg >= kSlotsMinAvg8 ? 8 : avg >= kSlotsMinAvg4 ? 4 : avg >= kSlotsMinAvg2 ? 2 : 1;
  return s < 32 / g ? s : 32 / g;
}

}  // namespace jax_ops::sparse
