"""The shared LSMR case suite (lsmr_cases.py) on the CPU: the CPU twin ("ffi") and the XLA path ("xla") against
scipy.sparse.linalg.lsmr on every operand kind (scipy.sparse, dense, BCSR, CSRPair): istop/itn equal SciPy's and
x within the bound of lsmr_cases' docstring (the cases are well conditioned: lsmr_cases' docstring)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err
from jax.experimental import sparse as jsparse
from lsmr_cases import CASES, problem, stop_margin_ok, x_bound
from scipy.sparse.linalg import lsmr as scipy_lsmr

import jax_ops
from jax_ops import sparse

BACKENDS = ["ffi", "xla"]  # the CPU twin and the XLA path run the same cases


def operands(a, impl):
    """The operand kinds of one case: scipy CSR, dense jax array, BCSR, CSRPair."""
    bcsr = jsparse.BCSR.from_scipy_sparse(a)
    return {
        "scipy": a,
        "dense": jnp.asarray(a.toarray()),
        "bcsr": bcsr,
        "csr_pair": sparse.csr_pair(bcsr, implementation=impl),
    }


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_scipy(x64, case, impl):
    a, b, kw, x0 = problem(case)
    ref = scipy_lsmr(a, b, x0=x0, **kw)
    assert stop_margin_ok(a, b, kw, ref), "the case's stop is rounding-borderline: not a strict case"
    x_tol = x_bound(a, b, kw, ref[0], x0)
    for kind, op in operands(a, impl).items():
        out = jax_ops.lsmr(
            op, jnp.asarray(b), x0=None if x0 is None else jnp.asarray(x0), implementation=impl, **kw
        )
        out = jax.tree_util.tree_map(np.asarray, out)
        assert out.x.dtype == np.float64 and out.x.shape == (a.shape[1],), kind
        assert (int(out.istop), int(out.itn)) == (int(ref[1]), int(ref[2])), kind
        assert rel_err(out.x, ref[0]) <= x_tol, kind
        # normx as x (| ||x|| - ||x'|| | <= ||x - x'||); norma (which sums the late, rounding-determined
        # alphas/betas too) to 1e-3, test_lsmr's bound
        assert abs(float(out.normx) - ref[7]) <= x_tol * max(ref[7], np.linalg.norm(ref[0])), kind
        assert abs(float(out.norma) - ref[5]) <= 1e-3 * ref[5], kind
