// The LSMR family's FFI contract (params) and vector recurrences, shared by the CPU twin and the CUDA handler.
//
//   hbar_x:  hbar' = h - c_h * hbar;   x' = x + c_x * hbar'      (one pass: read h, hbar, x; write hbar, x)
//   h:       h'    = v - c_v * h
//   step:    the solver's whole update after its products (LsmrStepUpdate below): v's normalisation, both of
//            the above and partial norms of x'. One pass instead of XLA's v fusion, the two kernels, two
//            copies of h (h_update overwrites the h that hbar_x reads, with no order between the two calls) and
//            XLA's reduction for ||x||.
//
// Vectors have shape [..., n]; each coefficient has the leading shape [...] (one scalar per row), which is what
// vmap with "broadcast_all" produces and what a block LSMR (one column per right-hand side) needs.
#pragma once

#include <cstdint>
#include <vector>

#include "common/ffi_helpers.h"
#include "lsmr/heuristics.h"
#include "lsmr/scalar_recurrence.h"

namespace jax_ops::lsmr {

// rows = product of the leading dims, n = length of the last dim.
struct RowShape {
  int64_t rows = 0;
  int64_t n = 0;
};

// `buf` must have dtype `dtype` and shape [lead..., last] (no trailing axis when last < 0).
inline ffi::Error CheckRowArray(const ffi::AnyBuffer& buf, const char* name, ffi::DataType dtype,
                                std::vector<int64_t> want, int64_t last) {
  if (last >= 0) want.push_back(last);
  auto got = buf.dimensions();
  if (buf.element_type() != dtype || std::vector<int64_t>(got.begin(), got.end()) != want)
    return ffi::Error::InvalidArgument(std::string(name) + " must be " + DTypeName(dtype) + " with shape " +
                                       ShapeString(want) + "; got " + DTypeName(buf.element_type()) + " " +
                                       ShapeString(got));
  return ffi::Error::Success();
}

// The same with lead = the vector's leading dims (all but its last).
inline ffi::Error CheckRowArray(const ffi::AnyBuffer& buf, const char* name, ffi::DataType dtype,
                                const ffi::AnyBuffer& vector, int64_t last) {
  auto dims = vector.dimensions();
  return CheckRowArray(buf, name, dtype, std::vector<int64_t>(dims.begin(), dims.end() - 1), last);
}

// Checks the vectors (same shape and dtype, rank >= 1): `vectors` are the inputs and results that must all match.
template <size_t NV>
ffi::ErrorOr<RowShape> CheckVectors(const ffi::AnyBuffer* const (&vectors)[NV], const char* const (&vector_names)[NV]) {
  const ffi::AnyBuffer& ref = *vectors[0];
  auto dims = ref.dimensions();
  if (dims.size() < 1)
    return ffi::Unexpected(ffi::Error::InvalidArgument(std::string(vector_names[0]) + " must have rank >= 1"));
  for (size_t i = 1; i < NV; ++i) {
    ffi::Error e = CheckSameShape(*vectors[i], vector_names[i], ref, vector_names[0]);
    if (!e.success()) return ffi::Unexpected(std::move(e));
  }
  RowShape shape;
  shape.n = dims[dims.size() - 1];
  shape.rows = 1;
  for (size_t d = 0; d + 1 < dims.size(); ++d) shape.rows *= dims[d];
  return shape;
}

// CheckVectors, and the coefficients: shape = the vectors' leading dims, the vectors' dtype.
template <size_t NV, size_t NC>
ffi::ErrorOr<RowShape> CheckRecurrenceArgs(const ffi::AnyBuffer* const (&vectors)[NV],
                                           const char* const (&vector_names)[NV],
                                           const ffi::AnyBuffer* const (&coefs)[NC],
                                           const char* const (&coef_names)[NC]) {
  auto shape = CheckVectors(vectors, vector_names);
  if (shape.has_error()) return shape;
  for (size_t i = 0; i < NC; ++i) {
    ffi::Error e = CheckRowArray(*coefs[i], coef_names[i], vectors[0]->element_type(), *vectors[0], -1);
    if (!e.success()) return ffi::Unexpected(std::move(e));
  }
  return shape;
}

// NormPartials (heuristics.h) for a vector dtype: the row length of an update's `partials` in the row layout.
inline int64_t NormPartialsFor(ffi::DataType dtype, int64_t n, int64_t unroll = 1) {
  return NormPartials(n, dtype == ffi::DataType::F64 ? 8 : 4, unroll);
}

// partials must have the vectors' dtype and shape [leading dims..., count].
inline ffi::Error CheckPartials(const ffi::AnyBuffer& partials, const ffi::AnyBuffer& vector, int64_t count) {
  return CheckRowArray(partials, "partials", vector.element_type(), vector, count);
}

// The vectors of a fused-iteration kernel: the row layout [rows..., n] (one right-hand side per row) or the column
// layout [batch..., n, cols] (leading batch dims come from vmap over a batched matrix). The column layout is a block
// solve's (k > 1 right-hand sides): a vector block is [L, k], the k columns interleaved, which is what the products'
// SpMM takes and gives (no transposes); each CTA takes ColumnsRowsPerCta(k) of the L rows of every column
// (heuristics.h), partial norms are [k, ColumnsPartials(L, k)] (one per CTA), coefficients per column. `lead` is the
// shape of the per-column state (beta, rows of sc/ints/params, partials' leading dims), `rows` its size (batch * cols
// in the column layout).
struct BlockShape {
  bool columns = false;
  int64_t rows = 0;
  int64_t n = 0;
  int64_t cols = 0;   // column layout: the fast axis
  int64_t batch = 1;  // column layout: product of the batch dims
  std::vector<int64_t> lead;
  // Length of the partial norms' last axis for Update's kUnroll (row layout) or the column layout's CTAs.
  int64_t Partials(ffi::DataType dtype, int64_t unroll) const {
    return columns ? ColumnsPartials(n, cols) : NormPartialsFor(dtype, n, unroll);
  }
};

template <size_t NV>
ffi::ErrorOr<BlockShape> CheckBlock(const ffi::AnyBuffer* const (&vectors)[NV], const char* const (&vector_names)[NV],
                                    bool columns) {
  auto rows = CheckVectors(vectors, vector_names);
  if (rows.has_error()) return ffi::Unexpected(rows.error());
  auto dims = vectors[0]->dimensions();
  BlockShape shape;
  shape.columns = columns;
  if (!columns) {
    shape.rows = rows->rows;
    shape.n = rows->n;
    shape.lead.assign(dims.begin(), dims.end() - 1);
    return shape;
  }
  if (dims.size() < 2)
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        std::string(vector_names[0]) + " must be [..., n, columns] in the column layout; got " + ShapeString(dims)));
  shape.n = dims[dims.size() - 2];
  shape.cols = dims[dims.size() - 1];
  for (size_t d = 0; d + 2 < dims.size(); ++d) shape.batch *= dims[d];
  shape.rows = shape.batch * shape.cols;
  shape.lead.assign(dims.begin(), dims.end() - 2);
  shape.lead.push_back(shape.cols);
  return shape;
}

// The state arrays of the fused iteration's step (LsmrIterationUpdate) and scalars kernels: sc [lead.., kNumScalars],
// ints int32 [.., kNumInts], params [.., kNumParams], beta [..], in `dt` except ints.
inline ffi::Error CheckColumnState(ffi::DataType dt, const std::vector<int64_t>& lead, const ffi::AnyBuffer& sc,
                                   const ffi::AnyBuffer& ints, const ffi::AnyBuffer& params,
                                   const ffi::AnyBuffer& beta) {
  ffi::Error e = CheckRowArray(sc, "sc", dt, lead, kNumScalars);
  if (e.success()) e = CheckRowArray(ints, "ints", ffi::DataType::S32, lead, kNumInts);
  if (e.success()) e = CheckRowArray(params, "params", dt, lead, kNumParams);
  if (e.success()) e = CheckRowArray(beta, "beta", dt, lead, -1);
  return e;
}

// The coefficient workspace of a kCoefFromState update: [lead.., kCoef] in the column layout, empty (no elements) in
// the row layout.
inline ffi::Error CheckCoefWorkspace(const ffi::AnyBuffer& ws, ffi::DataType dt, const BlockShape& shape, int kCoef) {
  if (shape.columns) return CheckRowArray(ws, "coef_ws", dt, shape.lead, kCoef);
  if (ws.element_count() != 0)
    return ffi::Error::InvalidArgument("coef_ws must be empty in the row layout; got " + ShapeString(ws.dimensions()));
  return ffi::Error::Success();
}

template <typename T>
JAX_OPS_HD inline T MulRn(T a, T b) {
#ifdef __CUDA_ARCH__
  if constexpr (sizeof(T) == 4)
    return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// Per-element updates, written once for the CPU twin and the CUDA kernels. `c` holds the row's coefficients,
// `in` the element of each input, `out` receives each result.
// Per-update traits besides kIn/kOut/kCoef: kNormOut / kNormIn (index of the output / input whose partial norms
// go to `partials`, -1: none), kUnroll (16-byte vectors per thread), kCoefFromState (the coefficients come from
// Coefficients() on a ColumnState instead of coefficient arrays).
struct ElementwiseTraits {
  static constexpr int kNormOut = -1;
  static constexpr int kNormIn = -1;
  static constexpr int kUnroll = 1;
  static constexpr bool kCoefFromState = false;
};

struct HbarXUpdate : ElementwiseTraits {
  static constexpr int kIn = 3;    // h, hbar, x
  static constexpr int kOut = 2;   // hbar', x'
  static constexpr int kCoef = 2;  // c_h, c_x
  template <typename T>
  JAX_OPS_HD static void Apply(const T* c, const T* in, T* out) {
    const T hbar_new = in[0] - c[0] * in[1];
    out[0] = hbar_new;
    out[1] = in[2] + c[1] * hbar_new;
  }
};

struct HUpdate : ElementwiseTraits {
  static constexpr int kIn = 2;    // v, h
  static constexpr int kOut = 1;   // h'
  static constexpr int kCoef = 1;  // c_v
  template <typename T>
  JAX_OPS_HD static void Apply(const T* c, const T* in, T* out) {
    out[0] = in[0] - c[0] * in[1];
  }
};

// The step's expressions (v' = keep_v ? v_kept : vb * s_v, hbar' = h - c_h hbar, x' = x + c_x hbar',
// h' = v' - c_v h; c = s_v, keep_v, c_h, c_x, c_v), written once for LsmrStepUpdate and LsmrIterationUpdate.
template <typename T>
JAX_OPS_HD inline void StepExpressions(const T* c, T vb, T v_kept, T h, T hbar, T x, T* out) {
  const T v_new = c[1] != T(0) ? v_kept : MulRn(vb, c[0]);
  const T hbar_new = h - c[2] * hbar;
  out[0] = v_new;
  out[1] = v_new - c[4] * h;
  out[2] = hbar_new;
  out[3] = x + c[3] * hbar_new;
}

// One LSMR iteration's vector work after the two products, in one pass (what the solver runs):
//   v'    = keep_v ? v : vb * s_v          (SciPy: v = A^T u - beta v, then v *= 1/alpha unless beta = 0)
//   hbar' = h - c_h * hbar;   x' = x + c_x * hbar';   h' = v' - c_v * h
// plus each CTA's norm of its elements of x' (the `partials` output: ||x'|| is the norm of a row of partials; a
// norm, not a sum of squares, so float32 partials do not overflow before the caller's float64 sum). The same
// expressions as XLA's v update followed by HbarXUpdate and HUpdate, so v', h', hbar', x' are bitwise theirs: the
// product vb * s_v is rounded on its own (MulRn), as XLA's separate fusion rounded it.
struct LsmrStepUpdate : ElementwiseTraits {
  static constexpr int kIn = 5;       // vb, v, h, hbar, x
  static constexpr int kOut = 4;      // v', h', hbar', x'
  static constexpr int kCoef = 5;     // s_v, keep_v (0 or 1), c_h, c_x, c_v
  static constexpr int kNormOut = 3;  // x': one partial norm per CTA
  template <typename T>
  JAX_OPS_HD static void Apply(const T* c, const T* in, T* out) {
    StepExpressions(c, in[0], in[1], in[2], in[3], in[4], out);
  }
};

// ---- The fused LSMR iteration (jax_ops/lsmr_solver.py, iteration "kernels"): per iteration the two products,
// then PartialNormsUpdate (norm of u's update), NormalizeUpdate, PartialNormsUpdate (of v's update),
// LsmrIterationUpdate and the scalars kernel (LsmrPostStep): the norms and the whole scalar recurrence run inside
// these launches instead of XLA's reductions and scalar fusions.

// Per-column inputs of the updates whose coefficients come from the solver's state (kCoefFromState). Rows of
// every array are the vectors' rows (one per right-hand side).
template <typename T>
struct ColumnState {
  const T* norm_partials = nullptr;  // [rows, num_norm_partials]: partial norms of the vector the update divides by
  int64_t num_norm_partials = 0;
  const T* sc = nullptr;          // [rows, kNumScalars]
  const int32_t* ints = nullptr;  // [rows, kNumInts]
  const T* params = nullptr;      // [rows, kNumParams]
  const T* beta = nullptr;        // [rows]: this iteration's beta (NormalizeUpdate's output)
  T* beta_out = nullptr;          // NormalizeUpdate: [rows] beta and vb_coef, written by the row's first CTA
  T* vb_coef_out = nullptr;
};

// A compensated (Neumaier) double sum: the CPU twin's sums of squares. A plain running sum over a long row loses
// ~sqrt(n) ulps, enough to move LSMR's rounding-sensitive estimates (cond(A)) off SciPy's (BLAS nrm2) path.
struct CompensatedSum {
  double sum = 0, correction = 0;
  void Add(double v) {
    const double t = sum + v;
    correction += std::abs(sum) >= std::abs(v) ? (sum - t) + v : (v - t) + sum;
    sum = t;
  }
  double Value() const { return sum + correction; }
};

// The sum of squares of a row from its partial norms (each the norm of a piece), accumulated in double. CPU twin
// order; the CUDA kernels sum in a fixed tree order (both deterministic).
template <typename T>
inline double SumOfSquaresHost(const T* partials, int64_t count) {
  CompensatedSum s;
  for (int64_t i = 0; i < count; ++i) s.Add(static_cast<double>(partials[i]) * partials[i]);
  return s.Value();
}

// Partial norms of one vector (no outputs): what beta = ||A v - alpha u|| and alpha = ||A^T u - beta v|| start from.
struct PartialNormsUpdate : ElementwiseTraits {
  static constexpr int kIn = 1;
  static constexpr int kOut = 0;
  static constexpr int kCoef = 0;
  static constexpr int kNormIn = 0;
  static constexpr int kUnroll = kPartialNormsUnroll;
  template <typename T>
  JAX_OPS_HD static void Apply(const T* c, const T* in, T* out) {}
};

// u = ub * (1 / beta) with beta = ||ub|| from ub's partial norms (SciPy: beta = norm(u); if beta > 0: u *= 1/beta).
// The row's first CTA also writes beta and vb_coef, the coefficient of v in the next product vb = A^T u + vb_coef v:
// -beta, or 1 when beta = 0. Then u = 0, so vb is v itself, which is what SciPy keeps as v in that case
// (LsmrIterationUpdate's keep_v takes vb): the vector update needs no copy of the old v.
struct NormalizeUpdate : ElementwiseTraits {
  static constexpr int kIn = 1;
  static constexpr int kOut = 1;
  static constexpr int kCoef = 1;  // 1 / beta, or 1 when beta = 0
  static constexpr bool kCoefFromState = true;
  template <typename T>
  JAX_OPS_HD static void Apply(const T* c, const T* in, T* out) {
    out[0] = in[0] * c[0];
  }
  template <typename T>
  JAX_OPS_HD static void Coefficients(const ColumnState<T>& st, int64_t row, double sum_of_squares, bool first_cta,
                                      T* c) {
    using std::sqrt;
    const T beta = static_cast<T>(sqrt(sum_of_squares));
    c[0] = beta > T(0) ? T(1) / beta : T(1);
    if (first_cta) {
      st.beta_out[row] = beta;
      st.vb_coef_out[row] = beta > T(0) ? -beta : T(1);
    }
  }
};

// The vector update of the fused iteration: LsmrStepUpdate's expressions (bitwise the same results) with v' taken
// from vb itself when keep_v (see NormalizeUpdate: vb = v then), so the old v is not an input. Coefficients from the
// column's state: alpha_raw = ||vb|| from vb's partial norms, then LsmrPreStep (the rotations), which every CTA of
// the row computes from the same inputs (same bits).
struct LsmrIterationUpdate : ElementwiseTraits {
  static constexpr int kIn = 4;       // vb, h, hbar, x
  static constexpr int kOut = 4;      // v', h', hbar', x'
  static constexpr int kCoef = 5;     // s_v, keep_v (0 or 1), c_h, c_x, c_v
  static constexpr int kNormOut = 3;  // x': one partial norm per CTA
  static constexpr bool kCoefFromState = true;
  template <typename T>
  JAX_OPS_HD static void Apply(const T* c, const T* in, T* out) {
    StepExpressions(c, in[0], in[0], in[1], in[2], in[3], out);  // keep_v takes vb itself (= v then)
  }
  template <typename T>
  JAX_OPS_HD static void Coefficients(const ColumnState<T>& st, int64_t row, double sum_of_squares, bool first_cta,
                                      T* c) {
    using std::sqrt;
    const PreStep<T> pre = LsmrPreStep(st.sc + row * kNumScalars, st.ints[row * kNumInts + kDone] == 0, st.beta[row],
                                       static_cast<T>(sqrt(sum_of_squares)), st.params[row * kNumParams + kDamp]);
    for (int k = 0; k < kCoef; ++k) c[k] = pre.coef[k];
  }
};

// The scalars kernel (one per iteration, after LsmrIterationUpdate): LsmrPreStep again (same inputs, same bits as
// the vector update's coefficients), LsmrPostStep, and -alpha for the next product A v - alpha u. In place.
template <typename T>
struct ScalarsArgs {
  T* sc = nullptr;                   // [rows, kNumScalars]
  int32_t* ints = nullptr;           // [rows, kNumInts]
  T* neg_alpha = nullptr;            // [rows]
  const T* beta = nullptr;           // [rows]
  const T* params = nullptr;         // [rows, kNumParams]
  const int32_t* maxiter = nullptr;  // [rows]
  const T* v_partials = nullptr;     // [rows, num_v_partials]: partial norms of A^T u - beta v
  int64_t num_v_partials = 0;
  const T* x_partials = nullptr;  // [rows, num_x_partials]: partial norms of the updated x
  int64_t num_x_partials = 0;
  int64_t rows = 0;
};

template <typename T>
JAX_OPS_HD inline void LsmrScalarStep(const ScalarsArgs<T>& a, int64_t row, double squares_v, double squares_x) {
  using std::sqrt;
  T* sc = a.sc + row * kNumScalars;
  int32_t* ints = a.ints + row * kNumInts;
  const T* params = a.params + row * kNumParams;
  const T beta = a.beta[row];
  const PreStep<T> pre = LsmrPreStep(sc, ints[kDone] == 0, beta, static_cast<T>(sqrt(squares_v)), params[kDamp]);
  LsmrPostStep(pre, beta, static_cast<T>(sqrt(squares_x)), params, a.maxiter[row], sc, ints);
  a.neg_alpha[row] = -sc[kAlpha];
}

// The scalars kernel's buffers, checked (the CPU twin and the CUDA handler share this). The rows are neg_alpha's
// shape; each partials array has those leading dims and its own length.
struct ScalarsBuffers {
  ffi::AnyBuffer* sc;
  ffi::AnyBuffer* ints;
  ffi::AnyBuffer* neg_alpha;
  const ffi::AnyBuffer* beta;
  const ffi::AnyBuffer* params;
  const ffi::AnyBuffer* maxiter;
  const ffi::AnyBuffer* v_partials;
  const ffi::AnyBuffer* x_partials;
  int64_t rows;

  template <typename T>
  ScalarsArgs<T> Typed() const {
    ScalarsArgs<T> a;
    a.sc = static_cast<T*>(sc->untyped_data());
    a.ints = static_cast<int32_t*>(ints->untyped_data());
    a.neg_alpha = static_cast<T*>(neg_alpha->untyped_data());
    a.beta = static_cast<const T*>(beta->untyped_data());
    a.params = static_cast<const T*>(params->untyped_data());
    a.maxiter = static_cast<const int32_t*>(maxiter->untyped_data());
    a.v_partials = static_cast<const T*>(v_partials->untyped_data());
    a.num_v_partials = v_partials->dimensions().back();
    a.x_partials = static_cast<const T*>(x_partials->untyped_data());
    a.num_x_partials = x_partials->dimensions().back();
    a.rows = rows;
    return a;
  }
};

inline ffi::ErrorOr<ScalarsBuffers> CheckScalarsArgs(ffi::AnyBuffer& sc, ffi::AnyBuffer& ints,
                                                     ffi::AnyBuffer& neg_alpha, const ffi::AnyBuffer& beta,
                                                     const ffi::AnyBuffer& params, const ffi::AnyBuffer& maxiter,
                                                     const ffi::AnyBuffer& v_partials, const ffi::AnyBuffer& x_partials,
                                                     ffi::AnyBuffer& sc_out, ffi::AnyBuffer& ints_out,
                                                     ffi::AnyBuffer& neg_alpha_out) {
  const ffi::DataType dt = neg_alpha.element_type();
  if (dt != ffi::DataType::F32 && dt != ffi::DataType::F64)
    return ffi::Unexpected(
        ffi::Error::InvalidArgument(std::string("neg_alpha must be float32 or float64; got ") + DTypeName(dt)));
  auto nd = neg_alpha.dimensions();
  const std::vector<int64_t> lead(nd.begin(), nd.end());
  auto parts_ok = [&](const ffi::AnyBuffer& p, const char* name) {
    auto pd = p.dimensions();
    return p.dimensions().size() == lead.size() + 1 && pd.back() >= 1
               ? CheckRowArray(p, name, dt, lead, pd.back())
               : ffi::Error::InvalidArgument(std::string(name) + " must have shape " + ShapeString(lead) +
                                             " + [count >= 1]; got " + ShapeString(pd));
  };
  ffi::Error e = CheckRowArray(sc, "sc", dt, lead, kNumScalars);
  if (e.success()) e = CheckRowArray(ints, "ints", ffi::DataType::S32, lead, kNumInts);
  if (e.success()) e = CheckRowArray(beta, "beta", dt, lead, -1);
  if (e.success()) e = CheckRowArray(params, "params", dt, lead, kNumParams);
  if (e.success()) e = CheckRowArray(maxiter, "maxiter", ffi::DataType::S32, lead, -1);
  if (e.success()) e = parts_ok(v_partials, "vb_partials");
  if (e.success()) e = parts_ok(x_partials, "x_partials");
  if (e.success()) e = CheckRowArray(sc_out, "sc_out", dt, lead, kNumScalars);
  if (e.success()) e = CheckRowArray(ints_out, "ints_out", ffi::DataType::S32, lead, kNumInts);
  if (e.success()) e = CheckRowArray(neg_alpha_out, "neg_alpha_out", dt, lead, -1);
  if (!e.success()) return ffi::Unexpected(std::move(e));
  int64_t rows = 1;
  for (int64_t d : lead) rows *= d;
  // Results alias the inputs (the solver's loop carry); the kernel works in place on the result buffers.
  ScalarsBuffers b{&sc_out, &ints_out, &neg_alpha_out, &beta, &params, &maxiter, &v_partials, &x_partials, rows};
  if (sc.untyped_data() != sc_out.untyped_data() || ints.untyped_data() != ints_out.untyped_data() ||
      neg_alpha.untyped_data() != neg_alpha_out.untyped_data())
    return ffi::Unexpected(ffi::Error::InvalidArgument(
        "jax_ops_lsmr_scalars updates sc, ints and neg_alpha in place: call it with input_output_aliases"));
  return b;
}

}  // namespace jax_ops::lsmr
