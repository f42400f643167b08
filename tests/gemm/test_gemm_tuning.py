"""The GEMM dispatch table (jax_ops/_src/gemm/tuning.py): problem classes, the choice `bench gemm --tune` records,
the table file, and how a table entry reaches the kernel call (plan attribute, workspace, no transposed copy of a
for the cublaslt plan). The table lookup runs on GPUs only; here the traced arch is patched to "sm90" and the call
runs the CPU twin, which accepts every plan."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from gemm_cases import BF16, E4M3, E5M2, F16, F32, operand, oracle, rngs, tol
from helpers import rel_err

import jax_ops
from jax_ops import _ffi, gemm_ops
from jax_ops._src.gemm import ffi as gemm_ffi
from jax_ops._src.gemm import tuning
from jax_ops._src.gemm.validation import Config
from jax_ops.bench import gemm as bench_gemm

CFG = Config(out_dtype=np.dtype(BF16))


def test_class_key_buckets():
    key = tuning.class_key
    assert key(CFG, BF16, 16, 32 << 20, False, False) == "bfloat16|m<=16|w<=l2|plain"
    assert key(CFG, BF16, 17, 64 << 20, True, False) == "bfloat16|m<=64|w>l2|lt"
    gelu = Config(out_dtype=np.dtype(BF16), activation="gelu")
    assert key(gelu, BF16, 300, 1, True, False) == "bfloat16|m>256|w<=l2|fused"
    tanh = Config(out_dtype=np.dtype(BF16), activation="gelu_tanh")
    assert key(tanh, BF16, 256, 1, False, True) == "bfloat16|m<=256|w<=l2|fused"  # a residual: ours only
    tf32 = Config(out_dtype=np.dtype(F32), tf32=True)
    assert key(tf32, F32, 1, 1, False, False) == "float32+tf32|m<=16|w<=l2|plain"
    gated = Config(out_dtype=np.dtype(BF16), gated="separate", activation="silu")
    assert key(gated, BF16, 1, 1, False, False).endswith("|fused")


def test_best_plans_geomean_and_margin():
    times = {
        "a": {"auto": [1.0, 2.0], "cublaslt": [0.8, 1.8]},  # geomean ratio 0.85: recorded
        "b": {"auto": [1.0, 1.0], "cublaslt": [0.99, 0.98]},  # within the 3 % margin: auto stays
        "c": {"auto": [1.0, 1.0], "cublaslt": [0.5]},  # failed a shape: not a candidate
        "d": {"cublaslt": [0.1]},  # no auto time: nothing to compare
        "e": {"auto": [1.0], "cublaslt": [2.0], "sm90": [0.9]},
    }
    assert tuning.best_plans(times) == {"a": "cublaslt", "e": "sm90"}


def test_table_file_round_trip(tmp_path, monkeypatch):
    monkeypatch.setattr(tuning, "TABLE", {"sm80": {"float16|m<=16|w<=l2|plain": "cublaslt"}})
    path = tuning.write_table("sm90", {"bfloat16|m<=16|w<=l2|plain": "cublaslt"}, "H200", tmp_path / "t.json")
    loaded = tuning._load(path)
    assert loaded == {
        "sm80": {"float16|m<=16|w<=l2|plain": "cublaslt"},
        "sm90": {"bfloat16|m<=16|w<=l2|plain": "cublaslt"},
    }
    tuning.write_table("sm90", {}, "H100", path)
    assert tuning._load(path)["sm90"] == {}
    assert "H100" in path.read_text()


def test_shipped_table_is_well_formed():
    assert tuning.TABLE_PATH.exists()  # package data: installed with the module
    plans = set(_ffi.constants()["gemm_plans"]) - {"auto"}
    for arch, entries in tuning._load().items():
        assert arch.startswith("sm"), arch
        for key, plan in entries.items():
            dtype, rows, weights, epilogue = key.split("|")
            np.dtype(dtype.removesuffix("+tf32"))
            assert rows.startswith("m") and weights in ("w<=l2", "w>l2"), key
            assert epilogue in ("plain", "lt", "fused") and plan in plans, (key, plan)


@pytest.mark.parametrize(
    "cfg, dtypes, operands, why",
    [
        (CFG, (BF16, BF16), {}, None),
        (
            Config(out_dtype=np.dtype(BF16), activation="relu", write_preact=True),
            (BF16, BF16),
            {},
            "sign bits",
        ),
        (Config(out_dtype=np.dtype(BF16), activation="silu"), (BF16, BF16), {}, "relu or tanh-GELU"),
        (Config(out_dtype=np.dtype(BF16), gated="packed"), (BF16, BF16), {}, "gated"),
        (CFG, (BF16, BF16), {"residual": 1}, "residual"),
        (
            Config(out_dtype=np.dtype(BF16), transpose_b=True),
            (E4M3, E5M2),
            {"a_scale": 1, "b_scale": 1},
            None,
        ),
        (
            Config(out_dtype=np.dtype(BF16), transpose_b=True),
            (E5M2, E5M2),
            {"a_scale": 1, "b_scale": 1},
            "e5m2",
        ),
        (CFG, (E4M3, E4M3), {"a_scale": 1, "b_scale": 1}, "K-major"),
        (
            Config(out_dtype=np.dtype(BF16), transpose_b=True),
            (E4M3, E4M3),
            {"a_scale": 1, "b_scale": 8},
            "per-tensor",
        ),
        (Config(out_dtype=np.dtype(F32)), (F32, F32), {"bias": 1}, "without bias"),
        (Config(out_dtype=np.dtype(BF16)), (jnp.int8, jnp.int8), {"a_scale": 1, "b_scale": 1}, "not int8"),
    ],
)
def test_cublaslt_refusal(cfg, dtypes, operands, why):
    given = [
        jnp.ones(operands[k]) if k in operands else None
        for k in ("bias", "c", "residual", "a_scale", "b_scale")
    ]
    got = tuning.cublaslt_refusal(cfg, *dtypes, cfg.out_dtype, 64, 64, tuple(given))
    assert got is None if why is None else why in got


@pytest.fixture
def gpu_table(monkeypatch):
    """Calls traced as on an sm_90 GPU whose table sends bf16 plain GEMMs of up to 64 rows to cuBLASLt."""
    monkeypatch.setattr(gemm_ffi, "table_arch", lambda: "sm90")
    table = {"sm90": {"bfloat16|m<=64|w<=l2|plain": "cublaslt", "bfloat16|m<=64|w<=l2|lt": "cublaslt"}}
    monkeypatch.setattr(tuning, "TABLE", table)


def _eqns(jaxpr):
    """Every equation of a jaxpr and of the jaxprs nested in its equations' parameters."""
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in v if isinstance(v, tuple) else (v,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    yield from _eqns(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    yield from _eqns(sub)


class _Call:
    """An ffi_call equation's attributes and result shapes."""

    def __init__(self, eqn):
        self.attrs = dict(eqn.params["attributes"])
        self.shapes = [v.aval.shape for v in eqn.outvars]


def _ffi_calls(fn, *args):
    eqns = list(_eqns(jax.make_jaxpr(fn)(*args).jaxpr))
    return eqns, [_Call(e) for e in eqns if e.primitive.name == "ffi_call"]


def _plan(name: str) -> int:
    return _ffi.constants()["gemm_plans"].index(name)


def test_table_entry_reaches_the_call(gpu_table):
    r = rngs(3)
    a, w = operand(r[0], (2, 40, 24), BF16), operand(r[1], (40, 32), BF16)  # a transposed: [B, K, M]

    def fn(a, w):
        return jax_ops.gemm(a, w, transpose_a=True, implementation="ffi")

    eqns, (call,) = _ffi_calls(fn, a, w)
    assert call.attrs["plan"] == _plan("cublaslt") and call.attrs["transpose_a"]
    assert call.shapes[2] == (tuning.CUBLASLT_WORKSPACE_BYTES,)
    # cuBLASLt reads the transposed a as stored: no transposed copy before the call
    assert not any(e.primitive.name == "transpose" for e in eqns)
    np.testing.assert_array_less(rel_err(jax.jit(fn)(a, w), oracle(a, w, transpose_a=True)), tol(BF16))


def test_table_entry_not_taken_where_cublaslt_refuses(gpu_table):
    r = rngs(3)
    a, w = operand(r[0], (40, 24), BF16), operand(r[1], (24, 32), BF16)
    bias = operand(r[2], (32,), F32)

    def relu_grad(
        a, w, bias
    ):  # relu with its pre-activation (written for the backward): an "lt" class refusal
        y = lambda a: jax_ops.linear(a, w, bias, activation="relu", implementation="ffi")  # noqa: E731
        return jax.grad(lambda a: y(a).astype(F32).sum())(a)

    _, calls = _ffi_calls(relu_grad, a, w, bias)
    forward = [c for c in calls if c.attrs["write_preact"]]
    assert forward and all(c.attrs["plan"] == _plan("auto") and c.shapes[2] == (0,) for c in forward)
    # the backward's plain GEMMs (dz @ w^T; a^T @ dz has 24 rows) are in the table's class: cuBLASLt
    assert any(c.attrs["plan"] == _plan("cublaslt") for c in calls if not c.attrs["write_preact"])


def test_forced_knob_wins_over_the_table(gpu_table):
    a, w = jnp.ones((4, 8), BF16), jnp.ones((8, 16), BF16)
    with gemm_ops.overrides(plan="simt"):
        _, (call,) = _ffi_calls(lambda a, w: jax_ops.gemm(a, w, implementation="ffi"), a, w)
    assert call.attrs["plan"] == _plan("simt") and call.shapes[2] == (0,)


def test_fp8_b_made_k_major_for_cublaslt(gpu_table, monkeypatch):
    monkeypatch.setattr(tuning, "TABLE", {"sm90": {"float8_e4m3fn|m<=16|w<=l2|plain": "cublaslt"}})
    r = rngs(2)
    a, w = operand(r[0], (8, 32), E4M3), operand(r[1], (32, 48), E4M3)
    scale = jnp.ones((1,), F32)

    def fn(a, w):
        return jax_ops.gemm(a, w, a_scale=scale, b_scale=scale, out_dtype=BF16, implementation="ffi")

    _, (call,) = _ffi_calls(fn, a, w)
    assert call.attrs["transpose_b"] and call.attrs["plan"] == _plan("cublaslt")
    np.testing.assert_array_less(rel_err(jax.jit(fn)(a, w), oracle(a, w)), tol(BF16))


TUNE_KINDS = [(d, "plain") for d in bench_gemm.TUNE_DTYPES] + [
    (BF16, "bias_gelu_tanh"),
    (F16, "bias_gelu_tanh"),
]


@pytest.mark.parametrize("dtype, kind", TUNE_KINDS, ids=str)
def test_tune_cases_hit_their_class(dtype, kind, monkeypatch, x64):
    """A --tune case's class key is the one the traced call looks up: a table entry for it reaches the call."""
    fn, x, w, key = bench_gemm._tune_fn({"M": 16, "N": 64, "K": 32, "kind": kind, "dtype": dtype})
    monkeypatch.setattr(gemm_ffi, "table_arch", lambda: "sm90")
    monkeypatch.setattr(tuning, "TABLE", {"sm90": {key: "cublaslt"}})
    _, (call,) = _ffi_calls(fn, x, w)
    assert call.attrs["plan"] == _plan("cublaslt"), key
    assert [c for c in bench_gemm._tune_cases(quick=True)]  # the quick list is not empty
