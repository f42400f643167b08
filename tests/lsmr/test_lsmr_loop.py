"""LSMR loop structure (the CPU twin, implementation="ffi"): the iteration variants (lsmr_solver.ITERATIONS), the packed scalar carry and the unroll; HLO
kernel counts."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ops
from jax_ops import lsmr_solver
from jax_ops._src.lsmr import kernels, recurrence
from jax_ops._src.lsmr.loop import step_kernels
from jax_ops._src.lsmr.operators import Spec
from jax_ops._src.lsmr.types import ColParams
from jax_ops.bench.hlo_count import while_body_counts

# The loop variants are the FFI path's (implementation=None runs the XLA path on the CPU).
lsmr = functools.partial(jax_ops.lsmr, implementation="ffi")


def _problem(m=300, n=40, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) * np.logspace(0, 2, n)
    b = rng.standard_normal(m)
    return jnp.asarray(a), jnp.asarray(b)


def _same(out, ref, fields=("x", "normr", "normar", "norma", "conda", "normx")):
    assert int(out.itn) == int(ref.itn) and int(out.istop) == int(ref.istop)
    for f in fields:
        np.testing.assert_array_equal(np.asarray(getattr(out, f)), np.asarray(getattr(ref, f)), err_msg=f)


@pytest.mark.parametrize("unroll", [1, 3])
def test_packed_carry_is_bit_identical(unroll):
    a, b = _problem()
    with lsmr_solver.overrides(iteration="step"):  # the carry of recurrence.step's loop
        ref = lsmr(a, b, atol=1e-10, btol=1e-10, unroll=1)
        with lsmr_solver.overrides(pack_scalars=False):
            out = lsmr(a, b, atol=1e-10, btol=1e-10, unroll=unroll)
    _same(out, ref)


@pytest.mark.parametrize("unroll", [2, 3])
def test_kernel_iteration_unroll_is_bit_identical(unroll):
    # The fused iteration (the default): a finished column is frozen inside a trip, so the unroll changes nothing.
    from jax.experimental import sparse

    a, b = _problem()
    for operand in (a, sparse.BCOO.fromdense(a)):
        _same(lsmr(operand, b, atol=1e-10, btol=1e-10, unroll=unroll),
              lsmr(operand, b, atol=1e-10, btol=1e-10, unroll=1))  # fmt: skip


def test_step_kernel_is_bit_identical():
    # The step kernel vs XLA's v update + the two kernels + XLA's ||x||: the iterates are bitwise the same (only
    # normx's summation order differs).
    from jax.experimental import sparse

    a, b = _problem()
    for operand in (a, sparse.BCOO.fromdense(a)):
        with lsmr_solver.overrides(iteration="step"):
            ref = lsmr(operand, b, atol=1e-10, btol=1e-10)
        with lsmr_solver.overrides(iteration="unfused"):
            out = lsmr(operand, b, atol=1e-10, btol=1e-10)
        _same(out, ref, ("x", "normr", "normar", "norma", "conda"))
        np.testing.assert_allclose(np.asarray(out.normx), np.asarray(ref.normx), rtol=1e-6)  # float32


class _FixedProducts(Spec):
    """A V + beta U and A^T U + beta V with fixed blocks standing for A V and A^T U (to feed both iterations the
    same vectors)."""

    def __init__(self, av, atu):
        self.m, self.n = av.shape[1], atu.shape[1]
        self.av, self.atu = av, atu

    def mv(self, leaves, V, cp):
        raise AssertionError("only the fused products are used")

    rmv = mv

    def mv_axpby(self, leaves, V, U, beta, cp):
        return self.av + beta[:, None] * U

    def rmv_axpby(self, leaves, U, V, beta, cp):
        return self.atu + beta[:, None] * V


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_kernel_scalars_bitwise_match_step(dtype):
    # One iteration of the fused kernels (ffi_cuda/lsmr/scalar_recurrence.h) against recurrence.step's jnp recurrence from
    # the same state, on products whose norms every summation order gets exactly (one nonzero per row): all 23
    # scalars, itn/istop/done and the vectors bitwise. Rows: an active column, damp > 0 on the iteration limit,
    # a done column (frozen), beta = 0 (A v - alpha u = 0: v and alpha kept; the fused iteration gets that v
    # through A^T u + 1 v with u = 0).
    with jax.enable_x64(dtype == "float64"):
        dt = np.dtype(dtype)
        rng = np.random.default_rng(5)
        k, m, n = 4, 7, 5
        one_hot = lambda size, col, scale: np.eye(size, dtype=dt)[col] * np.asarray(scale, dt)[:, None]  # noqa: E731
        av = one_hot(m, 2, rng.standard_normal(k) * 3)
        atu = one_hot(n, 3, rng.standard_normal(k) * 2)
        u = one_hot(m, 2, rng.standard_normal(k))
        av[3], u[3], atu[3] = 0, 0, 0  # the beta = 0 column
        st = {key: jnp.asarray(np.abs(rng.standard_normal(k)) + 0.1, dt) for key in kernels.SCALARS}
        st["sbar"] = jnp.asarray(rng.standard_normal(k), dt)
        st["zetabar"] = jnp.asarray(rng.standard_normal(k), dt)
        st["u"], st["v"] = jnp.asarray(u), jnp.asarray(one_hot(n, 3, rng.standard_normal(k)))
        for key in ("x", "h", "hbar"):
            st[key] = jnp.asarray(rng.standard_normal((k, n)), dt)
        st["itn"] = jnp.asarray([0, 3, 5, 2], jnp.int32)
        st["istop"] = jnp.zeros(k, jnp.int32)
        st["done"] = jnp.asarray([False, False, True, False])
        cp = ColParams(
            jnp.asarray([0.0, 0.3, 0.0, 1.0], dt), jnp.full(k, 1e-6, dt), jnp.full(k, 1e-6, dt),
            jnp.full(k, 1e8, dt), jnp.asarray([10, 4, 10, 10], jnp.int32), jnp.zeros(k, dt),
        )  # fmt: skip
        normb = jnp.asarray(np.abs(rng.standard_normal(k)) + 1, dt)
        spec = _FixedProducts(jnp.asarray(av), jnp.asarray(atu))
        ref = recurrence.step(spec, [], cp, normb, dict(st), None, "step")
        carry = {
            **{key: st[key] for key in ("x", "u", "v", "h", "hbar")},
            "sc": jnp.stack([st[key] for key in kernels.SCALARS], -1),
            "ints": jnp.stack([st["itn"], st["istop"], st["done"].astype(jnp.int32)], -1),
            "neg_alpha": -st["alpha"],
        }
        params = jnp.stack([cp.damp, cp.atol, cp.btol, cp.conlim, normb], -1)
        out = step_kernels(spec, [], cp, params, carry)
        for i, key in enumerate(kernels.SCALARS):
            np.testing.assert_array_equal(np.asarray(out["sc"][:, i]), np.asarray(ref[key]), err_msg=key)
        for j, key in enumerate(("itn", "istop", "done")):
            np.testing.assert_array_equal(
                np.asarray(out["ints"][:, j]), np.asarray(ref[key]).astype(np.int32)
            )
        for key in ("x", "u", "v", "h", "hbar"):
            np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(ref[key]), err_msg=key)
        np.testing.assert_array_equal(np.asarray(out["neg_alpha"]), -np.asarray(ref["alpha"]))
        # the rows did take their paths: the iteration limit, a frozen row, beta = 0 with v kept
        assert int(ref["istop"][1]) == 7 and bool(ref["done"][2]) and float(ref["beta"][3]) == 0
        np.testing.assert_array_equal(np.asarray(out["v"][3]), np.asarray(st["v"][3]))


def test_kernel_iteration_agrees_with_step(x64):
    # Before the Lanczos vectors lose orthogonality (here: the first ~12 of 40 iterations) only the norms'
    # summation order separates the two: the same itn/istop, x to 1e-10 (float64).
    a, b = _problem()
    a, b = a.astype(jnp.float64), b.astype(jnp.float64)
    out = lsmr(a, b, atol=1e-8, btol=1e-8, maxiter=10)
    with lsmr_solver.overrides(iteration="step"):
        ref = lsmr(a, b, atol=1e-8, btol=1e-8, maxiter=10)
    assert (int(out.itn), int(out.istop)) == (int(ref.itn), int(ref.istop))
    np.testing.assert_allclose(
        np.asarray(out.x), np.asarray(ref.x), rtol=0, atol=1e-10 * float(jnp.abs(ref.x).max())
    )
    for f in ("normr", "normar", "norma", "conda", "normx"):
        np.testing.assert_allclose(float(getattr(out, f)), float(getattr(ref, f)), rtol=1e-9, err_msg=f)


def test_compiler_options_only_at_top_level():
    # On the CPU the options are never attached; under a caller's jit they cannot be (JAX rejects compiler
    # options on a nested jit), so lsmr must not try.
    a, b = _problem()
    with lsmr_solver.overrides(compiler_options=lsmr_solver.COMMAND_BUFFER_OPTIONS["while"]):
        ref = lsmr(a, b)
        out = jax.jit(lambda a_, b_: lsmr(a_, b_))(a, b)
    assert int(out.itn) == int(ref.itn)


def test_while_body_counts_sees_the_loop():
    a, b = _problem()
    counts = {}
    for iteration in ("kernels", "step"):
        with lsmr_solver.overrides(iteration=iteration):
            text = jax.jit(lambda a_, b_: lsmr(a_, b_, unroll=2)).lower(a, b).compile().as_text()
        counts[iteration] = c = while_body_counts(text)
        assert c["launches"] > 0 and c["fusions"] > 0
        assert c["condition_ops"]
    # The fused iteration's trip: our four kernels per iteration and hardly any XLA work (on the CPU: 20 launches
    # against 121 for "step", whose scalar recurrence is XLA's).
    per_iteration = {"jax_ops_lsmr_partial_norms": 2, "jax_ops_lsmr_normalize": 1, "jax_ops_lsmr_iteration_step": 1,
                     "jax_ops_lsmr_scalars": 1}  # fmt: skip
    assert counts["kernels"]["custom_call_targets"] == {t: 2 * c for t, c in per_iteration.items()}
    assert counts["kernels"]["launches"] * 4 < counts["step"]["launches"]
