// CSR SpMV/SpMM contract shared by the CPU twin (spmm_cpu.cc) and the CUDA handler (spmm_cuda.cu).
//
//   out[r, n] = alpha[n] * sum_{p in row r, 0 <= col[p] < K} values[p] * b[col[p], n]  (+ beta[n] * y[r, n])
//
// FFI target "jax_ops_sparse_csr_spmm":
//   args:  indptr s32[M+1], indices s32[nnz], values T[nnz], b T[K, N], alpha Acc[N], beta Acc[N],
//          y T[M, N] or T[0] (no y: beta ignored), long_rows s32[L], long_ptr s32[L+1]
//   rets:  out T[M, N], workspace Acc[W]
//   attrs: algorithm (s32: 0 vector, 1 cta, 2 split, 3 stream, 4 segmented, 5 cusparse, 6 blocks), group
//          (s32: lanes per row, 1..32, power of 2), chunk (s64: nnz per work unit of a long row in split; rows
//          per CTA for stream; total CTAs of the segment table for segmented and blocks)
// T is f16, bf16, f32 or f64; Acc is f32 for the first three and f64 for f64.
//
// Row ranges are clamped: row r covers [s, e) with s = clamp(indptr[r], 0, nnz), e = clamp(indptr[r+1], s, nnz),
// so a decreasing indptr gives an empty row and nothing is read out of bounds. Entries whose column is outside
// [0, K) contribute nothing. Reduction order is fixed (no atomics): results are deterministic run to run.
//
// Split algorithm: rows longer than `chunk` are "long" and listed in long_rows (ascending work-unit offsets in
// long_ptr: long row i owns units [long_ptr[i], long_ptr[i+1]), unit k of it covers nnz
// [s + k*chunk, min(e, s + (k+1)*chunk))). Pass 1 handles the short rows; pass 2 writes one partial per unit
// into the workspace (W >= units * N); pass 3 sums each long row's partials in a fixed order (unit order for
// N > 1; for N == 1 lane l of a warp sums units l, l + 32, ... and a fixed xor tree combines the lanes) and applies
// the epilogue. group: lanes per row of the N == 1 row-block kernel, a power of two in [1, 32]. Python builds
// long_rows/long_ptr from the same indptr. Units past long_ptr[L] are skipped.
//
// Segmented (row classes): the rows come in contiguous segments of similar length, each with its own G.
// long_rows holds the table int32[3 S] (row begin, row end, G per segment, G a power of two in [1, 32]) and
// long_ptr int32[S + 1] the non-decreasing prefix of CTAs per segment; chunk = CTAs launched (long_ptr[S]).
// CTA b runs the segment s with long_ptr[s] <= b < long_ptr[s + 1] and grid-strides over that segment's
// row blocks (SegmentRowsPerCta(G) rows per CTA per step), so a segment with at least one launched CTA is fully
// written. Rows outside every such segment are not written (Python's table covers [0, M) in order); the CPU
// twin writes exactly the same rows. N > 1 on the 16-byte path uses the same table and CTAs (the slots kernel per
// segment, S from the segment's average row) and likewise writes only the table's rows; other N > 1 (the group
// kernel) and the CPU twin's N > 1 write every row. Python's table always covers [0, M), where they agree.
//
// Blocks (N == 1): the rows come in blocks of R consecutive rows (2 <= R <= kMaxBlockRows) that share one column
// list, stored once per block ("R x 1 BSR"): indptr s32[M/R + 1] over block rows, indices s32[P] (the blocks'
// column lists: P positions), values T[R * P] with values[R p + i] the entry of row R b + i at position p of block
// row b. R is not an attribute: it is M / (len(indptr) - 1) (M = 0 with no block row), and len(values) must be
// R * P. Each position's b[col] is gathered once for its R rows. Block-row ranges are clamped like rows (to
// [0, P]); the segment table is the segmented plan's over block rows (long_rows = (block row begin, end, lanes
// per block row), long_ptr = CTA prefix, chunk = CTAs), and a segment's block rows write their R rows each. The
// CPU twin writes the same rows.
//
// cuSPARSE (N == 1, f32/f64 only): cusparseSpMV with CSR_ALG2, cuSPARSE's deterministic CSR algorithm (bitwise
// repeatable; its default algorithm is not, on power-law rows). cuSPARSE takes the buffers as a standard CSR of
// nnz entries, so Python picks this plan only for a CSR it checked on concrete arrays (a CSRPair build): indptr
// monotone with indptr[0] == 0 and indptr[M] == nnz (no padding stored past the rows), every column in [0, K). The
// workspace holds a zero (the beta of a call without y) in its first kCusparseZeroBytes and cuSPARSE's buffer after it;
// a workspace smaller than cuSPARSE asks for is an error. The CPU twin runs its row loop. long_rows/long_ptr (the split
// lists, for N > 1) are not read.
#pragma once

#include <cstdint>
#include <string>

#include "common/ffi_helpers.h"
#include "sparse/instantiations/support.h"

namespace jax_ops::sparse {

// The `algorithm` attribute (exported to Python as sparse_algorithm_<name>).
enum Algorithm : int32_t { kVector = 0, kCta = 1, kSplit = 2, kStream = 3, kSegmented = 4, kCusparse = 5, kBlocks = 6 };

// Largest block height R of the blocks plan (exported to Python as sparse_max_block_rows).
constexpr int64_t kMaxBlockRows = 4;

// Bytes at the start of a cusparse-plan workspace that hold the zero beta (cuSPARSE's buffer starts after them,
// aligned; exported to Python as sparse_cusparse_zero_bytes).
constexpr int64_t kCusparseZeroBytes = 256;

// Lanes per row a segment table entry stands for: 1, 2, 4, 8, 16 as given, anything else 32 (both twins).
inline constexpr int SegmentGroup(int32_t g) { return g == 1 || g == 2 || g == 4 || g == 8 || g == 16 ? g : 32; }

// Rows one 256-thread CTA of the row-block kernel covers per step for lanes-per-row G (RowsConfig in
// spmm_kernels_impl.cuh: U = 1 for G = 1, else 2; 8 warps of U * 32 / G rows); Python reads the table
// sparse_segment_rows_per_cta (G = 1, 2, 4, ..., 32).
inline constexpr int64_t SegmentRowsPerCta(int32_t g) {
  return 8 * (SegmentGroup(g) == 1 ? 32 : 2 * (32 / SegmentGroup(g)));
}

// Stream (CSR-stream) SpMV: a CTA owns `chunk` consecutive rows (a power of two in [kStreamMinRows,
// kStreamMaxRows]), stages their products in shared memory (at most kStreamCap of them; a block with more runs
// a warp-per-row loop instead, so any indptr stays safe) and reduces each row from there.
constexpr int64_t kStreamMinRows = 8;
constexpr int64_t kStreamMaxRows = 256;
constexpr int64_t kStreamCap = 4096;

constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;

struct SpmmShape {
  int64_t m = 0, k = 0, n = 0, nnz = 0;  // blocks: nnz = positions P
  int64_t r = 1;                         // rows per block row (blocks), else 1
  int64_t num_long = 0;                  // L
  int64_t units = 0;                     // work units the workspace holds (split only)
  int32_t algorithm = kVector;
  int32_t group = 32;
  int64_t chunk = 0;
  bool has_y = false;
  ffi::DataType dtype = ffi::DataType::F32;
};

// Plain pointers for one call, used by both the CPU loops and the CUDA kernels. T is the storage type of the
// values (on the device: __half/__nv_bfloat16/float/double), Acc the accumulator.
template <typename T, typename Acc>
struct SpmmArgs {
  const int32_t* indptr = nullptr;
  const int32_t* indices = nullptr;
  const T* values = nullptr;
  const T* b = nullptr;
  const Acc* alpha = nullptr;
  const Acc* beta = nullptr;
  const T* y = nullptr;  // nullptr: no y term
  T* out = nullptr;
  Acc* ws = nullptr;
  const int32_t* long_rows = nullptr;
  const int32_t* long_ptr = nullptr;
  int64_t m = 0, k = 0, n = 0, nnz = 0, num_long = 0, units = 0, chunk = 0;
  int64_t r = 1;  // rows per block row (blocks): indptr has m / r + 1 entries, values r * nnz
  int32_t algorithm = kVector, group = 32;
};

inline ffi::DataType AccType(ffi::DataType dt) {
  return dt == ffi::DataType::F64 ? ffi::DataType::F64 : ffi::DataType::F32;
}

inline bool IsRank1S32(const ffi::AnyBuffer& b) {
  return b.dimensions().size() == 1 && b.element_type() == ffi::DataType::S32;
}

// Re-validates everything the kernels rely on (Python checked first) and returns the sizes.
inline ffi::ErrorOr<SpmmShape> CheckSpmmArgs(const ffi::AnyBuffer& indptr, const ffi::AnyBuffer& indices,
                                             const ffi::AnyBuffer& values, const ffi::AnyBuffer& b,
                                             const ffi::AnyBuffer& alpha, const ffi::AnyBuffer& beta,
                                             const ffi::AnyBuffer& y, const ffi::AnyBuffer& long_rows,
                                             const ffi::AnyBuffer& long_ptr, const ffi::AnyBuffer& out,
                                             const ffi::AnyBuffer& ws, int32_t algorithm, int32_t group,
                                             int64_t chunk) {
  auto fail = [](std::string msg) { return ffi::Unexpected(ffi::Error::InvalidArgument("csr_spmm: " + msg)); };
  SpmmShape s;
  s.dtype = values.element_type();
  const ffi::DataType acc = AccType(s.dtype);
  if (!Contains(kSpmmDTypes, s.dtype))
    return fail(std::string("values has dtype ") + DTypeName(s.dtype) + "; expected f16, bf16, f32 or f64");
  if (values.dimensions().size() != 1) return fail("values must have rank 1");
  if (!IsRank1S32(indptr) || !IsRank1S32(indices) || !IsRank1S32(long_rows) || !IsRank1S32(long_ptr))
    return fail("indptr, indices, long_rows and long_ptr must be rank-1 int32");
  if (b.dimensions().size() != 2 || out.dimensions().size() != 2)
    return fail("b and out must have rank 2, got " + ShapeString(b.dimensions()) + " and " +
                ShapeString(out.dimensions()));
  if (b.element_type() != s.dtype || out.element_type() != s.dtype || y.element_type() != s.dtype)
    return fail("b, y and out must have the values' dtype " + std::string(DTypeName(s.dtype)));
  s.nnz = indices.dimensions()[0];
  s.k = b.dimensions()[0];
  s.n = b.dimensions()[1];
  s.m = out.dimensions()[0];
  if (out.dimensions()[1] != s.n)
    return fail("out has shape " + ShapeString(out.dimensions()) + " but b has " + ShapeString(b.dimensions()));
  const int64_t ptr_rows = indptr.dimensions()[0] - 1;
  if (algorithm == kBlocks) {
    if (s.n != 1) return fail("the blocks plan needs N = 1, got N = " + std::to_string(s.n));
    if (ptr_rows < 0 || (ptr_rows == 0 && s.m != 0)) return fail("blocks needs indptr[M/R + 1] with M/R >= 1");
    s.r = ptr_rows > 0 ? s.m / ptr_rows : 2;
    if (s.r < 2 || s.r > kMaxBlockRows || s.r * ptr_rows != s.m)
      return fail("blocks: out has " + std::to_string(s.m) + " rows and indptr " + std::to_string(ptr_rows) +
                  " block rows; the block height M / block rows must be an integer in [2, " +
                  std::to_string(kMaxBlockRows) + "]");
  } else if (ptr_rows != s.m) {
    return fail("indptr has " + std::to_string(indptr.dimensions()[0]) +
                " entries; expected M+1 = " + std::to_string(s.m + 1));
  }
  if (values.dimensions()[0] != s.r * s.nnz)
    return fail("values has " + std::to_string(values.dimensions()[0]) + " entries; expected " +
                (s.r > 1 ? std::to_string(s.r) + " * " : std::string()) +
                "len(indices) = " + std::to_string(s.r * s.nnz));
  if (s.m > kMaxDim || s.k > kMaxDim || s.n > kMaxDim || s.r * s.nnz > kMaxDim)
    return fail("M, K, N and the number of values must be < 2^31");
  for (const ffi::AnyBuffer* c : {&alpha, &beta}) {
    if (c->element_type() != acc || c->dimensions().size() != 1 || c->dimensions()[0] != s.n)
      return fail("alpha and beta must be " + std::string(DTypeName(acc)) + "[N] with N = " + std::to_string(s.n));
  }
  if (y.element_count() != 0) {
    if (y.dimensions().size() != 2 || y.dimensions()[0] != s.m || y.dimensions()[1] != s.n)
      return fail("y must be empty or have the shape of out " + ShapeString(out.dimensions()) + "; got " +
                  ShapeString(y.dimensions()));
    s.has_y = true;
  }
  if (ws.element_type() != acc || ws.dimensions().size() != 1) return fail("workspace must be a rank-1 Acc array");
  s.num_long = long_rows.dimensions()[0];
  if (algorithm == kSegmented || algorithm == kBlocks) {
    s.num_long = long_ptr.dimensions()[0] - 1;  // segments
    if (s.num_long < 1 || long_rows.dimensions()[0] != 3 * s.num_long)
      return fail("segmented and blocks need a segment table long_rows[3 S] and long_ptr[S + 1] with S >= 1");
    if (chunk < 1 || chunk > kMaxDim) return fail("segmented and blocks need chunk (CTAs) in [1, 2^31)");
  } else if (long_ptr.dimensions()[0] != s.num_long + 1) {
    return fail("long_ptr must have len(long_rows) + 1 entries");
  }
  if (algorithm < kVector || algorithm > kBlocks) return fail("unknown algorithm " + std::to_string(algorithm));
  if (algorithm == kCusparse) {
    if (s.n > 1 || !Contains(kCusparseDTypes, s.dtype))
      return fail("the cusparse plan needs N <= 1 and f32 or f64 values, got N = " + std::to_string(s.n) + " and " +
                  DTypeName(s.dtype));
    if (static_cast<int64_t>(ws.size_bytes()) < kCusparseZeroBytes)
      return fail("the cusparse plan needs a workspace of at least " + std::to_string(kCusparseZeroBytes) + " bytes");
  }
  if (algorithm == kStream && (chunk < kStreamMinRows || chunk > kStreamMaxRows || (chunk & (chunk - 1)) != 0))
    return fail("stream needs chunk (rows per block) a power of two in [8, 256], got " + std::to_string(chunk));
  if (group < 1 || group > 32 || (group & (group - 1)) != 0)
    return fail("group must be a power of two in [1, 32], got " + std::to_string(group));
  s.algorithm = algorithm;
  s.group = group;
  s.chunk = chunk;
  if (algorithm == kSplit) {
    if (chunk < 1) return fail("split needs chunk >= 1");
    s.units = s.n > 0 ? static_cast<int64_t>(ws.element_count()) / s.n : 0;
  }
  return s;
}

// SpmmArgs over the buffers CheckSpmmArgs accepted, shared by both platforms (T/Acc: the platform's types).
template <typename T, typename Acc>
SpmmArgs<T, Acc> MakeSpmmArgs(const SpmmShape& s, const ffi::AnyBuffer& indptr, const ffi::AnyBuffer& indices,
                              const ffi::AnyBuffer& values, const ffi::AnyBuffer& b, const ffi::AnyBuffer& alpha,
                              const ffi::AnyBuffer& beta, const ffi::AnyBuffer& y, const ffi::AnyBuffer& long_rows,
                              const ffi::AnyBuffer& long_ptr, ffi::AnyBuffer& out, ffi::AnyBuffer& ws) {
  SpmmArgs<T, Acc> a;
  a.indptr = static_cast<const int32_t*>(indptr.untyped_data());
  a.indices = static_cast<const int32_t*>(indices.untyped_data());
  a.values = static_cast<const T*>(values.untyped_data());
  a.b = static_cast<const T*>(b.untyped_data());
  a.alpha = static_cast<const Acc*>(alpha.untyped_data());
  a.beta = static_cast<const Acc*>(beta.untyped_data());
  a.y = s.has_y ? static_cast<const T*>(y.untyped_data()) : nullptr;
  a.out = static_cast<T*>(out.untyped_data());
  a.ws = static_cast<Acc*>(ws.untyped_data());
  a.long_rows = static_cast<const int32_t*>(long_rows.untyped_data());
  a.long_ptr = static_cast<const int32_t*>(long_ptr.untyped_data());
  a.m = s.m, a.k = s.k, a.n = s.n, a.nnz = s.nnz, a.r = s.r;
  a.num_long = s.num_long, a.units = s.units, a.chunk = s.chunk;
  a.algorithm = s.algorithm, a.group = s.group;
  return a;
}

}  // namespace jax_ops::sparse
