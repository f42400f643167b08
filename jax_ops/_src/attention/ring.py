"""Context-parallel (ring) attention: T and S sharded over one mesh axis; K/V blocks travel around the ring with
``ppermute`` while each device runs the attention kernel on the block it holds, and the partial results merge by
their log-sum-exp (merge.py). The backward is a ring too: each device recomputes its blocks against the final
log-sum-exp (the backward kernel's contract) and the dK/dV accumulators travel with their K/V block until they
are home.

Sequence layouts (which global positions a shard holds; P shards, T = S):
- ``"contiguous"``: shard i holds positions [i·c, (i+1)·c), c = T / P (the natural order sharded by the mesh).
  A block pair (query shard i, key shard j) is classified by j - i alone: every key visible, none, or a band
  (causal diagonal, sliding window) that the kernel runs with a shifted window on a slice of the block.
- ``"zigzag"``: the sequence is cut into 2P chunks and shard i holds chunks i and 2P-1-i (``zigzag_order``): under
  causal masking every ring step is the same amount of work on every shard.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jax_ops import _checks
from jax_ops._src import dispatch
from jax_ops._src.attention import heuristics
from jax_ops._src.attention.batching import bwd_op
from jax_ops._src.attention.blocked import blocked_backward
from jax_ops._src.attention.ffi import fill
from jax_ops._src.attention.merge import merge_by_lse
from jax_ops._src.attention.validation import Config, normalize
from jax_ops._src.attention.vjp import _forward, reference_call
from jax_ops._src.vma import vary_like

LAYOUTS = ("contiguous", "zigzag")
_UNBOUNDED = None  # a window side with no limit, in the band arithmetic below (Config's -1)


def zigzag_order(length: int, num_shards: int) -> np.ndarray:
    """The permutation of sequence positions for ``layout="zigzag"``: ``x[:, zigzag_order(T, P)]`` sharded
    contiguously over P shards puts chunks i and 2P-1-i (of 2P equal chunks) on shard i.
    ``jnp.argsort(order)`` undoes it. ``length`` must be a multiple of 2P."""
    if num_shards < 1 or length % (2 * num_shards):
        raise ValueError(
            f"zigzag_order: length {length} must be a multiple of 2 * num_shards = {2 * num_shards}"
        )
    chunk = length // (2 * num_shards)
    chunks = [c for i in range(num_shards) for c in (i, 2 * num_shards - 1 - i)]
    return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in chunks])


@dataclasses.dataclass(frozen=True)
class _Band:
    """One block pair's visible keys: query rows [row0:] see key rows [col0:] with the window (left, right) of the
    sliced pair (None: unbounded); ``empty``: nothing is visible."""

    empty: bool = False
    row0: int = 0
    col0: int = 0
    left: int | None = _UNBOUNDED
    right: int | None = _UNBOUNDED


def _band(left, right, offset: int, c: int) -> _Band:
    """The band of a c x c block pair whose keys start ``offset`` positions after its queries, for the global
    rule t - left <= s <= t + right (None: unbounded)."""
    lo = None if left is None else left + offset  # key row sl >= tl - lo
    hi = None if right is None else right - offset  # key row sl <= tl + hi
    if (hi is not None and hi < -(c - 1)) or (lo is not None and lo < -(c - 1)):
        return _Band(empty=True)
    lo = None if lo is not None and lo >= c - 1 else lo  # a bound the block cannot reach is no bound
    hi = None if hi is not None and hi >= c - 1 else hi
    if hi is not None and hi < 0:  # rows [−hi:] see keys up to their own (shifted) row
        return _Band(row0=-hi, left=None if lo is None else lo + hi, right=0)
    if lo is not None and lo < 0:  # keys [−lo:] start at the (shifted) row
        return _Band(col0=-lo, left=0, right=None if hi is None else hi + lo)
    return _Band(left=lo, right=hi)


@dataclasses.dataclass(frozen=True)
class _Ring:
    """The static set-up of one ring call."""

    cfg: Config  # the per-shard call's contract (is_causal / window: global rules; no bias or mask)
    axis: str
    shards: int
    layout: str
    path: str  # "ffi" | "xla"

    def block_cfg(self, band: _Band, has_q_seqlen: bool, has_kv_seqlen: bool) -> Config:
        causal = band.left is None and band.right == 0
        return dataclasses.replace(
            self.cfg,
            is_causal=causal,
            window_left=-1 if causal or band.left is None else band.left,
            window_right=-1 if causal or band.right is None else band.right,
            has_q_seqlen=has_q_seqlen,
            has_kv_seqlen=has_kv_seqlen,
        )

    def cases(self, c: int) -> tuple[list[_Band], np.ndarray]:
        """Contiguous layout: the distinct bands over every key-minus-query shard offset, and the table from
        offset + shards - 1 to a band's index."""
        left = None if self.cfg.window_left < 0 else self.cfg.window_left
        right = None if self.cfg.window_right < 0 else self.cfg.window_right
        if self.cfg.is_causal:
            right = 0 if right is None else min(right, 0)
        bands, table = [], []
        for d in range(-(self.shards - 1), self.shards):
            b = _band(left, right, d * c, c)
            if b not in bands:
                bands.append(b)
            table.append(bands.index(b))
        return bands, np.asarray(table, np.int32)


def _acc_dtype(q):
    """The merge and gradient accumulators' dtype: float32 (float64 for float64 inputs)."""
    return jnp.promote_types(q.dtype, jnp.float32)


def _local_len(lengths, start, size: int):
    """Global sequence lengths [B] seen by the rows [start, start + size) of a shard: a prefix length."""
    return jnp.clip(lengths - start, 0, size).astype(jnp.int32)


def _zigzag_len(lengths, shard, shards: int, half: int):
    """The prefix length of a zig-zag shard (chunks shard and 2P-1-shard): the late chunk only has valid rows
    when the early one is full, so the valid rows stay a prefix."""
    return _local_len(lengths, shard * half, half) + _local_len(
        lengths, (2 * shards - 1 - shard) * half, half
    )


def _kernel_fwd(ring: _Ring, cfg: Config, q, k, v, qsl, kvsl):
    """(o in q's dtype, lse [B, N, T] in the accumulator dtype) of one block pair on the chosen path."""
    if ring.path == "ffi":
        return _forward(cfg, q, k, v, None, None, qsl, kvsl)
    o, lse = reference_call(cfg, q, k, v, None, None, qsl, kvsl, return_lse=True)
    return o, lse.astype(_acc_dtype(q))


def _kernel_bwd(ring: _Ring, cfg: Config, q, k, v, qsl, kvsl, o, lse, do):
    """(dq, dk, dv) of one block pair given the whole row's o and lse (the backward kernel's contract)."""
    if ring.path == "ffi":
        reason = heuristics.bwd_unsupported_reason(cfg, q.shape, k.shape[1])
        if reason is None:
            dq, dk, dv, _ = bwd_op(cfg)(q, k, v, *fill(cfg, None, None, qsl, kvsl), o, lse, do)
            return vary_like((dq, dk, dv), (q, k, v, qsl, kvsl, o, lse, do))
        _checks.warn_once(
            f"ring_attention:bwd:{reason}",
            f"jax_ops.ring_attention: {reason}; each block pair's backward runs the blocked jnp backward",
        )
    return blocked_backward(cfg, q, k, v, qsl, kvsl, o, lse, do)


def _embed(x, axis: int, rows: slice, size: int, value):
    """``x``, the result for rows ``rows`` of a block, padded with ``value`` to the block's ``size`` rows."""
    if rows.start == 0 and rows.stop == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (rows.start, size - rows.stop)
    return jnp.pad(x, widths, constant_values=value)


class _Pair:
    """The block pairs of one shard: which band each ring step runs and its seq lengths, for both passes."""

    def __init__(self, ring: _Ring, q, k, qsl, kvsl):
        self.ring, self.qsl, self.kvsl = ring, qsl, kvsl
        self.T, self.S = q.shape[1], k.shape[1]
        self.me = jax.lax.axis_index(ring.axis)

    def branches(self, j, body):
        """``body(cfg, q_rows, kv_rows, qsl, kvsl)`` per band, with (index, branches) for lax.switch. q_rows and
        kv_rows are static slices of the shard's rows; the lengths are the sliced blocks' prefix lengths."""
        ring, T, S, me = self.ring, self.T, self.S, self.me
        has_q, has_kv = self.qsl is not None, self.kvsl is not None
        if ring.layout == "zigzag":
            h = T // 2  # rows per zigzag half; keys have their own half (cross attention: S != T)
            ql = _zigzag_len(self.qsl, me, ring.shards, h) if has_q else None
            kl = _zigzag_len(self.kvsl, j, ring.shards, S // 2) if has_kv else None
            q_late = _local_len(self.qsl, (2 * ring.shards - 1 - me) * h, h) if has_q else None
            kv_early = _local_len(self.kvsl, j * h, h) if has_kv else None
            if ring.cfg.is_causal:
                diag = _Band(right=0)
                full = _Band()
                cfgs = (ring.block_cfg(full, has_q, has_kv), ring.block_cfg(diag, has_q, has_kv))
                cases = [
                    lambda: body(cfgs[0], slice(0, T), slice(0, h), ql, kv_early),  # j < me: early keys
                    lambda: body(cfgs[1], slice(0, T), slice(0, S), ql, kl),  # j == me: causal block
                    lambda: body(cfgs[0], slice(h, T), slice(0, S), q_late, kl),  # j > me: late queries
                ]
                return jnp.sign(j - me) + 1, cases
            cfg = ring.block_cfg(_Band(), has_q, has_kv)
            return None, [lambda: body(cfg, slice(0, T), slice(0, S), ql, kl)]
        bands, table = ring.cases(T)
        ql = _local_len(self.qsl, me * T, T) if has_q else None
        kl = _local_len(self.kvsl, j * S, S) if has_kv else None
        cases = []
        for b in bands:
            if b.empty:
                cases.append(lambda: body(None, slice(0, 0), slice(0, 0), None, None))
                continue
            qlb = None if ql is None else jnp.clip(ql - b.row0, 0, T - b.row0)
            klb = None if kl is None else jnp.clip(kl - b.col0, 0, S - b.col0)
            cfg = ring.block_cfg(b, has_q, has_kv)
            cases.append(
                functools.partial(body, cfg, slice(b.row0, T), slice(b.col0, S), qlb, klb),
            )
        index = jnp.asarray(table)[j - me + ring.shards - 1] if len(cases) > 1 else None
        return index, cases


def _switch(index, cases):
    return cases[0]() if index is None else jax.lax.switch(index, cases)


def _shift(x, ring: _Ring, direction: int = 1):
    """Each shard's block to the next shard of the ring (direction 1: shard i receives shard i-1's; -1: i+1's)."""
    perm = [(s, (s + direction) % ring.shards) for s in range(ring.shards)]
    return jax.lax.ppermute(x, ring.axis, perm)


def _ring_forward(ring: _Ring, q, k, v, qsl, kvsl):
    """(o in q's dtype, lse [B, N, T] f32) of the shard's queries over every shard's keys."""
    B, T, N, D = q.shape
    acc = _acc_dtype(q)
    pair = _Pair(ring, q, k, qsl, kvsl)
    o_acc = jnp.zeros((B, T, N, D), acc)
    lse_acc = jnp.full((B, T, N), -jnp.inf, acc)
    o_acc, lse_acc = vary_like((o_acc, lse_acc), (q,))
    kv = (k, v)
    for step in range(ring.shards):
        nxt = _shift(kv, ring) if step + 1 < ring.shards else None  # in flight during this step's kernel
        j = (pair.me - step) % ring.shards

        def body(cfg, rows, cols, ql, kl, kv=kv):
            if cfg is None:  # nothing visible: weight 0 in the merge
                return vary_like((jnp.zeros((B, T, N, D), q.dtype), jnp.full((B, N, T), -jnp.inf, acc)), (q,))
            o, lse = _kernel_fwd(ring, cfg, q[:, rows], kv[0][:, cols], kv[1][:, cols], ql, kl)
            return _embed(o, 1, rows, T, 0), _embed(lse, 2, rows, T, -jnp.inf)

        o_r, lse_r = _switch(*pair.branches(j, body))
        o_acc, lse_acc = merge_by_lse(
            jnp.stack([o_acc, o_r.astype(acc)]), jnp.stack([lse_acc, lse_r.transpose(0, 2, 1)])
        )
        kv = nxt
    return o_acc.astype(q.dtype), lse_acc.transpose(0, 2, 1)


def _ring_backward(ring: _Ring, q, k, v, qsl, kvsl, o, lse, do):
    """(dq, dk, dv): dq accumulates on the shard; each K/V block's dk/dv accumulate as it travels and arrive home
    after the last step. The blocks travel the other way round the ring from the forward's: the same ppermutes of
    the same k, v would be merged by XLA with the forward's, which then holds every received block from the forward
    until the backward (memory linear in the whole sequence)."""
    T = q.shape[1]
    acc = _acc_dtype(q)
    pair = _Pair(ring, q, k, qsl, kvsl)
    dq = vary_like((jnp.zeros(q.shape, acc),), (q,))[0]
    dkv = vary_like((jnp.zeros(k.shape, acc), jnp.zeros(v.shape, acc)), (k,))
    kv = (k, v)
    for step in range(ring.shards):
        nxt = _shift(kv, ring, -1) if step + 1 < ring.shards else None
        j = (pair.me + step) % ring.shards

        def body(cfg, rows, cols, ql, kl, kv=kv):
            if cfg is None:
                return vary_like((jnp.zeros(q.shape, q.dtype), jnp.zeros_like(k), jnp.zeros_like(v)), (q, k))
            dq_r, dk_r, dv_r = _kernel_bwd(
                ring, cfg, q[:, rows], kv[0][:, cols], kv[1][:, cols], ql, kl, o[:, rows], lse[:, :, rows],
                do[:, rows],
            )  # fmt: skip
            return (
                _embed(dq_r, 1, rows, T, 0),
                _embed(dk_r, 1, cols, k.shape[1], 0),
                _embed(dv_r, 1, cols, k.shape[1], 0),
            )

        dq_r, dk_r, dv_r = _switch(*pair.branches(j, body))
        dq = dq + dq_r.astype(acc)
        dkv = _shift((dkv[0] + dk_r.astype(acc), dkv[1] + dv_r.astype(acc)), ring, -1)
        kv = nxt
    return dq.astype(q.dtype), dkv[0].astype(k.dtype), dkv[1].astype(v.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _ring(ring: _Ring, q, k, v, qsl, kvsl):
    return _ring_forward(ring, q, k, v, qsl, kvsl)


def _ring_fwd(ring: _Ring, q, k, v, qsl, kvsl):
    o, lse = _ring_forward(ring, q, k, v, qsl, kvsl)
    return (o, lse), (q, k, v, qsl, kvsl, o, lse)


def _ring_bwd(ring: _Ring, res, cts):
    q, k, v, qsl, kvsl, o, lse = res
    do = cts[0].astype(q.dtype)  # the residual is returned under stop_gradient
    return (*_ring_backward(ring, q, k, v, qsl, kvsl, o, lse, do), None, None)


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention_shard(
    query,
    key,
    value,
    *,
    axis_name: str,
    layout: str = "contiguous",
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size=None,
    implementation: str | None = None,
    return_residual: bool = False,
    bias=None,
    mask=None,
):
    """Ring attention on the local blocks inside a ``jax.shard_map`` whose ``axis_name`` shards the sequence.

    ``query [B, Tl, N, H]``, ``key``/``value [B, Sl, K, H]``: this shard's rows of the global sequence, which
    ``layout`` ("contiguous" or "zigzag", module docstring) places; seq lengths are the global ``[B]`` lengths,
    replicated over ``axis_name``. Same semantics as :func:`dot_product_attention` on the whole sequence (top-left
    causal, empty rows 0, fp32 merge); ``is_causal`` and ``local_window_size`` need ``Tl == Sl`` (self-attention)
    and windows the contiguous layout. No bias or mask (``ValueError``). Returns the shard's output rows (and the log-sum-exp
    ``[B, Tl, N]`` when ``return_residual``); differentiable in query, key and value (the backward is a ring).
    """
    for name, given in (("bias", bias), ("mask", mask)):
        if given is not None:
            raise ValueError(
                f"ring attention takes no {name}: pass padding as query_seq_lengths / key_value_seq_lengths and "
                "causality as is_causal, or run dot_product_attention on the gathered sequence"
            )
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    cfg, (q, k, v, _, _, qsl, kvsl) = normalize(
        query, key, value, None, None, scale, is_causal, query_seq_lengths, key_value_seq_lengths,
        local_window_size,
    )  # fmt: skip
    if query.ndim != 4:
        raise ValueError(f"query must have rank 4 [B, Tl, N, H] in ring attention, got shape {query.shape}")
    T, S = q.shape[1], k.shape[1]
    positional = cfg.is_causal or cfg.window_left >= 0 or cfg.window_right >= 0
    if positional and T != S:
        raise ValueError(
            f"ring attention with is_causal or local_window_size needs equal query and key blocks per shard, "
            f"got {T} query rows and {S} key rows"
        )
    if layout == "zigzag":
        if cfg.window_left >= 0 or cfg.window_right >= 0:
            raise ValueError("ring attention: local_window_size needs layout='contiguous'")
        if T % 2 or S % 2:
            raise ValueError(f"layout='zigzag' needs an even number of rows per shard, got {T} and {S}")
    reason = heuristics.unsupported_reason(q.dtype, q.shape[3]) if implementation != "xla" else None
    path = dispatch.choose("jax_ops.ring_attention", implementation, unsupported=reason, default_on_cpu="xla")
    ring = _Ring(cfg=cfg, axis=axis_name, shards=jax.lax.axis_size(axis_name), layout=layout, path=path)
    o, lse = _ring(ring, q, k, v, qsl, kvsl)
    if not return_residual:
        return o
    return o, jax.lax.stop_gradient(lse.transpose(0, 2, 1).astype(q.dtype))


def ring_attention(
    query,
    key,
    value,
    *,
    mesh,
    seq_axis: str,
    batch_axis=None,
    head_axis=None,
    layout: str = "contiguous",
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    **kwargs,
):
    """Context-parallel attention of global ``[B, T, N, H]`` arrays whose T and S shard over ``seq_axis`` of
    ``mesh`` (batch over ``batch_axis`` and kv heads over ``head_axis`` too, as :func:`shard_map_attention`).
    The sequence axis is in ``layout``'s order (for "zigzag", permute it with :func:`zigzag_order` first; the
    output comes back in the same order). ``kwargs``: scale, is_causal, local_window_size, implementation,
    return_residual (see :func:`ring_attention_shard`); a bias or mask is a ``ValueError``."""
    qspec = P(batch_axis, seq_axis, head_axis, None)
    lspec = P(batch_axis)
    lengths = (query_seq_lengths, key_value_seq_lengths)
    present = [x for x in lengths if x is not None]

    def local(q, k, v, *ls):
        it = iter(ls)
        ql, kl = (next(it) if x is not None else None for x in lengths)
        return ring_attention_shard(
            q, k, v, axis_name=seq_axis, layout=layout, query_seq_lengths=ql, key_value_seq_lengths=kl,
            **kwargs,
        )  # fmt: skip

    out_specs = (qspec, P(batch_axis, seq_axis, head_axis)) if kwargs.get("return_residual") else qspec
    smap = jax.shard_map(
        local, mesh=mesh, in_specs=(qspec, qspec, qspec, *([lspec] * len(present))), out_specs=out_specs
    )
    return smap(query, key, value, *present)
