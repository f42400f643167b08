"""``custom_partitioning`` of the GEMM op (the Shardy rule and the partition callback): batch, M and N shard
without communication; a sharded K runs the product per shard into f32 (f64) partial sums, reduces them (a
reduce-scatter over the output dim the output's sharding splits over K's axes, else an all-reduce) and applies the
epilogue to the reduced block."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops._src.gemm.ffi import absent, dims, gemm_ffi
from jax_ops._src.gemm.reference import epilogue
from jax_ops._src.gemm.validation import F32, F64, Config, kind


def _shape_of(t) -> tuple[int, ...]:
    from jax._src.interpreters import mlir

    return tuple(mlir.ir.RankedTensorType(t).shape)


def _weight_dims(cfg: Config, batch: str) -> str:
    """b's factors: [Bb, K, N], [Bb, N, K] (transpose_b) or [Bb, K, 2, N] (packed gated)."""
    if cfg.gated == "packed":
        return f"{batch} k g n"
    return f"{batch} n k" if cfg.transpose_b else f"{batch} k n"


def _rule(cfg: Config, mesh, value_types, result_types):
    """Factors b (batch), m, n shard; k is the reduction factor; g (the gate/up pair) is replicated; absent
    operands get factors of their own."""
    a, b, b_up, bias, c, res, a_scale, b_scale = (_shape_of(t) for t in value_types)
    B, M, N = (
        a[0],
        (a[2] if cfg.transpose_a else a[1]),
        (b[-1] if cfg.gated == "packed" else b[2 - cfg.transpose_b]),
    )
    fresh = iter(f"z{i}" for i in range(64))

    def unique(shape):  # a factor of its own per dim: replicated
        return " ".join(next(fresh) for _ in shape)

    if cfg.sum_batch:  # a [B, K, M], b [B, K, N] -> [1, M, N]: b and k are both contracted
        operands = ["b k m", "b k n", *(unique(x) for x in (b_up, bias, c, res, a_scale, b_scale))]
        results = [f"{next(fresh)} m n", unique(_shape_of(result_types[1]))]
        return ", ".join(operands) + " -> " + ", ".join(results), {"reduction_factors": ("b", "k")}
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
    # k is contracted: sharded, the partition sums partial products; g pairs a gate column with its up column.
    kinds = {"reduction_factors": ("k",)}
    if "g" in factors:
        kinds["need_replication_factors"] = ("g",)
    return ", ".join(operands) + " -> " + ", ".join(results), kinds


def _spec(x) -> tuple:
    spec = tuple(x.sharding.spec) if isinstance(x.sharding, NamedSharding) else ()
    return spec + (None,) * (len(x.shape) - len(spec))


def _names(ax) -> tuple[str, ...]:
    """The mesh axis names of one PartitionSpec entry."""
    return () if ax is None else (ax if isinstance(ax, tuple) else (ax,))


def _entry(names: tuple[str, ...]):
    """A PartitionSpec entry of mesh axis names (None for none)."""
    return None if not names else names[0] if len(names) == 1 else names


def _extent(mesh, names) -> int:
    return math.prod(mesh.shape[n] for n in names)


def _k_axes(mesh, a_k, b_k, K: int) -> tuple[str, ...]:
    """The mesh axes K is split over: a's and b's K axes when both name the same ones, or the one operand's when
    the other's K is whole (sliced locally, no communication), if they divide K; else none (K is gathered)."""
    a_k, b_k = _names(a_k), _names(b_k)
    if a_k and b_k and a_k != b_k:
        return ()
    k = a_k or b_k
    return k if k and K % _extent(mesh, k) == 0 else ()


def _partial_products(cfg: Config, a, b, b_up):
    """This shard's op(a) @ op(b) over its K slice, no epilogue, in f32 (f64 for f64): [B, M, N], gated
    [B, M, 2, N] (gate, up)."""
    B, M, N, _ = dims(cfg, a, b)
    scaled = kind(a.dtype) in (
        "fp8",
        "int8",
    )  # their kernels take scales: unit ones, the real ones come after
    unit = jnp.ones((1,), F32) if scaled else absent()
    acc_cfg = Config(
        out_dtype=F64 if kind(a.dtype) == "f64" else F32,
        transpose_a=cfg.transpose_a,
        transpose_b=cfg.transpose_b,
        tf32=cfg.tf32,
        plan=cfg.plan,
        sum_batch=cfg.sum_batch,
    )
    e = absent()

    def product(w):
        return gemm_ffi(acc_cfg, a, w, e, e, e, e, unit, unit)[0]

    if cfg.gated == "packed":  # [Bb, K, 2, N] -> [Bb, K, 2N]: one product, columns (g, n)
        return product(b.reshape(b.shape[0], b.shape[1], 2 * N)).reshape(B, M, 2, N)
    if cfg.gated == "separate":
        return jnp.stack([product(b), product(b_up)], axis=2)
    return product(b)


def _k_sharded(cfg: Config, k_axes: tuple[str, ...], scatter: int | None):
    """The per-shard function of a K-sharded call: partial sums, one reduction over ``k_axes`` (a reduce-scatter
    over output dim ``scatter``, else an all-reduce), then the epilogue on the reduced block."""
    gated = cfg.gated != "none"

    def lower(*operands):
        if kind(operands[0].dtype) != "f64":
            return reduced(*operands)
        with jax.enable_x64(
            True
        ):  # XLA calls the partitioner on its own thread, outside the caller's x64 context
            return reduced(*operands)

    def reduced(a, b, b_up, bias, c, residual, a_scale, b_scale):
        acc = _partial_products(cfg, a, b, b_up)
        if scatter is None:
            acc = jax.lax.psum(acc, k_axes)
        else:
            dim = 3 if gated and scatter == 2 else scatter  # gated partials are [B, M, 2, N]
            acc = jax.lax.psum_scatter(acc, k_axes, scatter_dimension=dim, tiled=True)
        accs = [acc[:, :, 0], acc[:, :, 1]] if gated else [acc]
        out, preact = epilogue(cfg, accs, bias, c, residual, a_scale, b_scale)
        return out, preact if cfg.write_preact else jnp.zeros((0,), cfg.out_dtype)

    return lower


def _claim(mesh, wanted, reserved: tuple[str, ...]) -> list:
    """Per (PartitionSpec entry, dim size) in ``wanted``, in order: the entry when its axes divide the size and no
    earlier dim (nor ``reserved``) took them, else None (that dim is whole)."""
    used, axes = set(reserved), []
    for ax, size in wanted:
        names = _names(ax)
        if not names or used & set(names) or size % _extent(mesh, names):
            axes.append(None)
            continue
        used |= set(names)
        axes.append(ax)
    return axes


def _scatter_dim(mesh, out_axes, result_spec, sizes, red_axes):
    """The output dim (in ``sizes``' order of preference) to reduce-scatter over ``red_axes``: the one the output's
    propagated sharding splits over its own axes followed by those, when they divide it; else None."""
    for d, size in sizes:
        have, want = _names(out_axes[d]), _names(result_spec[d])
        if want == have + red_axes and (size // _extent(mesh, have)) % _extent(mesh, red_axes) == 0:
            return d, _entry(want)
    return None, None


def _partition_sum_batch(cfg: Config, mesh, arg_shapes, result_shape):
    """A ``sum_batch`` call (a [B, K, M], b [B, K, N] -> [1, M, N]): batch and K are both contractions, split over
    the axes the operands share on them (or the one operand's, the other sliced locally) and reduced once; M and N
    shard as a's M and b's N are sharded."""
    a, b = arg_shapes[0], arg_shapes[1]
    B, M, N, K = dims(cfg, a, b)
    a_spec, b_spec = _spec(a), _spec(b)
    batch_axes = _k_axes(mesh, a_spec[0], b_spec[0], B)
    k_axes = _k_axes(mesh, a_spec[1], b_spec[1], K)
    if set(k_axes) & set(batch_axes):
        k_axes = ()
    red = batch_axes + k_axes
    m_ax, n_ax = _claim(mesh, ((a_spec[2], M), (b_spec[2], N)), red)
    out_axes = [None, m_ax, n_ax]
    scatter = None
    if red:
        scatter, entry = _scatter_dim(mesh, out_axes, _spec(result_shape[0]), ((1, M), (2, N)), red)
        if scatter is not None:
            out_axes[scatter] = entry
    ns = lambda p: NamedSharding(mesh, p)  # noqa: E731
    batch_ax, k_ax = _entry(batch_axes), _entry(k_axes)
    args = [P(batch_ax, k_ax, m_ax), P(batch_ax, k_ax, n_ax), *(P(None) for _ in arg_shapes[2:])]
    lower = _k_sharded(cfg, red, scatter) if red else functools.partial(gemm_ffi, cfg)
    return mesh, lower, (ns(P(*out_axes)), ns(P(None))), tuple(map(ns, args))


def _partition(cfg: Config, mesh, arg_shapes, result_shape):
    """Shards batch and M as ``a`` is sharded and N as ``b`` is (each when it divides, each mesh axis once). A K
    split over mesh axes (_k_axes) sums partial products over them: reduce-scattered over the output's batch, M
    or N dim when the output's sharding splits that dim over K's axes too, else all-reduced."""
    if cfg.sum_batch:
        return _partition_sum_batch(cfg, mesh, arg_shapes, result_shape)
    a, b = arg_shapes[0], arg_shapes[1]
    B, M, N, K = dims(cfg, a, b)
    a_spec, b_spec = _spec(a), _spec(b)
    n_dim = 3 if cfg.gated == "packed" else (1 if cfg.transpose_b else 2)
    kb_dim = 2 if cfg.transpose_b and cfg.gated != "packed" else 1
    k_axes = _k_axes(mesh, a_spec[1 if cfg.transpose_a else 2], b_spec[kb_dim], K)
    wanted = ((a_spec[0], B), (a_spec[2 if cfg.transpose_a else 1], M), (b_spec[n_dim], N))
    axes = _claim(mesh, wanted, k_axes)
    b_ax, m_ax, n_ax = axes
    k_ax = _entry(k_axes)
    # the output's sharding: the operands', and with a split K maybe one dim split over K's axes as well
    out_axes = list(axes)
    scatter = None
    if k_axes:
        scatter, entry = _scatter_dim(mesh, axes, _spec(result_shape[0]), ((1, M), (2, N), (0, B)), k_axes)
        if scatter is not None:
            out_axes[scatter] = entry
    out_b, out_m, out_n = out_axes
    bb_ax = b_ax if b.shape[0] == B else None
    if cfg.gated == "packed":
        weight = P(bb_ax, k_ax, None, n_ax)
    else:
        weight = P(bb_ax, n_ax, k_ax) if cfg.transpose_b else P(bb_ax, k_ax, n_ax)
    out = P(out_b, out_m, out_n)

    def columns(x):  # bias / b_scale: [N] or [2, N] when per column, else replicated
        if x.shape[-1:] == (N,) and N > 1:
            return P(None, out_n) if len(x.shape) == 2 else P(out_n)
        return P(*(None,) * len(x.shape))

    _, b_up, bias, c, res, a_scale, b_scale = arg_shapes[1:]
    args = [
        P(b_ax, k_ax, m_ax) if cfg.transpose_a else P(b_ax, m_ax, k_ax),
        weight,
        weight if cfg.gated == "separate" else P(None),
        columns(bias),
        out if c.shape != (0,) else P(None),
        out if res.shape != (0,) else P(None),
        {(M,): P(out_m), (B, M): P(out_b, out_m)}.get(a_scale.shape, P(None)) if M > 1 else P(None),
        columns(b_scale),
    ]
    if cfg.write_preact:
        preact = P(out_b, out_m, None, out_n) if cfg.gated != "none" else out
    else:
        preact = P(None)
    ns = lambda p: NamedSharding(mesh, p)  # noqa: E731
    lower = _k_sharded(cfg, k_axes, scatter) if k_axes else functools.partial(gemm_ffi, cfg)
    return mesh, lower, (ns(out), ns(preact)), tuple(map(ns, args))


@functools.cache
def partitioned(cfg: Config):
    cp = custom_partitioning(functools.partial(gemm_ffi, cfg))
    cp.def_partition(
        partition=functools.partial(_partition, cfg), sharding_rule=functools.partial(_rule, cfg)
    )
    return cp
