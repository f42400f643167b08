"""The shared sparse case suite (sparse_cases.py) on the CPU: the CPU twin ("ffi") and the XLA reference ("xla")
against float64 NumPy, every entry point (BCSR, BCOO, scipy, spmv/spmm, jit, CSRPair matvec/rmatvec/.T, dense @
sparse) and the CSRPair alpha/beta/y epilogue."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err, tol
from sparse_cases import (
    CASES,
    DTYPES,
    EPILOGUE_CASES,
    EPILOGUES,
    MATRICES,
    NS,
    case_id,
    entries_for,
    expected_shape,
    matrix,
    run_entry,
    run_epilogue,
    x64_for,
)

BACKENDS = ["ffi", "xla"]  # the CPU twin and the XLA reference run the same cases


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("name,dtype,n", CASES, ids=map(case_id, CASES))
def test_products(name, dtype, n, impl):
    with x64_for(dtype):
        a, ref = matrix(name, dtype)
        for entry in entries_for(dtype, impl):
            out, want = run_entry(entry, a, ref, n, dtype, impl)
            assert out.dtype == jnp.dtype(dtype), entry
            assert out.shape == expected_shape(entry, a, n), entry
            assert rel_err(out, want) < tol(dtype), entry


@pytest.mark.parametrize("impl", BACKENDS)
@pytest.mark.parametrize("name,dtype,n", EPILOGUE_CASES, ids=map(case_id, EPILOGUE_CASES))
def test_epilogue(name, dtype, n, impl):
    with x64_for(dtype):
        a, ref = matrix(name, dtype)
        for epilogue in EPILOGUES:
            for transpose in (False, True):
                out, want = run_epilogue(epilogue, transpose, a, ref, n, dtype, impl)
                assert out.dtype == jnp.dtype(dtype), (epilogue, transpose)
                rows = a.shape[1] if transpose else a.shape[0]
                assert out.shape == ((rows,) if n is None else (rows, n)), (epilogue, transpose)
                assert rel_err(out, want) < tol(dtype), (epilogue, transpose)


def test_suite_covers_the_kernels():
    """The case list holds every matrix, dtype and N, and its matrices reach more than one CSRPair plan."""
    from sparse_cases import bcsr

    from jax_ops import sparse

    assert {c[0] for c in CASES} == set(MATRICES) and {c[2] for c in CASES} == set(NS)
    assert {np.dtype(c[1]) for c in CASES} == {np.dtype(d) for d in DTYPES}
    plans = set()
    for name in {c[0] for c in CASES if c[1] == np.float32 and c[2] is None}:
        a, _ = matrix(name, np.float32)
        pair = sparse.csr_pair(bcsr(a, np.float32), implementation="ffi")
        plans |= {pair.plan.algorithm, pair.plan_t.algorithm}
    assert {"vector", "warp"} <= plans, plans
