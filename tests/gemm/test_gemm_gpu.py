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
    E5M2,
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


# The cublaslt plan (cuBLASLt's own epilogues): (name, a dtype, b dtype, out dtype, B, M, N, K, transpose_a,
# transpose_b, activation, bias, beta, precision). fp8 weights are [N, K] (cuBLASLt reads fp8 K-major only).
CUBLASLT_CASES = [
    ("bf16 plain", BF16, BF16, BF16, 1, 128, 256, 512, False, False, None, False, 0.0, None),
    ("f16 bias relu odd", F16, F16, F16, 1, 33, 40, 72, False, False, "relu", True, 0.0, None),
    ("bf16 bias gelu_tanh c", BF16, BF16, BF16, 1, 200, 64, 96, False, True, "gelu_tanh", True, 0.5, None),
    ("bf16 ta batched shared", BF16, BF16, BF16, 3, 40, 48, 56, True, False, None, False, 0.0, None),
    ("bf16 ta tb batched f32 out", BF16, BF16, F32, 2, 24, 40, 64, True, True, None, True, 0.0, None),
    ("f32 exact", F32, F32, F32, 1, 33, 65, 129, False, False, None, False, 0.0, None),
    ("f32 tf32", F32, F32, F32, 1, 128, 128, 256, False, False, None, False, 0.0, "tensorfloat32"),
    ("f64", F64, F64, F64, 1, 17, 40, 100, True, False, None, False, 0.0, None),
    ("e4m3 bf16 out", E4M3, E4M3, BF16, 1, 64, 128, 256, False, True, None, False, 0.0, None),
    ("e4m3 x e5m2 bias f16 out", E4M3, E5M2, F16, 1, 200, 64, 128, False, True, "gelu_tanh", True, 0.0, None),
]


@pytest.mark.parametrize("case", CUBLASLT_CASES, ids=lambda c: c[0])
def test_cublaslt_plan(case):
    _, at, bt, ot, B, M, N, K, ta, tb, act, with_bias, beta, precision = case
    r = rngs(6, seed=M)
    a = operand(r[0], ((B, K, M) if ta else (B, M, K)) if B > 1 else ((K, M) if ta else (M, K)), at)
    b = operand(r[1], (N, K) if tb else (K, N), bt, K**-0.5)
    kw = dict(transpose_a=ta, transpose_b=tb, activation=act, out_dtype=ot, precision=precision)
    arrays = {}
    if with_bias:
        arrays["bias"] = operand(r[2], (N,), F32)
    if beta:
        arrays["c"] = operand(r[3], a.shape[:-2] + (M, N), ot)
        kw["beta"] = beta
    if jnp.dtype(at).itemsize == 1:
        arrays.update(a_scale=jnp.float32(0.5), b_scale=jnp.float32(0.25))

    def fn(a, b, arrays):
        return jax_ops.gemm(a, b, implementation="ffi", **arrays, **kw)

    ref = oracle(a, b, **{k: v for k, v in kw.items() if k not in ("out_dtype", "precision")}, **arrays)
    bound = 5e-3 if precision else tol(ot)  # TF32: 10 mantissa bits per product
    with gemm_ops.overrides(plan="cublaslt"):
        out = jax.jit(fn)(a, b, arrays)
    assert out.dtype == ot and out.shape == ref.shape
    assert rel_err(out, ref) < bound


def test_cublaslt_plan_gradients():
    """Forward + backward on the cublaslt plan: the forward keeps the tanh-GELU's input through cuBLASLt's
    GELU_AUX epilogue, the backward's GEMMs (transposed a and b) run on cuBLASLt too."""
    r = rngs(4)
    x, w = operand(r[0], (2, 96, 128), BF16), operand(r[1], (128, 80), BF16, 1 / 12)
    bias = operand(r[2], (80,), F32)

    def loss(impl):
        return lambda x, w, bias: jnp.sum(
            jax_ops.linear(x, w, bias, activation="gelu_tanh", implementation=impl).astype(F32) ** 2
        )

    with gemm_ops.overrides(plan="cublaslt"):
        g = jax.jit(jax.grad(loss("ffi"), argnums=(0, 1, 2)))(x, w, bias)
    g_ref = jax.jit(jax.grad(loss("xla"), argnums=(0, 1, 2)))(x, w, bias)
    for name, a, b in zip(("x", "w", "bias"), g, g_ref):
        assert rel_err(a, b) < 3e-2, name


# Problems the cublaslt plan refuses (a forced plan fails with the reason), each with the Python mirror's reason
# (jax_ops/_src/gemm/tuning.py: the dispatch table only takes the plan where the mirror accepts it).
CUBLASLT_REFUSED = [
    ("silu", dict(activation="silu"), "relu or tanh-GELU only"),
    ("residual", dict(residual=True), "no residual"),
    ("int8", dict(dtype=INT8), "not int8"),
    ("fp8 per-column scale", dict(dtype=E4M3, b_scale_len=64), "per-tensor scales"),
    ("e5m2 pair", dict(dtype=E5M2), "e5m2 x e5m2"),
    ("f32 bias", dict(dtype=F32, bias=True), "without bias or activation"),
    ("fp8 K not 16", dict(dtype=E4M3, K=40), "divisible by 16"),
]


@pytest.mark.parametrize(
    "name, spec, reason", CUBLASLT_REFUSED, ids=lambda x: x if isinstance(x, str) else ""
)
def test_cublaslt_refusals_agree_with_the_mirror(name, spec, reason):
    from jax_ops._src.gemm import tuning
    from jax_ops._src.gemm.validation import Config

    dtype, K, N, M = spec.get("dtype", BF16), spec.get("K", 64), 64, 32
    r = rngs(4)
    eight_bit = jnp.dtype(dtype).itemsize == 1
    a, b = operand(r[0], (M, K), dtype), operand(r[1], (N, K) if eight_bit else (K, N), dtype)
    out = BF16 if eight_bit or dtype == INT8 else dtype
    arrays = {}
    if spec.get("residual"):
        arrays["residual"] = operand(r[2], (M, N), out)
    if spec.get("bias"):
        arrays["bias"] = operand(r[3], (N,), F32)
    if eight_bit:
        arrays.update(a_scale=jnp.float32(1.0), b_scale=jnp.ones((spec.get("b_scale_len", 1),), F32))
    act = spec.get("activation")

    def fn(a, b, arrays):
        return jax_ops.gemm(
            a, b, activation=act, out_dtype=out, transpose_b=eight_bit, implementation="ffi", **arrays
        )

    cfg = Config(out_dtype=jnp.dtype(out), activation=act or "identity", transpose_b=eight_bit)
    given = tuple(arrays.get(k) for k in ("bias", "c", "residual", "a_scale", "b_scale"))
    assert reason in tuning.cublaslt_refusal(cfg, a.dtype, b.dtype, out, N, K, given)
    with (
        gemm_ops.overrides(plan="cublaslt"),
        pytest.raises(Exception, match=f"cannot run this GEMM: .*{reason}"),
    ):
        jax.block_until_ready(jax.jit(fn)(a, b, arrays))
