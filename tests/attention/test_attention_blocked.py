"""The jnp path in blocks (jax_ops/_src/attention/blocked.py) against the dense reference: forward, log-sum-exp
and every gradient (bias of each broadcast shape included) for causal / window / lengths / masks / GQA, ragged
block tails, float32 and float64; NaN/Inf propagation; jax.debug_infs; the dispatch rule and its memory."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import NONFINITE_CASES, assert_nonfinite_grads, assert_nonfinite_outputs, nonfinite_case
from helpers import rel_err

import jax_ops
from jax_ops import attention
from jax_ops._src.attention import blocked

B, T, S, N, K, D = 2, 37, 53, 4, 2, 16  # T and S not multiples of the blocks below


def _inputs(dtype, seed, t=T, s=S, n=N, kv=K):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((B, t, n, D)), dtype)
    k = jnp.asarray(rng.standard_normal((B, s, kv, D)), dtype)
    v = jnp.asarray(rng.standard_normal((B, s, kv, D)), dtype)
    return q, k, v, rng


def _run(block, q, k, v, bias, mask, kw, grads=True):
    """(o, lse, grads of sum(w * o) w.r.t. q, k, v and bias) on the jnp path, dense (block None) or in blocks."""

    @jax.jit
    def forward(q, k, v, bias):
        return jax_ops.dot_product_attention(
            q, k, v, bias, mask, implementation="xla", return_residual=True, **kw
        )

    with attention.overrides(jnp_block=block):
        o, lse = forward(q, k, v, bias)
        if not grads:
            return o, lse, []
        w = jax.random.normal(jax.random.key(3), o.shape, jnp.float32)
        argnums = (0, 1, 2) if bias is None else (0, 1, 2, 3)
        g = jax.jit(jax.grad(lambda *a: jnp.sum(w * forward(*a)[0].astype(jnp.float32)), argnums))(
            q, k, v, bias
        )
    return o, lse, list(g)


CASES = {
    "plain": dict(),
    "causal": dict(is_causal=True),
    "window": dict(local_window_size=(9, 4)),
    "lengths": dict(is_causal=True, query_seq_lengths=[30, 37], key_value_seq_lengths=[53, 0]),
    "bias_full": dict(bias=(B, N, T, S)),
    "bias_shared": dict(bias=(1, 1, T, S), is_causal=True),
    "bias_keys": dict(bias=(B, 1, 1, S)),
    "bias_heads": dict(bias=(1, N, 1, 1), key_value_seq_lengths=[20, 53]),
    "mask_keys": dict(mask=(B, 1, 1, S)),
    "mask_full": dict(mask=(B, N, T, S), bias=(1, N, T, S)),
}


def _case(name, dtype, seed=0):
    kw = dict(CASES[name])
    q, k, v, rng = _inputs(dtype, seed)
    bias = mask = None
    if "bias" in kw:
        bias = jnp.asarray(rng.standard_normal(kw.pop("bias")), dtype)
    if "mask" in kw:
        mask = jnp.asarray(rng.random(kw.pop("mask")) > 0.3)
    for key in ("query_seq_lengths", "key_value_seq_lengths"):
        if key in kw:
            kw[key] = jnp.asarray(kw[key], jnp.int32)
    return q, k, v, bias, mask, kw


@pytest.mark.parametrize("name,block", [(n, 8) for n in CASES] + [("causal", 16), ("mask_full", 16)])
def test_blocks_match_the_dense_reference(name, block):
    q, k, v, bias, mask, kw = _case(name, jnp.float32)
    o, lse, g = _run(block, q, k, v, bias, mask, kw)
    ro, rlse, rg = _run(None, q, k, v, bias, mask, kw)
    assert rel_err(o, ro) < 1e-5
    lse, rlse = np.asarray(lse), np.asarray(rlse)
    np.testing.assert_array_equal(np.isinf(lse), np.isinf(rlse))  # the same empty rows (-inf)
    np.testing.assert_allclose(np.where(np.isinf(rlse), 0, lse), np.where(np.isinf(rlse), 0, rlse), atol=1e-5)
    for i, (a, b) in enumerate(zip(g, rg)):
        assert a.shape == b.shape and a.dtype == b.dtype
        if (
            i == 3 and bias.shape[3] == 1
        ):  # a bias constant over the keys shifts no softmax: its gradient is 0
            assert np.abs(np.asarray(a)).max() < 1e-4 and np.abs(np.asarray(b)).max() < 1e-4
        else:
            assert rel_err(a, b) < 1e-5


@pytest.mark.parametrize("groups", [1, 4])
def test_blocks_gqa_and_float64(x64, groups):
    q, k, v, rng = _inputs(jnp.float64, 5, n=4, kv=4 // groups)
    bias = jnp.asarray(
        rng.standard_normal((1, 4, 1, S)), jnp.float64
    )  # per-key bias: dbias sums over queries
    kw = dict(is_causal=True)
    o, lse, g = _run(16, q, k, v, bias, None, kw)
    ro, rlse, rg = _run(None, q, k, v, bias, None, kw)
    assert o.dtype == jnp.float64 and rel_err(o, ro) < 1e-12
    np.testing.assert_allclose(lse, rlse, rtol=1e-12)
    for a, b in zip(g, rg):
        assert a.dtype == b.dtype and rel_err(a, b) < 1e-11


def test_blocks_in_bfloat16():
    q, k, v, bias, mask, kw = _case("lengths", jnp.bfloat16)
    o, _, g = _run(16, q, k, v, bias, mask, kw)
    ro, _, rg = _run(None, q, k, v, bias, mask, kw)
    assert o.dtype == jnp.bfloat16 and rel_err(o, ro) < 1e-2
    for a, b in zip(g, rg):
        assert rel_err(a, b) < 2e-2


@functools.partial(jax.jit, static_argnames="block")
def _nonfinite_forward(q, k, v, bias, mask, q_seqlen, block):
    with attention.overrides(jnp_block=block):
        return jax_ops.dot_product_attention(
            q, k, v, bias, mask, is_causal=True, query_seq_lengths=q_seqlen, implementation="xla",
            return_residual=True,
        )  # fmt: skip


@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_blocks_propagate_nonfinite_inputs(case):
    c = nonfinite_case(case, 2, 70, 70, 4, 2, 16)
    a = c.args
    out, lse = _nonfinite_forward(**a, block=16)
    ref, ref_lse = _nonfinite_forward(**c.expected, block=16)
    assert_nonfinite_outputs(c, out, lse, ref, ref_lse, atol=1e-5)
    w = jax.random.normal(jax.random.key(7), a["q"].shape, jnp.float32)
    argnums = (0, 1, 2) if a["bias"] is None else (0, 1, 2, 3)

    def loss(q, k, v, bias):
        return jnp.sum(w * _nonfinite_forward(q, k, v, bias, a["mask"], a["q_seqlen"], block=16)[0])

    grads = jax.jit(jax.grad(loss, argnums))(a["q"], a["k"], a["v"], a["bias"])
    assert_nonfinite_grads(c, [np.asarray(x, np.float32) for x in grads])


def test_blocks_create_no_inf_under_debug_infs():
    q, k, v, rng = _inputs(jnp.float32, 8)
    mask = jnp.asarray(rng.random((B, 1, T, S)) > 0.5).at[1, 0, 4].set(False)  # row 4 of batch 1: no key
    f = lambda q, k, v: jax_ops.dot_product_attention(q, k, v, mask=mask, implementation="xla")  # noqa: E731
    with attention.overrides(jnp_block=16), jax.debug_infs(True):
        out = f(q, k, v)
        g = jax.jit(jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), (0, 1, 2)))(q, k, v)
    assert np.all(np.asarray(out)[1, 4] == 0)
    assert all(np.isfinite(np.asarray(x)).all() for x in g)


def test_rule_runs_blocks_past_the_dense_budget_and_bounds_memory():
    # 1 x 4096 x 2 heads x 4096 keys: 128 MiB of fp32 logits, past the 64 MiB budget, so blocks of 512.
    t = s = 4096
    assert not blocked.dense_fits((1, t, 2, 64), s) and blocked.dense_fits((1, 1024, 2, 64), 1024)
    q = jax.ShapeDtypeStruct((1, t, 2, 64), jnp.float32)

    def fwd_bwd(q, k, v):
        return jax.grad(
            lambda *a: jnp.sum(jax_ops.dot_product_attention(*a, implementation="xla")), (0, 1, 2)
        )(q, k, v)

    compiled = jax.jit(fwd_bwd).lower(q, q, q).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        pytest.skip("no compiled memory analysis on this backend")
    assert analysis.temp_size_in_bytes < 64 << 20, (
        analysis.temp_size_in_bytes
    )  # never the [B, N, T, S] logits
    # and the default 512-blocks agree with the dense reference on a size with a ragged tail
    q, k, v, _ = _inputs(jnp.float32, 9, t=600, s=700)
    o, lse, _ = _run(512, q, k, v, None, None, dict(is_causal=True), grads=False)
    ro, rlse, _ = _run(None, q, k, v, None, None, dict(is_causal=True), grads=False)
    assert rel_err(o, ro) < 1e-5 and rel_err(lse, rlse) < 1e-6


def test_blocks_under_vmap():
    q, k, v, _ = _inputs(jnp.float32, 11)

    def f(q, k, v):
        return jax_ops.dot_product_attention(q, k, v, is_causal=True, implementation="xla")

    with attention.overrides(jnp_block=16):
        out = jax.jit(jax.vmap(f))(q[:, None], k[:, None], v[:, None])
    ref = jax.vmap(f)(q[:, None], k[:, None], v[:, None])
    assert rel_err(out, ref) < 1e-5
