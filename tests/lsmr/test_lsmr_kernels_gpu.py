"""The fused LSMR recurrences on the GPU: CUDA vs the CPU twin vs a float64 reference.

Tests whose name contains `small` are the quick cases.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err

from jax_ops import lsmr_kernels

pytestmark = pytest.mark.gpu
TOL = {np.float32: 2e-6, np.float64: 1e-14}


def _gpu():
    return jax.devices("cuda")[0]


def _run_both(fn, *args):
    cpu = jax.devices("cpu")[0]
    on_gpu = jax.jit(fn)(*(jax.device_put(a, _gpu()) for a in args))
    on_cpu = jax.jit(fn)(*(jax.device_put(a, cpu) for a in args))
    return on_gpu, on_cpu


# Shapes with ragged tails and rows whose start is not 16-byte aligned (odd n with several rows).
SMALL_SHAPES = [(1,), (3,), (17,), (1000,), (3, 1001), (4, 5), (2, 3, 65)]


@pytest.mark.parametrize("shape", SMALL_SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_hbar_x_cuda_matches_cpu_twin_and_reference(shape, dtype, x64):
    rng = np.random.default_rng(sum(shape))
    h, hbar, x = (rng.standard_normal(shape).astype(dtype) for _ in range(3))
    # h - hbar differs from hbar everywhere, so an element the kernel skipped would keep a wrong value.
    h = hbar + 1.0 + np.abs(h)
    c_h = np.asarray(rng.standard_normal(shape[:-1]) + 1.0, dtype)
    c_x = np.asarray(rng.standard_normal(shape[:-1]), dtype)
    (g_hbar, g_x), (c_hbar, c_x_out) = _run_both(lsmr_kernels.hbar_x_update, h, hbar, x, c_h, c_x)
    ref_hbar = h.astype(np.float64) - c_h.astype(np.float64)[..., None] * hbar
    ref_x = x.astype(np.float64) + c_x.astype(np.float64)[..., None] * ref_hbar
    assert rel_err(g_hbar, ref_hbar) <= TOL[dtype]
    assert rel_err(g_x, ref_x) <= TOL[dtype]
    # CUDA vs the CPU twin: same formula; fma contraction may differ, so compare as a whole, not per element.
    assert rel_err(g_hbar, np.asarray(c_hbar, np.float64)) <= 2 * TOL[dtype]
    assert rel_err(g_x, np.asarray(c_x_out, np.float64)) <= 2 * TOL[dtype]


@pytest.mark.parametrize("shape", SMALL_SHAPES)
def test_small_h_update_cuda(shape):
    rng = np.random.default_rng(7)
    v, h = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    c = np.asarray(rng.standard_normal(shape[:-1]) + 2.0, np.float32)
    g, c_out = _run_both(lsmr_kernels.h_update, v, h, c)
    ref = v.astype(np.float64) - c.astype(np.float64)[..., None] * h
    assert rel_err(g, ref) <= TOL[np.float32]
    assert rel_err(c_out, ref) <= TOL[np.float32]


@pytest.mark.parametrize("shape", SMALL_SHAPES + [(2, 100_003)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_step_update_cuda_matches_cpu_twin_and_reference(shape, dtype, x64):
    rng = np.random.default_rng(sum(shape) + 5)
    vb, v, h, hbar, x = (rng.standard_normal(shape).astype(dtype) for _ in range(5))
    h = hbar + 1.0 + np.abs(h)  # every result differs from every input, so a skipped element shows
    lead = shape[:-1]
    s_v, c_h, c_x, c_v = (np.asarray(rng.standard_normal(lead) + 1.0, dtype) for _ in range(4))
    keep_v = (np.arange(int(np.prod(lead))).reshape(lead) % 2).astype(dtype)  # rows keep v or take vb * s_v
    args = (vb, v, h, hbar, x, s_v, keep_v, c_h, c_x, c_v)
    g, c = _run_both(lsmr_kernels.step_update, *args)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    ref_v = np.where(f64(keep_v)[..., None] != 0, f64(v), f64(vb) * f64(s_v)[..., None])
    ref_hbar = f64(h) - f64(c_h)[..., None] * f64(hbar)
    ref_x = f64(x) + f64(c_x)[..., None] * ref_hbar
    ref_h = ref_v - f64(c_v)[..., None] * f64(h)
    for out_g, out_c, ref in zip(g[:4], c[:4], (ref_v, ref_h, ref_hbar, ref_x)):
        assert rel_err(out_g, ref) <= TOL[dtype]
        assert rel_err(out_g, f64(out_c)) <= 2 * TOL[dtype]
    assert g[4].shape == c[4].shape == (*lead, lsmr_kernels.norm_partials(shape[-1], dtype))
    squares = np.sum(ref_x * ref_x, axis=-1)
    np.testing.assert_allclose(np.sum(f64(g[4]) ** 2, -1), squares, rtol=10 * TOL[dtype])  # partial norms
    np.testing.assert_allclose(np.sum(f64(c[4]) ** 2, -1), squares, rtol=10 * TOL[dtype])
    # bitwise the "unfused" iteration on the GPU: XLA's v update, then the two kernels
    with jax.default_device(_gpu()):
        v_xla = jax.jit(lambda vb, v, s, k: jnp.where(k[..., None] != 0, v, vb * s[..., None]))(
            vb, v, s_v, keep_v
        )
        two_hbar, two_x = jax.jit(lsmr_kernels.hbar_x_update)(h, hbar, x, c_h, c_x)
        two_h = jax.jit(lsmr_kernels.h_update)(v_xla, h, c_v)
    for one, two in zip(g[:4], (v_xla, two_h, two_hbar, two_x)):
        np.testing.assert_array_equal(np.asarray(one), np.asarray(two))


def test_small_in_place_with_donation_on_gpu():
    rng = np.random.default_rng(8)
    h, hbar, x = (jax.device_put(rng.standard_normal(4099).astype(np.float32), _gpu()) for _ in range(3))
    ref_hbar = np.asarray(h, np.float64) - 0.5 * np.asarray(hbar, np.float64)
    ref_x = np.asarray(x, np.float64) + 2.0 * ref_hbar
    f = jax.jit(lambda h, hbar, x: lsmr_kernels.hbar_x_update(h, hbar, x, 0.5, 2.0), donate_argnums=(1, 2))
    hbar_new, x_new = f(h, hbar, x)
    assert hbar.is_deleted() and x.is_deleted()
    assert rel_err(hbar_new, ref_hbar) <= TOL[np.float32]
    assert rel_err(x_new, ref_x) <= TOL[np.float32]


def test_small_vmap_and_while_loop_on_gpu():
    rng = np.random.default_rng(9)
    with jax.default_device(_gpu()):
        h, hbar, x = (jnp.asarray(rng.standard_normal((6, 333)).astype(np.float32)) for _ in range(3))

        def body(s):
            i, hbar, x = s
            c = jnp.full((6,), 0.1, jnp.float32) * i.astype(jnp.float32)
            hbar, x = jax.vmap(lsmr_kernels.hbar_x_update)(h, hbar, x, c, c + 1.0)
            return i + 1, hbar, x

        _, hb, xx = jax.jit(lambda hbar, x: jax.lax.while_loop(lambda s: s[0] < 4, body, (0, hbar, x)))(
            hbar, x
        )
    rh, rx = np.asarray(hbar, np.float64), np.asarray(x, np.float64)
    for i in range(4):
        rh = np.asarray(h, np.float64) - 0.1 * i * rh
        rx = rx + (0.1 * i + 1.0) * rh
    assert rel_err(hb, rh) <= 1e-5
    assert rel_err(xx, rx) <= 1e-5


@pytest.mark.parametrize("n", [10**8 + 3])
def test_largest_claimed_size(n):
    # 1e8+3 float32 elements per vector (400 MB each, 2 GB moved): the benchmark's largest size.
    with jax.default_device(_gpu()):
        k = jax.random.split(jax.random.key(0), 3)
        h, hbar, x = (jax.random.normal(kk, (n,), jnp.float32) for kk in k)
        hbar_new, x_new = jax.jit(lsmr_kernels.hbar_x_update)(h, hbar, x, jnp.float32(0.5), jnp.float32(2.0))
        ref_hbar = h - 0.5 * hbar  # XLA's fused elementwise in float32
        ref_x = x + 2.0 * ref_hbar
        err_h = jnp.linalg.norm(hbar_new - ref_hbar) / jnp.linalg.norm(ref_hbar)
        err_x = jnp.linalg.norm(x_new - ref_x) / jnp.linalg.norm(ref_x)
        tail_ok = jnp.allclose(hbar_new[-5:], ref_hbar[-5:], rtol=1e-6)
    assert float(err_h) <= 1e-6 and float(err_x) <= 1e-6
    assert bool(tail_ok)


@pytest.mark.parametrize("shape", [(1,), (17,), (3, 1001), (2, 3, 65), (2, 1_000_003)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_fused_iteration_kernels_cuda_match_cpu_twin(shape, dtype, x64):
    # One iteration of the fused kernels (lsmr_solver._step_kernels after its products) on CUDA and on the CPU
    # twin from the same inputs. The norms' summation orders differ (tree vs compensated), so the results agree
    # to rounding; the scalar recurrence is the same code (no fma on either side). Rows: active ones and a done
    # one (frozen: its scalars and x stay).
    rng = np.random.default_rng(sum(shape) + 11)
    lead, rows = shape[:-1], int(np.prod(shape[:-1]))
    ub, vb, h, hbar, x = (rng.standard_normal(shape).astype(dtype) for _ in range(5))
    sc = (np.abs(rng.standard_normal((*lead, lsmr_kernels.NUM_SCALARS))) + 0.5).astype(dtype)
    ints = np.zeros((*lead, lsmr_kernels.NUM_INTS), np.int32)
    ints[..., 0] = 3
    ints.reshape(rows, -1)[-1, 2] = 1 if rows > 1 else 0  # the last row is done
    params = np.tile(np.asarray([0.1, 1e-6, 1e-6, 1e8, 2.0], dtype), (*lead, 1))
    maxiter = np.full(lead, 100, np.int32)

    def iteration(ub, vb, h, hbar, x, sc, ints, params, maxiter):
        u, beta, vb_coef = lsmr_kernels.normalize(ub, lsmr_kernels.partial_norms(ub))
        vb_parts = lsmr_kernels.partial_norms(vb)
        v2, h2, hbar2, x2, x_parts = lsmr_kernels.iteration_step(
            vb, h, hbar, x, vb_parts, sc, ints, beta, params
        )
        sc2, ints2, neg_alpha = lsmr_kernels.iteration_scalars(
            sc, ints, -sc[..., 0], beta, params, maxiter, vb_parts, x_parts
        )
        return u, beta, vb_coef, v2, h2, hbar2, x2, x_parts, sc2, ints2, neg_alpha

    g, c = _run_both(iteration, ub, vb, h, hbar, x, sc, ints, params, maxiter)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    exact_beta = np.linalg.norm(f64(ub), axis=-1)
    assert rel_err(g[1], exact_beta) <= TOL[dtype] and rel_err(c[1], exact_beta) <= TOL[dtype]
    np.testing.assert_array_equal(np.asarray(g[2]), -np.asarray(g[1]))  # vb_coef = -beta (beta > 0 here)
    tol = 4 * TOL[dtype]
    for i, name in enumerate(("u", "beta", "vb_coef", "v", "h", "hbar", "x")):
        assert rel_err(g[i], f64(c[i])) <= tol, name
    assert rel_err(g[0], f64(ub) / exact_beta[..., None]) <= TOL[dtype]
    np.testing.assert_allclose(
        np.linalg.norm(f64(g[7]), axis=-1), np.linalg.norm(f64(g[6]), axis=-1), rtol=tol
    )
    np.testing.assert_array_equal(np.asarray(g[9]), np.asarray(c[9]))  # itn, istop, done
    np.testing.assert_allclose(
        f64(g[8]), f64(c[8]), rtol=1e3 * TOL[dtype]
    )  # scalars: rotations of rounded norms
    np.testing.assert_array_equal(np.asarray(g[10]), -np.asarray(g[8])[..., 0])
    if rows > 1:  # the done row: scalars and x untouched
        np.testing.assert_array_equal(np.asarray(g[8]).reshape(rows, -1)[-1], sc.reshape(rows, -1)[-1])
        np.testing.assert_array_equal(np.asarray(g[6]).reshape(rows, -1)[-1], x.reshape(rows, -1)[-1])
    assert np.all(np.asarray(g[9])[..., 0].reshape(rows)[: rows - 1 if rows > 1 else rows] == 4)


@pytest.mark.parametrize("shape", [(1, 1), (5000, 3), (1_000_003, 16), (3, 300)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_column_layout_cuda_matches_cpu_twin(shape, dtype, x64):
    # The column layout [n, k] of a block solve (columns=True): CUDA vs the CPU twin, and against a float64
    # reference of the norms. Column tiles of 16 (k = 16), a ragged k = 3 (idle threads in each CTA), k > n.
    rng = np.random.default_rng(sum(shape) + 3)
    n, k = shape
    ub, vb, h, hbar, x = (rng.standard_normal(shape).astype(dtype) for _ in range(5))
    sc = (np.abs(rng.standard_normal((k, lsmr_kernels.NUM_SCALARS))) + 0.5).astype(dtype)
    ints = np.tile(np.asarray([3, 0, 0], np.int32), (k, 1))
    params = np.tile(np.asarray([0.1, 1e-6, 1e-6, 1e8, 2.0], dtype), (k, 1))

    def run(ub, vb, h, hbar, x, sc, ints, params):
        u, beta, vb_coef = lsmr_kernels.normalize(
            ub, lsmr_kernels.partial_norms(ub, columns=True), columns=True
        )
        vb_parts = lsmr_kernels.partial_norms(vb, columns=True)
        out = lsmr_kernels.iteration_step(vb, h, hbar, x, vb_parts, sc, ints, beta, params, columns=True)
        return u, beta, vb_coef, vb_parts, *out

    g, c = _run_both(run, ub, vb, h, hbar, x, sc, ints, params)
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    # float64 over 1M rows: the kernels' sums and NumPy's differ by ~1e-14 (summation order), hence 4x TOL.
    assert rel_err(g[1], np.linalg.norm(f64(ub), axis=0)) <= 4 * TOL[dtype]
    assert rel_err(np.linalg.norm(f64(g[3]), axis=-1), np.linalg.norm(f64(vb), axis=0)) <= 4 * TOL[dtype]
    assert rel_err(g[0], f64(ub) / np.linalg.norm(f64(ub), axis=0)) <= 4 * TOL[dtype]
    for i, name in enumerate(("u", "beta", "vb_coef", "vb_parts", "v", "h", "hbar", "x", "x_parts")):
        assert rel_err(g[i], f64(c[i])) <= 4 * TOL[dtype], name
