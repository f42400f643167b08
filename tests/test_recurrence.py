"""The fused LSMR recurrences (vertical slice) on the CPU twin, against a float64 NumPy reference."""

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


@pytest.mark.parametrize("shape", [(0,), (1,), (7,), (1_000_003,), (3, 101)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_h_hbar_x_update_matches_reference_and_the_two_halves(shape, dtype, x64):
    rng = np.random.default_rng(shape[-1] + 2)
    v, h, hbar, x = _inputs(rng, shape, dtype, 4)
    c_h, c_x, c_v = (jnp.asarray(rng.standard_normal(shape[:-1]).astype(dtype)) for _ in range(3))
    h_new, hbar_new, x_new = jax.jit(lsmr_kernels.h_hbar_x_update)(v, h, hbar, x, c_h, c_x, c_v)
    ref_hbar, ref_x = _ref_hbar_x(h, hbar, x, c_h, c_x)
    ref_h = np.asarray(v, np.float64) - np.asarray(c_v, np.float64)[..., None] * np.asarray(h, np.float64)
    _assert_close(h_new, ref_h, dtype)
    _assert_close(hbar_new, ref_hbar, dtype)
    _assert_close(x_new, ref_x, dtype)
    # The solver's update replaced the two halves: same expressions, so bitwise the same.
    two_hbar, two_x = jax.jit(lsmr_kernels.hbar_x_update)(h, hbar, x, c_h, c_x)
    two_h = jax.jit(lsmr_kernels.h_update)(v, h, c_v)
    for one, two in ((h_new, two_h), (hbar_new, two_hbar), (x_new, two_x)):
        np.testing.assert_array_equal(np.asarray(one), np.asarray(two))


def test_h_hbar_x_update_in_place_vmap_and_errors():
    rng = np.random.default_rng(11)
    v, h, hbar, x = _inputs(rng, (4, 37), np.float32, 4)
    c = [jnp.asarray(rng.standard_normal(4).astype(np.float32)) for _ in range(3)]
    f = jax.jit(lsmr_kernels.h_hbar_x_update, donate_argnums=(1, 2, 3))
    hlo = f.lower(v, h, hbar, x, *c).as_text()
    aliases = re.findall(r"output_operand_alias<output_tuple_indices = \[(\d)\], operand_index = (\d)", hlo)
    assert sorted(aliases) == [("0", "1"), ("1", "2"), ("2", "3")]
    ref = lsmr_kernels.h_hbar_x_update(v, h, hbar, x, *c, implementation="xla")
    ref = [np.asarray(r, np.float64) for r in ref]
    out = jax.vmap(lsmr_kernels.h_hbar_x_update)(v, h, hbar, x, *c)
    for o, r in zip(out, ref):
        _assert_close(o, r, np.float32)
    out = f(v, h, hbar, x, *c)
    assert h.is_deleted() and hbar.is_deleted() and x.is_deleted()
    for o, r in zip(out, ref):
        _assert_close(o, r, np.float32)
    f32 = jnp.ones(4, jnp.float32)
    with pytest.raises(ValueError, match="x has shape"):
        lsmr_kernels.h_hbar_x_update(f32, f32, f32, jnp.ones(5, jnp.float32), 1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="c_v must be a scalar"):
        lsmr_kernels.h_hbar_x_update(f32, f32, f32, f32, 1.0, 1.0, jnp.ones(2, jnp.float32))


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
