// LSMR's scalar recurrence (SciPy's lsmr, statement by statement), shared by the CPU twin and the CUDA kernels of
// the fused iteration (params.h: NormalizeUpdate, LsmrIterationUpdate; the scalars kernels).
//
// One column's state is a row of `sc` [.., kNumScalars] (Scalar below; Python reads the order from kScalarNames), a row
// of `ints` [.., kNumInts] (itn, istop, done) and a row of `params` [.., kNumParams]. The arithmetic is the solver's
// Python recurrence in the vectors' dtype T, operation for operation, without contraction into fma (the kernels'
// source, kernels.cu, is compiled with --fmad=false), so a kernel that recomputes PreStep from the same inputs gets the
// same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#ifdef __CUDACC__
#define JAX_OPS_HD __host__ __device__
#else
#define JAX_OPS_HD
#endif

namespace jax_ops::lsmr {

enum Scalar : int {
  kAlpha,
  kBeta,
  kZetabar,
  kAlphabar,
  kRho,
  kRhobar,
  kCbar,
  kSbar,
  kBetadd,
  kBetad,
  kRhodold,
  kTautildeold,
  kThetatilde,
  kZeta,
  kD,
  kNormA2,
  kMaxrbar,
  kMinrbar,
  kNormA,
  kCondA,
  kNormx,
  kNormr,
  kNormar,
  kNumScalars
};
enum IntState : int { kItn, kIstop, kDone, kNumInts };
enum Param : int { kDamp, kAtol, kBtol, kConlim, kNormb, kNumParams };

// The slots' names in enum order, exported to Python (constants()["lsmr_scalars"], ...), which reads its layout
// of sc/ints/params from them.
inline constexpr const char* kScalarNames[] = {"alpha",      "beta",  "zetabar", "alphabar", "rho",     "rhobar",
                                               "cbar",       "sbar",  "betadd",  "betad",    "rhodold", "tautildeold",
                                               "thetatilde", "zeta",  "d",       "normA2",   "maxrbar", "minrbar",
                                               "normA",      "condA", "normx",   "normr",    "normar"};
inline constexpr const char* kIntNames[] = {"itn", "istop", "done"};
inline constexpr const char* kParamNames[] = {"damp", "atol", "btol", "conlim", "normb"};
static_assert(sizeof(kScalarNames) / sizeof(kScalarNames[0]) == kNumScalars);
static_assert(sizeof(kIntNames) / sizeof(kIntNames[0]) == kNumInts);
static_assert(sizeof(kParamNames) / sizeof(kParamNames[0]) == kNumParams);

template <typename T>
JAX_OPS_HD inline T Sign(T a) {
  return a > T(0) ? T(1) : (a < T(0) ? T(-1) : a);  // 0 -> 0, NaN -> NaN (jnp.sign)
}
template <typename T>
JAX_OPS_HD inline T MaxNan(T a, T b) {  // jnp.maximum: NaN if either is NaN
  return (a != a || b != b) ? a + b : (a > b ? a : b);
}
template <typename T>
JAX_OPS_HD inline T MinNan(T a, T b) {
  return (a != a || b != b) ? a + b : (a < b ? a : b);
}

template <typename T>
struct Rotation {
  T c, s, r;
};

// SciPy's _sym_ortho: the stable Givens rotation with [c s; -s c] [a; b] = [r; 0].
template <typename T>
JAX_OPS_HD inline Rotation<T> SymOrtho(T a, T b) {
  using std::abs;
  using std::sqrt;
  if (b == T(0)) return {Sign(a), T(0), abs(a)};
  if (a == T(0)) return {T(0), Sign(b), abs(b)};
  if (abs(b) > abs(a)) {
    const T tau = a / b;
    const T s = Sign(b) / sqrt(T(1) + tau * tau);
    return {s * tau, s, b / s};
  }
  const T tau = b / a;
  const T c = Sign(a) / sqrt(T(1) + tau * tau);
  return {c, c * tau, a / c};
}

// The part of one iteration that the vector update needs: after both products and the norms of u (beta) and of
// A^T u - beta v (alpha_raw), before x, h, hbar move.
template <typename T>
struct PreStep {
  T alpha, chat, shat, c, s, rho, thetanew, alphabar, thetabar, rhotemp, cbar, sbar, rhobar, zeta, zetabar;
  // Coefficients of the vector update (LsmrStepUpdate's order): s_v, keep_v, c_h, c_x, c_v.
  T coef[5];
};

template <typename T>
JAX_OPS_HD inline PreStep<T> LsmrPreStep(const T* sc, bool active, T beta, T alpha_raw, T damp) {
  PreStep<T> p;
  const bool pos_b = beta > T(0);
  p.alpha = pos_b ? alpha_raw : sc[kAlpha];
  const Rotation<T> hat = SymOrtho(sc[kAlphabar], damp);
  p.chat = hat.c;
  p.shat = hat.s;
  const T rhoold = sc[kRho];
  const Rotation<T> rot = SymOrtho(hat.r, beta);
  p.c = rot.c;
  p.s = rot.s;
  p.rho = rot.r;
  p.thetanew = p.s * p.alpha;
  p.alphabar = p.c * p.alpha;
  const T rhobarold = sc[kRhobar];
  p.thetabar = sc[kSbar] * p.rho;
  p.rhotemp = sc[kCbar] * p.rho;
  const Rotation<T> bar = SymOrtho(sc[kCbar] * p.rho, p.thetanew);
  p.cbar = bar.c;
  p.sbar = bar.s;
  p.rhobar = bar.r;
  p.zeta = p.cbar * sc[kZetabar];
  p.zetabar = -p.sbar * sc[kZetabar];
  p.coef[0] = alpha_raw > T(0) ? T(1) / alpha_raw : T(1);  // s_v
  p.coef[1] = pos_b ? T(0) : T(1);                         // keep_v
  p.coef[2] = active ? p.thetabar * p.rho / (rhoold * rhobarold) : T(0);
  p.coef[3] = active ? p.zeta / (p.rho * p.rhobar) : T(0);
  p.coef[4] = active ? p.thetanew / p.rho : T(0);
  return p;
}

// The rest of the iteration: the estimates of ||r||, ||A||, cond(A), the stopping tests (SciPy's order: later
// tests win), then the guarded update of the column's state (a done column keeps it). `sc`/`ints` are read and
// written in place.
template <typename T>
JAX_OPS_HD inline void LsmrPostStep(const PreStep<T>& p, T beta, T normx, const T* params, int32_t maxiter, T* sc,
                                    int32_t* ints) {
  using std::abs;
  using std::sqrt;
  const bool active = ints[kDone] == 0;
  const int32_t itn = ints[kItn] + 1;
  const T betaacute = p.chat * sc[kBetadd];
  const T betacheck = -p.shat * sc[kBetadd];
  const T betahat = p.c * betaacute;
  const T betadd = -p.s * betaacute;
  const Rotation<T> tilde = SymOrtho(sc[kRhodold], p.thetabar);
  const T thetatilde = tilde.s * p.rhobar;
  const T rhodold = tilde.c * p.rhobar;
  const T betad = -tilde.s * sc[kBetad] + tilde.c * betahat;
  const T tautildeold = (sc[kZeta] - sc[kThetatilde] * sc[kTautildeold]) / tilde.r;
  const T taud = (p.zeta - thetatilde * tautildeold) / rhodold;
  const T d = sc[kD] + betacheck * betacheck;
  const T dt = betad - taud;
  const T normr = sqrt(d + dt * dt + betadd * betadd);

  T normA2 = sc[kNormA2] + beta * beta;
  const T normA = sqrt(normA2);
  normA2 = normA2 + p.alpha * p.alpha;
  const T rhobarold = sc[kRhobar];
  const T maxrbar = MaxNan(sc[kMaxrbar], rhobarold);
  const T minrbar = itn > 1 ? MinNan(sc[kMinrbar], rhobarold) : sc[kMinrbar];
  const T condA = MaxNan(maxrbar, p.rhotemp) / MinNan(minrbar, p.rhotemp);

  const T normar = abs(p.zetabar);
  const T normb = params[kNormb], atol = params[kAtol], btol = params[kBtol], conlim = params[kConlim];
  const T test1 = normr / normb;
  const T nr = normA * normr;
  const T test2 = nr != T(0) ? normar / nr : std::numeric_limits<T>::infinity();
  const T test3 = T(1) / condA;
  const T t1 = test1 / (T(1) + normA * normx / normb);
  const T rtol = btol + atol * normA * normx / normb;
  const T ctol = conlim > T(0) ? T(1) / conlim : T(0);
  int32_t istop = 0;
  if (itn >= maxiter) istop = 7;
  if (T(1) + test3 <= T(1)) istop = 6;
  if (T(1) + test2 <= T(1)) istop = 5;
  if (T(1) + t1 <= T(1)) istop = 4;
  if (test3 <= ctol) istop = 3;
  if (test2 <= atol) istop = 2;
  if (test1 <= rtol) istop = 1;
  using std::isfinite;
  if (!(isfinite(normr) && isfinite(normar) && isfinite(normx) && isfinite(normA))) istop = -1;
  if (!active) return;

  const T updated[kNumScalars] = {p.alpha, beta,    p.zetabar, p.alphabar,  p.rho,      p.rhobar, p.cbar, p.sbar,
                                  betadd,  betad,   rhodold,   tautildeold, thetatilde, p.zeta,   d,      normA2,
                                  maxrbar, minrbar, normA,     condA,       normx,      normr,    normar};
  for (int i = 0; i < kNumScalars; ++i) sc[i] = updated[i];
  ints[kItn] = itn;
  ints[kIstop] = istop;
  ints[kDone] = istop != 0 ? 1 : 0;
}

}  // namespace jax_ops::lsmr
