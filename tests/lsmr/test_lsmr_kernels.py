"""The fused LSMR recurrences (vertical slice) on the CPU twin, against a float64 NumPy reference."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops import lsmr_kernels

TOL = {np.float32: 2e-6, np.float64: 1e-14}


def _ref_hbar_x(h, hbar, x, c_h, c_x):
    h, hbar, x = (np.asarray(a, np.float64) for a in (h, hbar, x))
    c_h = np.asarray(c_h, np.float64)[..., None]
    c_x = np.asarray(c_x, np.float64)[..., None]
    hbar_new = h - c_h * hbar
    return hbar_new, x + c_x * hbar_new


def _assert_close(out, ref, dtype):
    out = np.asarray(out)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == ref.shape
    assert np.all(np.isfinite(out))
    err = np.linalg.norm(out.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-300)
    assert err <= TOL[dtype], err


def _inputs(rng, shape, dtype, n_vectors):
    return [jnp.asarray(rng.standard_normal(shape).astype(dtype)) for _ in range(n_vectors)]


@pytest.mark.parametrize("n", [0, 1, 7, 1_000_003])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_hbar_x_update_matches_reference(n, dtype, x64):
    rng = np.random.default_rng(n)
    h, hbar, x = _inputs(rng, (n,), dtype, 3)
    c_h, c_x = (jnp.asarray(rng.standard_normal(), dtype) for _ in range(2))
    hbar_new, x_new = jax.jit(lsmr_kernels.hbar_x_update)(h, hbar, x, c_h, c_x)
    ref_hbar, ref_x = _ref_hbar_x(h, hbar, x, c_h, c_x)
    _assert_close(hbar_new, ref_hbar, dtype)
    _assert_close(x_new, ref_x, dtype)


@pytest.mark.parametrize("n", [0, 1, 7, 1_000_003])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_h_update_matches_reference(n, dtype, x64):
    rng = np.random.default_rng(n + 1)
    v, h = _inputs(rng, (n,), dtype, 2)
    c_v = jnp.asarray(rng.standard_normal(), dtype)
    out = jax.jit(lsmr_kernels.h_update)(v, h, c_v)
    ref = np.asarray(v, np.float64) - float(c_v) * np.asarray(h, np.float64)
    _assert_close(out, ref, dtype)


def _step_inputs(rng, shape, dtype):
    vb, v, h, hbar, x = _inputs(rng, shape, dtype, 5)
    lead = shape[:-1]
    s_v, c_h, c_x, c_v = (jnp.asarray(rng.standard_normal(lead).astype(dtype)) for _ in range(4))
    keep_v = jnp.asarray((np.arange(int(np.prod(lead))).reshape(lead) % 2).astype(dtype))  # both cases
    return vb, v, h, hbar, x, s_v, keep_v, c_h, c_x, c_v


def _ref_step(vb, v, h, hbar, x, s_v, keep_v, c_h, c_x, c_v):
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    v_new = np.where(f64(keep_v)[..., None] != 0, f64(v), f64(vb) * f64(s_v)[..., None])
    hbar_new, x_new = _ref_hbar_x(h, hbar, x, c_h, c_x)
    h_new = v_new - f64(c_v)[..., None] * f64(h)
    return v_new, h_new, hbar_new, x_new, np.sum(x_new * x_new, axis=-1)


@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (1_000_003,), (4, 101), (2, 3, 5000)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_step_update_matches_reference_and_the_separate_steps(shape, dtype, x64):
    rng = np.random.default_rng(shape[-1] + 2)
    args = _step_inputs(rng, shape, dtype)
    v_new, h_new, hbar_new, x_new, partials = jax.jit(lsmr_kernels.step_update)(*args)
    ref = _ref_step(*args)
    for out, r in zip((v_new, h_new, hbar_new, x_new), ref):
        _assert_close(out, r, dtype)
    assert partials.shape == (*shape[:-1], lsmr_kernels.norm_partials(shape[-1], dtype))
    squares = np.sum(np.asarray(partials, np.float64) ** 2, axis=-1)  # ||x'||^2 from the partial norms
    np.testing.assert_allclose(squares, ref[4], rtol=10 * TOL[dtype], atol=1e-300)
    # The "unfused" iteration: XLA's v update, then the two kernels. Bitwise the same.
    vb, v, h, hbar, x, s_v, keep_v, c_h, c_x, c_v = args
    v_xla = jax.jit(lambda: jnp.where(keep_v[..., None] != 0, v, vb * s_v[..., None]))()
    two_hbar, two_x = jax.jit(lsmr_kernels.hbar_x_update)(h, hbar, x, c_h, c_x)
    two_h = jax.jit(lsmr_kernels.h_update)(v_xla, h, c_v)
    for one, two in ((v_new, v_xla), (h_new, two_h), (hbar_new, two_hbar), (x_new, two_x)):
        np.testing.assert_array_equal(np.asarray(one), np.asarray(two))


def test_step_update_partial_norms_do_not_overflow_float32(x64):
    # ||x||^2 of float32 x = 1e20 overflows float32; the partial norms stay finite, as lsmr's float64 sum needs.
    n = 3000
    big = jnp.full((n,), 1e20, jnp.float32)
    zeros = jnp.zeros((n,), jnp.float32)
    out = lsmr_kernels.step_update(zeros, zeros, zeros, zeros, big, 1.0, 0.0, 0.0, 0.0, 0.0)
    parts = np.asarray(out[4], np.float64)
    assert np.all(np.isfinite(parts))
    np.testing.assert_allclose(np.sqrt(np.sum(parts**2)), 1e20 * np.sqrt(n), rtol=1e-6)


def test_step_update_in_place_vmap_xla_and_errors():
    rng = np.random.default_rng(11)
    args = _step_inputs(rng, (4, 37), np.float32)
    f = jax.jit(lsmr_kernels.step_update, donate_argnums=(1, 2, 3, 4))
    hlo = f.lower(*args).as_text()
    aliases = re.findall(r"output_operand_alias<output_tuple_indices = \[(\d)\], operand_index = (\d)", hlo)
    assert sorted(aliases) == [("0", "1"), ("1", "2"), ("2", "3"), ("3", "4")]
    ref = _ref_step(*args)
    xla = lsmr_kernels.step_update(*args, implementation="xla")
    vm = jax.vmap(lsmr_kernels.step_update)(*args)
    out = f(*args)
    assert all(a.is_deleted() for a in args[1:5])
    for res in (xla, vm, out):
        for o, r in zip(res[:4], ref[:4]):
            _assert_close(o, r, np.float32)
        np.testing.assert_allclose(np.sum(np.asarray(res[4], np.float64) ** 2, -1), ref[4], rtol=1e-5)
    f32 = jnp.ones(4, jnp.float32)
    with pytest.raises(ValueError, match="x has shape"):
        lsmr_kernels.step_update(f32, f32, f32, f32, jnp.ones(5, jnp.float32), 1.0, 0.0, 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="keep_v must be a scalar"):
        lsmr_kernels.step_update(f32, f32, f32, f32, f32, 1.0, jnp.ones(2, jnp.float32), 1.0, 1.0, 1.0)
    # The native handler checks the partials' shape (Python sizes them).
    from jax_ops import _ffi

    bad = jax.ShapeDtypeStruct((3,), jnp.float32)
    with pytest.raises(Exception, match="partials must be float32 with shape"):
        jax.jit(
            lambda: _ffi.ffi_call(
                "jax_ops_lsmr_step", (bad, bad, bad, bad, jax.ShapeDtypeStruct((2,), jnp.float32)),
                *([jnp.ones(3, jnp.float32)] * 5), *([jnp.float32(1.0)] * 5),
            )
        )()  # fmt: skip


def test_python_scalar_coefficients_and_xla_path_agree():
    rng = np.random.default_rng(0)
    h, hbar, x = _inputs(rng, (33,), np.float32, 3)
    ffi = lsmr_kernels.hbar_x_update(h, hbar, x, 0.25, -3.0)
    xla = lsmr_kernels.hbar_x_update(h, hbar, x, 0.25, -3.0, implementation="xla")
    for a, b in zip(ffi, xla):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_results_alias_inputs_in_place():
    rng = np.random.default_rng(1)
    h, hbar, x = _inputs(rng, (1001,), np.float32, 3)
    ref_hbar, ref_x = _ref_hbar_x(h, hbar, x, 0.5, 2.0)
    f = jax.jit(lambda h, hbar, x: lsmr_kernels.hbar_x_update(h, hbar, x, 0.5, 2.0), donate_argnums=(1, 2))
    hlo = f.lower(h, hbar, x).as_text()
    aliases = re.findall(r"output_operand_alias<output_tuple_indices = \[(\d)\], operand_index = (\d)", hlo)
    assert sorted(aliases) == [("0", "1"), ("1", "2")]
    hbar_new, x_new = f(h, hbar, x)
    assert hbar.is_deleted() and x.is_deleted()  # donated buffers were consumed by the in-place update
    _assert_close(hbar_new, ref_hbar, np.float32)
    _assert_close(x_new, ref_x, np.float32)
    v = jnp.ones(5, jnp.float32)
    hlo_h = jax.jit(lambda v, h: lsmr_kernels.h_update(v, h, 1.0)).lower(v, v).as_text()
    assert "output_operand_alias<output_tuple_indices = [], operand_index = 1" in hlo_h


def test_vmap_gives_per_row_coefficients():
    rng = np.random.default_rng(2)
    h, hbar, x = _inputs(rng, (5, 37), np.float32, 3)
    c_h, c_x = (jnp.asarray(rng.standard_normal(5).astype(np.float32)) for _ in range(2))
    out = jax.vmap(lsmr_kernels.hbar_x_update)(h, hbar, x, c_h, c_x)
    ref = _ref_hbar_x(h, hbar, x, c_h, c_x)
    for o, r in zip(out, ref):
        _assert_close(o, r, np.float32)
    # Only the coefficient batched: the vectors are broadcast.
    out = jax.vmap(lambda c: lsmr_kernels.h_update(h[0], hbar[0], c))(c_h)
    ref = (
        np.asarray(h[0], np.float64)[None] - np.asarray(c_h, np.float64)[:, None] * np.asarray(hbar[0])[None]
    )
    _assert_close(out, ref, np.float32)


def test_batched_rows_without_vmap():
    rng = np.random.default_rng(3)
    v, h = _inputs(rng, (2, 3, 11), np.float32, 2)
    c = jnp.asarray(rng.standard_normal((2, 3)).astype(np.float32))
    out = lsmr_kernels.h_update(v, h, c)
    ref = np.asarray(v, np.float64) - np.asarray(c, np.float64)[..., None] * np.asarray(h, np.float64)
    _assert_close(out, ref, np.float32)


def test_inside_while_loop_with_device_coefficients(x64):
    rng = np.random.default_rng(4)
    h, hbar, x = _inputs(rng, (101,), np.float64, 3)

    def body(state):
        i, hbar, x = state
        c_h = jnp.sin(i.astype(jnp.float64))  # computed on device inside the loop
        c_x = 1.0 / (1.0 + i.astype(jnp.float64))
        hbar, x = lsmr_kernels.hbar_x_update(h, hbar, x, c_h, c_x)
        return i + 1, hbar, x

    _, hbar_k, x_k = jax.jit(lambda hbar, x: jax.lax.while_loop(lambda s: s[0] < 6, body, (0, hbar, x)))(
        hbar, x
    )
    ref_hbar, ref_x = np.asarray(hbar, np.float64), np.asarray(x, np.float64)
    for i in range(6):
        ref_hbar, ref_x = _ref_hbar_x(h, ref_hbar, ref_x, np.sin(i), 1.0 / (1.0 + i))
    _assert_close(hbar_k, ref_hbar, np.float64)
    _assert_close(x_k, ref_x, np.float64)


def test_shard_map_on_8_devices():
    devices = jax.devices("cpu")
    assert len(devices) == 8, "tests/conftest.py sets 8 fake CPU devices"
    mesh = Mesh(np.array(devices), ("d",))
    rng = np.random.default_rng(5)
    h, hbar, x = _inputs(rng, (8 * 1003,), np.float32, 3)
    c_h, c_x = jnp.float32(0.75), jnp.float32(-0.5)
    spec = P("d")
    f = jax.jit(
        jax.shard_map(
            lsmr_kernels.hbar_x_update,
            mesh=mesh,
            in_specs=(spec, spec, spec, P(), P()),
            out_specs=(spec, spec),
        )
    )
    args = [jax.device_put(a, NamedSharding(mesh, spec)) for a in (h, hbar, x)]
    hbar_new, x_new = f(*args, c_h, c_x)
    assert hbar_new.sharding.spec == spec
    ref = _ref_hbar_x(h, hbar, x, c_h, c_x)
    _assert_close(hbar_new, ref[0], np.float32)
    _assert_close(x_new, ref[1], np.float32)


# ------------------------------------------------------------------------------------------ bad input
def test_bad_input_raises_before_any_kernel():
    f32 = jnp.ones(4, jnp.float32)
    with pytest.raises(ValueError, match="rank >= 1"):
        lsmr_kernels.h_update(jnp.float32(1.0), jnp.float32(1.0), 1.0)
    with pytest.raises(TypeError, match="h must have dtype"):
        lsmr_kernels.h_update(f32, jnp.ones(4, jnp.int32), 1.0)
    with pytest.raises(TypeError, match="v must have dtype"):
        lsmr_kernels.h_update(jnp.ones(4, jnp.bfloat16), jnp.ones(4, jnp.bfloat16), 1.0)
    with pytest.raises(ValueError, match="hbar has shape"):
        lsmr_kernels.hbar_x_update(f32, jnp.ones(5, jnp.float32), f32, 1.0, 1.0)
    with pytest.raises(TypeError, match="c_x must have the vectors' dtype"):
        with jax.enable_x64(True):
            lsmr_kernels.hbar_x_update(f32, f32, f32, 1.0, jnp.float64(1.0))
    with pytest.raises(ValueError, match="c_h must be a scalar"):
        lsmr_kernels.hbar_x_update(f32, f32, f32, jnp.ones(3, jnp.float32), 1.0)
    with pytest.raises(TypeError, match="x must be an array"):
        lsmr_kernels.hbar_x_update(f32, f32, [1.0, 2.0, 3.0, 4.0], 1.0, 1.0)
    with pytest.raises(ValueError, match="implementation must be one of"):
        lsmr_kernels.h_update(f32, f32, 1.0, implementation="cuda")


def test_native_handler_revalidates_shapes():
    # Bypass the Python checks: the C++ handler must refuse, not read out of bounds.
    from jax_ops import _ffi

    out = jax.ShapeDtypeStruct((4,), jnp.float32)
    with pytest.raises(Exception, match="h has shape"):
        jax.jit(
            lambda: _ffi.ffi_call(
                "jax_ops_lsmr_h", out, jnp.ones(4, jnp.float32), jnp.ones(3, jnp.float32), jnp.float32(1.0)
            )
        )()
    with pytest.raises(Exception, match="c_v must be float32 with shape"):
        jax.jit(
            lambda: _ffi.ffi_call(
                "jax_ops_lsmr_h",
                out,
                jnp.ones(4, jnp.float32),
                jnp.ones(4, jnp.float32),
                jnp.ones(2, jnp.float32),
            )
        )()


# ---- The fused iteration's kernels (lsmr_solver._step_kernels; whole-iteration tests in test_lsmr_loop.py).


@pytest.mark.parametrize("shape", [(0,), (1,), (4097,), (3, 10_001), (2, 1, 5)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_partial_norms_and_normalize(shape, dtype, x64):
    rng = np.random.default_rng(3)
    ub = rng.standard_normal(shape).astype(dtype) * np.exp(rng.standard_normal(shape)).astype(dtype)
    if len(shape) > 1:
        ub[0] = 0  # a row with beta = 0: u stays ub, beta 0
    parts = lsmr_kernels.partial_norms(jnp.asarray(ub))
    assert (
        parts.shape == (*shape[:-1], lsmr_kernels.norm_partials(shape[-1], dtype, 4)) and parts.dtype == dtype
    )
    exact = np.linalg.norm(ub.astype(np.float64), axis=-1)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(parts, np.float64), axis=-1), exact, rtol=TOL[dtype])
    u, beta, vb_coef = jax.jit(lsmr_kernels.normalize)(jnp.asarray(ub), parts)
    assert beta.shape == shape[:-1] and u.shape == shape
    np.testing.assert_allclose(np.asarray(beta, np.float64), exact, rtol=TOL[dtype])
    np.testing.assert_array_equal(np.asarray(vb_coef), np.where(np.asarray(beta) > 0, -np.asarray(beta), 1))
    # u = ub * (1/beta) with 1/beta rounded to the dtype (SciPy's u *= 1/beta), ub itself where beta = 0.
    b = np.asarray(beta)[..., None]
    with np.errstate(divide="ignore"):
        scale = np.where(b > 0, (dtype(1) / np.where(b > 0, b, 1)).astype(dtype), dtype(1))
    np.testing.assert_array_equal(np.asarray(u), (ub * scale).astype(dtype))


def test_fused_iteration_kernels_validate_their_arguments():
    f32 = jnp.ones((2, 5), jnp.float32)
    parts = lsmr_kernels.partial_norms(f32)
    sc = jnp.ones((2, lsmr_kernels.NUM_SCALARS), jnp.float32)
    ints = jnp.zeros((2, lsmr_kernels.NUM_INTS), jnp.int32)
    params = jnp.ones((2, lsmr_kernels.NUM_PARAMS), jnp.float32)
    beta = jnp.ones(2, jnp.float32)
    x_parts = jnp.ones((2, 1), jnp.float32)
    with pytest.raises(Exception, match=r"ub_partials must be float32 with shape \[2, 1\]"):
        jax.jit(lsmr_kernels.normalize)(f32, jnp.ones((2, 3), jnp.float32))
    with pytest.raises(Exception, match=r"sc must be float32 with shape \[2, 23\]"):
        jax.jit(lsmr_kernels.iteration_step)(f32, f32, f32, f32, parts, sc[:, :5], ints, beta, params)
    with pytest.raises(Exception, match=r"ints must be int32 with shape \[2, 3\]"):
        jax.jit(lsmr_kernels.iteration_step)(f32, f32, f32, f32, parts, sc, ints[:1], beta, params)
    maxiter = jnp.full(2, 10, jnp.int32)
    with pytest.raises(Exception, match=r"maxiter must be int32 with shape \[2\]"):
        jax.jit(lsmr_kernels.iteration_scalars)(sc, ints, -beta, beta, params, maxiter[:1], parts, x_parts)
    # The scalars kernel works in place: a call without the aliases is refused, not silently wrong.
    from jax_ops import _ffi

    outs = (jax.ShapeDtypeStruct(sc.shape, sc.dtype), jax.ShapeDtypeStruct(ints.shape, ints.dtype),
            jax.ShapeDtypeStruct(beta.shape, beta.dtype))  # fmt: skip
    with pytest.raises(Exception, match="in place"):
        jax.jit(lambda: _ffi.ffi_call(
            "jax_ops_lsmr_scalars", outs, sc, ints, -beta, beta, params, maxiter, parts, x_parts))()  # fmt: skip
    sc2, ints2, neg_alpha = jax.jit(lsmr_kernels.iteration_scalars)(
        sc, ints, -beta, beta, params, maxiter, parts, x_parts
    )
    assert np.all(np.asarray(ints2)[:, 0] == 1) and np.all(np.isfinite(np.asarray(sc2)))
    np.testing.assert_array_equal(np.asarray(neg_alpha), -np.asarray(sc2)[:, 0])


@pytest.mark.parametrize("shape", [(0, 3), (1, 1), (5000, 3), (20_001, 16), (3, 300)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_column_layout_matches_row_layout(shape, dtype, x64):
    # A block solve's column layout [n, k] (columns=True) against the row layout on the transposed block: the same
    # norms, u, beta, and the same update (its coefficients derived from the same state); partial norms per column.
    rng = np.random.default_rng(sum(shape))
    n, k = shape
    ub, vb, h, hbar, x = (rng.standard_normal(shape).astype(dtype) for _ in range(5))
    sc = jnp.asarray((np.abs(rng.standard_normal((k, lsmr_kernels.NUM_SCALARS))) + 0.5).astype(dtype))
    ints = jnp.asarray(np.tile(np.asarray([3, 0, 0], np.int32), (k, 1)))
    params = jnp.asarray(np.tile(np.asarray([0.1, 1e-6, 1e-6, 1e8, 2.0], dtype), (k, 1)))

    def run(columns, ub, vb, h, hbar, x):
        u, beta, vb_coef = lsmr_kernels.normalize(
            ub, lsmr_kernels.partial_norms(ub, columns=columns), columns=columns
        )
        vb_parts = lsmr_kernels.partial_norms(vb, columns=columns)
        out = lsmr_kernels.iteration_step(vb, h, hbar, x, vb_parts, sc, ints, beta, params, columns=columns)
        return u, beta, vb_coef, vb_parts, *out

    cols = jax.jit(functools.partial(run, True))(ub, vb, h, hbar, x)
    rows = jax.jit(functools.partial(run, False))(ub.T, vb.T, h.T, hbar.T, x.T)
    assert cols[3].shape == (k, lsmr_kernels.columns_partials(n, k))
    assert cols[8].shape == (k, lsmr_kernels.columns_partials(n, k))
    for i in (0, 4, 5, 6, 7):  # u, v, h, hbar, x
        _assert_close(np.asarray(cols[i]).T, np.asarray(rows[i], np.float64), dtype)
    for i in (1, 2):  # beta, vb_coef
        np.testing.assert_allclose(np.asarray(cols[i]), np.asarray(rows[i]), rtol=TOL[dtype])
    for i in (3, 8):  # partial norms: the same column norms
        np.testing.assert_allclose(
            np.linalg.norm(np.asarray(cols[i], np.float64), axis=-1),
            np.linalg.norm(np.asarray(rows[i], np.float64), axis=-1),
            rtol=TOL[dtype],
        )
    with pytest.raises(ValueError, match=r"column layout takes \[..., n, k\]"):
        lsmr_kernels.partial_norms(jnp.ones((4,), dtype), columns=True)
