"""NaN and Inf inputs on the CPU: the CPU twin ("ffi") and the XLA reference ("xla") propagate them as jax.nn
does into the rows that read them, leave other rows alone, and keep rows without keys at 0 (docs/attention.md,
"NaN and Inf"). The CUDA kernels run the same cases in test_attention_gpu.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import (
    NONFINITE_CASES,
    assert_nonfinite_grads,
    assert_nonfinite_outputs,
    nonfinite_case,
    qkv,
)

import jax_ops
from jax_ops import attention

IMPLS = ["ffi", "xla"]
SHAPE = (2, 70, 70, 4, 2, 16)  # two 64-key tiles of the CPU twin; GQA groups of 2


@functools.partial(jax.jit, static_argnames="impl")
def attend(q, k, v, bias, mask, q_seqlen, impl):
    return jax_ops.dot_product_attention(
        q,
        k,
        v,
        bias,
        mask,
        is_causal=True,
        query_seq_lengths=q_seqlen,
        implementation=impl,
        return_residual=True,
    )


@functools.partial(jax.jit, static_argnames="impl")
def attend_grads(q, k, v, bias, mask, q_seqlen, w, impl):
    """The gradients (q, k, v, and bias when given) of sum(w * o)."""

    def loss(q, k, v, bias):
        return jnp.sum(w * attend(q, k, v, bias, mask, q_seqlen, impl)[0].astype(jnp.float32))

    return jax.grad(loss, (0, 1, 2) if bias is None else (0, 1, 2, 3))(q, k, v, bias)


def forward_and_grads(c, impl):
    """o, lse and the gradients of a case's call; jitted once per input structure, shared across cases."""
    a = c.args
    w = jax.random.normal(jax.random.key(7), a["q"].shape, jnp.float32)
    out, lse = attend(**a, impl=impl)
    grads = attend_grads(**a, w=w, impl=impl)
    return out, lse, [np.asarray(g, np.float32) for g in grads]


def expected_forward(c, impl):
    return attend(**c.expected, impl=impl)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_nonfinite_inputs(case, impl):
    c = nonfinite_case(case, *SHAPE)
    out, lse, grads = forward_and_grads(c, impl)
    ref, ref_lse = expected_forward(c, impl)
    assert_nonfinite_outputs(c, out, lse, ref, ref_lse, atol=1e-5)
    assert_nonfinite_grads(c, grads)


@pytest.mark.parametrize("dtype,impl", [(jnp.bfloat16, "ffi"), (jnp.bfloat16, "xla"), (jnp.float16, "ffi")])
@pytest.mark.parametrize("case", ["q_nan", "k_posinf", "v_nan"])
def test_nonfinite_inputs_low_precision(case, dtype, impl):
    c = nonfinite_case(case, *SHAPE, dtype=dtype)
    out, lse, grads = forward_and_grads(c, impl)
    ref, ref_lse = expected_forward(c, impl)
    assert_nonfinite_outputs(c, out, lse, ref, ref_lse, atol=1e-2)
    assert_nonfinite_grads(c, grads)


def test_nonfinite_through_split_kv_merge():
    # The split-KV forward (4 key chunks merged by log-sum-exp in Python): a NaN chunk keeps the row NaN, and a
    # +Inf key past a batch's kv length (so in a chunk with no allowed key) changes nothing.
    B, T, S, N, K, D = 2, 1, 256, 4, 2, 16
    q, k, v = (np.array(x) for x in qkv(B, T, S, N, K, D, seed=2))
    q[..., 5] = np.abs(q[..., 5]) + 0.1
    q[0, 0, 1, 3] = np.nan  # row (0, 0, 1)
    k[0, 200, 1, 5] = np.inf  # chunk 3 of batch 0: rows of heads 2, 3 see +Inf
    k[1, 200, 0, 5] = np.inf  # batch 1 has 100 keys: masked
    kvl = jnp.array([256, 100], jnp.int32)
    hit = np.zeros((B, T, N), bool)
    hit[0, 0, [1, 2, 3]] = True

    def run(q, k, v):
        return jax.jit(
            lambda q, k, v: jax_ops.dot_product_attention(
                q, k, v, key_value_seq_lengths=kvl, implementation="ffi", return_residual=True
            )
        )(q, k, v)  # a fresh jit per call: the kv_splits knob is read at trace time

    with attention.overrides(kv_splits=4):
        out, lse = run(q, k, v)
    k_clean = k.copy()
    k_clean[1, 200, 0, 5] = 0.0
    ref, ref_lse = run(q, k_clean, v)  # unsplit on the CPU
    out, lse, ref, ref_lse = (np.asarray(x) for x in (out, lse, ref, ref_lse))
    assert np.isnan(out[hit]).any(-1).all() and np.isnan(lse[hit]).all()
    np.testing.assert_allclose(out[~hit], ref[~hit], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(lse[~hit], ref_lse[~hit], atol=1e-5, rtol=1e-5)
