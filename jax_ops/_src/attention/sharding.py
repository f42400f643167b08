"""``custom_partitioning`` of the two targets: batch and kv heads shard without gathers (Shardy rule and the
partition callback); T, S and D stay whole on each shard."""

from __future__ import annotations

import functools
import math

import jax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops._src.attention.ffi import bwd_ffi, fwd_ffi
from jax_ops._src.attention.validation import Config


def _axes_size(mesh, axes) -> int:
    if axes is None:
        return 1
    axes = axes if isinstance(axes, tuple) else (axes,)
    return math.prod(mesh.shape[a] for a in axes)


def _as_tuple(axes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return axes if isinstance(axes, tuple) else (axes,)


def _shape_of(t) -> tuple[int, ...]:
    from jax._src.interpreters import mlir

    return tuple(mlir.ir.RankedTensorType(t).shape)


def _rule(cfg: Config, bwd: bool, mesh, value_types, result_types):
    """Shardy rule: batch ``b`` and kv heads ``k`` may shard; ``N = (k g)`` keeps the GQA group on one shard."""
    shapes = [_shape_of(t) for t in value_types]
    B, T, N, D = shapes[0]
    S, K = shapes[1][1], shapes[1][2]
    full = {"b": B, "n": N, "t": T, "s": S}
    fresh = iter(f"z{i}" for i in range(64))
    heads = "(k g)" if N != K else "k"  # Shardy rejects a size-1 factor inside a compound dim

    def bcast(shape):
        names = []
        for d, f in zip(shape, ("b", "n", "t", "s")):
            if d != full[f] or d == 1:
                names.append(next(fresh))
            else:
                names.append(heads if f == "n" else f)
        return " ".join(names)

    def seq(shape, present):
        return "b" if present and shape == (B,) else next(fresh)

    qs, ks = f"b t {heads} d", "b s k d"
    ins = [
        qs,
        ks,
        ks,
        bcast(shapes[3]),
        bcast(shapes[4]),
        seq(shapes[5], cfg.has_q_seqlen),
        seq(shapes[6], cfg.has_kv_seqlen),
    ]
    if bwd:
        ins += [qs, f"b {heads} t", qs]
        outs = [qs, ks, ks, bcast(shapes[3])]
    else:
        outs = [qs, f"b {heads} t"]
    rule = ", ".join(ins) + " -> " + ", ".join(outs)
    # Special factors must be listed in the order the rule first uses them (q's dims, then k's).
    if N == K:
        return rule, {"need_replication_factors": ("t", "d", "s")}
    return rule, {"need_replication_factors": ("t", "g", "d", "s"), "g": N // K}


def _partition(cfg: Config, bwd: bool, mesh, arg_shapes, result_shape):
    """Shards batch and kv heads as the query is sharded (when they divide); T, S and D stay whole."""
    q = arg_shapes[0]
    B, T, N, D = q.shape
    K = arg_shapes[1].shape[2]
    spec = tuple(q.sharding.spec) + (None,) * 4 if isinstance(q.sharding, NamedSharding) else (None,) * 4
    b_ax, n_ax = spec[0], spec[2]
    if b_ax is not None and B % _axes_size(mesh, b_ax):
        b_ax = None
    if n_ax is not None and K % _axes_size(mesh, n_ax):
        n_ax = None
    bias_shape = arg_shapes[3].shape
    mask_shape = arg_shapes[4].shape

    def bcast_spec(shape):
        return P(
            b_ax if shape[0] == B and B > 1 else None, n_ax if shape[1] == N and N > 1 else None, None, None
        )

    def seq_spec(present, shape):
        return P(b_ax) if present and shape == (B,) else P(None)

    ns = lambda p: NamedSharding(mesh, p)  # noqa: E731
    qspec, lspec = P(b_ax, None, n_ax, None), P(b_ax, n_ax, None)
    args = [
        qspec,
        qspec,
        qspec,
        bcast_spec(bias_shape),
        bcast_spec(mask_shape),
        seq_spec(cfg.has_q_seqlen, arg_shapes[5].shape),
        seq_spec(cfg.has_kv_seqlen, arg_shapes[6].shape),
    ]
    if bwd:
        args += [qspec, lspec, qspec]
        dbias_spec = bcast_spec(bias_shape)
        results = [qspec, qspec, qspec, dbias_spec]
        # dbias is summed over the batch/head shards its broadcast dims hide.
        reduce_axes = ()
        if bias_shape[0] == 1 or B == 1:
            reduce_axes += _as_tuple(b_ax)
        if bias_shape[1] == 1 or N == 1:
            reduce_axes += _as_tuple(n_ax)

        def lower(*xs):
            dq, dk, dv, db = bwd_ffi(cfg, *xs)
            if reduce_axes and cfg.has_bias:
                db = jax.lax.psum(db, reduce_axes)
            return dq, dk, dv, db

    else:
        results = [qspec, lspec]

        def lower(*xs):
            return fwd_ffi(cfg, *xs)

    return mesh, lower, tuple(map(ns, results)), tuple(map(ns, args))


@functools.cache
def partitioned(cfg: Config, bwd: bool):
    fn = functools.partial(bwd_ffi if bwd else fwd_ffi, cfg)
    cp = custom_partitioning(fn)
    cp.def_partition(
        partition=functools.partial(_partition, cfg, bwd),
        sharding_rule=functools.partial(_rule, cfg, bwd),
    )
    return cp
