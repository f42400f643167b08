"""A small GPT-style decoder serving four requests from a paged KV cache (``jax_ops.kv_cache``).

Random weights (2 layers, d_model 256, 8 query / 2 kv heads of 32, vocab 512; float16 on a GPU, float32 on a CPU).
Four requests with prompts of 40, 24, 48 and 8 tokens; request 2's prompt starts with request 0's first 24
tokens, so it shares their pages (``BlockManager.fork``) and prefills only its own 24. Its first write lands in
the half-full shared page: the manager hands it a private copy (copy-on-write, applied with ``copy_pages``).

- Prefill, one request at a time in chunks of ``--prefill-chunk`` tokens: per layer ``append`` the chunk's K/V
  ``[1, T, Hkv, D]`` into the shared pools through a one-row view of the block table, then ``decode`` the chunk
  (causal within it, over everything cached before).
- Decode: ``--steps`` greedy tokens for all four requests at once, one jitted step per token (the pools donated,
  the block table and lengths from the manager), tokens/s printed.
- Check: the same model with plain jnp attention over a contiguous per-request cache, fed the same tokens
  (teacher-forced), gives the same greedy token at every step (a step whose top-2 logits differ by less than
  the two runs' logit difference counts as a tie and is reported) and close logits; prints PASS.

    python examples/paged_decode.py [--steps 32] [--implementation ffi|xla] [--prefill-chunk 16]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops import kv_cache as kc


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 512
    dim: int = 256
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    layers: int = 2
    page_size: int = 16
    max_len: int = 256  # positions (learned position embedding)
    dtype: str = "float32"


PROMPT_LENGTHS = (40, 24, 48, 8)
# Request 2's prompt starts with request 0's first 24 tokens (1.5 pages: the second page is shared half full).
SHARING_REQUEST, SHARED_SOURCE, SHARED_TOKENS = 2, 0, 24


# ---------------------------------------------------------------------------------------------------- model


def init_params(cfg: Config, key: jax.Array) -> dict:
    dt = jnp.dtype(cfg.dtype)
    dense = lambda k, fan_in, shape: (jax.random.normal(k, shape, jnp.float32) / math.sqrt(fan_in)).astype(dt)
    d, hd = cfg.dim, cfg.head_dim
    keys = jax.random.split(key, 3 + cfg.layers)
    layers = []
    for lk in keys[3:]:
        k = jax.random.split(lk, 6)
        layers.append(
            {
                "wq": dense(k[0], d, (d, cfg.heads * hd)),
                "wk": dense(k[1], d, (d, cfg.kv_heads * hd)),
                "wv": dense(k[2], d, (d, cfg.kv_heads * hd)),
                "wo": dense(k[3], cfg.heads * hd, (cfg.heads * hd, d)),
                "w1": dense(k[4], d, (d, 4 * d)),
                "w2": dense(k[5], 4 * d, (4 * d, d)),
            }
        )
    return {
        "tok_emb": dense(keys[0], 1, (cfg.vocab, d)),
        "pos_emb": dense(keys[1], 4, (cfg.max_len, d)),
        "unembed": dense(
            keys[2], d / 4, (d, cfg.vocab)
        ),  # logits of std ~2: few near-ties in the greedy pick
        "layers": layers,
    }


def _rms_norm(x: jax.Array) -> jax.Array:
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + 1e-6)).astype(x.dtype)


def forward(cfg: Config, params: dict, tokens: jax.Array, positions: jax.Array, attend) -> jax.Array:
    """tokens, positions [B, T] -> logits [B, T, vocab] float32. ``attend(layer, q, k, v)`` with q
    ``[B, T, Hq, D]`` and the chunk's k, v ``[B, T, Hkv, D]`` stores k, v in its cache and returns attention
    of q over everything cached (causal), ``[B, T, Hq, D]``."""
    B, T = tokens.shape
    x = params["tok_emb"][tokens] + params["pos_emb"][positions]
    for i, p in enumerate(params["layers"]):
        h = _rms_norm(x)
        q = (h @ p["wq"]).reshape(B, T, cfg.heads, cfg.head_dim)
        k = (h @ p["wk"]).reshape(B, T, cfg.kv_heads, cfg.head_dim)
        v = (h @ p["wv"]).reshape(B, T, cfg.kv_heads, cfg.head_dim)
        x = x + attend(i, q, k, v).reshape(B, T, -1) @ p["wo"]
        x = x + jax.nn.gelu(_rms_norm(x) @ p["w1"]) @ p["w2"]
    return (_rms_norm(x) @ params["unembed"]).astype(jnp.float32)


# ----------------------------------------------------------------------------------------- paged serving


@functools.partial(jax.jit, static_argnums=(0, 1), donate_argnums=(3,))
def paged_forward(cfg, implementation, params, pools, block_table, lengths, tokens):
    """One step over a paged cache: tokens [B, T] at positions ``lengths[b] + t`` (``lengths``: before this
    step). ``pools``: per layer (k_pages, v_pages), donated. Returns (logits [B, T, vocab], pools, status [B]:
    nonzero where an append found no allocated page)."""
    B, T = tokens.shape
    new_pools, statuses = [], []

    def attend(i, q, k, v):
        cache = kc.PagedKVCache(*pools[i], block_table=block_table, lengths=lengths)
        if T == 1:  # one token per request: the [B, Hkv, D] / [B, Hq, D] forms
            cache, status = kc.append(
                cache, k[:, 0], v[:, 0], return_status=True, implementation=implementation
            )
            out = kc.decode(q[:, 0], cache, implementation=implementation)[:, None]
        else:
            cache, status = kc.append(cache, k, v, return_status=True, implementation=implementation)
            out = kc.decode(q, cache, implementation=implementation)
        new_pools.append((cache.k_pages, cache.v_pages))
        statuses.append(status)
        return out

    positions = lengths[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]
    logits = forward(cfg, params, tokens, positions, attend)
    return logits, new_pools, jnp.max(jnp.stack(statuses), axis=0)


class Server:
    """The page pools (device) and the BlockManager (host) for a fixed batch of requests 0 .. B-1."""

    def __init__(self, cfg: Config, params: dict, batch: int, max_tokens: int, implementation):
        self.cfg, self.params, self.implementation = cfg, params, implementation
        self.batch = batch
        self.max_pages = -(-max_tokens // cfg.page_size)
        num_pages = batch * self.max_pages  # enough even with no sharing at all
        self.mgr = kc.BlockManager(num_pages, cfg.page_size)
        self.pools = []  # per layer (k_pages, v_pages); one page id addresses the same token in every layer
        for _ in range(cfg.layers):
            empty = kc.create(
                num_pages, cfg.page_size, cfg.kv_heads, cfg.head_dim, cfg.dtype, batch, self.max_pages
            )
            self.pools.append((empty.k_pages, empty.v_pages))
        self.statuses = []  # append statuses, checked once at the end (no host sync per step)
        self.cow_copies = 0

    def _reserve(self, request, num_tokens: int) -> None:
        """Room for ``num_tokens`` more tokens; applies the manager's copy-on-write copies to every layer."""
        copies = self.mgr.extend(request, num_tokens)
        if copies:
            self.cow_copies += len(copies)
            table = self.mgr.block_table([request], self.max_pages)
            lengths = self.mgr.lengths([request]) - num_tokens
            for i, pool in enumerate(self.pools):
                cache = kc.PagedKVCache(*pool, block_table=jnp.asarray(table), lengths=jnp.asarray(lengths))
                cache = kc.copy_pages(cache, copies)
                self.pools[i] = (cache.k_pages, cache.v_pages)

    def _step(self, requests, tokens: jax.Array) -> jax.Array:
        T = tokens.shape[1]
        table = self.mgr.block_table(requests, self.max_pages)
        lengths = self.mgr.lengths(requests) - T  # the manager already counts this step's tokens
        logits, self.pools, status = paged_forward(
            self.cfg, self.implementation, self.params, self.pools, table, lengths, tokens
        )
        self.statuses.append(status)
        return logits

    def prefill(self, request, prompt: np.ndarray, chunk: int, share=None) -> jax.Array:
        """Caches ``prompt`` for a new request, chunk by chunk; ``share=(source, n)``: its first n tokens are
        ``source``'s (their pages shared, not recomputed). Returns the logits of the prompt's last token."""
        if share is None:
            self.mgr.allocate(request)
            start = 0
        else:
            source, start = share
            self.mgr.fork(source, request, start)
        for s in range(start, len(prompt), chunk):
            piece = prompt[s : s + chunk]
            self._reserve(request, len(piece))
            logits = self._step([request], jnp.asarray(piece[None], jnp.int32))
        return logits[0, -1]

    def decode(self, tokens: jax.Array) -> jax.Array:
        """One token for every request: tokens [B] -> logits [B, vocab]."""
        for r in range(self.batch):
            self._reserve(r, 1)
        return self._step(list(range(self.batch)), tokens[:, None])[:, 0]

    def check_statuses(self) -> None:
        bad = [i for i, s in enumerate(self.statuses) if int(jnp.max(s)) != 0]
        if bad:
            raise RuntimeError(f"kv_cache.append wrote nothing for some request in steps {bad}")


def serve(cfg, params, prompts, steps, chunk, implementation):
    """Prefill every request, then ``steps`` greedy tokens for all. Returns (generated [steps + 1, B]: the
    prompts' greedy tokens then each decode step's, their logits [steps + 1, B, vocab], tokens/s of the decode
    loop, the server)."""
    max_tokens = max(len(p) for p in prompts) + steps
    server = Server(cfg, params, len(prompts), max_tokens, implementation)
    last = {}
    # The sharing request after its source, whose pages must hold the prefix first.
    for r in sorted(range(len(prompts)), key=lambda r: r == SHARING_REQUEST):
        share = (SHARED_SOURCE, SHARED_TOKENS) if r == SHARING_REQUEST else None
        last[r] = server.prefill(r, prompts[r], chunk, share=share)
    logits = [jnp.stack([last[r] for r in range(len(prompts))])]
    generated = [jnp.argmax(logits[0], axis=-1).astype(jnp.int32)]
    t0 = None
    for i in range(steps):
        if i == 1:  # the first step compiles: time the rest
            jax.block_until_ready(logits[-1])
            t0 = time.perf_counter()
        logits.append(server.decode(generated[-1]))
        generated.append(jnp.argmax(logits[-1], axis=-1).astype(jnp.int32))
    jax.block_until_ready(logits[-1])
    rate = len(prompts) * (steps - 1) / (time.perf_counter() - t0) if steps > 1 else float("nan")
    server.check_statuses()
    return np.asarray(jnp.stack(generated)), np.asarray(jnp.stack(logits)), rate, server


# ------------------------------------------------------------------------------- contiguous reference


@functools.partial(jax.jit, static_argnums=0)
def contiguous_forward(cfg, params, caches, start, tokens):
    """The same model over one request's contiguous cache: ``caches`` per layer (k, v) ``[1, S, Hkv, D]``,
    tokens [1, T] at positions ``start + t``; plain jnp attention. Returns (logits [1, T, vocab], caches)."""
    T = tokens.shape[1]
    positions = start + jnp.arange(T, dtype=jnp.int32)[None, :]
    new_caches = []

    def attend(i, q, k, v):
        kc_, vc_ = (jax.lax.dynamic_update_slice(c, x, (0, start, 0, 0)) for c, x in zip(caches[i], (k, v)))
        new_caches.append((kc_, vc_))
        S, G = kc_.shape[1], cfg.heads // cfg.kv_heads
        qg = q.reshape(1, T, cfg.kv_heads, G, cfg.head_dim).astype(jnp.float32)
        s = jnp.einsum("btkgd,bskd->bkgts", qg, kc_.astype(jnp.float32)) / math.sqrt(cfg.head_dim)
        visible = jnp.arange(S)[None, :] <= positions[0][:, None]  # [T, S]
        p = jax.nn.softmax(jnp.where(visible, s, -jnp.inf), axis=-1)
        o = jnp.einsum("bkgts,bskd->btkgd", p, vc_.astype(jnp.float32))
        return o.reshape(1, T, cfg.heads, cfg.head_dim).astype(q.dtype)

    logits = forward(cfg, params, tokens, positions, attend)
    return logits, new_caches


def reference_logits(cfg, params, prompts, generated, chunk):
    """Teacher-forced contiguous run: per request the prompt (same chunks), then the paged run's tokens one at a
    time. Returns the logits [steps + 1, B, vocab] aligned with ``serve``'s."""
    steps = generated.shape[0] - 1
    S = max(len(p) for p in prompts) + steps
    out = []
    for r, prompt in enumerate(prompts):
        zeros = jnp.zeros((1, S, cfg.kv_heads, cfg.head_dim), cfg.dtype)
        caches = [(zeros, zeros) for _ in range(cfg.layers)]
        for s in range(0, len(prompt), chunk):
            piece = jnp.asarray(prompt[None, s : s + chunk], jnp.int32)
            logits, caches = contiguous_forward(cfg, params, caches, jnp.int32(s), piece)
        per_step = [logits[0, -1]]
        for i in range(steps):
            token = jnp.asarray(generated[i, r], jnp.int32).reshape(1, 1)
            logits, caches = contiguous_forward(cfg, params, caches, jnp.int32(len(prompt) + i), token)
            per_step.append(logits[0, 0])
        out.append(jnp.stack(per_step))
    return np.asarray(jnp.stack(out, axis=1))


def compare(paged_logits, ref_logits, generated, tol: float) -> dict:
    """The paged run's greedy picks against the reference's argmax at every step: a mismatch is a tie when the
    reference's top-2 gap there is below twice the two runs' largest logit difference at that step."""
    ref_pick = np.argmax(ref_logits, axis=-1)
    mismatches, ties = [], 0
    for i, b in zip(*np.nonzero(generated != ref_pick)):
        gap = ref_logits[i, b, ref_pick[i, b]] - ref_logits[i, b, generated[i, b]]
        if gap <= 2 * np.max(np.abs(paged_logits[i, b] - ref_logits[i, b])):
            ties += 1
        else:
            mismatches.append((int(i), int(b), float(gap)))
    err = lambda a, b: float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))
    step_errs = [err(p, r) for p, r in zip(paged_logits, ref_logits)]
    return {
        "mismatches": mismatches,
        "ties": ties,
        "logits_err_max": max(step_errs),
        "final_logits_err": step_errs[-1],
        "tol": tol,
    }


# ------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=32, help="greedy tokens per request")
    ap.add_argument(
        "--implementation",
        choices=["ffi", "xla"],
        default=None,
        help="of append/decode (default: the fastest)",
    )
    ap.add_argument("--prefill-chunk", type=int, default=16)
    ap.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.steps < 1 or args.prefill_chunk < 1:
        ap.error("--steps and --prefill-chunk must be positive")
    dtype = args.dtype or ("float16" if jax.default_backend() == "gpu" else "float32")
    cfg = Config(dtype=dtype, max_len=max(PROMPT_LENGTHS) + args.steps)
    key_params, key_prompts = jax.random.split(jax.random.key(args.seed))
    params = init_params(cfg, key_params)
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, cfg.vocab, n).astype(np.int32) for n in PROMPT_LENGTHS]
    prompts[SHARING_REQUEST][:SHARED_TOKENS] = prompts[SHARED_SOURCE][:SHARED_TOKENS]
    print(
        f"{jax.default_backend()}: {cfg.layers} layers, d_model {cfg.dim}, {cfg.heads}/{cfg.kv_heads} heads of "
        f"{cfg.head_dim}, vocab {cfg.vocab}, {dtype}, page size {cfg.page_size}; prompts {PROMPT_LENGTHS} "
        f"(request {SHARING_REQUEST} shares request {SHARED_SOURCE}'s first {SHARED_TOKENS} tokens), "
        f"{args.steps} decode steps, "
        f"implementation={args.implementation}"
    )

    generated, paged_logits, rate, server = serve(
        cfg, params, prompts, args.steps, args.prefill_chunk, args.implementation
    )
    print(
        f"decode: {rate:,.0f} tokens/s ({len(prompts)} requests, steps after the first); copy-on-write "
        f"copies: {server.cow_copies}; pages in use {server.mgr.num_pages - server.mgr.num_free} of "
        f"{server.mgr.num_pages}"
    )
    for r in range(len(prompts)):
        server.mgr.free(r)
    assert server.mgr.num_free == server.mgr.num_pages, "freeing every request must return every page"

    ref_logits = reference_logits(cfg, params, prompts, generated, args.prefill_chunk)
    tol = 1e-4 if dtype == "float32" else 3e-2
    result = compare(paged_logits, ref_logits, generated, tol)
    result.update(generated=generated, tokens_per_s=rate, cow_copies=server.cow_copies)
    print(
        f"vs contiguous jnp: greedy tokens {generated.size - len(result['mismatches']) - result['ties']}"
        f"/{generated.size} equal ({result['ties']} ties within rounding), logits rel err max "
        f"{result['logits_err_max']:.2e} (final step {result['final_logits_err']:.2e}, tol {tol:g})"
    )
    assert not result["mismatches"], (
        f"greedy tokens differ (step, request, top-2 gap): {result['mismatches']}"
    )
    assert result["logits_err_max"] <= tol, f"logits differ: {result['logits_err_max']:.2e} > {tol:g}"
    assert server.cow_copies >= 1, "the shared prompt page was never copied on write"
    print("PASS")
    return result


if __name__ == "__main__":
    main()
