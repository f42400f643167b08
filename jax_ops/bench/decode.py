"""Suite ``decode``: one decode step over a paged KV cache (jax_ops.kv_cache), and the cache append.

Decode cases: B=8, Hq=32, Hkv=8, D=128, fp16, page size 16, every request of length L = 1k ... 32k; L = 128k at
B=1; B = 1, 4, 64 at L = 4k; GQA 32/4 at L = 4k (B = 8, and B = 4: the latency-bound small decode); one case with
ragged lengths (uniform in [L/2, L]). ``--quick``: L = 1k, 8k, 32k, the B=4 GQA 32/4 case and the ragged case.
The page table holds a random permutation of a pool exactly as big as the requests need (shuffled pages).

Rows per case:
- ``jax_ops paged``: ``kv_cache.decode(q, cache)`` (``implementation=None``); ``jax_ops paged fp8``: the same
  over ``kv_cache.to_float8(cache)`` (float8 pages, fp16 queries; its TBps counts the float8 bytes it reads, its
  rel_l2_err includes the quantisation); ``jax_ops paged xla``: its jnp
  reference (``implementation="xla"``, skipped in ``--quick`` at L >= 32k, where it takes tens of ms);
  ``jax_ops paged tma`` / ``kernel-merge`` / ``tma+kernel-merge`` (GPU): the CUDA decode with the variants that
  are off by default (``KERNEL_VARIANTS``: the kv_cache ``load`` / ``merge`` knobs).
- ``pallas paged``: ``jax.experimental.pallas.ops.gpu.paged_attention`` on the same pages in its own
  ``[Hkv, P, page, D]`` layout (built once, outside the timing) and the same shuffled table; q pre-scaled by
  1/sqrt(D), which that kernel does not apply.
- ``cudnn contiguous`` / ``xla contiguous``: ``jax.nn.dot_product_attention`` (GQA native) over the same K/V as one
  ``[B, L, Hkv, D]`` buffer, q ``[B, 1, Hq, D]``, ``key_value_seq_lengths`` when ragged; ``jax_ops contiguous``:
  ``jax_ops.dot_product_attention`` on that buffer.

Columns: ``TBps`` = K and V bytes the step must read (sum(lengths)·Hkv·D·2·itemsize) / time; ``frac_copy`` that
rate over the measured copy bandwidth; ``vs_cudnn`` / ``vs_pallas`` = their time / this row's (above 1: this row
is faster); ``temp_MiB``: the compiled temp memory of one call (a paged row whose temp reaches the gathered
cache's K+V size gets a note); ``rel_l2_err`` against fp32 XLA attention at the highest matmul precision over
the contiguous data, checked once per case before timing.

Append rows (B=8 and, full run, B=64 at L=4k): ``kv_cache.append`` of one token ``[B, Hkv, D]`` and of a chunk
``[B, 16, Hkv, D]`` (``jax_ops append``, ``implementation=None``) vs the pair of ``.at[].set`` scatters (``xla
scatter pair``, ``implementation="xla"``), the cache donated and carried through the loop; each trip appends
APPENDS_PER_TRIP times in a row at successive positions (as a model's layers do in one step, so the loop's own
cost is amortised; ``time_us`` is per append) and then resets the lengths, so each trip writes the same slots;
``TBps`` is bytes written / time, ``vs_xla`` the scatter pair's time / this row's, ``max_abs_err`` compares the
written tokens read back and both pools with the scatter pair's. ``jax_ops append fp8``: the same tokens
quantised into float8 pages (``vs_xla`` against the fp16 scatter pair; ``max_abs_err`` not computed).

On a CPU: tiny float32 cases; no cuDNN; the Pallas kernel (Triton) runs once in interpret mode for its error only.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

import jax_ops
from jax_ops import kv_cache as kc
from jax_ops.bench.harness import compiled_temp_bytes, rel_l2, time_loop

PAGE = 16
XLA_TEMP_LIMIT = 20 * 2**30
PAGED_XLA_QUICK_MAX_L = 16384  # --quick skips the jnp paged reference above this length (a loop over pages)
APPEND_CHUNKS = (1, 16)
APPENDS_PER_TRIP = 8  # appends per timed loop trip (time_us is per append)


def _case(B: int, L: int, Hkv: int = 8, *, Hq: int = 32, D: int = 128, ragged: bool = False) -> dict:
    return dict(B=B, L=L, Hq=Hq, Hkv=Hkv, D=D, ragged=ragged)


def _cases(quick: bool, on_gpu: bool) -> list[dict]:
    if not on_gpu:  # tiny sizes: checks the suite runs (jnp paths and the CPU twins)
        return [_case(2, 64, 2, Hq=4, D=32), _case(3, 64, 1, Hq=4, D=32, ragged=True)]
    lengths = (1024, 8192, 32768) if quick else (1024, 4096, 8192, 16384, 32768)
    cases = [_case(8, n) for n in lengths]
    if not quick:
        cases += [_case(1, 131072)] + [_case(b, 4096) for b in (1, 4, 64)] + [_case(8, 4096, 4)]
    return cases + [_case(4, 4096, 4), _case(8, 8192, ragged=True)]


def _append_cases(quick: bool, on_gpu: bool) -> list[dict]:
    if not on_gpu:
        return [dict(_case(2, 160, 2, Hq=4, D=32), T=t) for t in APPEND_CHUNKS]
    batches = (8,) if quick else (8, 64)
    return [dict(_case(b, 4096), T=t) for b in batches for t in APPEND_CHUNKS]


def _name(c: dict) -> str:
    name = f"B={c['B']} L={c['L']} H={c['Hq']}/{c['Hkv']} D={c['D']}" + (" ragged" if c["ragged"] else "")
    return f"append T={c['T']} {name}" if "T" in c else name


def _paged_data(c: dict, dtype, seed: int):
    """q [B, Hq, D], the contiguous K/V [B, L, Hkv, D], and the cache holding the same tokens in shuffled pages
    of a pool exactly as big as the lengths need (table slots past a request's length: ``NO_PAGE``)."""
    B, L, Hq, Hkv, D = c["B"], c["L"], c["Hq"], c["Hkv"], c["D"]
    rng = np.random.default_rng(seed)
    lengths = rng.integers(L // 2, L + 1, B) if c["ragged"] else np.full(B, L)
    lengths = lengths.astype(np.int32)
    max_pages = -(-L // PAGE)
    used = np.arange(max_pages)[None, :] < -(-lengths[:, None] // PAGE)
    table = np.full((B, max_pages), kc.NO_PAGE, np.int32)
    table[used] = rng.permutation(int(used.sum()))
    rows, slots = np.nonzero(used)
    order = np.argsort(table[rows, slots])  # page p holds block (rows[order[p]], slots[order[p]])
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (B, Hq, D), jnp.float32).astype(dtype)
    k = jax.random.normal(keys[1], (B, max_pages * PAGE, Hkv, D), jnp.float32).astype(dtype)
    v = jax.random.normal(keys[2], (B, max_pages * PAGE, Hkv, D), jnp.float32).astype(dtype)
    to_pool = lambda x: x.reshape(B, max_pages, PAGE, Hkv, D)[rows[order], slots[order]]
    cache = kc.PagedKVCache(
        k_pages=to_pool(k), v_pages=to_pool(v), block_table=jnp.asarray(table), lengths=jnp.asarray(lengths)
    )
    return q, k, v, cache


def _reference(q, k, v, lengths) -> jax.Array:
    """fp32 attention of q over the contiguous K/V at the highest matmul precision (no TF32)."""
    f32 = jnp.float32
    with jax.default_matmul_precision("highest"):
        fn = jax.jit(
            lambda q, k, v, n: jax.nn.dot_product_attention(
                q[:, None].astype(f32),
                k.astype(f32),
                v.astype(f32),
                key_value_seq_lengths=n,
                implementation="xla",
            )[:, 0]
        )
        return fn(q, k, v, lengths)


# The CUDA decode's variants that are off by default (kv_cache knobs), timed beside the default (GPU only).
KERNEL_VARIANTS = {
    "tma": dict(load="tma"),
    "kernel-merge": dict(merge="kernel"),
    "tma+kernel-merge": dict(load="tma", merge="kernel"),
}


def _variant(knobs: dict):
    """kc.decode with the knobs set while it traces (they are read at trace time)."""

    def fn(q, cache):
        with kc.overrides(**knobs):
            return kc.decode(q, cache)

    return fn


def _contiguous_fn(implementation: str):
    def fn(q, k, v, lengths):
        if implementation == "jax_ops":
            out = jax_ops.dot_product_attention(q[:, None], k, v, key_value_seq_lengths=lengths)
        else:
            out = jax.nn.dot_product_attention(
                q[:, None], k, v, key_value_seq_lengths=lengths, implementation=implementation
            )
        return out[:, 0]

    return fn


def _pallas_fn(head_dim: int, max_pages: int, interpret: bool):
    from jax.experimental.pallas.ops.gpu.paged_attention import paged_attention

    scale = 1.0 / math.sqrt(head_dim)
    k_splits = math.gcd(max_pages, 16)  # the table's page count must split evenly (16 = its default)

    def fn(q, k_pages, v_pages, table, lengths):
        return paged_attention(
            (q * scale).astype(q.dtype),
            k_pages,
            v_pages,
            table,
            lengths,
            k_splits=k_splits,
            interpret=interpret,
        )

    return fn


def _step(fn):
    def step(q, *operands):
        out = fn(q, *operands)
        return q + (out * 1e-6).astype(
            q.dtype
        )  # tiny dependency: XLA cannot hoist the call; all of out is read

    return step


def _failed(e: Exception) -> str:
    return f"failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}"


def _dtype(on_gpu: bool):
    return jnp.float16 if on_gpu else jnp.float32  # XLA's CPU dot has no fp16 x fp16 -> fp32 form


def _decode_rows(ctx, c: dict, on_gpu: bool) -> list[dict]:
    dtype = _dtype(on_gpu)
    name = _name(c)
    q, k, v, cache = _paged_data(c, dtype, seed=c["B"] * 7 + c["L"] + c["Hkv"])
    itemsize = jnp.dtype(dtype).itemsize
    kv_bytes = int(np.sum(np.asarray(cache.lengths))) * c["Hkv"] * c["D"] * 2 * itemsize
    gathered_bytes = 2 * k.size * itemsize
    ref = _reference(q, k, v, cache.lengths)
    seq_lengths = cache.lengths if c["ragged"] else None
    pallas_table = jnp.maximum(cache.block_table, 0)  # its compute blocks may read unused slots (masked)
    pallas_pools = tuple(p.transpose(2, 0, 1, 3) for p in (cache.k_pages, cache.v_pages))
    fp8_cache = kc.to_float8(cache)
    impls = {
        "jax_ops paged": (lambda q, cache: kc.decode(q, cache), (cache,)),
        "jax_ops paged fp8": (lambda q, cache: kc.decode(q, cache), (fp8_cache,)),
        **(
            {f"jax_ops paged {name}": (_variant(knobs), (cache,)) for name, knobs in KERNEL_VARIANTS.items()}
            if on_gpu
            else {}
        ),
        "jax_ops paged xla": (lambda q, cache: kc.decode(q, cache, implementation="xla"), (cache,)),
        "pallas paged": (None, (*pallas_pools, pallas_table, cache.lengths)),
        "cudnn contiguous": (_contiguous_fn("cudnn"), (k, v, seq_lengths)),
        "xla contiguous": (_contiguous_fn("xla"), (k, v, seq_lengths)),
        "jax_ops contiguous": (_contiguous_fn("jax_ops"), (k, v, seq_lengths)),
    }
    rows: list[dict] = []
    times: dict[str, float] = {}
    for impl, (fn, operands) in impls.items():
        row = {"case": name, "dtype": jnp.dtype(dtype).name, "impl": impl, "time_us": None}
        rows.append(row)
        if impl == "cudnn contiguous" and not on_gpu:
            row["note"] = "skipped: cuDNN needs a GPU"
            continue
        if impl == "jax_ops paged xla" and ctx.quick and c["L"] > PAGED_XLA_QUICK_MAX_L:
            row["note"] = (
                f"skipped in --quick at L > {PAGED_XLA_QUICK_MAX_L} (a jnp loop over the pages: slow)"
            )
            continue
        try:
            if impl == "pallas paged":
                fn = _pallas_fn(c["D"], cache.max_pages, interpret=not on_gpu)
            out = jax.jit(fn)(q, *operands)
            row["rel_l2_err"] = rel_l2(out, ref)
            if impl == "pallas paged" and not on_gpu:
                row["note"] = "skipped timing on CPU (a Triton kernel): rel_l2_err from interpret mode"
                continue
            temp = compiled_temp_bytes(fn, q, *operands)
            if impl == "xla contiguous" and (temp is None or temp > XLA_TEMP_LIMIT):
                row["note"] = f"skipped: XLA temp memory {temp and temp / 2**30:.1f} GiB > 20 GiB"
                continue
            t = time_loop(_step(fn), q, *operands)
        except Exception as e:  # noqa: BLE001 - e.g. a kernel refusing a shape: the row says why
            row["note"] = _failed(e)
            continue
        times[impl] = t
        read = kv_bytes // itemsize if impl == "jax_ops paged fp8" else kv_bytes  # float8: one byte a value
        row.update(
            time_us=t * 1e6,
            TBps=read / t / 1e12,
            frac_copy=read / t / 1e9 / ctx.ceilings.copy_gbps,
            temp_MiB=(temp or 0) / 2**20,
        )
        if "paged" in impl and temp is not None and temp >= gathered_bytes:
            row["note"] = (
                f"temp {temp / 2**20:.0f} MiB >= the gathered K+V ({gathered_bytes / 2**20:.0f} MiB)"
            )
    for row in rows:
        if row["time_us"]:
            for anchor, col in (("cudnn contiguous", "vs_cudnn"), ("pallas paged", "vs_pallas")):
                if anchor in times:
                    row[col] = times[anchor] / (row["time_us"] / 1e6)
    return rows


def _append_rows(c: dict, on_gpu: bool) -> list[dict]:
    dtype = _dtype(on_gpu)
    name, T = _name(c), c["T"]
    _, _, _, full = _paged_data(c, dtype, seed=c["B"] * 7 + c["L"] + c["T"])
    # The last APPENDS_PER_TRIP * T slots of each request are free: each trip appends that many times in a row.
    cache = dataclasses.replace(full, lengths=full.lengths - APPENDS_PER_TRIP * T)
    B, Hkv, D = c["B"], c["Hkv"], c["D"]
    keys = jax.random.split(jax.random.key(T), 2)
    shape = (B, Hkv, D) if T == 1 else (B, T, Hkv, D)
    k_new, v_new = (jax.random.normal(key, shape, jnp.float32).astype(dtype) for key in keys)
    pos = np.asarray(cache.lengths)[:, None] + np.arange(T)[None, :]  # [B, T]
    page_ids = np.take_along_axis(np.asarray(cache.block_table), pos // PAGE, axis=1)
    offsets = pos % PAGE
    written_bytes = 2 * B * T * Hkv * D * jnp.dtype(dtype).itemsize
    ref = kc.append(cache, k_new, v_new, implementation="xla")
    rows: list[dict] = []
    times: dict[str, float] = {}
    fp8_cache = kc.to_float8(cache)
    variants = (
        ("jax_ops append", None, cache),
        ("xla scatter pair", "xla", cache),
        ("jax_ops append fp8", None, fp8_cache),
    )
    for impl, implementation, start in variants:
        row = {"case": name, "dtype": jnp.dtype(dtype).name, "impl": impl, "time_us": None}
        rows.append(row)

        def fn(cache, k_new, v_new, implementation=implementation):
            return kc.append(cache, k_new, v_new, implementation=implementation)

        def step(cache, k_new, v_new, fn=fn):
            # APPENDS_PER_TRIP appends in a row (as the layers of one decode step do), then the lengths go back:
            # the same slots every trip, never past the allocated pages; the loop's own cost is amortised.
            out = cache
            for _ in range(APPENDS_PER_TRIP):
                out = fn(out, k_new, v_new)
            return dataclasses.replace(out, lengths=cache.lengths)

        try:
            out = jax.jit(fn)(start, k_new, v_new)
            if not start.quantized:  # the tokens read back, and both pools against the scatter pair's
                errs = [
                    jnp.max(jnp.abs(got[page_ids, offsets].astype(jnp.float32) - new.reshape(B, T, Hkv, D)))
                    for got, new in ((out.k_pages, k_new), (out.v_pages, v_new))
                ] + [
                    jnp.max(jnp.abs(a.astype(jnp.float32) - b))
                    for a, b in ((out.k_pages, ref.k_pages), (out.v_pages, ref.v_pages))
                ]
                row["max_abs_err"] = max(float(e) for e in errs)
            if not np.array_equal(np.asarray(out.lengths), np.asarray(start.lengths) + T):
                row["note"] = "lengths after append are not lengths + T"
            temp = compiled_temp_bytes(fn, start, k_new, v_new, donate_argnums=(0,))
            carry = jax.tree_util.tree_map(jnp.copy, start)  # donated to the loop: `start` stays valid
            t = time_loop(step, carry, k_new, v_new, donate_carry=True) / APPENDS_PER_TRIP
        except Exception as e:  # noqa: BLE001
            row["note"] = _failed(e)
            continue
        times[impl] = t
        written = written_bytes // jnp.dtype(dtype).itemsize if start.quantized else written_bytes
        row.update(time_us=t * 1e6, TBps=written / t / 1e12, temp_MiB=(temp or 0) / 2**20)
    for row in rows:
        if row["time_us"] and "xla scatter pair" in times:
            row["vs_xla"] = times["xla scatter pair"] / (row["time_us"] / 1e6)
    return rows


def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    cases = [c for c in _cases(ctx.quick, on_gpu) if ctx.selected(_name(c))]
    append_cases = [c for c in _append_cases(ctx.quick, on_gpu) if ctx.selected(_name(c))]
    rows: list[dict] = []
    progress = ctx.progress(len(cases) + len(append_cases), "decode", rows)
    for c in cases:
        rows += _decode_rows(ctx, c, on_gpu)
        progress.step(_name(c))
    for c in append_cases:
        rows += _append_rows(c, on_gpu)
        progress.step(_name(c))
    return rows


__all__ = ["run"]
