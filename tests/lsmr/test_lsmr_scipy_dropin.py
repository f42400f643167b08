"""jax_ops.lsmr as a drop-in for scipy.sparse.linalg.lsmr: the argument forms SciPy accepts (b as a column, a
list, a Python number or an integer array; LinearOperator inputs; negative damp/atol/btol, float and
non-positive maxiter; show=), the checks SciPy's own test suite makes (identity and bidiagonal systems, scalar and
column b, warm starts from x0, consistency of the returned norms), and the documented refusals (complex; float64
without jax_enable_x64 runs in float32 with a warning). Written for this library, on the CPU twin."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

scipy = pytest.importorskip("scipy")
import scipy.sparse as sp  # noqa: E402
from scipy.sparse.linalg import LinearOperator, aslinearoperator  # noqa: E402
from scipy.sparse.linalg import lsmr as scipy_lsmr  # noqa: E402

import jax_ops  # noqa: E402

lsmr = functools.partial(jax_ops.lsmr, implementation="ffi")


def _bidiagonal(m, n):
    """Lower bidiagonal m x n (m >= n) with entries that grow along the diagonal: full column rank."""
    d = np.arange(1, n + 1, dtype=np.float64)
    rows = np.concatenate([np.arange(n), np.arange(1, n + 1)])
    cols = np.concatenate([np.arange(n), np.arange(n)])
    vals = np.concatenate([d, d * 0.5])
    keep = rows < m
    return sp.csr_matrix((vals[keep], (rows[keep], cols[keep])), shape=(m, n))


class _Callback(LinearOperator):
    """A LinearOperator with Python matvec/rmatvec (no wrapped matrix: runs through a host callback)."""

    def __init__(self, a):
        super().__init__(a.dtype, a.shape)
        self.a = a
        self.calls = 0

    def _matvec(self, v):
        self.calls += 1
        return self.a @ v

    def _rmatvec(self, u):
        self.calls += 1
        return self.a.T @ u


def _operators(a):
    """The same matrix as every operator kind a SciPy user may pass."""
    return {
        "scipy": a,
        "dense": a.toarray(),
        "aslinearoperator": aslinearoperator(a),
        "aslinearoperator_dense": aslinearoperator(a.toarray()),
        "callback": _Callback(a),
    }


def _x(out):
    return np.asarray(out.x, np.float64)


# --------------------------------------------------------------------------------------- compatible systems
@pytest.mark.parametrize("kind", ["scipy", "dense", "aslinearoperator", "aslinearoperator_dense", "callback"])
def test_identity_and_bidiagonal_compatible(x64, kind):
    n = 10
    eye = sp.identity(n, format="csr")
    for b in (np.ones(n), np.arange(n, dtype=np.float64), 10.0 * np.arange(n)):
        out = lsmr(_operators(eye)[kind], b)
        assert np.linalg.norm(_x(out) - b) <= 1e-10 * max(1.0, np.linalg.norm(b))
    a = _bidiagonal(20, 10)
    xtrue = np.arange(1, 11, dtype=np.float64)
    out = lsmr(_operators(a)[kind], a @ xtrue)
    assert np.linalg.norm(_x(out) - xtrue) <= 1e-5
    assert int(out.istop) in (1, 2, 4, 5)


def test_callback_operator_inside_jit_and_vmap(x64):
    a = _bidiagonal(20, 10)
    op = _Callback(a)
    xtrue = np.arange(1, 11, dtype=np.float64)
    b = jnp.asarray(a @ xtrue)
    out = jax.jit(lambda b: lsmr(op, b))(b)
    assert np.linalg.norm(_x(out) - xtrue) <= 1e-5 and op.calls > 0
    B = jnp.stack([b, 2 * b, -b])
    outs = jax.vmap(lambda b: lsmr(op, b))(B)
    for k, s in enumerate((1.0, 2.0, -1.0)):
        assert np.linalg.norm(np.asarray(outs.x[k]) - s * xtrue) <= 1e-5 * abs(s) * 10
    # b's gradient solves with Aᵀ: the callback's rmatmat
    g = jax.grad(lambda b: jnp.sum(lsmr(op, b).x))(b)
    ref = np.linalg.pinv(a.toarray()).T @ np.ones(10)
    np.testing.assert_allclose(np.asarray(g), ref, rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------------------------------ b as SciPy takes it
def test_scalar_list_int_and_column_b(x64):
    out = lsmr(sp.csr_matrix(np.array([[2.0]])), 3.0)
    assert out.x.shape == (1,) and abs(float(out.x[0]) * 2.0 - 3.0) <= 1e-12
    a = _bidiagonal(20, 10)
    b = np.arange(20, dtype=np.int64) % 7 - 3
    want = scipy_lsmr(a, b.astype(np.float64))
    for form in (
        b,
        b.tolist(),
        b.astype(np.int32),
        b.astype(np.float64)[:, None],
        b.astype(np.float64)[None, :],
    ):
        out = lsmr(a, form)
        assert out.x.dtype == jnp.float64 and out.x.shape == (10,)
        assert (int(out.istop), int(out.itn)) == (want[1], want[2])
        np.testing.assert_allclose(_x(out), want[0], rtol=1e-8, atol=1e-12)
    with pytest.raises(ValueError, match="b must be a vector"):
        lsmr(a, np.ones((20, 2)))
    with pytest.raises(TypeError, match="b must be real"):
        lsmr(a, ["x"] * 20)
    with pytest.raises(TypeError, match="b must be an array or a list"):
        lsmr(a, [object()] * 20)


def test_b_dtype_sets_the_precision_and_lists_follow_a(x64):
    a32 = _bidiagonal(20, 10).astype(np.float32)
    assert lsmr(a32, np.ones(20, np.float32)).x.dtype == jnp.float32
    assert lsmr(a32, np.ones(20)).x.dtype == jnp.float64  # a float64 b sets float64
    assert lsmr(a32, [1.0] * 20).x.dtype == jnp.float32  # a list takes A's float dtype
    assert lsmr(a32, np.ones(20, np.int32)).x.dtype == jnp.float32


def test_float64_without_x64_warns_and_runs_float32():
    a = _bidiagonal(20, 10)
    with jax.enable_x64(False):
        with pytest.warns(UserWarning, match="float64 but jax_enable_x64 is off"):
            out = lsmr(a, np.ones(20))
        assert out.x.dtype == jnp.float32
        with pytest.warns(UserWarning, match="float64 but jax_enable_x64 is off"):
            lsmr(a, [1.0] * 20)  # a list follows A, which is float64
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out = lsmr(a.astype(np.float32), np.ones(20, np.float32))
        assert out.x.dtype == jnp.float32
    ref = scipy_lsmr(a.astype(np.float32), np.ones(20, np.float32))[0]  # SciPy in float32 (10 iterations)
    assert np.linalg.norm(np.asarray(out.x, np.float64) - ref) <= 1e-5 * np.linalg.norm(ref)


# ----------------------------------------------------------------------------------- SciPy's scalar arguments
ARGS = [
    dict(damp=-0.7),
    dict(atol=-1.0),
    dict(btol=-1.0),
    dict(atol=-1.0, btol=-1.0),
    dict(conlim=0.0),
    dict(conlim=-5.0),
    dict(maxiter=5.5),
    dict(maxiter=4.2),
    dict(maxiter=0),
    dict(maxiter=-3),
    dict(maxiter=float("nan")),
    dict(maxiter=float("inf")),
    dict(maxiter=np.float32(6.0)),
]


@pytest.mark.parametrize("kw", ARGS, ids=[str(kw) for kw in ARGS])
def test_scalar_arguments_as_scipy(x64, kw):
    rng = np.random.default_rng(0)
    # well conditioned, so SciPy's and our iterates agree to rounding (no loss of orthogonality)
    a = (sp.random(60, 30, density=0.2, random_state=rng) + 3 * sp.eye(60, 30)).tocsr()
    b = rng.standard_normal(60)
    want = scipy_lsmr(a, b, **kw)
    out = lsmr(a, b, **kw)
    assert (int(out.istop), int(out.itn)) == (want[1], want[2])
    np.testing.assert_allclose(_x(out), want[0], rtol=1e-7, atol=1e-10)
    if "damp" in kw:  # -d is d, bitwise
        flipped = lsmr(a, b, damp=-kw["damp"])
        np.testing.assert_array_equal(np.asarray(flipped.x), np.asarray(out.x))
    # traced maxiter / damp take the same meaning
    traced = {k: jnp.asarray(v) for k, v in kw.items()}
    out = jax.jit(lambda b, t: lsmr(a, b, **t))(b, traced)
    assert (int(out.istop), int(out.itn)) == (want[1], want[2])


# ---------------------------------------------------------------------------------- x0 and the returned norms
def test_warm_start_from_x0(x64):
    rng = np.random.default_rng(1)
    a = sp.random(80, 40, density=0.15, random_state=rng, format="csr") + sp.eye(80, 40)
    b = rng.standard_normal(80)
    ref = lsmr(a, b)
    x0 = np.asarray(lsmr(a, b, maxiter=3).x)
    kept = x0.copy()
    out = lsmr(a, b, x0=x0)
    np.testing.assert_array_equal(x0, kept)  # x0 is not modified
    assert int(out.itn) <= int(ref.itn) + 1
    res = lambda x: np.linalg.norm(b - a @ np.asarray(x))  # noqa: E731
    assert res(out.x) <= res(ref.x) * (1 + 1e-6)
    # a list x0 and an integer one are accepted like arrays
    np.testing.assert_allclose(_x(lsmr(a, b, x0=x0.tolist())), _x(out), rtol=1e-12)
    assert lsmr(a, b, x0=np.zeros(40, np.int32)).x.dtype == jnp.float64


def test_returned_norms_are_consistent(x64):
    rng = np.random.default_rng(2)
    a = sp.random(70, 25, density=0.2, random_state=rng, format="csr")
    b = rng.standard_normal(70)
    out = lsmr(a, b, atol=1e-10, btol=1e-10)
    x = _x(out)
    r = b - a @ x
    assert float(out.normr) == pytest.approx(np.linalg.norm(r), rel=1e-6)
    assert float(out.normar) == pytest.approx(np.linalg.norm(a.T @ r), rel=1e-3, abs=1e-9)
    assert float(out.normx) == pytest.approx(np.linalg.norm(x), rel=1e-10)


# -------------------------------------------------------------------------------------------- show / complex
def test_show_prints_outside_jit_only(x64, capsys):
    a = _bidiagonal(20, 10)
    out = lsmr(a, np.ones(20), show=True)
    text = capsys.readouterr().out
    assert "The matrix A has 20 rows and 10 columns" in text and "LSMR finished" in text
    assert f"itn   ={int(out.itn):8d}" in text and jax_ops.lsmr_solver.ISTOP_MESSAGES[int(out.istop)] in text
    lsmr(a, np.ones(20), show=False)
    assert capsys.readouterr().out == ""
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        jax.jit(lambda b: lsmr(a, b, show=True))(jnp.ones(20))
    assert capsys.readouterr().out == ""


def test_complex_is_refused_clearly():
    a = np.eye(4)
    for A, b, x0 in (
        (a + 1j * a, np.ones(4), None),
        (a, np.ones(4) + 1j, None),
        (a, np.ones(4), np.ones(4) * 1j),
        (sp.csr_matrix(a + 1j * a), np.ones(4), None),
        (aslinearoperator(sp.csr_matrix(a).astype(np.complex128)), np.ones(4), None),
        (_Callback(a.astype(np.complex64)), np.ones(4), None),
    ):
        with pytest.raises(TypeError, match="is complex .*real form"):
            lsmr(A, b, x0=x0)
