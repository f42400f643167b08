"""``custom_vmap`` rules of the two targets: the mapped axis folds into the batch (one kernel launch); an unmapped
broadcast bias/mask stays shared unless its gradient must come out per example. The one exception: a backward
whose folded dbias scores (dS [V*B, N, T, S] float32) would pass their budget runs in groups of examples, one
launch per group."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jax_ops._src.attention import heuristics
from jax_ops._src.attention.ffi import writes_dbias_scores
from jax_ops._src.attention.sharding import partitioned
from jax_ops._src.attention.validation import Config
from jax_ops._src.batching import fold_leading, lead, unfold_leading


def _fold_bcast(x, batched: bool, v: int, B: int, present: bool, reducible: bool):
    """A rank-4 broadcastable bias/mask under vmap. Unbatched [1, ...] stays shared unless ``reducible``
    (dbias must then come out per mapped example); otherwise [V, B|1, ...] -> [V*B, ...] (or [V, ...] if B==1)."""
    if not present:
        return x
    if not batched and x.shape[0] == 1 and not reducible:
        return x
    x = lead(x, batched, v)
    if x.shape[1] != B:
        x = jnp.broadcast_to(x, (v, B, *x.shape[2:]))
    return x.reshape(v * B, *x.shape[2:])


def _map_in_groups(f, group: int, in_batched, args):
    """f over the mapped axis of ``args`` in groups of ``group`` examples (each group one vmapped call, so this
    rule again, with axis size ``group``); unmapped args are shared."""
    mapped = tuple(a for a, b in zip(args, in_batched) if b)

    def one(xs):
        it = iter(xs)
        return f(*(next(it) if b else a for a, b in zip(args, in_batched)))

    return jax.lax.map(one, mapped, batch_size=group)


@functools.cache
def fwd_op(cfg: Config):
    part = partitioned(cfg, False)

    @jax.custom_batching.custom_vmap
    def fwd(q, k, v, bias, mask, qsl, kvsl):
        return part(q, k, v, bias, mask, qsl, kvsl)

    @fwd.def_vmap
    def _fwd_rule(axis_size, in_batched, q, k, v, bias, mask, qsl, kvsl):
        V, B = axis_size, (q.shape[1] if in_batched[0] else q.shape[0])
        qf, kf, vf = (fold_leading(x, bt, V) for x, bt in zip((q, k, v), in_batched[:3]))
        bf = _fold_bcast(bias, in_batched[3], V, B, cfg.has_bias, False)
        mf = _fold_bcast(mask, in_batched[4], V, B, cfg.has_mask, False)
        qs = fold_leading(qsl, in_batched[5], V) if cfg.has_q_seqlen else qsl
        ks = fold_leading(kvsl, in_batched[6], V) if cfg.has_kv_seqlen else kvsl
        o, lse = fwd(qf, kf, vf, bf, mf, qs, ks)
        return (unfold_leading(o, V), unfold_leading(lse, V)), (True, True)

    return fwd


@functools.cache
def bwd_op(cfg: Config):
    part = partitioned(cfg, True)

    @jax.custom_batching.custom_vmap
    def bwd(q, k, v, bias, mask, qsl, kvsl, o, lse, do):
        return part(q, k, v, bias, mask, qsl, kvsl, o, lse, do)

    @bwd.def_vmap
    def _bwd_rule(axis_size, in_batched, q, k, v, bias, mask, qsl, kvsl, o, lse, do):
        V, B = axis_size, (q.shape[1] if in_batched[0] else q.shape[0])
        args = (q, k, v, bias, mask, qsl, kvsl, o, lse, do)
        example_scores_bytes = heuristics.dbias_scores_bytes(B, q.shape[-2], q.shape[-3], k.shape[-3])
        if writes_dbias_scores(cfg) and V > 1 and V * example_scores_bytes > heuristics.DBIAS_SCORES_BYTES:
            group = max(1, heuristics.DBIAS_SCORES_BYTES // example_scores_bytes)
            return _map_in_groups(bwd, group, in_batched, args), (True,) * 4
        qf, kf, vf = (fold_leading(x, bt, V) for x, bt in zip((q, k, v), in_batched[:3]))
        of, lf, df = (fold_leading(x, bt, V) for x, bt in zip((o, lse, do), in_batched[7:]))
        bf = _fold_bcast(bias, in_batched[3], V, B, cfg.has_bias, True)
        mf = _fold_bcast(mask, in_batched[4], V, B, cfg.has_mask, False)
        qs = fold_leading(qsl, in_batched[5], V) if cfg.has_q_seqlen else qsl
        ks = fold_leading(kvsl, in_batched[6], V) if cfg.has_kv_seqlen else kvsl
        dq, dk, dv, db = bwd(qf, kf, vf, bf, mf, qs, ks, of, lf, df)
        if cfg.has_bias:
            bias_b = bias.shape[1] if in_batched[3] else bias.shape[0]
            db = unfold_leading(db, V)
            if bias_b == 1 and B != 1:
                db = db.sum(axis=1, keepdims=True)
            db_batched = True
        else:
            db_batched = False
        return (unfold_leading(dq, V), unfold_leading(dk, V), unfold_leading(dv, V), db), (
            True,
            True,
            True,
            db_batched,
        )

    return bwd
