"""``custom_partitioning`` of the GEMM op: batch, M and N shard without communication (the Shardy rule and the
partition callback); K stays whole on each shard (no partial sums)."""

from __future__ import annotations

import functools
import math

from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops._src.gemm.ffi import dims, gemm_ffi
from jax_ops._src.gemm.validation import Config


def _shape_of(t) -> tuple[int, ...]:
    from jax._src.interpreters import mlir

    return tuple(mlir.ir.RankedTensorType(t).shape)


def _weight_dims(cfg: Config, batch: str) -> str:
    """b's factors: [Bb, K, N], [Bb, N, K] (transpose_b) or [Bb, K, 2, N] (packed gated)."""
    if cfg.gated == "packed":
        return f"{batch} k g n"
    return f"{batch} n k" if cfg.transpose_b else f"{batch} k n"


def _rule(cfg: Config, mesh, value_types, result_types):
    """Factors b (batch), m, n shard; k and g (the gate/up pair) are replicated; absent operands get their own."""
    a, b, b_up, bias, c, res, a_scale, b_scale = (_shape_of(t) for t in value_types)
    B, M, N = (
        a[0],
        (a[2] if cfg.transpose_a else a[1]),
        (b[-1] if cfg.gated == "packed" else b[2 - cfg.transpose_b]),
    )
    fresh = iter(f"z{i}" for i in range(64))

    def unique(shape):  # a factor of its own per dim: replicated
        return " ".join(next(fresh) for _ in shape)

    weight = _weight_dims(cfg, "b" if b[0] == B else next(fresh))
    operands = [
        "b k m" if cfg.transpose_a else "b m k",
        weight,
        weight if cfg.gated == "separate" else unique(b_up),
        ("g n" if len(bias) == 2 else "n") if bias != (0,) else unique(bias),
        "b m n" if c != (0,) else unique(c),
        "b m n" if res != (0,) else unique(res),
        {(M,): "m", (B, M): "b m"}.get(a_scale, unique(a_scale)) if M > 1 else unique(a_scale),
        ("g n" if len(b_scale) == 2 else "n") if b_scale[-1:] == (N,) and N > 1 else unique(b_scale),
    ]
    preact = result_types[1]
    results = [
        "b m n",
        ("b m g n" if cfg.gated != "none" else "b m n") if cfg.write_preact else unique(_shape_of(preact)),
    ]
    factors = " ".join(operands + results).split()
    # K is contracted (no partial sums across shards); g pairs a gate column with its up column.
    replicated = tuple(f for f in ("k", "g") if f in factors)
    return ", ".join(operands) + " -> " + ", ".join(results), {"need_replication_factors": replicated}


def _spec(x) -> tuple:
    spec = tuple(x.sharding.spec) if isinstance(x.sharding, NamedSharding) else ()
    return spec + (None,) * (len(x.shape) - len(spec))


def _partition(cfg: Config, mesh, arg_shapes, result_shape):
    """Shards batch and M as ``a`` is sharded and N as ``b`` is (each when it divides, each mesh axis once)."""
    a, b = arg_shapes[0], arg_shapes[1]
    B, M, N, _ = dims(cfg, a, b)
    a_spec, b_spec = _spec(a), _spec(b)
    n_dim = 3 if cfg.gated == "packed" else (1 if cfg.transpose_b else 2)
    wanted = ((a_spec[0], B), (a_spec[2 if cfg.transpose_a else 1], M), (b_spec[n_dim], N))
    used: set[str] = set()
    axes = []
    for ax, size in wanted:
        names = () if ax is None else (ax if isinstance(ax, tuple) else (ax,))
        if not names or used & set(names) or size % math.prod(mesh.shape[n] for n in names):
            axes.append(None)
            continue
        used |= set(names)
        axes.append(ax)
    b_ax, m_ax, n_ax = axes
    bb_ax = b_ax if b.shape[0] == B else None
    if cfg.gated == "packed":
        weight = P(bb_ax, None, None, n_ax)
    else:
        weight = P(bb_ax, n_ax, None) if cfg.transpose_b else P(bb_ax, None, n_ax)
    out = P(b_ax, m_ax, n_ax)

    def columns(x):  # bias / b_scale: [N] or [2, N] when per column, else replicated
        if x.shape[-1:] == (N,) and N > 1:
            return P(None, n_ax) if len(x.shape) == 2 else P(n_ax)
        return P(*(None,) * len(x.shape))

    _, b_up, bias, c, res, a_scale, b_scale = arg_shapes[1:]
    args = [
        P(b_ax, None, m_ax) if cfg.transpose_a else P(b_ax, m_ax, None),
        weight,
        weight if cfg.gated == "separate" else P(None),
        columns(bias),
        out if c.shape != (0,) else P(None),
        out if res.shape != (0,) else P(None),
        {(M,): P(m_ax), (B, M): P(b_ax, m_ax)}.get(a_scale.shape, P(None)) if M > 1 else P(None),
        columns(b_scale),
    ]
    if cfg.write_preact:
        preact = P(b_ax, m_ax, None, n_ax) if cfg.gated != "none" else out
    else:
        preact = P(None)
    ns = lambda p: NamedSharding(mesh, p)  # noqa: E731
    lower = functools.partial(gemm_ffi, cfg)
    return mesh, lower, (ns(out), ns(preact)), tuple(map(ns, args))


@functools.cache
def partitioned(cfg: Config):
    cp = custom_partitioning(functools.partial(gemm_ffi, cfg))
    cp.def_partition(
        partition=functools.partial(_partition, cfg), sharding_rule=functools.partial(_rule, cfg)
    )
    return cp
