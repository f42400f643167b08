"""GPU tests of jax_ops_gemm: the CUDA kernels against the CPU twin (the same jitted function on host inputs) and
the float64 oracle, over the CPU suite's epilogue x dtype x transpose matrix, every plan forced once through the
``plan`` knob, ragged K, M = 1 and a large case, gated forms and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_cases import (
    ACTIVATIONS,
    BF16,
    DTYPES,
    E4M3,
    F16,
    F32,
    F64,
    INT8,
    TRANSPOSES,
    default_out,
    epilogue_case,
    gated_oracle,
    operand,
    oracle,
    rngs,
    split_static,
    tol,
)
from helpers import rel_err

import jax_ops
from jax_ops import gemm_ops

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _needs_cuda_target(x64):
    # On a GPU a build without the kernels is broken, not a reason to skip.
    if "jax_ops_gemm" not in jax_ops._ffi.target_names("CUDA"):
        pytest.fail("this build has no CUDA GEMM target (jax_ops_gemm): build with JAX_OPS_CUDA=ON")


def on_cpu(fn, *args):
    """The CPU twin: the same jitted function with inputs committed to the host."""
    return jax.jit(fn)(*jax.device_put(args, jax.devices("cpu")[0]))


def check(fn, args, ref, out_dtype, *, twin=True):
    """fn on the GPU against the float64 oracle and (small cases) the CPU twin."""
    out = jax.jit(fn)(*args)
    assert out.dtype == out_dtype
    assert rel_err(out, ref) < tol(out_dtype)
    if twin:
        assert rel_err(out, on_cpu(fn, *args)) < 2 * tol(out_dtype)
    return out


@pytest.mark.parametrize("transposes", TRANSPOSES, ids=lambda t: f"ta{int(t[0])}tb{int(t[1])}")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_epilogue_matrix_small(activation, dtype, transposes):
    a, b, kw = epilogue_case(dtype, *transposes, B=2, M=17, N=40, K=72)
    arrays, static = split_static(kw)

    def fn(a, b, arrays):
        return jax_ops.gemm(a, b, activation=activation, implementation="ffi", **arrays, **static)

    check(fn, (a, b, arrays), oracle(a, b, activation=activation, **kw), default_out(dtype))


# One case per plan that the plan is built for; a forced plan that cannot run a problem fails with
# InvalidArgument, so each case also checks the plan's reach.
PLAN_CASES = {
    "sm90": [(BF16, 256, 384, 200), (F16, 128, 256, 1000), (E4M3, 256, 256, 512)],
    "skinny": [(BF16, 1, 4096, 1000), (BF16, 16, 2048, 512), (BF16, 64, 512, 4096)],
    "simt": [(F32, 33, 65, 129), (F64, 17, 40, 100), (INT8, 9, 24, 70)],
}


@pytest.mark.parametrize("plan", list(PLAN_CASES))
@pytest.mark.parametrize("index", [0, 1, 2])
def test_forced_plan(plan, index):
    dtype, M, N, K = PLAN_CASES[plan][index]
    a, b, kw = epilogue_case(dtype, False, False, B=1, M=M, N=N, K=K, seed=index)
    arrays, static = split_static(kw)

    def fn(a, b, arrays):
        return jax_ops.gemm(a, b, activation="gelu", implementation="ffi", **arrays, **static)

    with gemm_ops.overrides(plan=plan):  # a trace-time knob: the jit below traces inside it
        check(
            fn,
            (a, b, arrays),
            oracle(a, b, activation="gelu", **kw),
            default_out(dtype),
            twin=M * N * K < 1e8,
        )


@pytest.mark.parametrize("plan", ["auto", "sm90", "skinny"])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("M", [1, 16, 100, 512])
def test_gated_linear(M, packed, plan):
    if plan == "skinny" and M > 64 or plan == "sm90" and M < 64:
        pytest.skip("outside the plan's rows")
    K, N = 1024, 768
    r = rngs(5)
    x = operand(r[0], (M, K), BF16)
    wg, wu = operand(r[1], (K, N), BF16, K**-0.5), operand(r[2], (K, N), BF16, K**-0.5)
    bias, res = operand(r[3], (2, N), F32), operand(r[4], (M, N), BF16)
    weights = (jnp.stack([wg, wu], axis=1),) if packed else (wg, wu)

    def fn(x, w, bias, res):
        return jax_ops.gated_linear(x, *w, bias=bias, residual=res, implementation="ffi")

    with gemm_ops.overrides(plan=plan):
        check(fn, (x, weights, bias, res), gated_oracle(x, wg, wu, bias=bias, residual=res), BF16)


@pytest.mark.parametrize("dtype", [BF16, F16, E4M3])
def test_large(dtype):
    M = N = K = 4096
    a, b, kw = epilogue_case(dtype, False, False, B=1, M=M, N=N, K=K)
    kw = {k: v for k, v in kw.items() if k not in ("c", "beta")}
    arrays, static = split_static(kw)

    def fn(a, b, arrays):
        return jax_ops.gemm(a, b, activation="silu", implementation="ffi", **arrays, **static)

    check(fn, (a, b, arrays), oracle(a, b, activation="silu", **kw), default_out(dtype), twin=False)


@pytest.mark.parametrize("dtype", [BF16, F32])
def test_grads_match_the_xla_path(dtype):
    r = rngs(4)
    a, b = operand(r[0], (2, 200, 256), dtype), operand(r[1], (256, 300), dtype, 1 / 16)
    bias, res = operand(r[2], (300,), F32), operand(r[3], (2, 200, 300), dtype)

    def loss(impl):
        return lambda *xs: jnp.sum(
            jax_ops.gemm(*xs[:2], bias=xs[2], residual=xs[3], activation="gelu", implementation=impl).astype(
                F32
            )
            ** 2
        )

    g = jax.jit(jax.grad(loss("ffi"), argnums=(0, 1, 2, 3)))(a, b, bias, res)
    g_ref = jax.jit(jax.grad(loss("xla"), argnums=(0, 1, 2, 3)))(a, b, bias, res)
    for x, y in zip(g, g_ref):
        assert rel_err(x, y) < (3e-2 if dtype == BF16 else 1e-4)


def test_default_implementation_runs_the_kernel():
    f = jax.jit(lambda a, b: jax_ops.gemm(a, b))
    assert "jax_ops_gemm" in f.lower(jnp.ones((64, 64), BF16), jnp.ones((64, 64), BF16)).as_text()
