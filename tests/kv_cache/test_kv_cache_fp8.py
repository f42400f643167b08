"""float8 (e4m3) pages with per-(page, kv head) scales: the append's quantisation rules on every path (the jnp
path and the C++ twin agree byte for byte), its error bound, and decode against the dequantised cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err, tol
from test_kv_cache import nn_reference, random_cache

from jax_ops import kv_cache as kc

FP8 = jnp.float8_e4m3fn
PAGE = 8


def quantized(cache):
    return kc.to_float8(cache)


def dequantized(cache):
    """The float32 cache a float8 one stands for (pages times their scales)."""
    deq = lambda p, s: p.astype(jnp.float32) * s[:, None, :, None]  # noqa: E731
    return kc.PagedKVCache(
        deq(cache.k_pages, cache.k_scales),
        deq(cache.v_pages, cache.v_scales),
        cache.block_table,
        cache.lengths,
    )


def bits(x):
    return np.asarray(x).view(np.uint8) if x.dtype == FP8 else np.asarray(x)


def grown_cache(rng, *, token_dtype, steps, hkv=2, d=16, batch=3, num_pages=24):
    """A float8 cache filled by a sequence of appends (chunk sizes and magnitudes from ``steps``) on both paths;
    returns the two caches and every token appended, per request, as float32."""
    max_pages = num_pages // batch
    table = rng.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
    empty = kc.create(num_pages, PAGE, hkv, d, FP8, batch, max_pages).replace(block_table=jnp.asarray(table))
    caches = {"xla": empty, "ffi": empty}
    tokens = [[] for _ in range(batch)]
    for T, magnitude in steps:
        k = jnp.asarray(magnitude * rng.standard_normal((batch, T, hkv, d)), token_dtype)
        v = jnp.asarray(rng.standard_normal((batch, T, hkv, d)), token_dtype)
        for name in caches:
            caches[name] = kc.append(caches[name], k, v, implementation=name)
        for b in range(batch):
            tokens[b].append(np.asarray(k[b].astype(jnp.float32)))
    return caches["xla"], caches["ffi"], [np.concatenate(t) for t in tokens]


STEPS = [(3, 1.0), (1, 4.0), (2, 0.1), (PAGE + 3, 2.0), (1, 50.0), (1, 0.0)]


@pytest.mark.parametrize("token_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_append_paths_agree_byte_for_byte(token_dtype):
    rng = np.random.default_rng(1)
    jnp_cache, twin_cache, _ = grown_cache(rng, token_dtype=token_dtype, steps=STEPS)
    for name in ("k_pages", "v_pages", "k_scales", "v_scales"):
        np.testing.assert_array_equal(
            bits(getattr(jnp_cache, name)), bits(getattr(twin_cache, name)), err_msg=name
        )
    np.testing.assert_array_equal(twin_cache.lengths, sum(t for t, _ in STEPS))


def test_append_quantisation_error_is_bounded():
    """Each value within half an e4m3 step of the original: 2^-4 relative, or 2^-10 of its page's scale below the
    normal range; re-scaling a page (a power of two) adds nothing more."""
    rng = np.random.default_rng(2)
    for steps in ([(2 * PAGE, 1.0)], STEPS):
        _, cache, tokens = grown_cache(rng, token_dtype=jnp.float32, steps=steps)
        k = dequantized(cache).k_pages
        table = np.asarray(cache.block_table)
        scales = np.asarray(cache.k_scales)
        for b, x in enumerate(tokens):
            pos = np.arange(len(x))
            pages = table[b, pos // PAGE]
            got = np.asarray(k[pages, pos % PAGE])  # [L, Hkv, D]
            bound = 2.0**-4 * np.abs(x) + 2.0**-10 * scales[pages][:, :, None]
            assert np.all(np.abs(got - x) <= bound)


def test_scale_rules():
    cache = kc.create(4, PAGE, 1, 4, FP8, 1, 2).replace(block_table=jnp.asarray([[2, 0]], jnp.int32))
    assert cache.quantized and cache.k_scales.shape == (4, 1)
    zeros = jnp.zeros((1, 2, 1, 4), jnp.float32)
    for impl in ("xla", "ffi"):
        c = kc.append(cache, zeros, zeros, implementation=impl)
        assert float(c.k_scales[2, 0]) == 0 and not np.any(bits(c.k_pages))  # a page of zeros: scale 0
        ones = jnp.ones((1, 1, 1, 4), jnp.float32)
        c = kc.append(c, 2 * ones, ones, implementation=impl)  # grows: the zeros stay zeros
        assert float(c.k_scales[2, 0]) == 2.0**-7  # the smallest power of two with 2 <= 448 p
        c = kc.append(c, ones, ones, implementation=impl)  # smaller: the scale stays
        assert float(c.k_scales[2, 0]) == 2.0**-7
        c = kc.append(
            c, 192 * ones, ones, implementation=impl
        )  # grows to 2^-1: earlier rows re-scaled exactly
        assert float(c.k_scales[2, 0]) == 0.5
        deq = np.asarray(dequantized(c).k_pages[2, :5, 0])
        np.testing.assert_array_equal(deq, [[0] * 4, [0] * 4, [2] * 4, [1] * 4, [192] * 4])
        # a write that starts at a page's row 0 ignores the page's old scale (a stale scale of a reused page)
        stale = c.replace(k_scales=c.k_scales.at[0, 0].set(1e6))
        tail = jnp.zeros((1, PAGE - 4, 1, 4))  # rows 5..7 of page 2, then row 0 of page 0
        after = kc.append(stale, tail, tail, implementation=impl)
        assert float(after.k_scales[0, 0]) == 0


@pytest.mark.parametrize("q_dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("implementation", ["xla", "ffi"])
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_equals_the_dequantised_cache(q_dtype, implementation, splits):
    rng = np.random.default_rng(3)
    lengths = [0, 1, PAGE, 5 * PAGE + 3]
    cache = quantized(random_cache(rng, lengths=lengths, page_size=PAGE, hkv=2, d=32, dtype=jnp.float32))
    q = jnp.asarray(rng.standard_normal((len(lengths), 3, 8, 32)), q_dtype)
    with kc.overrides(splits=splits):
        out = jax.jit(lambda q, c: kc.decode(q, c, implementation=implementation))(q, cache)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref, visible = nn_reference(q, dequantized(cache))
    assert rel_err(out, ref) < tol(q_dtype)
    assert np.all(np.asarray(out, np.float32)[~visible] == 0)


def test_append_then_decode_equals_dequantised_concatenation():
    rng = np.random.default_rng(4)
    jnp_cache, twin_cache, _ = grown_cache(rng, token_dtype=jnp.bfloat16, steps=STEPS[:4])
    q = jnp.asarray(rng.standard_normal((3, 2, 4, 16)), jnp.bfloat16)
    ref, _ = nn_reference(q, dequantized(twin_cache))
    for impl in ("xla", "ffi"):
        assert rel_err(kc.decode(q, twin_cache, implementation=impl), ref) < tol(jnp.bfloat16)


def test_nan_token_poisons_only_its_page():
    rng = np.random.default_rng(5)
    cache = kc.create(6, PAGE, 1, 8, FP8, 2, 3).replace(
        block_table=jnp.asarray([[0, 1, 2], [3, 4, 5]], jnp.int32)
    )
    k = jnp.asarray(rng.standard_normal((2, 3, 1, 8)), jnp.float32)
    k = k.at[0, 1, 0, 2].set(jnp.nan)
    q = jnp.asarray(rng.standard_normal((2, 4, 8)), jnp.float32)
    for impl in ("xla", "ffi"):
        c = kc.append(cache, k, k, implementation=impl)
        assert np.isnan(float(c.k_scales[0, 0])) and np.isfinite(float(c.k_scales[3, 0]))
        out = np.asarray(kc.decode(q, c, implementation=impl))
        assert np.all(np.isnan(out[0])) and np.all(np.isfinite(out[1]))


def test_copy_pages_copies_the_scales():
    rng = np.random.default_rng(6)
    cache = quantized(random_cache(rng, lengths=[PAGE, 2], page_size=PAGE, hkv=2, d=8, dtype=jnp.float32))
    src, dst = int(cache.block_table[0, 0]), int(cache.num_pages - 1)
    copied = kc.copy_pages(cache, [(src, dst)])
    np.testing.assert_array_equal(copied.k_scales[dst], cache.k_scales[src])
    np.testing.assert_array_equal(copied.v_scales[dst], cache.v_scales[src])
    np.testing.assert_array_equal(bits(copied.k_pages[dst]), bits(cache.k_pages[src]))


def test_cache_pytree_and_bad_inputs():
    cache = kc.create(4, PAGE, 2, 8, FP8, 2, 2)
    assert len(jax.tree_util.tree_leaves(cache)) == 6
    same = jax.jit(lambda c: c)(cache)
    assert same.quantized and same.k_scales.shape == (4, 2)
    with pytest.raises(ValueError, match="k_scales .* is required with float8 pages"):
        cache.replace(k_scales=None)
    with pytest.raises(ValueError, match=r"v_scales must have shape \(P, Hkv\) = \(4, 2\)"):
        cache.replace(v_scales=jnp.zeros((4, 3), jnp.float32))
    with pytest.raises(TypeError, match="k_scales must have dtype"):
        cache.replace(k_scales=jnp.zeros((4, 2), jnp.float16))
    plain = kc.create(4, PAGE, 2, 8, jnp.float16, 2, 2)
    with pytest.raises(ValueError, match="k_scales must be None for float16 pages"):
        plain.replace(k_scales=jnp.zeros((4, 2), jnp.float32))
    with pytest.raises(TypeError, match="q must have dtype"):
        kc.decode(jnp.zeros((2, 4, 8), FP8), cache)
    with pytest.raises(TypeError, match="k_new must have dtype"):
        kc.append(cache, jnp.zeros((2, 2, 8), FP8), jnp.zeros((2, 2, 8), FP8))
    with pytest.raises(TypeError, match="v_new has dtype float16 but k_new has float32"):
        kc.append(cache, jnp.zeros((2, 2, 8), jnp.float32), jnp.zeros((2, 2, 8), jnp.float16))
