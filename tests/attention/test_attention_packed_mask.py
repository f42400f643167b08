"""The mask operand of the FFI contract (ffi_cuda/attention/params.h): bit-packed along the keys into uint32 words,
whole 128-key groups per line. The packing against numpy's bit order, and the targets' refusal of an unpacked or
wrongly sized mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from attention_cases import qkv

import jax_ops
from jax_ops._src.attention.ffi import mask_words, packed_mask
from jax_ops._src.attention.heuristics import FWD_TARGET
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
