"""The mask operand of the FFI contract (ffi_cuda/attention/params.h): bit-packed along the keys into uint32 words,
whole 128-key groups per line. The packing against numpy's bit order, the backward's key-major copies
(mask_by_key, bias_by_key), and the targets' refusal of an unpacked or wrongly sized mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import qkv

import jax_ops
from jax_ops._src.attention.ffi import mask_words, packed_mask
from jax_ops._src.attention.heuristics import BWD_TARGET, FWD_TARGET
from jax_ops._src.attention.validation import Config

MASKED = Config(1.0, False, -1, -1, has_bias=False, has_mask=True, has_q_seqlen=False, has_kv_seqlen=False)


def _unpack(words, keys):
    """numpy's view of the contract: key s = bit s % 32 of word s // 32 (little-endian bit order)."""
    as_bytes = np.asarray(words).astype("<u4").view(np.uint8)
    return np.unpackbits(as_bytes, axis=-1, bitorder="little")[..., :keys].astype(bool)


@pytest.mark.parametrize("keys", [1, 31, 32, 33, 128, 129, 300])
@pytest.mark.parametrize("shape", [(2, 1, 5), (1, 3, 1)])
def test_bits_and_padding(keys, shape):
    rng = np.random.default_rng(keys)
    mask = rng.random((*shape, keys)) < 0.6
    words = packed_mask(MASKED, jnp.asarray(mask), keys)
    assert words.dtype == jnp.uint32 and words.shape == (*shape, mask_words(keys))
    assert mask_words(keys) % 4 == 0 and mask_words(keys) * 32 >= keys
    np.testing.assert_array_equal(_unpack(words, keys), mask)
    tail = _unpack(words, mask_words(keys) * 32)[..., keys:]
    assert not tail.any()  # the bits past S are clear


def test_key_broadcast_mask_is_widened():
    mask = jnp.asarray(np.array([True, False, True])[None, None, :, None])  # [1, 1, T=3, 1]
    words = packed_mask(MASKED, mask, 70)
    np.testing.assert_array_equal(_unpack(words, 70), np.broadcast_to(np.asarray(mask), (1, 1, 3, 70)))


def test_mask_by_key_is_the_packing_along_the_queries():
    # The backward's mask_by_key: the mask with T and S swapped, packed along the queries; a key-broadcast mask
    # [1, 1, T, 1] becomes one broadcast key line of T query bits.
    rng = np.random.default_rng(3)
    mask = rng.random((2, 1, 37, 70)) < 0.5  # [B, 1, T, S]
    by_key = packed_mask(MASKED, jnp.swapaxes(jnp.asarray(mask), 2, 3), 37)
    assert by_key.shape == (2, 1, 70, mask_words(37))
    np.testing.assert_array_equal(_unpack(by_key, 37), np.swapaxes(mask, 2, 3))
    rows = np.array([True, False, True])[None, None, :, None]  # [1, 1, T=3, 1]
    by_key = packed_mask(MASKED, jnp.swapaxes(jnp.asarray(rows), 2, 3), 3)
    assert by_key.shape == (1, 1, 1, mask_words(3))
    np.testing.assert_array_equal(_unpack(by_key, 3), np.swapaxes(rows, 2, 3))


def test_no_mask_gives_the_dummy_word():
    unmasked = Config(1.0, False, -1, -1, False, False, False, False)
    words = packed_mask(unmasked, None, 4)
    assert words.shape == (1, 1, 1, 1) and words.dtype == jnp.uint32


def _raw_fwd(q, k, mask_operand):
    out = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((1, q.shape[2], q.shape[1]), jnp.float32),
    )
    bias = jnp.zeros((1, 1, 1, 1), jnp.float32)
    seqlen = jnp.zeros((1,), jnp.int32)
    return jax_ops._ffi.ffi_call(
        FWD_TARGET, out, q, k, k, bias, mask_operand, seqlen, seqlen, **MASKED.fwd_attrs()
    )


@pytest.mark.parametrize(
    "operand, message",
    [
        (jnp.ones((1, 1, 4, 40), bool), "must have 4 words per line"),
        (jnp.ones((1, 1, 4, 8), jnp.uint32), "must have 4 words per line"),
        (jnp.ones((1, 1, 4, 4), jnp.int32), "must be uint32"),
    ],
)
def test_target_refuses_an_unpacked_mask(operand, message):
    q, k, _ = qkv(1, 4, 40, 2, 2, 8)
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(_raw_fwd(q, k, operand))


MASKED_BIASED = Config(
    1.0, False, -1, -1, has_bias=True, has_mask=True, has_q_seqlen=False, has_kv_seqlen=False
)


def _raw_bwd(mask_by_key, bias_by_key, T=5, S=40):
    """The backward target on a [1, 1, T, S] mask and bias, with the given key-major operands."""
    q, k, v = qkv(1, T, S, 2, 2, 8)
    bias = jnp.zeros((1, 1, T, S), jnp.float32)
    mask = packed_mask(MASKED_BIASED, jnp.ones((1, 1, T, S), bool), S)
    seqlen = jnp.zeros((1,), jnp.int32)
    o, lse = q, jnp.zeros((1, 2, T), jnp.float32)
    out = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(bias.shape, bias.dtype),
    )
    return jax_ops._ffi.ffi_call(
        BWD_TARGET,
        out,
        q,
        k,
        v,
        bias,
        mask,
        seqlen,
        seqlen,
        o,
        lse,
        q,
        mask_by_key,
        bias_by_key,
        **MASKED_BIASED.bwd_attrs(),
    )


def _good_by_key(T=5, S=40):
    return packed_mask(MASKED_BIASED, jnp.ones((1, 1, S, T), bool), T), jnp.zeros((1, 1, S, T), jnp.float32)


def test_bwd_target_takes_the_key_major_operands():
    dq, dk, dv, db = jax.block_until_ready(_raw_bwd(*_good_by_key()))
    assert np.isfinite(np.asarray(dq)).all() and db.shape == (1, 1, 5, 40)


@pytest.mark.parametrize(
    "which, operand, message",
    [
        ("mask", jnp.ones((1, 1, 5, 4), jnp.uint32), "mask_by_key"),  # not key-major: 5 lines, not 40
        ("mask", jnp.ones((1, 1, 40, 8), jnp.uint32), "mask_by_key"),  # words for 256 queries, not 5
        ("mask", jnp.ones((1, 1, 40, 4), jnp.int32), "mask_by_key must be uint32"),
        ("bias", jnp.zeros((1, 1, 5, 40), jnp.float32), "bias_by_key"),  # T and S not swapped
        ("bias", jnp.zeros((1, 1, 40, 5), jnp.bfloat16), "bias_by_key has dtype"),
    ],
)
def test_bwd_target_refuses_a_wrong_key_major_operand(which, operand, message):
    mask_by_key, bias_by_key = _good_by_key()
    if which == "mask":
        mask_by_key = operand
    else:
        bias_by_key = operand
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(_raw_bwd(mask_by_key, bias_by_key))
