"""The CUDA paged decode and append against a float64 reference and the jnp path, at serving sizes: D 64/128/256,
fp16/bf16 queries over pages of their dtype or float8, page sizes 16 and 64, GQA 1/4/8, chunks, softcap, every
split choice forced once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err, tol
from test_kv_cache import gathered, random_cache
from test_kv_cache_fp8 import dequantized, quantized

from jax_ops import kv_cache as kc

pytestmark = pytest.mark.gpu


def float64_reference(q, cache, softcap=None):
    """q [B, T, Hq, D] over the gathered cache in float64 numpy, causal within the chunk; empty rows 0."""
    k, v = (np.asarray(x.astype(jnp.float32), np.float64) for x in gathered(cache))
    q = np.asarray(q.astype(jnp.float32), np.float64)
    B, T, Hq, D = q.shape
    G = Hq // k.shape[2]
    out = np.zeros(q.shape)
    for b, L in enumerate(np.asarray(cache.lengths)):
        for t in range(T):
            visible = max(0, min(L, L - T + t + 1))
            if visible == 0:
                continue
            kk, vv = k[b, :visible], v[b, :visible]
            logits = np.einsum("kgd,skd->kgs", q[b, t].reshape(-1, G, D), kk) / np.sqrt(D)
            if softcap is not None:
                logits = softcap * np.tanh(logits / softcap)
            p = np.exp(logits - logits.max(-1, keepdims=True))
            o = np.einsum("kgs,skd->kgd", p / p.sum(-1, keepdims=True), vv)
            out[b, t] = o.reshape(Hq, D)
    return out


def poisoned_run(fn, *args):
    """Runs fn after filling the device with NaN garbage of the output's size (so unwritten rows show up)."""
    junk = jnp.full((1 << 22,), jnp.nan, jnp.float32)
    junk.block_until_ready()
    del junk
    return fn(*args)


CASES = [
    # lengths, page, hq, hkv, d, T
    ([1, 17, 300, 0, 1000, 64, 63, 129], 16, 32, 8, 128, 1),
    ([4096, 3001], 16, 32, 4, 128, 1),
    ([50, 700, 1], 64, 8, 8, 64, 1),
    ([333, 90], 16, 16, 2, 256, 1),
    ([100, 257, 5, 1000], 16, 32, 8, 128, 4),
    ([40, 530], 16, 8, 1, 128, 16),
]


# The kernel's load paths and split merges: the defaults, then the TMA load and the in-kernel (cluster) merge.
KERNEL_OPTIONS = {
    "default": {},
    "tma": dict(load="tma"),
    "kernel-merge": dict(merge="kernel"),
    "tma-kernel-merge": dict(load="tma", merge="kernel"),
}


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("splits", [None, 1, 2, 5])
@pytest.mark.parametrize("options", list(KERNEL_OPTIONS))
def test_cuda_decode_matches_float64(case, dtype, splits, options):
    lengths, page, hq, hkv, d, T = CASES[case]
    rng = np.random.default_rng(case * 7 + (splits or 0))
    cache = random_cache(
        rng, lengths=lengths, page_size=page, hkv=hkv, d=d, dtype=dtype, shared_prefix_pages=1
    )
    shape = (len(lengths), T, hq, d) if T > 1 else (len(lengths), hq, d)
    q = jnp.asarray(rng.standard_normal(shape), dtype)
    with kc.overrides(splits=splits, **KERNEL_OPTIONS[options]):
        out = poisoned_run(jax.jit(lambda q, c: kc.decode(q, c, implementation="ffi")), q, cache)
    ref = float64_reference(q if T > 1 else q[:, None], cache)
    ref = ref if T > 1 else ref[:, 0]
    assert out.shape == q.shape and out.dtype == q.dtype
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    assert rel_err(out, ref) < tol(dtype)
    empty = np.asarray(cache.lengths) == 0
    assert np.all(np.asarray(out, np.float32)[empty] == 0)


@pytest.mark.parametrize("splits", [1, 3])
def test_cuda_decode_softcap(splits):
    rng = np.random.default_rng(1)
    cache = random_cache(rng, lengths=[700, 33], page_size=16, hkv=2, d=128, dtype=jnp.float16)
    q = jnp.asarray(3 * rng.standard_normal((2, 8, 128)), jnp.float16)
    with kc.overrides(splits=splits):
        out = kc.decode(q, cache, softcap=5.0, implementation="ffi")
    ref = float64_reference(q[:, None], cache, softcap=5.0)[:, 0]
    assert rel_err(out, ref) < tol(jnp.float16)


@pytest.mark.parametrize("T", [1, 16])
def test_cuda_append_matches_scatter(T):
    rng = np.random.default_rng(T)
    lengths = [0, 15, 16, 100]
    cache = random_cache(
        rng, lengths=[x + T for x in lengths], page_size=16, hkv=8, d=128, dtype=jnp.bfloat16
    )
    cache = cache.replace(lengths=jnp.asarray(lengths, jnp.int32))
    k = jnp.asarray(rng.standard_normal((4, T, 8, 128)), jnp.bfloat16)
    v = jnp.asarray(rng.standard_normal((4, T, 8, 128)), jnp.bfloat16)
    ours, status = jax.jit(lambda c, k, v: kc.append(c, k, v, return_status=True, implementation="ffi"))(
        cache, k, v
    )
    ref, ref_status = kc.append(cache, k, v, return_status=True, implementation="xla")
    np.testing.assert_array_equal(status, ref_status)
    np.testing.assert_array_equal(ours.lengths, ref.lengths)
    np.testing.assert_array_equal(np.asarray(ours.k_pages, np.float32), np.asarray(ref.k_pages, np.float32))
    np.testing.assert_array_equal(np.asarray(ours.v_pages, np.float32), np.asarray(ref.v_pages, np.float32))


def test_cuda_append_past_allocated_pages_writes_nothing():
    cache = kc.create(4, 16, 1, 64, jnp.float16, 2, 2).replace(
        block_table=jnp.asarray([[0, -1], [1, 2]], jnp.int32)
    )
    tokens = jnp.ones((2, 17, 1, 64), jnp.float16)
    new, status = jax.jit(lambda c, k: kc.append(c, k, k, return_status=True, implementation="ffi"))(
        cache, tokens
    )
    np.testing.assert_array_equal(status, [1, 0])
    np.testing.assert_array_equal(new.lengths, [0, 17])
    assert float(jnp.abs(new.k_pages[0]).max()) == 0


def test_cuda_decode_donated_append_loop_matches_reference():
    """append then decode, token by token under jit with the cache donated (the serving loop)."""
    rng = np.random.default_rng(2)
    B, hkv, hq, d, page, steps = 4, 8, 32, 128, 16, 40
    start = [0, 10, 31, 100]
    cache = random_cache(
        rng, lengths=[x + steps for x in start], page_size=page, hkv=hkv, d=d, dtype=jnp.float16
    )
    cache = cache.replace(lengths=jnp.asarray(start, jnp.int32))

    @jax.jit
    def step(cache, k, v, q):
        cache = kc.append(cache, k, v, implementation="ffi")
        return cache, kc.decode(q, cache, implementation="ffi")

    step = jax.jit(step, donate_argnums=0)
    for _ in range(steps):
        k, v, q = (
            jnp.asarray(rng.standard_normal(s), jnp.float16) for s in ((B, hkv, d), (B, hkv, d), (B, hq, d))
        )
        cache, out = step(cache, k, v, q)
    ref = float64_reference(q[:, None], cache)[:, 0]
    assert rel_err(out, ref) < tol(jnp.float16)
    np.testing.assert_array_equal(cache.lengths, np.asarray(start) + steps)


@pytest.mark.parametrize("options", list(KERNEL_OPTIONS))
@pytest.mark.parametrize("splits", [1, 2, 5])
def test_cuda_decode_nan_stays_in_its_row(options, splits):
    """A NaN in one query row (and a NaN key past a request's length, never visible) leaves NaN in that row's
    output only, through every load path and split merge."""
    rng = np.random.default_rng(11)
    lengths = [700, 300]
    cache = random_cache(rng, lengths=lengths, page_size=16, hkv=2, d=128, dtype=jnp.float16)
    slot = cache.block_table[
        1, 300 // 16
    ]  # request 1's page holding position 300: row 300 % 16 is past its length
    cache = cache.replace(
        k_pages=cache.k_pages.at[slot, 300 % 16].set(jnp.nan),
        v_pages=cache.v_pages.at[slot, 300 % 16].set(jnp.nan),
    )
    q = np.asarray(rng.standard_normal((2, 8, 128)), np.float16)
    q[0, 3, 5] = np.nan  # query head 3 of request 0 (kv head 0, GQA 4)
    with kc.overrides(splits=splits, **KERNEL_OPTIONS[options]):
        out = np.asarray(
            jax.jit(lambda q, c: kc.decode(q, c, implementation="ffi"))(jnp.asarray(q), cache), np.float32
        )
    assert np.isnan(out[0, 3]).all()
    rest = np.ones(out.shape[:2], bool)
    rest[0, 3] = False
    assert np.isfinite(out[rest]).all()
    ref = float64_reference(jnp.asarray(np.nan_to_num(q))[:, None], cache)[:, 0]
    assert rel_err(out[rest], ref[rest]) < tol(jnp.float16)


# ---------------------------------------------------------------- float8 pages


@pytest.mark.parametrize("q_dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("splits", [None, 1, 5])
@pytest.mark.parametrize("merge", ["xla", "kernel"])
def test_cuda_fp8_decode_matches_float64(case, q_dtype, splits, merge):
    """float8 pages against float64 attention over the dequantised cache (the dequantisation is exact; the kernel
    rounds each dequantised K/V value to the query dtype once)."""
    lengths, page, hq, hkv, d, T = CASES[case]
    rng = np.random.default_rng(case * 5 + (splits or 0))
    cache = quantized(
        random_cache(
            rng, lengths=lengths, page_size=page, hkv=hkv, d=d, dtype=jnp.float32, shared_prefix_pages=1
        )
    )
    shape = (len(lengths), T, hq, d) if T > 1 else (len(lengths), hq, d)
    q = jnp.asarray(rng.standard_normal(shape), q_dtype)
    with kc.overrides(splits=splits, merge=merge):
        out = poisoned_run(jax.jit(lambda q, c: kc.decode(q, c, implementation="ffi")), q, cache)
    ref = float64_reference(q if T > 1 else q[:, None], dequantized(cache))
    ref = ref if T > 1 else ref[:, 0]
    assert out.shape == q.shape and out.dtype == q.dtype
    assert np.all(np.isfinite(np.asarray(out, np.float32)))
    assert rel_err(out, ref) < tol(q_dtype)
    assert np.all(np.asarray(out, np.float32)[np.asarray(cache.lengths) == 0] == 0)


@pytest.mark.parametrize("token_dtype", [jnp.float16, jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("T", [1, 16, 37])
def test_cuda_fp8_append_matches_the_jnp_path(T, token_dtype):
    """The CUDA float8 append stores the jnp path's bytes and scales (both exact up to the final rounding), over
    pages already holding tokens (scales that grow, rows re-scaled) and pages written from row 0."""
    rng = np.random.default_rng(T)
    lengths = [0, 15, 16, 100]
    cache = quantized(
        random_cache(rng, lengths=[x + T for x in lengths], page_size=16, hkv=8, d=128, dtype=jnp.float32)
    )
    cache = cache.replace(lengths=jnp.asarray(lengths, jnp.int32))
    scale = jnp.asarray([0.5, 1.0, 3.0, 40.0])[:, None, None, None]  # some requests grow their page's scale
    k = (scale * rng.standard_normal((4, T, 8, 128))).astype(token_dtype)
    v = (scale * rng.standard_normal((4, T, 8, 128))).astype(token_dtype)
    run = lambda impl: jax.jit(lambda c, k, v: kc.append(c, k, v, return_status=True, implementation=impl))  # noqa: E731
    ours, status = run("ffi")(cache, k, v)
    ref, ref_status = run("xla")(cache, k, v)
    np.testing.assert_array_equal(status, ref_status)
    np.testing.assert_array_equal(ours.lengths, ref.lengths)
    for name in ("k_pages", "v_pages"):
        got, want = (np.asarray(getattr(c, name)).view(np.uint8) for c in (ours, ref))
        np.testing.assert_array_equal(got, want, err_msg=name)
    for name in ("k_scales", "v_scales"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(ref, name), err_msg=name)


def test_cuda_fp8_serving_loop_matches_float64():
    """append then decode token by token under jit, float8 pages donated, bf16 tokens and queries."""
    rng = np.random.default_rng(3)
    B, hkv, hq, d, page, steps = 4, 8, 32, 128, 16, 24
    start = [0, 10, 31, 100]
    cache = quantized(
        random_cache(rng, lengths=[x + steps for x in start], page_size=page, hkv=hkv, d=d, dtype=jnp.float32)
    )
    cache = cache.replace(lengths=jnp.asarray(start, jnp.int32))

    def step(cache, k, v, q):
        cache = kc.append(cache, k, v, implementation="ffi")
        return cache, kc.decode(q, cache, implementation="ffi")

    step = jax.jit(step, donate_argnums=0)
    for _ in range(steps):
        k, v, q = (
            jnp.asarray(rng.standard_normal(s), jnp.bfloat16) for s in ((B, hkv, d), (B, hkv, d), (B, hq, d))
        )
        cache, out = step(cache, k, v, q)
    ref = float64_reference(q[:, None], dequantized(cache))[:, 0]
    assert rel_err(out, ref) < tol(jnp.bfloat16)
