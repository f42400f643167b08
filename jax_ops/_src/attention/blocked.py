"""The jnp path in blocks: the reference's semantics (reference.py) with O(block_q x block_k) memory per head
instead of O(T x S), forward and backward (a custom_vjp that recomputes the probabilities from the saved
log-sum-exp). It is what ``implementation="xla"`` (and a GPU fallback) runs when the dense reference would
materialise a large logits tensor (``dense_fits``); the results agree with the reference to fp32 rounding."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax

from jax_ops._src.attention.validation import Config
from jax_ops._src.vma import vary_like

# The dense reference materialises a few [B, N, T, S] fp32 tensors (logits, probabilities, their cotangents);
# above this many logits bytes the blocked path runs instead.
DENSE_LOGITS_BYTES = 64 << 20
DEFAULT_BLOCK = 512


def dense_fits(q_shape, s: int, itemsize: int = 4) -> bool:
    """Whether the dense reference's [B, N, T, S] logits stay within DENSE_LOGITS_BYTES."""
    b, t, n, _ = q_shape
    return b * n * t * s * max(itemsize, 4) <= DENSE_LOGITS_BYTES


@dataclasses.dataclass(frozen=True)
class _Blocks:
    """Static tiling of one call: query/key block sizes and block counts (T and S padded to whole blocks)."""

    bq: int
    bk: int
    nq: int
    nk: int


def _tiling(t: int, s: int, block: int) -> _Blocks:
    bq, bk = min(block, max(t, 1)), min(block, max(s, 1))
    return _Blocks(bq, bk, -(-t // bq), -(-s // bk))


def _pad_to(x, axis: int, size: int, value=0):
    pad = size - x.shape[axis]
    if pad == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, pad)
    return jnp.pad(x, widths, constant_values=value)


def _pad_broadcast(x, tp: int, sp: int, value):
    """A rank-4 bias / mask (each dim 1 or full, [B, N, T, S]) with T and S padded to tp / sp where full."""
    if x.shape[2] > 1:
        x = _pad_to(x, 2, tp, value)
    return _pad_to(x, 3, sp, value) if x.shape[3] > 1 else x


def _tile(x, axis: int, start, size: int):
    """Rows [start, start + size) of a broadcastable operand along ``axis`` (kept whole where it has size 1)."""
    if x.shape[axis] == 1:
        return x
    return lax.dynamic_slice_in_dim(x, start, size, axis)


class _Problem:
    """The padded operands of one call and the per-block pieces the forward and both backward passes share."""

    def __init__(self, cfg: Config, q, k, v, bias, mask, qsl, kvsl, blocks: _Blocks):
        self.cfg, self.blk = cfg, blocks
        self.f32 = jnp.promote_types(q.dtype, jnp.float32)
        self.B, self.T, self.N, self.D = q.shape
        self.S, self.K = k.shape[1], k.shape[2]
        self.G = self.N // self.K
        tp, sp = blocks.nq * blocks.bq, blocks.nk * blocks.bk
        # q [B, Tp, K, G, D], k / v [B, Sp, K, D] in fp32 (fp64 for float64)
        self.q = _pad_to(q.astype(self.f32), 1, tp).reshape(self.B, tp, self.K, self.G, self.D)
        self.k = _pad_to(k.astype(self.f32), 1, sp)
        self.v = _pad_to(v.astype(self.f32), 1, sp)
        self.bias = None if bias is None else _pad_broadcast(bias, tp, sp, 0)
        self.mask = None if mask is None else _pad_broadcast(mask, tp, sp, False)
        self.qsl = qsl if cfg.has_q_seqlen else None
        self.kvsl = kvsl if cfg.has_kv_seqlen else None
        self.operands = (q, k, v, bias, mask, self.qsl, self.kvsl)

    def carry(self, init, *more):
        """A scan's initial carry, typed as varying over the manual axes the operands (and ``more``) vary over
        inside ``jax.shard_map`` (the carry out is)."""
        return vary_like(init, self.operands + more)

    def q_block(self, i):
        return lax.dynamic_slice_in_dim(self.q, i * self.blk.bq, self.blk.bq, 1)

    def kv_block(self, j):
        bk = self.blk.bk
        return (
            lax.dynamic_slice_in_dim(self.k, j * bk, bk, 1),
            lax.dynamic_slice_in_dim(self.v, j * bk, bk, 1),
        )

    def allowed(self, i, j):
        """bool [B|1, N|1, bq, bk] of block (i, j): the reference's causal/window/length/mask rules, padding out."""
        cfg, bq, bk = self.cfg, self.blk.bq, self.blk.bk
        t = i * bq + jnp.arange(bq)[:, None]
        s = j * bk + jnp.arange(bk)[None, :]
        ok = (t < self.T) & (s < self.S)
        if cfg.is_causal:
            ok &= s <= t
        if cfg.window_left >= 0:
            ok &= s >= t - cfg.window_left
        if cfg.window_right >= 0:
            ok &= s <= t + cfg.window_right
        ok = ok[None, None]
        if self.qsl is not None:
            ok = ok & (t[None, None] < self.qsl[:, None, None, None])
        if self.kvsl is not None:
            ok = ok & (s[None, None] < self.kvsl[:, None, None, None])
        if self.mask is not None:
            ok = ok & _tile(_tile(self.mask, 2, i * bq, bq), 3, j * bk, bk)
        return ok

    def logits(self, qb, kb, i, j):
        """fp32 [B, N, bq, bk]: scale * q.k + bias, and where the block's keys are allowed."""
        lg = jnp.einsum("btkgd,bskd->bkgts", qb, kb, precision=lax.Precision.HIGHEST)
        lg = lg.reshape(self.B, self.N, self.blk.bq, self.blk.bk) * jnp.asarray(self.cfg.scale, self.f32)
        if self.bias is not None:
            lg = lg + _tile(
                _tile(self.bias, 2, i * self.blk.bq, self.blk.bq), 3, j * self.blk.bk, self.blk.bk
            ).astype(self.f32)
        return lg, self.allowed(i, j)

    def pv(self, p, vb):
        """[B, bq, K, G, D] = P V for P [B, N, bq, bk]."""
        p = p.reshape(self.B, self.K, self.G, self.blk.bq, self.blk.bk)
        return jnp.einsum("bkgts,bskd->btkgd", p, vb, precision=lax.Precision.HIGHEST)


def _forward(cfg: Config, blocks: _Blocks, q, k, v, bias, mask, qsl, kvsl):
    """(o [B, T, N, D] in q's dtype, lse [B, N, T] fp32/fp64 with 0 for empty rows, empty [B, N, T] bool): the
    reference's online-softmax form. The lse of an empty row is -inf only where the caller asks for it, so that
    finite inputs create no inf (jax.debug_infs)."""
    pr = _Problem(cfg, q, k, v, bias, mask, qsl, kvsl, blocks)
    low = jnp.finfo(pr.f32).min
    B, N, D, bq = pr.B, pr.N, pr.D, blocks.bq

    def query_block(i):
        qb = pr.q_block(i)

        def key_block(carry, j):
            m, l, acc = carry  # noqa: E741
            kb, vb = pr.kv_block(j)
            lg, ok = pr.logits(qb, kb, i, j)
            # as the reference: the max over allowed logits only, at least the lowest finite value (never -inf)
            m_new = jnp.maximum(m, jnp.max(jnp.where(ok, lg, low), axis=-1))
            corr = jnp.exp(m - m_new)
            e = jnp.where(ok, jnp.exp(jnp.where(ok, lg, m_new[..., None]) - m_new[..., None]), 0.0)
            l = l * corr + jnp.sum(e, axis=-1)  # noqa: E741
            c = corr.reshape(B, pr.K, pr.G, bq).transpose(0, 3, 1, 2)[..., None]
            return (m_new, l, acc * c + pr.pv(e, vb)), None

        init = (
            jnp.full((B, N, bq), low, pr.f32),
            jnp.zeros((B, N, bq), pr.f32),
            jnp.zeros((B, bq, pr.K, pr.G, D), pr.f32),
        )
        (m, l, acc), _ = lax.scan(key_block, pr.carry(init), jnp.arange(blocks.nk))  # noqa: E741
        empty = l == 0  # no allowed key (a NaN l is not empty: NaN reaches o, as in the reference)
        l_safe = jnp.where(empty, 1.0, l)
        o = acc.reshape(B, bq, N, D) / l_safe.transpose(0, 2, 1)[..., None]
        o = jnp.where(empty.transpose(0, 2, 1)[..., None], 0.0, o)
        return o, jnp.where(empty, 0.0, m + jnp.log(l_safe)), empty

    o, lse, empty = lax.map(query_block, jnp.arange(blocks.nq))  # [nq, B, bq, N, D], [nq, B, N, bq] x 2
    o = o.transpose(1, 0, 2, 3, 4).reshape(B, blocks.nq * bq, N, D)[:, : pr.T]
    lse = lse.transpose(1, 2, 0, 3).reshape(B, N, blocks.nq * bq)[:, :, : pr.T]
    empty = empty.transpose(1, 2, 0, 3).reshape(B, N, blocks.nq * bq)[:, :, : pr.T]
    return o.astype(q.dtype), lse, empty


def _probabilities(lg, ok, lse_b, empty_b):
    """P = exp(logit - lse) where allowed in a row that is not empty, else 0."""
    live = ok & ~empty_b[..., None]
    return jnp.where(live, jnp.exp(jnp.where(live, lg - lse_b[..., None], 0.0)), 0.0)


def _backward(cfg: Config, blocks: _Blocks, res, do):
    q, k, v, bias, mask, qsl, kvsl, o, lse, empty = res
    pr = _Problem(cfg, q, k, v, bias, mask, qsl, kvsl, blocks)
    B, N, K, G, D, bq, bk = pr.B, pr.N, pr.K, pr.G, pr.D, blocks.bq, blocks.bk
    tp = blocks.nq * bq
    do_p = _pad_to(do.astype(pr.f32), 1, tp).reshape(B, tp, K, G, D)
    # delta = rowsum(dO * O) [B, N, Tp]; padded rows are empty
    delta = jnp.sum(do.astype(pr.f32) * o.astype(pr.f32), axis=-1).transpose(0, 2, 1)
    delta = _pad_to(delta, 2, tp)
    lse_p = _pad_to(lse.astype(pr.f32), 2, tp)
    empty_p = _pad_to(empty, 2, tp, True)
    scale = jnp.asarray(cfg.scale, pr.f32)

    def pieces(i, j, kb, vb):
        qb, dob = pr.q_block(i), lax.dynamic_slice_in_dim(do_p, i * bq, bq, 1)
        lg, ok = pr.logits(qb, kb, i, j)
        rows = (
            lax.dynamic_slice_in_dim(lse_p, i * bq, bq, 2),
            lax.dynamic_slice_in_dim(empty_p, i * bq, bq, 2),
        )
        p = _probabilities(lg, ok, *rows)
        dp = jnp.einsum("btkgd,bskd->bkgts", dob, vb, precision=lax.Precision.HIGHEST).reshape(B, N, bq, bk)
        ds = p * (dp - lax.dynamic_slice_in_dim(delta, i * bq, bq, 2)[..., None])  # d(logits) [B, N, bq, bk]
        return qb, dob, p, ds

    def dq_block(i):
        def step(dq, j):
            kb, vb = pr.kv_block(j)
            _, _, _, ds = pieces(i, j, kb, vb)
            return dq + pr.pv(ds, kb) * scale, None

        (dq,) = pr.carry((jnp.zeros((B, bq, K, G, D), pr.f32),), o, lse, do)
        dq, _ = lax.scan(step, dq, jnp.arange(blocks.nk))
        return dq

    def dkv_block(j):
        kb, vb = pr.kv_block(j)

        def step(carry, i):
            dk, dv = carry
            qb, dob, p, ds = pieces(i, j, kb, vb)
            p5 = p.reshape(B, K, G, bq, bk)
            ds5 = ds.reshape(B, K, G, bq, bk)
            dv = dv + jnp.einsum("bkgts,btkgd->bskd", p5, dob, precision=lax.Precision.HIGHEST)
            dk = dk + jnp.einsum("bkgts,btkgd->bskd", ds5, qb, precision=lax.Precision.HIGHEST) * scale
            return (dk, dv), _reduce_bias_block(pr, ds)

        zeros = jnp.zeros((B, bk, K, D), pr.f32)
        (dk, dv), dbias = lax.scan(step, pr.carry((zeros, zeros), o, lse, do), jnp.arange(blocks.nq))
        return dk, dv, dbias

    dq = lax.map(dq_block, jnp.arange(blocks.nq))  # [nq, B, bq, K, G, D]
    dq = dq.transpose(1, 0, 2, 3, 4, 5).reshape(B, tp, N, D)[:, : pr.T].astype(q.dtype)
    dk, dv, dbias = lax.map(dkv_block, jnp.arange(blocks.nk))  # [nk, B, bk, K, D], dbias [nk, nq, ...]
    sp = blocks.nk * bk
    dk = dk.transpose(1, 0, 2, 3, 4).reshape(B, sp, K, D)[:, : pr.S].astype(k.dtype)
    dv = dv.transpose(1, 0, 2, 3, 4).reshape(B, sp, K, D)[:, : pr.S].astype(v.dtype)
    db = None if bias is None else _assemble_bias(pr, bias, dbias)
    return dq, dk, dv, db


def _reduce_bias_block(pr: _Problem, ds):
    """d(bias) of one block: ds [B, N, bq, bk] summed over the bias's broadcast dims (kept as size 1)."""
    if pr.bias is None:
        return jnp.zeros((), pr.f32)
    axes = tuple(a for a in range(4) if pr.bias.shape[a] == 1 and ds.shape[a] != 1)
    return jnp.sum(ds, axis=axes, keepdims=True)


def _assemble_bias(pr: _Problem, bias, dbias):
    """The bias gradient from the per-block sums [nk, nq, B|1, N|1, bq|1, bk|1]: blocks laid out where T/S are
    full, summed over the block axes where they are broadcast."""
    d = dbias
    if bias.shape[3] == 1:
        d = jnp.sum(d, axis=0, keepdims=True)
    if bias.shape[2] == 1:
        d = jnp.sum(d, axis=1, keepdims=True)
    ck, cq = d.shape[0], d.shape[1]
    b0, n0, rt, rs = d.shape[2:]
    d = d.transpose(2, 3, 1, 4, 0, 5).reshape(b0, n0, cq * rt, ck * rs)
    return d[:, :, : bias.shape[2], : bias.shape[3]].astype(bias.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _blocked(cfg: Config, blocks: _Blocks, q, k, v, bias, mask, qsl, kvsl):
    return _forward(cfg, blocks, q, k, v, bias, mask, qsl, kvsl)


def _blocked_fwd(cfg: Config, blocks: _Blocks, q, k, v, bias, mask, qsl, kvsl):
    o, lse, empty = _forward(cfg, blocks, q, k, v, bias, mask, qsl, kvsl)
    return (o, lse, empty), (q, k, v, bias, mask, qsl, kvsl, o, lse, empty)


def _blocked_bwd(cfg: Config, blocks: _Blocks, res, cts):
    do = cts[0]  # the lse output is returned under stop_gradient
    dq, dk, dv, db = _backward(cfg, blocks, res, do)
    return dq, dk, dv, db, None, None, None


_blocked.defvjp(_blocked_fwd, _blocked_bwd)


def blocked_attention(
    cfg: Config, q, k, v, bias, mask, qsl, kvsl, *, return_lse: bool, block: int = DEFAULT_BLOCK
):
    """The reference's result (``(o, lse)``, or ``o`` alone) for normalized inputs (validation.normalize), in
    blocks of ``block`` queries x ``block`` keys; differentiable in q, k, v and bias."""
    o, lse, empty = _blocked(cfg, _tiling(q.shape[1], k.shape[1], block), q, k, v, bias, mask, qsl, kvsl)
    return (o, jnp.where(empty, -jnp.inf, lse)) if return_lse else o


def blocked_backward(cfg: Config, q, k, v, qsl, kvsl, o, lse, do, *, block: int = DEFAULT_BLOCK):
    """(dq, dk, dv) of one key block of a larger attention whose output ``o`` and natural-log ``lse`` [B, N, T]
    (-inf on empty rows) are given: the probabilities are recomputed against that lse, as the backward kernel
    does (ring attention's per-block backward on the jnp path). No bias or mask."""
    empty = lse == -jnp.inf
    res = (q, k, v, None, None, qsl, kvsl, o, jnp.where(empty, 0.0, lse), empty)
    dq, dk, dv, _ = _backward(cfg, _tiling(q.shape[1], k.shape[1], block), res, do)
    return dq, dk, dv
