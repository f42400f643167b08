"""jax_ops.gemm / gated_linear (the CPU twin) under vmap (folded into one kernel call), grad of vmap and vmap of
grad, and sharding on the 8 fake CPU devices of tests/conftest.py: jit with NamedSharding (batch, M and N) and
shard_map."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_cases import F32, INT8, gated_oracle, operand, oracle, rngs, uniform
from helpers import rel_err
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_ops
from jax_ops import _checks

gemm = functools.partial(jax_ops.gemm, implementation="ffi")
gated = functools.partial(jax_ops.gated_linear, implementation="ffi")


def kernel_calls(f, *args) -> int:
    return jax.jit(f).lower(*args).as_text().count("jax_ops_gemm")


# ------------------------------------------------------------------------------------------------------ vmap
def test_vmap_shared_weights_is_one_kernel_call():
    r = rngs(4)
    a, b = operand(r[0], (5, 3, 7, 16), F32), operand(r[1], (16, 9), F32)
    bias, res = operand(r[2], (9,), F32), operand(r[3], (5, 3, 7, 9), F32)
    f = jax.vmap(lambda a, res: gemm(a, b, bias=bias, residual=res, activation="relu"))
    assert rel_err(f(a, res), oracle(a, b, bias=bias, residual=res, activation="relu")) < 1e-6
    assert kernel_calls(f, a, res) == 1


@pytest.mark.parametrize("in_axes", [(0, 0), (None, 0), (0, None)])
@pytest.mark.parametrize("transposes", [(False, False), (True, True)])
def test_vmap_weights_and_transposes(in_axes, transposes):
    ta, tb = transposes
    r = rngs(2)
    a = operand(r[0], (4, 2, 16, 7) if ta else (4, 2, 7, 16), F32)
    b = operand(r[1], (4, 9, 16) if tb else (4, 16, 9), F32)
    args = [x if ax == 0 else x[0] for x, ax in zip((a, b), in_axes)]
    f = jax.vmap(lambda a, b: gemm(a, b, activation="silu", transpose_a=ta, transpose_b=tb), in_axes=in_axes)
    ref_a = a if in_axes[0] == 0 else a[0]
    ref_b = b[:, None] if in_axes[1] == 0 else b[0]  # a mapped weight is shared by the 2 inner batches
    ref = oracle(ref_a, ref_b, activation="silu", transpose_a=ta, transpose_b=tb)
    out = f(*args)
    assert out.shape == (4, 2, 7, 9)
    assert rel_err(out, np.broadcast_to(ref, out.shape)) < 1e-6
    assert kernel_calls(f, *args) == 1


def test_nested_vmap_and_int8_row_scales():
    r = rngs(4)
    a, b = operand(r[0], (2, 3, 5, 16), INT8), operand(r[1], (16, 6), INT8)
    a_scale, b_scale = uniform(r[2], (5,), 0.5, 1.5) / 127, uniform(r[3], (6,), 0.5, 1.5) / 127
    f = jax.vmap(jax.vmap(lambda a: gemm(a, b, a_scale=a_scale, b_scale=b_scale, out_dtype=F32)))
    out = f(a)
    assert rel_err(out, oracle(a, b, a_scale=a_scale, b_scale=b_scale)) < 1e-6
    assert kernel_calls(f, a) == 1


def test_vmap_per_example_bias_runs_the_jnp_version_with_a_warning():
    r = rngs(3)
    a, b, bias = operand(r[0], (4, 7, 16), F32), operand(r[1], (16, 9), F32), operand(r[2], (4, 9), F32)
    f = jax.vmap(lambda a, bias: gemm(a, b, bias=bias, activation="gelu"))
    _checks._warned.discard("gemm:vmap-bias")  # the warning is once per process
    with pytest.warns(UserWarning, match="per-example bias"):
        out = f(a, bias)
    assert rel_err(out, oracle(a, b, bias=bias[:, None], activation="gelu")) < 1e-6
    assert kernel_calls(f, a, bias) == 0


def test_vmap_per_example_int8_row_scales_fold_into_the_kernel():
    r = rngs(4)
    a, b = operand(r[0], (3, 2, 5, 16), INT8), operand(r[1], (16, 6), INT8)
    a_scale, b_scale = uniform(r[2], (3, 2, 5), 0.5, 1.5) / 127, uniform(r[3], (6,), 0.5, 1.5) / 127
    f = jax.vmap(lambda a, s: gemm(a, b, a_scale=s, b_scale=b_scale, out_dtype=F32))
    assert rel_err(f(a, a_scale), oracle(a, b, a_scale=a_scale, b_scale=b_scale)) < 1e-6
    assert kernel_calls(f, a, a_scale) == 1
    per_tensor = jnp.float32([0.5, 1.0, 2.0])
    g = jax.vmap(lambda a, s: gemm(a, b, a_scale=s, b_scale=b_scale, out_dtype=F32))
    assert rel_err(g(a, per_tensor), oracle(a, b, a_scale=per_tensor[:, None, None], b_scale=b_scale)) < 1e-6
    assert kernel_calls(g, a, per_tensor) == 1


@pytest.mark.parametrize("packed", [False, True])
def test_vmap_gated(packed):
    r = rngs(3)
    x = operand(r[0], (3, 5, 16), F32)
    wg, wu = operand(r[1], (3, 16, 8), F32), operand(r[2], (3, 16, 8), F32)
    if packed:
        w = jnp.stack([wg, wu], axis=2)
        shared = jax.vmap(lambda x: gated(x, w[0]))(x)
        batched = jax.vmap(lambda x, w: gated(x, w))(x, w)
    else:
        shared = jax.vmap(lambda x: gated(x, wg[0], wu[0]))(x)
        batched = jax.vmap(lambda x, wg, wu: gated(x, wg, wu))(x, wg, wu)
    assert rel_err(shared, gated_oracle(x, wg[0], wu[0])) < 1e-6
    ref = np.stack([gated_oracle(x[i], wg[i], wu[i]) for i in range(3)])
    assert rel_err(batched, ref) < 1e-6


def test_per_example_grads_and_grad_of_vmap():
    r = rngs(2)
    a, b = operand(r[0], (4, 6, 16), F32), operand(r[1], (16, 5), F32)

    def loss(impl):
        return lambda a, b: jnp.sum(jax_ops.gemm(a, b, activation="gelu_tanh", implementation=impl) ** 2)

    per_example = [jax.vmap(jax.grad(loss(i), argnums=1), in_axes=(0, None))(a, b) for i in ("ffi", "xla")]
    assert per_example[0].shape == (4, 16, 5)
    assert rel_err(per_example[0], per_example[1]) < 1e-5

    def vloss(impl):
        return lambda a, b: jnp.sum(
            jax.vmap(lambda a: jax_ops.gemm(a, b, activation="silu", implementation=impl))(a)
        )

    g = [jax.grad(vloss(i), argnums=(0, 1))(a, b) for i in ("ffi", "xla")]
    for x, y in zip(*g):
        assert rel_err(x, y) < 1e-5


# -------------------------------------------------------------------------------------------------- sharding
@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))


def put(mesh, x, *spec):
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def collectives(f, *args) -> int:
    hlo = jax.jit(f).lower(*args).compile().as_text()
    return sum(hlo.count(op) for op in ("all-gather", "all-reduce", "all-to-all", "collective-permute"))


@pytest.mark.parametrize(
    "specs",
    [
        (("x", "y", None), (None, None), P("x", "y", None)),  # batch and M
        (("x", None, None), (None, "y"), P("x", None, "y")),  # batch and N
        ((None, "x", None), (None, ("y",)), P(None, "x", "y")),  # M and N
    ],
)
def test_jit_named_sharding(mesh, specs):
    a_spec, b_spec, out_spec = specs
    r = rngs(3)
    a, b, bias = operand(r[0], (4, 16, 32), F32), operand(r[1], (32, 24), F32), operand(r[2], (24,), F32)
    f = jax.jit(lambda a, b, bias: gemm(a, b, bias=bias, activation="gelu"))
    args = (put(mesh, a, *a_spec), put(mesh, b, *b_spec), bias)
    out = f(*args)
    assert rel_err(out, oracle(a, b, bias=bias, activation="gelu")) < 1e-6
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, out_spec), 3)
    assert collectives(f, *args) == 0


def test_jit_sharded_packed_gated_and_grads(mesh):
    r = rngs(3)
    x, w = operand(r[0], (16, 32), F32), operand(r[1], (32, 2, 24), F32, 0.2)
    bias = operand(r[2], (2, 24), F32)
    args = (put(mesh, x, "x", None), put(mesh, w, None, None, "y"), put(mesh, bias, None, "y"))
    f = jax.jit(lambda x, w, bias: gated(x, w, bias=bias))
    out = f(*args)
    assert rel_err(out, gated_oracle(x, w, bias=bias)) < 1e-6
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P("x", "y")), 2)
    assert collectives(f, *args) == 0

    def loss(impl):
        return lambda *xs: jnp.sum(jax_ops.gated_linear(*xs[:2], bias=xs[2], implementation=impl) ** 2)

    g_sharded = jax.jit(jax.grad(loss("ffi"), argnums=(0, 1, 2)))(*args)
    g_ref = jax.grad(loss("xla"), argnums=(0, 1, 2))(x, w, bias)
    for gs, gr in zip(g_sharded, g_ref):
        assert rel_err(gs, gr) < 1e-5


@pytest.mark.parametrize("specs", [(P("x", "y", None), P(None, None)), (P("x", None, None), P(None, "y"))])
def test_shard_map_forward_and_grads(mesh, specs):
    a_spec, b_spec = specs
    out_spec = P(a_spec[0], a_spec[1], b_spec[1])
    r = rngs(2)
    a, b = operand(r[0], (4, 16, 32), F32), operand(r[1], (32, 24), F32)

    def local(a, b):
        return gemm(a, b, activation="relu")

    sm = jax.shard_map(local, mesh=mesh, in_specs=(a_spec, b_spec), out_specs=out_spec)
    out = jax.jit(sm)(a, b)
    assert rel_err(out, oracle(a, b, activation="relu")) < 1e-6

    def loss(f):
        return lambda a, b: jnp.sum(jnp.sin(f(a, b)))

    g = jax.jit(jax.grad(loss(sm), argnums=(0, 1)))(a, b)
    g_ref = jax.grad(
        loss(lambda a, b: jax_ops.gemm(a, b, activation="relu", implementation="xla")), argnums=(0, 1)
    )(a, b)
    for x, y in zip(g, g_ref):
        assert rel_err(x, y) < 1e-5
