"""jax_ops.gemm / gated_linear (the CPU twin) under vmap (folded into one kernel call), grad of vmap and vmap of
grad, and sharding on the 8 fake CPU devices of tests/conftest.py: jit with NamedSharding (batch, M and N; K split:
the reduction and the epilogue after it, one collective in the compiled forward) and shard_map (k_sharded_gemm)."""

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


def test_shared_weight_grad_sums_the_batch_under_vmap_and_twice():
    """The shared weight's gradient sums over batch and rows in one GEMM (Config.sum_batch): per example under
    vmap (each example its own sum over its batch), and differentiated again (its own backward)."""
    r = rngs(2)
    a, b = operand(r[0], (3, 2, 6, 16), F32), operand(r[1], (16, 5), F32)

    def loss(impl):
        return lambda a, b: jnp.sum(jnp.sin(jax_ops.gemm(a, b, activation="gelu_tanh", implementation=impl)))

    per_example = [jax.vmap(jax.grad(loss(i), argnums=1), in_axes=(0, None))(a, b) for i in ("ffi", "xla")]
    assert per_example[0].shape == (3, 16, 5)
    assert rel_err(per_example[0], per_example[1]) < 1e-5

    def second(impl):  # d/da of |dL/db|^2: through the weight gradient's own backward
        return jax.grad(lambda a: jnp.sum(jax.grad(loss(impl), argnums=1)(a, b) ** 2))(a[0])

    assert rel_err(second("ffi"), second("xla")) < 1e-5


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


@pytest.mark.parametrize("a_spec", [P(None, "y", None), P("x", "y", None), P("x", None, None)])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_shared_weight_grad_with_rows_sharded_does_not_gather(mesh, a_spec, transpose_b):
    """A shared weight's gradient with a's rows (M) and/or batch sharded is a partial sum per shard and one
    all-reduce: a and dz are never gathered (batch > 1, so batch and rows cannot merge into one sharded dim)."""
    r = rngs(2)
    a, b = operand(r[0], (2, 16, 32), F32), operand(r[1], (24, 32) if transpose_b else (32, 24), F32)

    def loss(impl):
        return lambda a, b: jnp.sum(jnp.sin(gemm(a, b, transpose_b=transpose_b, implementation=impl)))

    f = jax.grad(loss("ffi"), argnums=(0, 1))
    args = (put(mesh, a, *a_spec), b)
    counts = collective_counts(f, *args)
    assert counts == only(all_reduce=1), counts
    for g, g_ref in zip(jax.jit(f)(*args), jax.grad(loss("xla"), argnums=(0, 1))(a, b)):
        assert rel_err(g, g_ref) < 1e-5


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


# ---------------------------------------------------------------------------------------------- K sharding
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


def collective_counts(f, *args) -> dict[str, int]:
    hlo = jax.jit(f).lower(*args).compile().as_text()
    return {op: sum(line.split("=", 1)[1].lstrip().count(f" {op}(") for line in hlo.splitlines() if "=" in line)
            for op in COLLECTIVES}  # fmt: skip


def only(**counts) -> dict[str, int]:
    return {op: counts.get(op.replace("-", "_"), 0) for op in COLLECTIVES}


def k_mesh(devices: int) -> Mesh:
    return Mesh(np.array(jax.devices()[:devices]), ("k",))


EPILOGUES = {
    "none": dict(),
    "bias_gelu": dict(bias=True, activation="gelu"),
    "full": dict(bias=True, c=True, alpha=0.75, beta=0.5, residual=True, activation="silu"),
    "relu_residual": dict(residual=True, activation="relu"),
}


def epilogue_args(r, kind: str, out_shape, dtype=F32):
    """(array keywords, static keywords) of an EPILOGUES entry for an output of ``out_shape``."""
    spec = EPILOGUES[kind]
    arrays = {}
    if spec.get("bias"):
        arrays["bias"] = operand(r[0], out_shape[-1:], F32)
    if spec.get("c"):
        arrays["c"] = operand(r[1], out_shape, dtype)
    if spec.get("residual"):
        arrays["residual"] = operand(r[2], out_shape, dtype)
    static = {k: spec[k] for k in ("alpha", "beta", "activation") if k in spec}
    return arrays, static


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("epi", list(EPILOGUES))
@pytest.mark.parametrize("out", ["replicated", "M", "N"])
def test_k_sharded(devices, epi, out):
    """K split over 2/4/8 devices: one all-reduce for a replicated output, one reduce-scatter for an output
    sharded over M or N, never a gather; the epilogue after the reduction."""
    m = k_mesh(devices)
    r = rngs(5)
    a, b = operand(r[0], (2, 16, 64), F32), operand(r[1], (64, 24), F32, 0.2)
    arrays, static = epilogue_args(r[2:], epi, (2, 16, 24))
    out_spec = {"replicated": P(), "M": P(None, "k", None), "N": P(None, None, "k")}[out]
    f = jax.jit(lambda a, b, kw: gemm(a, b, **kw, **static), out_shardings=NamedSharding(m, out_spec))
    args = (put(m, a, None, None, "k"), put(m, b, "k", None), arrays)
    y = f(*args)
    assert rel_err(y, oracle(a, b, **arrays, **static)) < 1e-5
    assert y.sharding.is_equivalent_to(NamedSharding(m, out_spec), 3)
    want = only(all_reduce=1) if out == "replicated" else only(reduce_scatter=1)
    assert collective_counts(f, *args) == want


@pytest.mark.parametrize(
    "specs",
    [  # a, b, the output's sharding, the one reduction
        ((None, "x", "y"), ("y", None), P(None, "x", None), "all_reduce"),  # K over y, M over x
        ((None, "x", "y"), ("y", None), P(None, ("x", "y"), None), "reduce_scatter"),  # M over x, then y
        ((None, "x", "y"), ("y", None), P(None, "x", "y"), "reduce_scatter"),  # M over x, N over y
        ((None, None, "x"), ("x", "y"), P(None, None, "y"), "all_reduce"),  # K over x, N over y
        ((None, None, "x"), ("x", "y"), P(None, "x", "y"), "reduce_scatter"),  # ... scattered over M
        (("x", None, "y"), ("y", None), P("x", None, None), "all_reduce"),  # batch over x
        ((None, None, ("x", "y")), (("x", "y"), None), P(), "all_reduce"),  # K over both axes
    ],
)
def test_k_sharded_with_mn_sharding_on_2x4(mesh, specs):
    a_spec, b_spec, out_spec, reduction = specs
    r = rngs(5)
    a, b = operand(r[0], (2, 16, 64), F32), operand(r[1], (64, 24), F32, 0.2)
    arrays, static = epilogue_args(r[2:], "full", (2, 16, 24))
    f = jax.jit(lambda a, b, kw: gemm(a, b, **kw, **static), out_shardings=NamedSharding(mesh, out_spec))
    args = (put(mesh, a, *a_spec), put(mesh, b, *b_spec), arrays)
    y = f(*args)
    assert rel_err(y, oracle(a, b, **arrays, **static)) < 1e-5
    assert y.sharding.is_equivalent_to(NamedSharding(mesh, out_spec), 3)
    assert collective_counts(f, *args) == only(**{reduction: 1})


@pytest.mark.parametrize("shape", [(1, 8), (2, 4), (8, 1)])
def test_k_sharded_mesh_shapes(shape):
    """K over y and M over x on 1x8, 2x4 and 8x1 meshes (a size-1 axis shards nothing)."""
    m = Mesh(np.array(jax.devices()[:8]).reshape(shape), ("x", "y"))
    r = rngs(3)
    a, b = operand(r[0], (16, 64), F32), operand(r[1], (64, 24), F32, 0.2)
    bias = operand(r[2], (24,), F32)
    f = jax.jit(lambda a, b, bias: gemm(a, b, bias=bias, activation="gelu"))
    args = (put(m, a, "x", "y"), put(m, b, "y", None), bias)
    assert rel_err(f(*args), oracle(a, b, bias=bias, activation="gelu")) < 1e-5
    assert collective_counts(f, *args) == (only() if shape[1] == 1 else only(all_reduce=1))


@pytest.mark.parametrize("transposes", [(True, False), (False, True), (True, True)])
def test_k_sharded_transposed_operands(mesh, transposes):
    ta, tb = transposes
    r = rngs(3)
    a = operand(r[0], (2, 64, 16) if ta else (2, 16, 64), F32)
    b = operand(r[1], (24, 64) if tb else (64, 24), F32, 0.2)
    bias = operand(r[2], (24,), F32)
    f = jax.jit(
        lambda a, b, bias: gemm(a, b, bias=bias, activation="gelu_tanh", transpose_a=ta, transpose_b=tb),
        out_shardings=NamedSharding(mesh, P(None, "x", "y")),
    )
    args = (put(mesh, a, None, "y", "x") if ta else put(mesh, a, None, "x", "y"),
            put(mesh, b, None, "y") if tb else put(mesh, b, "y", None), bias)  # fmt: skip
    y = f(*args)
    assert rel_err(y, oracle(a, b, bias=bias, activation="gelu_tanh", transpose_a=ta, transpose_b=tb)) < 1e-5
    assert collective_counts(f, *args) == only(reduce_scatter=1)


def test_k_sharded_partials_reduce_in_f32(mesh):
    """bf16 operands and output: the partial sums cross the shards as f32, rounded once after the epilogue."""
    r = rngs(4)
    a, b = operand(r[0], (32, 256), jnp.bfloat16), operand(r[1], (256, 24), jnp.bfloat16, 0.1)
    res = operand(r[2], (32, 24), jnp.bfloat16)
    f = jax.jit(lambda a, b, res: gemm(a, b, residual=res, activation="silu"))
    args = (put(mesh, a, "x", "y"), put(mesh, b, "y", None), res)
    y = f(*args)
    assert y.dtype == jnp.bfloat16
    assert rel_err(y, oracle(a, b, residual=res, activation="silu")) < 1e-2
    hlo = jax.jit(f).lower(*args).compile().as_text()
    reductions = [line for line in hlo.splitlines() if " all-reduce(" in line and "=" in line]
    assert len(reductions) == 1 and "f32[" in reductions[0].split("=", 1)[1].split("all-reduce")[0]


def test_k_sharded_f64(x64, mesh):
    r = rngs(3)
    a, b = operand(r[0], (16, 64), jnp.float64), operand(r[1], (64, 24), jnp.float64)
    bias = operand(r[2], (24,), jnp.float64)
    f = jax.jit(lambda a, b, bias: gemm(a, b, bias=bias, activation="gelu"))
    args = (put(mesh, a, None, "y"), put(mesh, b, "y", "x"), bias)
    assert rel_err(f(*args), oracle(a, b, bias=bias, activation="gelu")) < 1e-12
    assert collective_counts(f, *args) == only(all_reduce=1)


@pytest.mark.parametrize("dtype", [INT8, jnp.float8_e4m3fn])
def test_k_sharded_8bit_scales_after_the_reduction(mesh, dtype):
    r = rngs(4)
    a, b = operand(r[0], (16, 64), dtype), operand(r[1], (64, 24), dtype)
    a_scale, b_scale = uniform(r[2], (16,), 0.5, 1.5) / 127, uniform(r[3], (24,), 0.5, 1.5) / 127
    f = jax.jit(
        lambda a, b, sa, sb: gemm(a, b, a_scale=sa, b_scale=sb, activation="relu", out_dtype=F32),
        out_shardings=NamedSharding(mesh, P("y", None)),
    )
    args = (put(mesh, a, None, "y"), put(mesh, b, "y", None), a_scale, b_scale)
    y = f(*args)
    assert rel_err(y, oracle(a, b, a_scale=a_scale, b_scale=b_scale, activation="relu")) < 1e-5
    assert collective_counts(f, *args) == only(reduce_scatter=1)


@pytest.mark.parametrize("packed", [False, True])
def test_k_sharded_gated(mesh, packed):
    """The gate and up partials reduce together (one collective), the gated epilogue after it."""
    r = rngs(5)
    x = operand(r[0], (16, 64), F32)
    wg, wu = operand(r[1], (64, 24), F32, 0.2), operand(r[2], (64, 24), F32, 0.2)
    bias, res = operand(r[3], (2, 24), F32), operand(r[4], (16, 24), F32)
    out_sharding = NamedSharding(mesh, P("x", "y"))
    if packed:
        w = jnp.stack([wg, wu], axis=1)
        f = jax.jit(lambda x, w, bias, res: gated(x, w, bias=bias, residual=res), out_shardings=out_sharding)
        args = (put(mesh, x, "x", "y"), put(mesh, w, "y", None, None), bias, res)
    else:
        f = jax.jit(
            lambda x, wg, wu, bias, res: gated(x, wg, wu, bias=bias, residual=res), out_shardings=out_sharding
        )
        args = (put(mesh, x, "x", "y"), put(mesh, wg, "y", None), put(mesh, wu, "y", None), bias, res)
    y = f(*args)
    assert rel_err(y, gated_oracle(x, wg, wu, bias=bias, residual=res)) < 1e-5
    assert collective_counts(f, *args) == only(reduce_scatter=1)

    def loss(impl):
        fn = functools.partial(jax_ops.gated_linear, implementation=impl)
        if packed:
            return lambda x, w, bias, res: jnp.sum(jnp.sin(fn(x, w, bias=bias, residual=res)))
        return lambda x, wg, wu, bias, res: jnp.sum(jnp.sin(fn(x, wg, wu, bias=bias, residual=res)))

    ref_args = (x, w, bias, res) if packed else (x, wg, wu, bias, res)
    argnums = tuple(range(len(args)))
    g = jax.jit(jax.grad(loss("ffi"), argnums=argnums))(*args)
    g_ref = jax.grad(loss("xla"), argnums=argnums)(*ref_args)
    for gs, gr in zip(g, g_ref):
        assert rel_err(gs, gr) < 1e-5


@pytest.mark.parametrize("epi", ["bias_gelu", "full"])
@pytest.mark.parametrize(
    "specs",
    [
        ((None, None, "y"), ("y", None)),
        ((None, "x", "y"), ("y", "x")),
        ((None, None, ("x", "y")), (("x", "y"), None)),
    ],
)
def test_k_sharded_grads(mesh, epi, specs):
    """Gradients through a K-sharded forward (its backward GEMMs contract over M or N, or run K-split again)."""
    a_spec, b_spec = specs
    r = rngs(5)
    a, b = operand(r[0], (2, 16, 64), F32), operand(r[1], (64, 24), F32, 0.2)
    arrays, static = epilogue_args(r[2:], epi, (2, 16, 24))

    def loss(impl):
        return lambda a, b, kw: jnp.sum(jnp.sin(jax_ops.gemm(a, b, **kw, **static, implementation=impl)))

    g = jax.jit(jax.grad(loss("ffi"), argnums=(0, 1, 2)))(
        put(mesh, a, *a_spec), put(mesh, b, *b_spec), arrays
    )
    g_ref = jax.grad(loss("xla"), argnums=(0, 1, 2))(a, b, arrays)
    for gs, gr in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
        assert rel_err(gs, gr) < 1e-5


def test_k_on_different_axes_is_gathered(mesh):
    """a's K over x and b's over y: K is gathered (the documented fallback), the result is still exact."""
    r = rngs(2)
    a, b = operand(r[0], (16, 64), F32), operand(r[1], (64, 24), F32, 0.2)
    f = jax.jit(lambda a, b: gemm(a, b, activation="relu"))
    args = (put(mesh, a, None, "x"), put(mesh, b, "y", None))
    assert rel_err(f(*args), oracle(a, b, activation="relu")) < 1e-5
    counts = collective_counts(f, *args)
    assert counts["all-gather"] > 0 and counts["all-reduce"] == counts["reduce-scatter"] == 0


@pytest.mark.parametrize("scatter", [None, -2, -1])
def test_k_sharded_gemm_in_shard_map(scatter):
    """The shard_map helper: local partials, psum / psum_scatter, the epilogue on the reduced block."""
    m = k_mesh(4)
    r = rngs(5)
    a, b = operand(r[0], (2, 16, 64), F32), operand(r[1], (64, 24), F32, 0.2)
    bias, res = operand(r[2], (24,), F32), operand(r[3], (2, 16, 24), F32)
    out_spec = {None: P(), -2: P(None, "k", None), -1: P(None, None, "k")}[scatter]
    bias_spec = P("k") if scatter == -1 else P()

    def local(a, b, bias, res):
        return jax_ops.gemm_ops.k_sharded_gemm(
            a, b, axis_name="k", scatter_dimension=scatter, bias=bias, residual=res, activation="gelu",
            implementation="ffi",
        )  # fmt: skip

    sm = jax.jit(
        jax.shard_map(
            local,
            mesh=m,
            in_specs=(P(None, None, "k"), P("k", None), bias_spec, out_spec),
            out_specs=out_spec,
        )
    )
    y = sm(a, b, bias, res)
    assert rel_err(y, oracle(a, b, bias=bias, residual=res, activation="gelu")) < 1e-5
    want = only(all_reduce=1) if scatter is None else only(reduce_scatter=1)
    assert collective_counts(sm, a, b, bias, res) == want

    def loss(f):
        return lambda *xs: jnp.sum(jnp.sin(f(*xs)))

    ref = functools.partial(jax_ops.gemm, activation="gelu", implementation="xla")
    g = jax.jit(jax.grad(loss(sm), argnums=(0, 1, 2, 3)))(a, b, bias, res)
    g_ref = jax.grad(loss(lambda a, b, bias, res: ref(a, b, bias=bias, residual=res)), argnums=(0, 1, 2, 3))(
        a, b, bias, res
    )
    for gs, gr in zip(g, g_ref):
        assert rel_err(gs, gr) < 1e-5


def test_k_sharded_gemm_int8_in_shard_map():
    """int8 partials cross the shards as f32; the per-row / per-column scales apply to the scattered block."""
    m = k_mesh(4)
    r = rngs(4)
    a, b = operand(r[0], (16, 64), INT8), operand(r[1], (64, 24), INT8)
    a_scale, b_scale = uniform(r[2], (16,), 0.5, 1.5) / 127, uniform(r[3], (24,), 0.5, 1.5) / 127

    def local(a, b, sa, sb):
        return jax_ops.gemm_ops.k_sharded_gemm(
            a,
            b,
            axis_name="k",
            scatter_dimension=-1,
            a_scale=sa,
            b_scale=sb,
            out_dtype=F32,
            implementation="ffi",
        )

    specs = (P(None, "k"), P("k", None), P(), P("k"))
    sm = jax.jit(jax.shard_map(local, mesh=m, in_specs=specs, out_specs=P(None, "k")))
    assert rel_err(sm(a, b, a_scale, b_scale), oracle(a, b, a_scale=a_scale, b_scale=b_scale)) < 1e-5


def test_k_sharded_gemm_errors():
    a, b = jnp.ones((4, 8)), jnp.ones((8, 3))
    with pytest.raises(ValueError, match="axis_name"):
        jax_ops.gemm_ops.k_sharded_gemm(a, b, axis_name=None)
    with pytest.raises(ValueError, match="rank >= 2"):
        jax_ops.gemm_ops.k_sharded_gemm(a[0], b, axis_name="k")
    with pytest.raises(ValueError, match="apply to float8 and int8"):
        jax_ops.gemm_ops.k_sharded_gemm(a, b, axis_name="k", a_scale=1.0, b_scale=1.0)
    with pytest.raises(ValueError, match="need a_scale"):
        jax_ops.gemm_ops.k_sharded_gemm(a.astype(INT8), b.astype(INT8), axis_name="k")
    with pytest.raises(TypeError, match="out_dtype"):
        jax_ops.gemm_ops.k_sharded_gemm(a, b, axis_name="k", out_dtype=jnp.float16)
