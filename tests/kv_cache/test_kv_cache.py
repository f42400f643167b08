"""Paged decode and append against jax.nn.dot_product_attention on the gathered contiguous cache."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err, tol

from jax_ops import kv_cache as kc


def random_cache(rng, *, lengths, page_size, hkv, d, dtype, num_pages=None, shared_prefix_pages=0):
    """A cache whose requests hold shuffled pages (the first ``shared_prefix_pages`` slots of every request
    point at the same pages), random contents, unused slots ``-1``."""
    lengths = np.asarray(lengths, np.int32)
    B = len(lengths)
    need = -(-lengths // page_size)
    max_pages = max(int(need.max()), 1)
    own = int(np.maximum(need - shared_prefix_pages, 0).sum())
    num_pages = num_pages or shared_prefix_pages + own + 3
    perm = rng.permutation(num_pages)
    shared, rest = perm[:shared_prefix_pages], list(perm[shared_prefix_pages:])
    table = np.full((B, max_pages), -1, np.int32)
    for b in range(B):
        n_shared = min(shared_prefix_pages, int(need[b]))
        table[b, :n_shared] = shared[:n_shared]
        for j in range(n_shared, int(need[b])):
            table[b, j] = rest.pop()
    shape = (num_pages, page_size, hkv, d)
    return kc.PagedKVCache(
        k_pages=jnp.asarray(rng.standard_normal(shape), dtype),
        v_pages=jnp.asarray(rng.standard_normal(shape), dtype),
        block_table=jnp.asarray(table),
        lengths=jnp.asarray(lengths),
    )


@jax.jit
def gathered(cache):
    """The contiguous ``[B, max_pages * page_size, Hkv, D]`` K and V (unused slots read page 0, masked)."""
    table = jnp.maximum(cache.block_table, 0)
    B, n = table.shape
    k = cache.k_pages[table].reshape(B, n * cache.page_size, cache.num_kv_heads, cache.head_dim)
    v = cache.v_pages[table].reshape(B, n * cache.page_size, cache.num_kv_heads, cache.head_dim)
    return k, v


def nn_reference(q, cache, softcap=None):
    """jax.nn on the gathered cache in fp32 (q ``[B, T, Hq, D]``, causal within the chunk); length-0 rows -> 0."""
    o, visible = _nn_reference(q, cache, softcap)
    return np.asarray(o), np.asarray(visible)


@functools.partial(jax.jit, static_argnums=2)
def _nn_reference(q, cache, softcap):
    k, v = gathered(cache)
    B, T = q.shape[:2]
    S = k.shape[1]
    lengths = cache.lengths
    q_pos = lengths[:, None] - T + jnp.arange(T)[None]
    s = jnp.arange(S)
    mask = (s[None, None] < lengths[:, None, None]) & (s[None, None] <= q_pos[:, :, None])
    f32 = jnp.float32
    if softcap is None:
        o = jax.nn.dot_product_attention(q.astype(f32), k.astype(f32), v.astype(f32), mask=mask[:, None])
    else:  # jax.nn has no softcap: the same math spelled out
        G = q.shape[2] // k.shape[2]
        kk, vv = jnp.repeat(k, G, axis=2).astype(f32), jnp.repeat(v, G, axis=2).astype(f32)
        logits = jnp.einsum("btnd,bsnd->bnts", q.astype(f32), kk, precision="highest") / np.sqrt(q.shape[-1])
        logits = jnp.where(mask[:, None], softcap * jnp.tanh(logits / softcap), -jnp.inf)
        p = jax.nn.softmax(logits, axis=-1)
        o = jnp.einsum("bnts,bsnd->btnd", jnp.nan_to_num(p), vv, precision="highest")
    visible = jnp.any(mask, axis=-1)  # [B, T]
    return jnp.where(visible[:, :, None, None], o, 0.0), visible


PAGE = 8

# Every test runs on each backend: the jnp path, our kernel (the CPU twin here, CUDA under -m gpu), the kernel with
# 3 key splits forced (the split-KV path and its log-sum-exp merge), and the same splits merged by the kernel.
BACKENDS = {
    "xla": ("xla", {}),
    "ffi": ("ffi", {}),
    "ffi-split3": ("ffi", dict(splits=3)),
    "ffi-split3-kernel-merge": ("ffi", dict(splits=3, merge="kernel")),
}
_implementation = "xla"


@pytest.fixture(autouse=True, params=list(BACKENDS))
def backend(request):
    global _implementation
    _implementation, knobs = BACKENDS[request.param]
    with kc.overrides(**knobs):
        yield request.param


def decode(q, cache, **kw):
    return kc.decode(q, cache, implementation=_implementation, **kw)


def append(cache, k, v, **kw):
    return kc.append(cache, k, v, implementation=_implementation, **kw)


LENGTHS = [0, 1, PAGE - 1, PAGE, 5 * PAGE + 3]


@pytest.mark.parametrize(
    "hq,hkv,dtype", [(2, 2, np.float32), (8, 2, np.float16), (8, 1, np.float32), (8, 8, np.float16)]
)
def test_decode_one_token(hq, hkv, dtype):
    rng = np.random.default_rng(hq * 10 + hkv)
    cache = random_cache(rng, lengths=LENGTHS, page_size=PAGE, hkv=hkv, d=32, dtype=dtype)
    q = jnp.asarray(rng.standard_normal((len(LENGTHS), hq, 32)), dtype)
    out = jax.jit(decode)(q, cache)
    assert out.shape == q.shape and out.dtype == q.dtype
    ref, visible = nn_reference(q[:, None], cache)
    assert rel_err(out, ref[:, 0]) < tol(dtype)
    assert np.all(np.asarray(out)[~visible[:, 0]] == 0)  # length 0 -> exactly 0


@pytest.mark.parametrize("shared", [0, 2])
def test_decode_chunk_causal_shared_prefix(shared):
    rng = np.random.default_rng(shared)
    lengths = [2, PAGE, 3 * PAGE + 1, 4 * PAGE]
    cache = random_cache(
        rng, lengths=lengths, page_size=PAGE, hkv=2, d=16, dtype=np.float32, shared_prefix_pages=shared
    )
    q = jnp.asarray(
        rng.standard_normal((4, 5, 8, 16)), np.float32
    )  # T=5 > lengths[0]: early rows see nothing
    out = decode(q, cache)
    ref, visible = nn_reference(q, cache)
    assert not visible.all()
    assert rel_err(out, ref) < tol(np.float32)
    assert np.all(np.asarray(out)[~visible] == 0)


def test_decode_softcap_and_scale():
    rng = np.random.default_rng(7)
    cache = random_cache(rng, lengths=[3, 20], page_size=PAGE, hkv=1, d=16, dtype=np.float32)
    q = jnp.asarray(4 * rng.standard_normal((2, 4, 16)), np.float32)
    ref, _ = nn_reference(q[:, None], cache, softcap=2.0)
    assert rel_err(decode(q, cache, softcap=2.0), ref[:, 0]) < tol(np.float32)
    # an explicit scale equal to the default gives the same result
    same = decode(q, cache, scale=0.25)
    assert rel_err(same, decode(q, cache)) < 1e-6


def test_append_then_decode_equals_concatenated():
    rng = np.random.default_rng(3)
    B, hkv, d, T = 3, 2, 16, 6
    lengths = [0, PAGE - 1, 2 * PAGE]
    cache = random_cache(rng, lengths=lengths, page_size=PAGE, hkv=hkv, d=d, dtype=np.float32, num_pages=16)
    mgr_pages = np.asarray(cache.block_table)
    used = set(mgr_pages[mgr_pages >= 0].tolist())
    free = [p for p in range(16) if p not in used]
    table = mgr_pages.copy()
    for b in range(B):  # give each request the pages its chunk needs
        for j in range(-(-lengths[b] // PAGE), -(-(lengths[b] + T) // PAGE)):
            if j >= table.shape[1]:
                table = np.pad(table, ((0, 0), (0, 1)), constant_values=-1)
            table[b, j] = free.pop()
    cache = cache.replace(block_table=jnp.asarray(table))
    k_old, v_old = gathered(cache)
    k_new = jnp.asarray(rng.standard_normal((B, T, hkv, d)), np.float32)
    v_new = jnp.asarray(rng.standard_normal((B, T, hkv, d)), np.float32)
    after = jax.jit(append)(cache, k_new[:, :2], v_new[:, :2])  # a chunk of 2 ...
    for t in range(2, T):  # ... then token by token
        after = append(after, k_new[:, t], v_new[:, t])
    np.testing.assert_array_equal(after.lengths, np.asarray(lengths) + T)
    k_got, v_got = gathered(after)
    for b in range(B):  # the concatenated cache, token for token (the old tokens kept, the new ones written)
        L = lengths[b]
        np.testing.assert_array_equal(k_got[b, :L], k_old[b, :L])
        np.testing.assert_array_equal(k_got[b, L : L + T], k_new[b])
        np.testing.assert_array_equal(v_got[b, L : L + T], v_new[b])
    q = jnp.asarray(rng.standard_normal((B, 4, 8, d)), np.float32)
    ref, _ = nn_reference(q, after)
    assert rel_err(decode(q, after), ref) < tol(np.float32)


def test_append_past_allocated_pages_writes_nothing():
    cache = kc.create(4, PAGE, 1, 8, jnp.float32, 2, 2).replace(
        block_table=jnp.asarray([[0, -1], [1, 2]], jnp.int32)
    )
    tokens = jnp.ones((2, PAGE + 1, 1, 8), jnp.float32)
    with pytest.raises(ValueError, match="request 0 .*past its allocated pages"):
        append(cache, tokens, tokens)
    new, status = jax.jit(lambda c, k: append(c, k, k, return_status=True))(cache, tokens)
    np.testing.assert_array_equal(status, [1, 0])
    np.testing.assert_array_equal(new.lengths, [0, PAGE + 1])
    assert float(jnp.abs(new.k_pages[0]).max()) == 0  # request 0's page untouched
    assert float(new.k_pages[1].min()) == 1 and float(new.k_pages[2, 0].min()) == 1
    full = kc.create(4, PAGE, 1, 8, jnp.float32, 1, 1).replace(block_table=jnp.asarray([[3]], jnp.int32))
    full = append(full, tokens[:1, :PAGE], tokens[:1, :PAGE])
    with pytest.raises(ValueError, match="past its allocated pages"):  # past max_pages
        append(full, tokens[:1, 0], tokens[:1, 0])


def test_bad_inputs():
    cache = kc.create(4, PAGE, 2, 8, jnp.float16, 2, 2)
    q = jnp.zeros((2, 4, 8), jnp.float16)
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = 9"):
        decode(
            q,
            cache.replace(
                block_table=jnp.asarray([[9, -1], [0, -1]], jnp.int32), lengths=jnp.asarray([1, 1], jnp.int32)
            ),
        )
    with pytest.raises(ValueError, match=r"block_table\[1, 0\] = -1"):
        decode(q, cache.replace(lengths=jnp.asarray([0, 1], jnp.int32)))
    with pytest.raises(ValueError, match=r"lengths\[0\] = 17"):
        decode(q, dataclass_replace(cache, lengths=jnp.asarray([17, 0], jnp.int32)))
    with pytest.raises(TypeError, match="block_table must have dtype"):
        cache.replace(block_table=jnp.zeros((2, 2), jnp.float32))
    with pytest.raises(TypeError, match="q has dtype float32"):
        decode(q.astype(jnp.float32), cache)
    with pytest.raises(ValueError, match="not a multiple"):
        decode(jnp.zeros((2, 3, 8), jnp.float16), cache)
    with pytest.raises(ValueError, match="head dim 16"):
        decode(jnp.zeros((2, 4, 16), jnp.float16), cache)
    with pytest.raises(ValueError, match="k_new must be"):
        append(cache, jnp.zeros((2, 3, 8), jnp.float16), jnp.zeros((2, 3, 8), jnp.float16))
    with pytest.raises(TypeError, match="k_new has dtype"):
        append(cache, jnp.zeros((2, 2, 8), jnp.float32), jnp.zeros((2, 2, 8), jnp.float32))
    with pytest.raises(ValueError, match="implementation must be"):
        kc.decode(q, cache, implementation="cuda")
    with pytest.raises(ValueError, match="max_pages must be a positive int"):
        kc.create(4, PAGE, 2, 8, jnp.float16, 2, 0)
    with pytest.raises(TypeError, match="cache must be a PagedKVCache"):
        decode(q, (cache.k_pages, cache.v_pages))


def dataclass_replace(cache, **changes):
    """Bypasses ``PagedKVCache.replace``'s check, so the check inside ``decode`` is the one tested."""
    return dataclasses.replace(cache, **changes)


def test_cache_is_a_pytree_under_jit():
    cache = kc.create(4, PAGE, 1, 8, jnp.float32, 2, 2)
    leaves = jax.tree_util.tree_leaves(cache)
    assert len(leaves) == 4
    doubled = jax.jit(lambda c: jax.tree_util.tree_map(lambda x: x * 2, c))(cache)
    assert isinstance(doubled, kc.PagedKVCache)


def numpy_reference(q, cache):
    """float64 attention of one query token per request over the gathered cache, written out in numpy."""
    k, v = (np.asarray(x.astype(jnp.float32), np.float64) for x in gathered(cache))
    q = np.asarray(q.astype(jnp.float32), np.float64)
    G = q.shape[1] // k.shape[2]
    out = np.zeros(q.shape)
    for b, L in enumerate(np.asarray(cache.lengths)):
        for h in range(q.shape[1]):
            logits = k[b, :L, h // G] @ q[b, h] / np.sqrt(q.shape[-1])
            p = np.exp(logits - logits.max(initial=-np.inf)) if L else logits
            out[b, h] = p @ v[b, :L, h // G] / p.sum() if L else 0.0
    return out


def test_decode_bfloat16_against_float64():
    rng = np.random.default_rng(11)
    lengths = [1, 2 * PAGE - 1, 3 * PAGE, 0]
    cache = random_cache(
        rng, lengths=lengths, page_size=PAGE, hkv=2, d=64, dtype=jnp.bfloat16, shared_prefix_pages=1
    )
    q = jnp.asarray(rng.standard_normal((4, 8, 64)), jnp.bfloat16)
    assert rel_err(decode(q, cache), numpy_reference(q, cache)) < tol(jnp.bfloat16)


def test_decode_in_jit_clamps_bad_entries():
    """Inside jit the contents are not checked: an out-of-range page id and a too-long length read in bounds."""
    rng = np.random.default_rng(5)
    cache = random_cache(rng, lengths=[PAGE, 2], page_size=PAGE, hkv=1, d=8, dtype=np.float32)
    bad = dataclasses.replace(
        cache,
        block_table=cache.block_table.at[0, 0].set(10**6),
        lengths=jnp.asarray([10**6, 2], jnp.int32),
    )
    q = jnp.asarray(rng.standard_normal((2, 2, 8)), np.float32)
    out = jax.jit(decode)(q, bad)
    assert np.all(np.isfinite(np.asarray(out)))
    ref, _ = nn_reference(q[:, None], cache)
    assert rel_err(out[1], ref[1, 0]) < tol(np.float32)  # the well-formed request is unaffected


def test_decode_long_requests_over_several_splits():
    """Lengths spanning several 64-key split chunks (the kernel's key tiles), ragged, one request empty."""
    rng = np.random.default_rng(13)
    lengths = [200, 130, 0, 65]
    cache = random_cache(rng, lengths=lengths, page_size=16, hkv=2, d=32, dtype=np.float32)
    q = jnp.asarray(rng.standard_normal((4, 3, 8, 32)), np.float32)
    out = decode(q, cache)
    ref, visible = nn_reference(q, cache)
    assert rel_err(out, ref) < tol(np.float32)
    assert np.all(np.asarray(out)[~visible] == 0)


def test_status_codes_are_the_native_ones():
    from jax_ops import _ffi
    from jax_ops._src.kv_cache import reference

    consts = _ffi.constants()
    assert reference.STATUS_OK == consts["kv_cache_status_ok"]
    assert reference.STATUS_PAST_ALLOCATED_PAGES == consts["kv_cache_status_past_allocated_pages"]


def test_kernel_option_knobs_are_checked():
    cache = kc.create(4, PAGE, 1, 8, jnp.float32, batch=1, max_pages=2)
    q = jnp.zeros((1, 2, 8), jnp.float32)
    for bad in (dict(load="ldg"), dict(merge="python")):
        with kc.overrides(**bad), pytest.raises(ValueError, match="kv_cache (load|merge) must be"):
            kc.decode(q, cache, implementation="ffi")
    with kc.overrides(
        splits=1, merge="kernel", load="tma"
    ):  # one split: nothing to merge; the twin ignores tma
        out = kc.decode(q, cache, implementation="ffi")
    assert out.shape == q.shape and not np.any(np.asarray(out))


def test_split_rule(monkeypatch):
    """The GPU split rule (one wave of 2 CTAs per SM on 132 SMs, >= 256 keys a split, at most 64 or, with the kernel
    merge, its 8), evaluated as if on the H200."""
    from jax_ops._src import dispatch
    from jax_ops._src.kv_cache import heuristics

    monkeypatch.setattr(dispatch, "platform", lambda: "gpu")
    monkeypatch.setattr(dispatch, "sm_count", lambda: 132)
    with kc.overrides(splits=None, merge="xla"):  # (the backend fixture may force them)
        assert heuristics.splits(8, 8, 4, 8192) == 4  # 64 CTAs: 264 // 64
        assert heuristics.splits(8, 8, 4, 512) == 2  # capped by 256 keys a split
        assert heuristics.splits(1, 8, 4, 1 << 17) == 33
        assert heuristics.splits(1, 1, 4, 1 << 20) == 64
    with kc.overrides(splits=None, merge="kernel"):
        assert heuristics.splits(1, 8, 4, 1 << 17) == 8
        assert heuristics.splits(8, 8, 4, 8192) == 4
