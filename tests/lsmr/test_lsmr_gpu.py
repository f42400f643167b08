"""jax_ops.lsmr on the GPU: the same solve on CUDA equals the CPU result within the CPU test bounds.

Run on the GPU machine: ``pytest -m gpu tests/test_lsmr_gpu.py``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

scipy = pytest.importorskip("scipy")
import scipy.sparse as sp  # noqa: E402
from helpers import rel_err  # noqa: E402
from scipy.sparse.linalg import lsmr as scipy_lsmr  # noqa: E402

import jax_ops  # noqa: E402

pytestmark = pytest.mark.gpu


def _gen(m, n, colscale=0.0, density=0.01, seed=1, dtype=np.float64):
    rng = np.random.default_rng(seed)
    a = sp.random(m, n, density=density, random_state=rng, format="csr") + sp.eye(m, n) * 0.5
    return sp.csr_matrix(a @ sp.diags(np.logspace(0, colscale, n))).astype(dtype)


def _solve_on(device, a, b, **kw):
    from jax.experimental import sparse

    with jax.default_device(device):
        op = sparse.BCOO.from_scipy_sparse(a)
        op = jax.device_put(op, device)
        out = jax_ops.lsmr(op, jax.device_put(jnp.asarray(b), device), **kw)
        return jax.tree_util.tree_map(np.asarray, out)


@pytest.mark.parametrize(
    "m,n,kw", [(2000, 400, {}), (2000, 400, dict(damp=0.5)), (400, 2000, {}), (2000, 400, dict(maxiter=7))]
)
def test_gpu_float64_matches_cpu_and_scipy(x64, m, n, kw):
    a = _gen(m, n)
    b = np.random.default_rng(2).standard_normal(m)
    ref = scipy_lsmr(a, b, **kw)
    gpu = _solve_on(jax.devices("cuda")[0], a, b, **kw)
    cpu = _solve_on(jax.devices("cpu")[0], a, b, **kw)
    assert (int(gpu.istop), int(gpu.itn)) == (int(cpu.istop), int(cpu.itn)) == ref[1:3]
    assert rel_err(gpu.x, cpu.x) <= 1e-8
    assert rel_err(gpu.x, ref[0]) <= 1e-8


@pytest.mark.parametrize("colscale", [0.0, 2.0])
def test_gpu_float32_matches_cpu(colscale):
    a64 = _gen(20000, 2000, colscale=colscale, density=0.002)
    b64 = np.random.default_rng(3).standard_normal(20000)
    a, b = a64.astype(np.float32), b64.astype(np.float32)
    gpu = _solve_on(jax.devices("cuda")[0], a, b)
    cpu = _solve_on(jax.devices("cpu")[0], a, b)
    ref = scipy_lsmr(a, b)
    assert gpu.x.dtype == np.float32
    assert int(gpu.istop) == int(cpu.istop) == ref[1]
    assert abs(int(gpu.itn) - int(cpu.itn)) <= max(1, 0.02 * int(cpu.itn))
    res = lambda x: np.linalg.norm(a64 @ np.asarray(x, np.float64) - b64) / np.linalg.norm(b64)  # noqa: E731
    assert abs(res(gpu.x) - res(cpu.x)) <= 1e-5 * res(cpu.x) + 1e-6
    assert abs(res(gpu.x) - res(ref[0])) <= 1e-5 * res(ref[0]) + 1e-6


def test_gpu_vmap_block_matches_single():
    a = _gen(20000, 2000, density=0.002).astype(np.float32)
    from jax.experimental import sparse

    dev = jax.devices("cuda")[0]
    op = jax.device_put(sparse.BCOO.from_scipy_sparse(a), dev)
    bs = jax.device_put(
        jnp.asarray(np.random.default_rng(4).standard_normal((16, 20000)).astype(np.float32)), dev
    )
    out = jax.jit(jax.vmap(lambda b: jax_ops.lsmr(op, b)))(bs)
    for i in (0, 7, 15):
        one = jax_ops.lsmr(op, bs[i])
        assert int(out.istop[i]) == int(one.istop)
        assert abs(int(out.itn[i]) - int(one.itn)) <= max(1, 0.02 * int(one.itn))
        assert rel_err(out.x[i], one.x) <= 1e-4


def test_gpu_grad_b(x64):
    rng = np.random.default_rng(5)
    dev = jax.devices("cuda")[0]
    a = jax.device_put(jnp.asarray(rng.standard_normal((60, 20))), dev)
    b = jax.device_put(jnp.asarray(rng.standard_normal(60)), dev)
    g = jax.grad(lambda b: jnp.sum(jax_ops.lsmr(a, b, atol=1e-14, btol=1e-14).x ** 2))(b)
    ref = jax.grad(lambda b: jnp.sum(jnp.linalg.lstsq(a, b)[0] ** 2))(b)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("code", range(8))
def test_gpu_every_stop_code(x64, code):
    """The CPU suite's problems for each istop 0..7 (tests/test_lsmr.py) give the same istop/itn on CUDA."""
    from test_lsmr import _stop_code_problem

    a, b, kw = _stop_code_problem(code)
    a = sp.csr_matrix(a)
    ref = scipy_lsmr(a, b, **kw)
    gpu = _solve_on(jax.devices("cuda")[0], a, b, **kw)
    cpu = _solve_on(jax.devices("cpu")[0], a, b, **kw)
    assert int(gpu.istop) == int(cpu.istop) == ref[1] == code
    # 4 and 5 stop when a ratio crosses eps/2, where another summation order can move the crossing by one.
    slack = 1 if code in (4, 5) else 0
    assert abs(int(gpu.itn) - int(cpu.itn)) <= slack and abs(int(gpu.itn) - ref[2]) <= slack
    if code == 6:  # x is amplified rounding there (see the CPU test): compare the estimates
        assert abs(float(gpu.norma) / ref[5] - 1) <= 1e-8
    elif ref[0].any():
        assert rel_err(gpu.x, ref[0]) <= 1e-8


def test_gpu_kernel_iteration_agrees_with_step(x64):
    # The fused iteration (default) vs XLA's norms and scalar recurrence ("step") on the GPU, float64, before
    # the loss of orthogonality: the same itn/istop, x to 1e-8.
    from jax_ops import lsmr_solver

    a = _gen(2000, 400)
    b = np.random.default_rng(4).standard_normal(2000)
    gpu = jax.devices("cuda")[0]
    out = _solve_on(gpu, a, b, atol=1e-8, btol=1e-8)
    again = _solve_on(gpu, a, b, atol=1e-8, btol=1e-8)
    with lsmr_solver.overrides(iteration="step"):
        ref = _solve_on(gpu, a, b, atol=1e-8, btol=1e-8)
    assert (int(out.istop), int(out.itn)) == (int(ref.istop), int(ref.itn))
    # 1e-8 as GPU vs CPU: "step" itself moves by ~2e-10 between runs on the GPU (XLA's reductions are not
    # deterministic there); the fused iteration repeats bitwise (below).
    assert rel_err(out.x, ref.x) <= 1e-8
    # normx to 1e-8; normr is a difference of nearly equal quantities at convergence (1e-4).
    for f, rel in (("normx", 1e-8), ("normr", 1e-4)):
        assert abs(float(getattr(out, f)) - float(getattr(ref, f))) <= rel * abs(float(getattr(ref, f))), f
    # normar = |A^T r| has converged to ~atol * norma * normr (the stopping test's scale), where rounding moves
    # it by ~1e-4 of itself: bound it at 1 % of atol on that scale.
    scale = float(ref.norma) * float(ref.normr)
    assert abs(float(out.normar) - float(ref.normar)) <= 1e-2 * 1e-8 * scale
    # norma/conda accumulate the late alpha/beta and rbar, which follow rounding: bound them by twice SciPy's own
    # spread over row-permuted copies of the problem (the summation order alone moves conda by ~10% here).
    full = scipy_lsmr(a, b, atol=1e-8, btol=1e-8)
    spread = {"norma": 0.0, "conda": 0.0}
    for seed in range(4):
        perm = np.random.default_rng(10 + seed).permutation(a.shape[0])
        permuted = scipy_lsmr(a[perm], b[perm], atol=1e-8, btol=1e-8)
        spread["norma"] = max(spread["norma"], abs(permuted[5] - full[5]))
        spread["conda"] = max(spread["conda"], abs(permuted[6] - full[6]))
    for f, floor in (("norma", 1e-3), ("conda", 1e-2)):  # (the floor: should SciPy's spread come out ~0)
        ref_f = float(getattr(ref, f))
        assert abs(float(getattr(out, f)) - ref_f) <= max(2 * spread[f], floor * abs(ref_f)), f
    # Deterministic: the same solve again gave the same bits (fixed-order reductions in every kernel).
    for f in out._fields:
        np.testing.assert_array_equal(np.asarray(getattr(again, f)), np.asarray(getattr(out, f)), err_msg=f)
