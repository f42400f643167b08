"""BlockManager invariants, and the manager driving a real cache through prefix sharing and copy-on-write."""

import jax.numpy as jnp
import numpy as np
import pytest

from jax_ops import kv_cache as kc


def check_invariants(mgr, requests):
    """Every page is free xor referenced; a page's count equals the number of requests holding it."""
    held = {}
    for r in requests:
        pages = mgr.pages(r)
        assert len(set(pages)) == len(pages), f"request {r} holds a page twice"
        assert len(pages) == -(-mgr.num_tokens(r) // mgr.page_size)
        for p in pages:
            held[p] = held.get(p, 0) + 1
    for p in range(mgr.num_pages):
        assert mgr.ref_count(p) == held.get(p, 0)
    assert mgr.num_free == mgr.num_pages - len(held)


def test_allocate_extend_free_returns_every_page():
    rng = np.random.default_rng(0)
    mgr = kc.BlockManager(num_pages=64, page_size=4)
    live = []
    for step in range(200):
        op = rng.integers(3)
        if op == 0 or not live:
            mgr.allocate(step, int(rng.integers(0, 9)))
            live.append(step)
        elif op == 1:
            r = live[rng.integers(len(live))]
            try:
                assert mgr.extend(r, int(rng.integers(0, 6))) == []  # no sharing: never a copy
            except MemoryError:
                pass
        else:
            mgr.free(live.pop(rng.integers(len(live))))
        check_invariants(mgr, live)
    for r in live:
        mgr.free(r)
    assert mgr.num_free == 64 and all(mgr.ref_count(p) == 0 for p in range(64))


def test_fork_shares_and_copy_on_write_keeps_the_sharer():
    mgr = kc.BlockManager(num_pages=8, page_size=4)
    mgr.allocate("a", 6)  # pages [0, 1], page 1 half full
    mgr.fork("a", "b")
    assert mgr.pages("b") == mgr.pages("a") and mgr.ref_count(1) == 2
    check_invariants(mgr, ["a", "b"])
    copies = mgr.extend("b", 3)  # writes positions 6..8: into shared page 1 (copy) and a new page
    assert copies == [(1, 2)]
    assert mgr.pages("a") == [0, 1] and mgr.pages("b")[:2] == [0, 2]
    assert mgr.ref_count(0) == 2 and mgr.ref_count(1) == 1
    check_invariants(mgr, ["a", "b"])
    assert mgr.extend("a", 1) == []  # page 1 is a's alone now
    mgr.fork("a", "c", num_tokens=4)  # a page-aligned prefix: only page 0 shared
    assert mgr.pages("c") == [0] and mgr.ref_count(0) == 3
    assert mgr.extend("c", 2) == [] and mgr.pages("c")[0] == 0  # the new tokens land in a new page
    check_invariants(mgr, ["a", "b", "c"])
    with pytest.raises(MemoryError):
        mgr.extend("a", 100)
    check_invariants(mgr, ["a", "b", "c"])  # a failed extend changes nothing
    for r in ("a", "b", "c"):
        mgr.free(r)
    assert mgr.num_free == 8
    with pytest.raises(KeyError, match="unknown request"):
        mgr.free("a")


def test_manager_drives_cache_with_shared_prefix():
    rng = np.random.default_rng(1)
    P, page, hkv, d, max_pages = 12, 4, 1, 8, 4
    mgr = kc.BlockManager(P, page)
    cache = kc.create(P, page, hkv, d, jnp.float32, 2, max_pages)
    prompt = jnp.asarray(rng.standard_normal((1, 6, hkv, d)), np.float32)
    mgr.allocate("a", 6)
    one = kc.create(P, page, hkv, d, jnp.float32, 1, max_pages)
    one = one.replace(block_table=jnp.asarray(mgr.block_table(["a"], max_pages)))
    one = kc.append(one, prompt, prompt)  # prefill request a
    mgr.fork("a", "b")  # b shares a's prompt
    lengths = jnp.asarray(mgr.lengths(["a", "b"]))
    new = jnp.asarray(rng.standard_normal((2, 1, hkv, d)), np.float32)
    # a writes into the shared half-full page first: a gets a copy; b then holds the original alone
    copies = mgr.extend("a", 1) + mgr.extend("b", 1)
    assert len(copies) == 1
    cache = cache.replace(k_pages=one.k_pages, v_pages=one.v_pages)
    cache = kc.copy_pages(cache, copies)
    cache = cache.replace(block_table=jnp.asarray(mgr.block_table(["a", "b"], max_pages)), lengths=lengths)
    cache = kc.append(cache, new[:, 0], new[:, 0])
    np.testing.assert_array_equal(cache.lengths, mgr.lengths(["a", "b"]))
    table = np.asarray(cache.block_table)
    k = np.asarray(cache.k_pages)[table[:, :2]].reshape(2, 2 * page, hkv, d)
    for b in range(2):  # both requests hold the prompt and then their own token
        np.testing.assert_array_equal(k[b, :6], prompt[0])
        np.testing.assert_array_equal(k[b, 6], new[b, 0])
