"""The LSMR case suite shared by the backends' test files (CPU twin "ffi", XLA reference "xla", CUDA).

The cases are well-conditioned float64 problems on which agreement with ``scipy.sparse.linalg.lsmr`` is a property
of a correct solver on any CPU: LSMR stops long before its Lanczos vectors lose orthogonality, and SciPy's stopping
test fires (and the others stay off) with a margin of more than ``BORDERLINE`` at the stop and the iteration before
(``stop_margin_ok`` checks this of every case, so a case that turns borderline fails as such, not as a solver bug).
There istop/itn equal SciPy's and ``||x - x_scipy|| / ||x_scipy|| <= x_bound(...)``: X_TOL, or where larger
X_SPREAD_FACTOR x SciPy's own spread over ``rounding_copies``; the bound of test_lsmr's strict cases too: the stopping
tolerances leave x itself only as accurate as the summation order of the last iterations).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import lsmr as scipy_lsmr

X_TOL = 1e-8
# x may differ from SciPy's by this multiple of SciPy's own spread: a few rounding copies underestimate what
# another summation order reaches (docs/design/lsmr.md, "Test bounds")
X_SPREAD_FACTOR = 10.0

# A stop test whose ratio (test / threshold) is within this factor of 1 at the stopping iteration or the one
# before is rounding-borderline: past the loss of orthogonality the tests' inputs (normar, normA, ...) move by a
# few percent under one-ulp perturbations of b, and another BLAS's summation order moves a stop with a 1% margin by
# one iteration (docs/design/lsmr.md, "Test bounds").
BORDERLINE = 0.1


def gen(m, n, colscale=0.0, density=0.01, seed=1, dtype=np.float64):
    """Random sparse matrix + 0.5*I, columns scaled by logspace(0, colscale) (larger colscale: more iterations)."""
    rng = np.random.default_rng(seed)
    a = sp.random(m, n, density=density, random_state=rng, format="csr") + sp.eye(m, n) * 0.5
    a = sp.csr_matrix(a @ sp.diags(np.logspace(0, colscale, n)))
    return a.astype(dtype)


def rhs(a, consistent, seed=2):
    rng = np.random.default_rng(seed)
    if consistent:
        return np.asarray(a @ rng.standard_normal(a.shape[1]))
    return rng.standard_normal(a.shape[0])


# (id, m, n, consistent, solver keywords ("x0": a random initial guess), seed of b: one whose stop has the margin)
CASES = [
    ("tall-inconsistent", 300, 80, False, dict(), 3),
    ("tall-consistent", 300, 80, True, dict(), 2),
    ("tall-damped", 300, 80, False, dict(damp=0.5), 2),
    ("tall-tight", 300, 80, False, dict(atol=1e-8, btol=1e-8), 2),
    ("tall-maxiter", 300, 80, False, dict(maxiter=4), 2),
    ("tall-x0", 300, 80, False, dict(x0=True), 3),
    ("wide-consistent", 80, 300, True, dict(), 3),
    ("wide-damped-tight", 80, 300, False, dict(damp=0.5, atol=1e-10, btol=1e-10), 2),
    ("square-damped", 150, 150, False, dict(damp=1.0, atol=1e-8, btol=1e-8), 2),
]


def problem(case):
    """(scipy CSR a, b, SciPy keywords, x0 or None) of a case."""
    _, m, n, consistent, kw, seed = case
    a = gen(m, n, density=0.02)
    b = rhs(a, consistent, seed=seed)
    kw = dict(kw)
    x0 = np.random.default_rng(seed + 1000).standard_normal(n) if kw.pop("x0", False) else None
    return a, b, kw, x0


def scipy_at(a, b, kw, itn):
    """SciPy's state after exactly ``itn`` iterations (the tolerances do not change the trajectory)."""
    return scipy_lsmr(a, b, **{**kw, "atol": 0.0, "btol": 0.0, "conlim": 0.0, "maxiter": itn})


def stop_ratios(r, normb, kw):
    """test / threshold for each of SciPy's stop tests 1..6 on a result tuple ``r`` (<= 1: the test fires)."""
    _, _, _, normr, normar, norma, conda, normx = r[:8]
    atol, btol, conlim = kw.get("atol", 1e-6), kw.get("btol", 1e-6), kw.get("conlim", 1e8)
    eps_half = np.finfo(np.float64).eps / 2  # 1 + t <= 1 in round-to-nearest
    with np.errstate(divide="ignore", invalid="ignore"):
        test1 = normr / normb
        test2 = normar / (norma * normr) if norma * normr else np.inf
        test3 = 1 / conda
        t1 = test1 / (1 + norma * normx / normb)
        rtol = btol + atol * norma * normx / normb
        ctol = 1 / conlim if conlim > 0 else 0.0
        ratios = [test1 / rtol, test2 / atol, test3 / ctol, t1 / eps_half, test2 / eps_half, test3 / eps_half]
    return {code: float(v) for code, v in zip(range(1, 7), ratios) if np.isfinite(v) or v == np.inf}


def rounding_copies(a, b, copies=4, seed=0):
    """Copies of the problem (a, b) that differ only in rounding: a dense a (another summation order), then
    ``copies`` b's perturbed by one ulp."""
    rng = np.random.default_rng(seed)
    out = [(a.toarray() if sp.issparse(a) else a, b)]
    for _ in range(copies):
        out.append((a, b * (1 + np.finfo(np.float64).eps * rng.standard_normal(b.shape))))
    return out


def x_bound(a, b, kw, ref_x, x0=None) -> float:
    """The bound on x's relative distance from SciPy's ``ref_x``: X_TOL, or if larger X_SPREAD_FACTOR x SciPy's
    own spread of x over the problem's rounding copies."""
    spread = max(
        float(np.linalg.norm(scipy_lsmr(ac, bc, x0=x0, **kw)[0] - ref_x) / np.linalg.norm(ref_x))
        for ac, bc in rounding_copies(a, b)
    )
    return max(X_TOL, X_SPREAD_FACTOR * spread)


def stop_margin_ok(a, b, kw, ref) -> bool:
    """Whether SciPy's stop ``ref`` is clear of rounding: the firing test (none for istop 7) fired with a margin of
    BORDERLINE, every other test was further than BORDERLINE from firing there and one iteration earlier."""
    istop, itn = int(ref[1]), int(ref[2])
    normb = np.linalg.norm(b)
    at = stop_ratios(ref, normb, kw)
    before = stop_ratios(scipy_at(a, b, kw, itn - 1), normb, kw) if itn > 1 else {}
    if istop in at and not at[istop] <= 1 / (1 + BORDERLINE):
        return False
    others = [v for c, v in at.items() if c != istop] + list(before.values())
    return all(v > 1 + BORDERLINE for v in others)
