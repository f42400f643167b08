"""Gradients of jax_ops.gemm / gated_linear through the custom_vjp (the CPU twin) against jax.grad of a float64
jnp formula written here, for every activation, shared and batched weights, each transpose pair and the gated
forms."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_cases import ACTIVATIONS, BF16, E4M3, F32, F64, INT8, operand, rngs
from helpers import rel_err

import jax_ops

NN = {
    None: lambda z: z,
    "relu": jax.nn.relu,
    "gelu_tanh": lambda z: jax.nn.gelu(z, approximate=True),
    "gelu": lambda z: jax.nn.gelu(z, approximate=False),
    "silu": jax.nn.silu,
}
GRAD_TOL = {F32: 1e-5, F64: 1e-11, BF16: 3e-2}


def formula(a, b, bias, c, residual, *, activation, alpha, beta, transpose_a, transpose_b):
    A = jnp.swapaxes(a, -1, -2) if transpose_a else a
    B = jnp.swapaxes(b, -1, -2) if transpose_b else b
    z = alpha * jnp.matmul(A, B, precision=jax.lax.Precision.HIGHEST) + beta * c + bias
    return NN[activation](z) + residual


def gated_formula(x, wg, wu, bias, residual, *, activation):
    hi = jax.lax.Precision.HIGHEST
    zg, zu = jnp.matmul(x, wg, precision=hi) + bias[0], jnp.matmul(x, wu, precision=hi) + bias[1]
    return NN[activation](zg) * zu + residual


def grads_of(f, args, cotangent):
    """The gradients of sum(f(*args) * cotangent) for every argument."""
    return jax.grad(
        lambda *xs: jnp.sum(f(*xs).astype(jnp.float32) * cotangent), argnums=tuple(range(len(args)))
    )(*args)


def f64(args):
    return tuple(jnp.asarray(x, jnp.float64) for x in args)


# (a shape, b shape, transpose_a, transpose_b): shared weights folded into M, transposed shared weights (the
# per-batch weight gradient), batched weights with each transpose.
LAYOUTS = {
    "shared": ((2, 9, 16), (16, 12), False, False),
    "shared-ta-tb": ((2, 16, 9), (12, 16), True, True),
    "shared-ta": ((2, 16, 9), (16, 12), True, False),
    "batched-tb": ((2, 9, 16), (2, 12, 16), False, True),
    "batched-ta": ((2, 16, 9), (2, 16, 12), True, False),
}


def check_gemm_grads(dtype, layout):
    sa, sb, ta, tb = LAYOUTS[layout]
    r = rngs(6)
    a, b = operand(r[0], sa, dtype), operand(r[1], sb, dtype, 0.25)
    bias = operand(r[2], (12,), F64 if dtype == F64 else F32)
    c, residual, ct = (operand(x, (2, 9, 12), dtype) for x in r[3:6])
    kw = dict(alpha=0.75, beta=0.5, transpose_a=ta, transpose_b=tb)

    @jax.jit
    def ours(a, b, bias, c, residual):
        return [
            grads_of(
                lambda *xs, act=act: jax_ops.gemm(
                    *xs[:2], bias=xs[2], c=xs[3], residual=xs[4], activation=act, implementation="ffi", **kw
                ),  # fmt: skip
                (a, b, bias, c, residual),
                ct.astype(jnp.float32),
            )
            for act in ACTIVATIONS
        ]

    got = ours(a, b, bias, c, residual)
    for act, grads in zip(ACTIVATIONS, got):
        want = grads_of(
            lambda *xs, act=act: formula(*xs, activation=act, **kw),
            f64((a, b, bias, c, residual)),
            f64((ct,))[0],
        )
        for name, g, w in zip(("a", "b", "bias", "c", "residual"), grads, want):
            assert g.shape == w.shape and g.dtype == (bias.dtype if name == "bias" else dtype), (act, name)
            assert rel_err(g, w) < GRAD_TOL[dtype], (act, name, rel_err(g, w))


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_gemm_grads_f32(layout, x64):
    check_gemm_grads(F32, layout)


@pytest.mark.parametrize("dtype", [BF16, F64], ids=["bfloat16", "float64"])
def test_gemm_grads_dtypes(dtype, x64):
    check_gemm_grads(dtype, "shared")


@pytest.mark.parametrize("dtype", [F32, BF16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
def test_gated_grads(packed, dtype, x64):
    r = rngs(6)
    x = operand(r[0], (3, 5, 16), dtype)
    wg, wu = operand(r[1], (16, 12), dtype, 0.25), operand(r[2], (16, 12), dtype, 0.25)
    bias, residual, ct = (
        operand(r[3], (2, 12), F32),
        operand(r[4], (3, 5, 12), dtype),
        operand(r[5], (3, 5, 12), F32),
    )

    @jax.jit
    def ours(x, wg, wu, bias, residual):
        out = []
        for act in ACTIVATIONS:
            if packed:
                f = lambda x, w, bias, res, act=act: jax_ops.gated_linear(x, w, None, act, bias=bias, residual=res,  # noqa: E731
                                                                 implementation="ffi")  # fmt: skip
                gx, gw, gb, gr = grads_of(f, (x, jnp.stack([wg, wu], 1), bias, residual), ct)
                out.append((gx, gw[:, 0], gw[:, 1], gb, gr))
            else:
                f = lambda *xs, act=act: jax_ops.gated_linear(*xs[:3], act, bias=xs[3], residual=xs[4],  # noqa: E731
                                                     implementation="ffi")  # fmt: skip
                out.append(grads_of(f, (x, wg, wu, bias, residual), ct))
        return out

    for act, grads in zip(ACTIVATIONS, ours(x, wg, wu, bias, residual)):
        want = grads_of(
            lambda *xs, act=act: gated_formula(*xs, activation=act),
            f64((x, wg, wu, bias, residual)),
            f64((ct,))[0],
        )
        for name, g, w in zip(("x", "w_gate", "w_up", "bias", "residual"), grads, want):
            assert rel_err(g, w) < GRAD_TOL[dtype], (act, name, rel_err(g, w))


def test_second_order(x64):
    """The backward's GEMMs go through the op again, so grad of grad works."""
    r = rngs(2)
    a, b = operand(r[0], (6, 8), F32), operand(r[1], (8, 5), F32)

    def inner(f):
        return lambda a, b: jnp.sum(jax.grad(lambda a: jnp.sum(f(a, b) ** 2))(a) ** 2)

    ours = jax.grad(
        inner(lambda a, b: jax_ops.gemm(a, b, activation="silu", implementation="ffi")), argnums=1
    )
    ref = jax.grad(inner(lambda a, b: formula(a, b, 0.0, 0.0, 0.0, activation="silu", alpha=1.0, beta=0.0,
                                              transpose_a=False, transpose_b=False)), argnums=1)  # fmt: skip
    assert rel_err(ours(a, b), ref(*f64((a, b)))) < 1e-5


@pytest.mark.parametrize("dtype", [E4M3, INT8], ids=["float8_e4m3fn", "int8"])
def test_quantized_inputs_have_no_gradient(dtype):
    a, b = jnp.ones((4, 8), dtype), jnp.ones((8, 3), dtype)
    bias = jnp.zeros(3)

    def loss(bias):
        return jnp.sum(jax_ops.gemm(a, b, bias=bias, a_scale=1.0, b_scale=1.0, implementation="ffi"))

    with pytest.raises(TypeError, match="no gradient for"):
        jax.grad(loss)(bias)


def test_xla_path_grads_match(x64):
    """implementation="xla" differentiates the jnp version: same gradients as the kernel's custom_vjp."""
    r = rngs(3)
    a, b, bias = operand(r[0], (7, 8), F32), operand(r[1], (8, 5), F32), operand(r[2], (5,), F32)

    def loss(impl):
        return lambda *xs: jnp.sum(
            jax_ops.gemm(*xs[:2], bias=xs[2], activation="gelu", implementation=impl) ** 2
        )

    g = [jax.grad(loss(impl), argnums=(0, 1, 2))(a, b, bias) for impl in ("ffi", "xla")]
    for x, y in zip(*g):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=2e-5, atol=2e-5)
