"""LSMR loop structure: the packed scalar carry and the unroll give bit-identical results; HLO kernel counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_ops
from jax_ops import lsmr_solver
from jax_ops.bench.hlo_count import while_body_counts


def _problem(m=300, n=40, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) * np.logspace(0, 2, n)
    b = rng.standard_normal(m)
    return jnp.asarray(a), jnp.asarray(b)


@pytest.mark.parametrize("unroll", [1, 3])
def test_packed_carry_is_bit_identical(monkeypatch, unroll):
    a, b = _problem()
    ref = jax_ops.lsmr(a, b, atol=1e-10, btol=1e-10, unroll=1)
    monkeypatch.setitem(lsmr_solver._TUNING, "pack_scalars", False)
    out = jax_ops.lsmr(a, b, atol=1e-10, btol=1e-10, unroll=unroll)
    assert int(out.itn) == int(ref.itn) and int(out.istop) == int(ref.istop)
    for f in ("x", "normr", "normar", "norma", "conda", "normx"):
        np.testing.assert_array_equal(np.asarray(getattr(out, f)), np.asarray(getattr(ref, f)))


def test_fused_step_is_bit_identical(monkeypatch):
    # The fused step kernel vs XLA's v update + the two kernels + XLA's ||x||: the iterates are bitwise the
    # same (only normx's summation order differs).
    from jax.experimental import sparse

    a, b = _problem()
    for operand in (a, sparse.BCOO.fromdense(a)):
        ref = jax_ops.lsmr(operand, b, atol=1e-10, btol=1e-10)
        monkeypatch.setitem(lsmr_solver._TUNING, "fused_step", False)
        out = jax_ops.lsmr(operand, b, atol=1e-10, btol=1e-10)
        monkeypatch.setitem(lsmr_solver._TUNING, "fused_step", True)
        assert int(out.itn) == int(ref.itn) and int(out.istop) == int(ref.istop)
        for f in ("x", "normr", "normar", "norma", "conda"):
            np.testing.assert_array_equal(np.asarray(getattr(out, f)), np.asarray(getattr(ref, f)))
        np.testing.assert_allclose(np.asarray(out.normx), np.asarray(ref.normx), rtol=1e-6)  # float32


def test_compiler_options_only_at_top_level(monkeypatch):
    # On the CPU the options are never attached; under a caller's jit they cannot be (JAX rejects compiler
    # options on a nested jit), so lsmr must not try.
    monkeypatch.setitem(lsmr_solver._TUNING, "compiler_options", lsmr_solver.COMMAND_BUFFER_OPTIONS["while"])
    a, b = _problem()
    ref = jax_ops.lsmr(a, b)
    out = jax.jit(lambda a_, b_: jax_ops.lsmr(a_, b_))(a, b)
    assert int(out.itn) == int(ref.itn)


def test_while_body_counts_sees_the_loop():
    a, b = _problem()
    text = jax.jit(lambda a_, b_: jax_ops.lsmr(a_, b_, unroll=2)).lower(a, b).compile().as_text()
    c = while_body_counts(text)
    assert c["launches"] > 0 and c["fusions"] > 0
    assert c["condition_ops"]
