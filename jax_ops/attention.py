"""Fused scaled dot-product attention with the API of ``jax.nn.dot_product_attention``.

``dot_product_attention(query, key, value, bias=None, mask=None, *, scale=None, is_causal=False,
query_seq_lengths=None, key_value_seq_lengths=None, local_window_size=None, implementation=None,
return_residual=False)``

Layouts (as jax.nn): ``query [B,T,N,H]`` or ``[T,N,H]``; ``key``/``value [B,S,K,H]`` or ``[S,K,H]`` with ``N`` a
multiple of ``K`` (MHA, GQA, MQA); ``bias``/``mask`` of rank <= 4 broadcastable to ``[B,N,T,S]`` (each dim 1 or
full); ``mask`` is bool (True = attend); seq lengths are integer ``[B]``. Causal masking is top-left aligned as in
jax.nn (query ``t`` sees keys ``s <= t``, also when ``T != S``); ``local_window_size=(left, right)`` keeps keys
``t - left <= s <= t + right`` (an int means ``(w, w)``; ``None`` inside the tuple means unbounded on that side).

Differences from jax.nn's XLA path (documented in docs/attention.md): a query row with no allowed key returns
zeros (and ``-inf`` residual, zero gradients) instead of a uniform average of ``value``; the softmax, both matmuls
and all accumulations are fp32 for f16/bf16 inputs (jax.nn rounds the probabilities to the input dtype).

``implementation``: ``None`` uses the FFI kernel when the inputs are supported, otherwise the reference
(``jax_ops.reference.dot_product_attention``) with a one-time warning naming the reason; ``"ffi"`` raises on
unsupported inputs; ``"xla"`` forces the reference; ``"cudnn"`` calls ``jax.nn.dot_product_attention(...,
implementation="cudnn")`` unchanged. The CPU twin supports float16, bfloat16, float32 and head dims 1..256; the
CUDA kernels float16/bfloat16 and head dims 32, 64, 96, 128, 256 (others fall back with a warning).

Split-KV: when the grid of the forward kernel would be small (decode, ``T`` small, few heads) and nothing ties a
key to its absolute position (no causal/window, bias or mask), the keys are split into ``kv_splits`` equal chunks
folded into the batch (a reshape, no copy of K/V), one kernel call computes every chunk's output and log-sum-exp,
and the chunks are merged with their log-sum-exp weights in fp32. With GQA and few query rows (decode), the query
heads of a group are packed into the rows of one head first (``packs_gqa``), so K/V are read once per group.

Autodiff: ``custom_vjp``; the forward saves O and the fp32 log-sum-exp, the backward target recomputes P.
``bias`` gets a gradient (reduced over its broadcast dims inside the kernel). ``vmap`` folds the mapped axis into
the batch (``custom_vmap``, never a sequential loop). Sharding: batch and head dims partition without gathers
via ``custom_partitioning`` (Shardy rule; the head dim shards over kv heads, so the shard count must divide
``K``); :func:`shard_map_attention` is the explicit ``jax.shard_map`` path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops import _checks, _ffi, reference

IMPLEMENTATIONS = (None, "ffi", "xla", "cudnn")
KERNEL_DTYPES = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16), np.dtype(np.float32))
MAX_HEAD_DIM = 256  # kMaxHeadDim in ffi_cuda/attention/attention_params.h
FWD_TARGET = "jax_ops_attention_fwd"
BWD_TARGET = "jax_ops_attention_bwd"
# What the CUDA forward kernel instantiates (ffi_cuda/attention/attention_fwd_kernels_*.cu); keep in sync.
CUDA_DTYPES = (np.dtype(jnp.float16), np.dtype(jnp.bfloat16))
CUDA_HEAD_DIMS = (32, 64, 96, 128, 256)


@dataclasses.dataclass(frozen=True)
class _Config:
    """Static attributes of one call (hashable: keys the custom_vmap/custom_partitioning caches)."""

    scale: float
    is_causal: bool
    window_left: int  # -1: unbounded
    window_right: int
    has_bias: bool
    has_mask: bool
    has_q_seqlen: bool
    has_kv_seqlen: bool

    def attrs(self) -> dict[str, Any]:
        return dict(
            scale=np.float32(self.scale),
            is_causal=bool(self.is_causal),
            window_left=np.int64(self.window_left),
            window_right=np.int64(self.window_right),
            has_bias=bool(self.has_bias),
            has_mask=bool(self.has_mask),
            has_q_seqlen=bool(self.has_q_seqlen),
            has_kv_seqlen=bool(self.has_kv_seqlen),
        )


# ------------------------------------------------------------------------------------------ validation
def _as_array(name: str, x) -> jax.Array:
    if isinstance(x, (jax.Array, np.ndarray)) or hasattr(x, "aval"):
        return x
    try:
        return jnp.asarray(x)
    except TypeError as e:
        raise TypeError(f"{name} must be an array, got {type(x).__name__}") from e


def _window(local_window_size) -> tuple[int, int]:
    if local_window_size is None:
        return -1, -1
    w = local_window_size
    if isinstance(w, (int, np.integer)) and not isinstance(w, bool):
        w = (int(w), int(w))
    if not isinstance(w, (tuple, list)) or len(w) != 2:
        raise ValueError(
            f"local_window_size must be an int or a (left, right) pair, got {local_window_size!r}"
        )
    out = []
    for side, x in zip(("left", "right"), w):
        if x is None:
            out.append(-1)
            continue
        if not isinstance(x, (int, np.integer)) or isinstance(x, bool) or x < 0:
            raise ValueError(
                f"local_window_size {side} size must be a non-negative int (or None for unbounded), got {x!r}"
            )
        out.append(int(x))
    return out[0], out[1]


def _broadcast4(name: str, x, full: tuple[int, int, int, int]) -> jax.Array:
    if x.ndim > 4:
        raise ValueError(f"{name} must have rank <= 4 (broadcastable to [B, N, T, S]), got shape {x.shape}")
    x = x.reshape((1,) * (4 - x.ndim) + tuple(x.shape))
    if any(d not in (1, f) for d, f in zip(x.shape, full)):
        raise ValueError(
            f"{name} has shape {tuple(x.shape)}, which does not broadcast to [B, N, T, S] = {full} "
            "(each dim must be 1 or full)"
        )
    return x


def _seqlen(name: str, x, batch: int) -> jax.Array | None:
    if x is None:
        return None
    x = _as_array(name, x)
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"{name} must be an integer (int32) array, got dtype {x.dtype}")
    if tuple(x.shape) != (batch,):
        raise ValueError(f"{name} must have shape (B,) = ({batch},), got {tuple(x.shape)}")
    return x.astype(jnp.int32)


def _normalize(query, key, value, bias, mask, scale, is_causal, q_seqlen, kv_seqlen, local_window_size):
    query, key, value = (_as_array(n, x) for n, x in (("query", query), ("key", key), ("value", value)))
    if query.ndim not in (3, 4):
        raise ValueError(f"query must have rank 4 [B,T,N,H] or 3 [T,N,H], got shape {query.shape}")
    for name, x in (("key", key), ("value", value)):
        if x.ndim != query.ndim:
            raise ValueError(f"{name} must have query's rank {query.ndim}, got shape {x.shape}")
    if query.ndim == 3:
        query, key, value = query[None], key[None], value[None]
    B, T, N, H = query.shape
    _, S, K, _ = key.shape
    if tuple(value.shape) != tuple(key.shape):
        raise ValueError(f"value has shape {value.shape} but key has shape {key.shape}")
    if key.shape[0] != B:
        raise ValueError(f"key has batch {key.shape[0]} but query has batch {B}")
    if key.shape[3] != H:
        raise ValueError(f"key has head dim {key.shape[3]} but query has head dim {H}")
    if K == 0 or N % K != 0:
        raise ValueError(f"query's number of heads N={N} must be a multiple of key/value's K={K}")
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise TypeError(f"{name} must be a floating-point array, got dtype {x.dtype}")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(
            f"query, key and value must share a dtype, got {query.dtype}, {key.dtype}, {value.dtype}"
        )
    full = (B, N, T, S)
    if bias is not None:
        bias = _broadcast4("bias", _as_array("bias", bias), full)
        if not jnp.issubdtype(bias.dtype, jnp.floating):
            bias = bias.astype(jnp.float32)
        elif bias.dtype not in (query.dtype, np.dtype(np.float32)):
            bias = bias.astype(jnp.float32)  # the kernel reads bias in q's dtype or float32
    if mask is not None:
        mask = _broadcast4("mask", _as_array("mask", mask), full)
        if mask.dtype != np.dtype(bool):
            raise TypeError(
                f"mask must be a bool array (True = attend), got dtype {mask.dtype}; pass additive masks as bias"
            )
    q_seqlen = _seqlen("query_seq_lengths", q_seqlen, B)
    kv_seqlen = _seqlen("key_value_seq_lengths", kv_seqlen, B)
    if scale is None:
        scale = 1.0 / math.sqrt(H) if H > 0 else 1.0
    if isinstance(scale, jax.core.Tracer):
        raise TypeError("scale must be a static Python float (it is a kernel attribute), got a traced value")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a Python bool, got {type(is_causal).__name__}")
    wl, wr = _window(local_window_size)
    cfg = _Config(
        scale=scale,
        is_causal=bool(is_causal),
        window_left=wl,
        window_right=wr,
        has_bias=bias is not None,
        has_mask=mask is not None,
        has_q_seqlen=q_seqlen is not None,
        has_kv_seqlen=kv_seqlen is not None,
    )
    return cfg, (query, key, value, bias, mask, q_seqlen, kv_seqlen)


def unsupported_reason(query_dtype, head_dim: int, platform: str | None = None) -> str | None:
    """Why the FFI kernel cannot run these inputs (None when it can). ``platform`` defaults to JAX's default
    backend; on "gpu" the build must provide the CUDA attention target."""
    dtype = np.dtype(query_dtype)
    if dtype not in KERNEL_DTYPES:
        return f"dtype {dtype} is not supported by the attention kernel (float16, bfloat16, float32)"
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        return f"head dim {head_dim} is outside the kernel's range [1, {MAX_HEAD_DIM}]"
    platform = platform or jax.default_backend()
    if platform == "gpu":
        if FWD_TARGET not in _ffi.target_names("CUDA"):
            return "this jax_ops build has no CUDA attention kernel (jax_ops_attention_fwd)"
        if dtype not in CUDA_DTYPES:
            return f"the CUDA attention kernel supports float16/bfloat16, not {dtype}"
        if head_dim not in CUDA_HEAD_DIMS:
            return f"the CUDA attention kernel supports head dims {CUDA_HEAD_DIMS}, not {head_dim}"
    if platform not in ("cpu", "gpu"):
        return f"no attention kernel for platform {platform!r}"
    return None


# ------------------------------------------------------------------------------------- raw FFI calls
def _vma(x) -> frozenset:
    return getattr(jax.typeof(x), "vma", frozenset())


def _vary_like(outs, ins, targets=None):
    """Inside ``jax.shard_map``: the kernel's results carry no varying-manual-axes type. Mark each result as
    varying over the axes any input varies over; with ``targets`` (the primal inputs of cotangents), sum the
    cotangent over axes its primal is invariant along and mark it varying where its primal is."""
    union = frozenset().union(*(_vma(x) for x in ins if x is not None))
    if not union and not targets:
        return tuple(outs)
    res = []
    for i, x in enumerate(outs):
        if x is None:
            res.append(x)
            continue
        missing = tuple(sorted(union - _vma(x)))
        x = jax.lax.pcast(x, missing, to="varying") if missing else x
        if targets is not None:
            want = _vma(targets[i])
            extra = tuple(sorted(_vma(x) - want))
            x = jax.lax.psum(x, extra) if extra else x
            missing = tuple(sorted(want - _vma(x)))
            x = jax.lax.pcast(x, missing, to="varying") if missing else x
        res.append(x)
    return tuple(res)


def _fwd_ffi(cfg: _Config, q, k, v, bias, mask, qsl, kvsl):
    B, T, N, _ = q.shape
    out = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32))
    return tuple(_ffi.ffi_call(FWD_TARGET, out, q, k, v, bias, mask, qsl, kvsl, **cfg.attrs()))


def _bwd_ffi(cfg: _Config, q, k, v, bias, mask, qsl, kvsl, o, lse, do):
    out = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        jax.ShapeDtypeStruct(bias.shape, bias.dtype),
    )
    return tuple(_ffi.ffi_call(BWD_TARGET, out, q, k, v, bias, mask, qsl, kvsl, o, lse, do, **cfg.attrs()))


# ------------------------------------------------------------------------------ custom_partitioning
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


def _rule(cfg: _Config, bwd: bool, mesh, value_types, result_types):
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


def _partition(cfg: _Config, bwd: bool, mesh, arg_shapes, result_shape):
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
            dq, dk, dv, db = _bwd_ffi(cfg, *xs)
            if reduce_axes and cfg.has_bias:
                db = jax.lax.psum(db, reduce_axes)
            return dq, dk, dv, db

    else:
        results = [qspec, lspec]

        def lower(*xs):
            return _fwd_ffi(cfg, *xs)

    return mesh, lower, tuple(map(ns, results)), tuple(map(ns, args))


@functools.cache
def _partitioned(cfg: _Config, bwd: bool):
    fn = functools.partial(_bwd_ffi if bwd else _fwd_ffi, cfg)
    cp = custom_partitioning(fn)
    cp.def_partition(
        partition=functools.partial(_partition, cfg, bwd),
        sharding_rule=functools.partial(_rule, cfg, bwd),
    )
    return cp


# ---------------------------------------------------------------------------------------- custom_vmap
def _lead(x, batched: bool, v: int):
    return x if batched else jnp.broadcast_to(x, (v, *x.shape))


def _fold(x, batched: bool, v: int):
    """[V, B, ...] (broadcasting an unbatched x) -> [V*B, ...]."""
    x = _lead(x, batched, v)
    return x.reshape(v * x.shape[1], *x.shape[2:])


def _fold_bcast(x, batched: bool, v: int, B: int, present: bool, reducible: bool):
    """A rank-4 broadcastable bias/mask under vmap. Unbatched [1, ...] stays shared unless ``reducible``
    (dbias must then come out per mapped example); otherwise [V, B|1, ...] -> [V*B, ...] (or [V, ...] if B==1)."""
    if not present:
        return x
    if not batched and x.shape[0] == 1 and not reducible:
        return x
    x = _lead(x, batched, v)
    if x.shape[1] != B:
        x = jnp.broadcast_to(x, (v, B, *x.shape[2:]))
    return x.reshape(v * B, *x.shape[2:])


@functools.cache
def _fwd_op(cfg: _Config):
    part = _partitioned(cfg, False)

    @jax.custom_batching.custom_vmap
    def fwd(q, k, v, bias, mask, qsl, kvsl):
        return part(q, k, v, bias, mask, qsl, kvsl)

    @fwd.def_vmap
    def _fwd_rule(axis_size, in_batched, q, k, v, bias, mask, qsl, kvsl):
        V, B = axis_size, (q.shape[1] if in_batched[0] else q.shape[0])
        qf, kf, vf = (_fold(x, bt, V) for x, bt in zip((q, k, v), in_batched[:3]))
        bf = _fold_bcast(bias, in_batched[3], V, B, cfg.has_bias, False)
        mf = _fold_bcast(mask, in_batched[4], V, B, cfg.has_mask, False)
        qs = _fold(qsl, in_batched[5], V) if cfg.has_q_seqlen else qsl
        ks = _fold(kvsl, in_batched[6], V) if cfg.has_kv_seqlen else kvsl
        o, lse = fwd(qf, kf, vf, bf, mf, qs, ks)
        return (o.reshape(V, B, *o.shape[1:]), lse.reshape(V, B, *lse.shape[1:])), (True, True)

    return fwd


@functools.cache
def _bwd_op(cfg: _Config):
    part = _partitioned(cfg, True)

    @jax.custom_batching.custom_vmap
    def bwd(q, k, v, bias, mask, qsl, kvsl, o, lse, do):
        return part(q, k, v, bias, mask, qsl, kvsl, o, lse, do)

    @bwd.def_vmap
    def _bwd_rule(axis_size, in_batched, q, k, v, bias, mask, qsl, kvsl, o, lse, do):
        V, B = axis_size, (q.shape[1] if in_batched[0] else q.shape[0])
        qf, kf, vf = (_fold(x, bt, V) for x, bt in zip((q, k, v), in_batched[:3]))
        of, lf, df = (_fold(x, bt, V) for x, bt in zip((o, lse, do), in_batched[7:]))
        bf = _fold_bcast(bias, in_batched[3], V, B, cfg.has_bias, True)
        mf = _fold_bcast(mask, in_batched[4], V, B, cfg.has_mask, False)
        qs = _fold(qsl, in_batched[5], V) if cfg.has_q_seqlen else qsl
        ks = _fold(kvsl, in_batched[6], V) if cfg.has_kv_seqlen else kvsl
        dq, dk, dv, db = bwd(qf, kf, vf, bf, mf, qs, ks, of, lf, df)
        unfold = lambda x: x.reshape(V, B, *x.shape[1:])  # noqa: E731
        if cfg.has_bias:
            bias_b = bias.shape[1] if in_batched[3] else bias.shape[0]
            db = unfold(db)
            if bias_b == 1 and B != 1:
                db = db.sum(axis=1, keepdims=True)
            db_batched = True
        else:
            db_batched = False
        return (unfold(dq), unfold(dk), unfold(dv), db), (True, True, True, db_batched)

    return bwd


# ------------------------------------------------------------------------------------------ custom_vjp
def _fill(cfg: _Config, bias, mask, qsl, kvsl):
    """Dummy 1-element buffers for absent optional inputs (the kernel ignores them; see attention_params.h)."""
    bias = bias if cfg.has_bias else jnp.zeros((1, 1, 1, 1), jnp.float32)
    mask = mask if cfg.has_mask else jnp.ones((1, 1, 1, 1), bool)
    qsl = qsl if cfg.has_q_seqlen else jnp.zeros((1,), jnp.int32)
    kvsl = kvsl if cfg.has_kv_seqlen else jnp.zeros((1,), jnp.int32)
    return bias, mask, qsl, kvsl


# Split-KV policy: split while the forward grid (64-query-row blocks x heads x batch) would cover less than half of
# SPLIT_KV_TARGET_CTAS (two waves on a 132-SM H100/H200), keeping >= SPLIT_KV_MIN_KEYS keys per chunk. Only on a
# GPU backend (the CPU twin gains nothing). FORCE_KV_SPLITS (tests) overrides the policy on any backend.
SPLIT_KV_TARGET_CTAS = 264
SPLIT_KV_MIN_KEYS = 1024
FORCE_KV_SPLITS: int | None = None


def kv_splits(cfg: _Config, batch: int, seqlen_q: int, seqlen_k: int, num_heads: int) -> int:
    """How many equal key chunks the forward splits into (1 = no split). The count divides S, so splitting is a
    reshape; position-dependent rules (causal, window) and bias/mask keep the unsplit kernel."""
    if cfg.is_causal or cfg.window_left >= 0 or cfg.window_right >= 0 or cfg.has_bias or cfg.has_mask:
        return 1
    if FORCE_KV_SPLITS is not None:
        want = FORCE_KV_SPLITS
    else:
        if jax.default_backend() != "gpu":
            return 1
        ctas = batch * num_heads * -(-seqlen_q // 64)
        if 2 * ctas > SPLIT_KV_TARGET_CTAS:
            return 1
        want = min(-(-SPLIT_KV_TARGET_CTAS // ctas), seqlen_k // SPLIT_KV_MIN_KEYS)
    for d in range(min(want, seqlen_k), 1, -1):
        if seqlen_k % d == 0:
            return d
    return 1


def _forward_split(cfg: _Config, splits: int, q, k, v, qsl, kvsl):
    """The forward over `splits` key chunks folded into the batch, merged by log-sum-exp (fp32)."""
    B, T, N, D = q.shape
    S, K = k.shape[1], k.shape[2]
    chunk = S // splits
    qf = jnp.broadcast_to(q[:, None], (B, splits, T, N, D)).reshape(B * splits, T, N, D)
    kf = k.reshape(B * splits, chunk, K, D)
    vf = v.reshape(B * splits, chunk, K, D)
    kv_len = kvsl if cfg.has_kv_seqlen else jnp.full((B,), S, jnp.int32)
    starts = jnp.arange(splits, dtype=jnp.int32) * chunk
    chunk_len = jnp.clip(kv_len[:, None] - starts[None, :], 0, chunk).reshape(B * splits).astype(jnp.int32)
    qslf = jnp.repeat(qsl, splits) if cfg.has_q_seqlen else qsl
    split_cfg = dataclasses.replace(cfg, has_kv_seqlen=True)
    bias, mask, qslf, _ = _fill(split_cfg, None, None, qslf, chunk_len)
    o_parts, lse_parts = _fwd_op(split_cfg)(qf, kf, vf, bias, mask, qslf, chunk_len)
    lse_parts = lse_parts.reshape(B, splits, N, T)
    top = jnp.max(lse_parts, axis=1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)  # all chunks empty: weights 0, lse -inf, o 0
    w = jnp.exp(lse_parts - top)  # [B, splits, N, T]; exp(-inf) = 0 for empty chunks
    total = jnp.sum(w, axis=1)  # [B, N, T]
    lse = jnp.where(total > 0, jnp.log(jnp.where(total > 0, total, 1.0)) + top[:, 0], -jnp.inf)
    w = w / jnp.where(total > 0, total, 1.0)[:, None]
    o_parts = o_parts.reshape(B, splits, T, N, D).astype(jnp.float32)
    o = jnp.einsum("bsnt,bstnd->btnd", w, o_parts, precision=jax.lax.Precision.HIGHEST)
    return o.astype(q.dtype), lse.astype(jnp.float32)


# GQA packing: with few query rows (decode), the G query heads that share a kv head become G·T rows of one head,
# so each K/V tile is read once per group instead of once per query head. Position-free calls only (no causal,
# window, bias or mask: those tie a row to its position t); query lengths scale by G. At most one Hopper CTA of
# rows after packing.
GQA_PACK_MAX_ROWS = 128


def packs_gqa(cfg: _Config, seqlen_q: int, num_heads: int, num_kv_heads: int) -> bool:
    """Whether the forward packs the query heads of each GQA group into the rows of one head."""
    if cfg.is_causal or cfg.window_left >= 0 or cfg.window_right >= 0 or cfg.has_bias or cfg.has_mask:
        return False
    groups = num_heads // num_kv_heads
    return groups > 1 and seqlen_q * groups <= GQA_PACK_MAX_ROWS


def _forward_gqa_packed(cfg: _Config, q, k, v, qsl, kvsl):
    """The forward with q [B,T,K·G,D] seen as [B,T·G,K,D] (row t·G+g of kv head k is query head k·G+g)."""
    B, T, N, D = q.shape
    K = k.shape[2]
    G = N // K
    qp = q.reshape(B, T, K, G, D).transpose(0, 1, 3, 2, 4).reshape(B, T * G, K, D)
    qslp = qsl * G if cfg.has_q_seqlen else qsl
    o, lse = _forward(cfg, qp, k, v, None, None, qslp, kvsl)
    o = o.reshape(B, T, G, K, D).transpose(0, 1, 3, 2, 4).reshape(B, T, N, D)
    lse = lse.reshape(B, K, T, G).transpose(0, 1, 3, 2).reshape(B, N, T)
    return o, lse


def _forward(cfg: _Config, q, k, v, bias, mask, qsl, kvsl):
    ins = (q, k, v, bias, mask, qsl, kvsl)
    if packs_gqa(cfg, q.shape[1], q.shape[2], k.shape[2]):
        return _vary_like(_forward_gqa_packed(cfg, q, k, v, qsl, kvsl), ins)
    splits = kv_splits(cfg, q.shape[0], q.shape[1], k.shape[1], q.shape[2])
    if splits > 1:
        return _vary_like(_forward_split(cfg, splits, q, k, v, qsl, kvsl), ins)
    return _vary_like(_fwd_op(cfg)(q, k, v, *_fill(cfg, bias, mask, qsl, kvsl)), ins)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: _Config, q, k, v, bias, mask, qsl, kvsl):
    return _forward(cfg, q, k, v, bias, mask, qsl, kvsl)


def _attention_fwd(cfg: _Config, q, k, v, bias, mask, qsl, kvsl):
    o, lse = _forward(cfg, q, k, v, bias, mask, qsl, kvsl)
    return (o, lse), (q, k, v, bias, mask, qsl, kvsl, o, lse)


# The CUDA backward has no bias gradient and no head dim 256 (its dK/dV accumulators would spill).
CUDA_BWD_HEAD_DIMS = (32, 64, 96, 128)


def _bwd_unsupported_reason(cfg: _Config, head_dim: int) -> str | None:
    """Why the backward kernel cannot run (None when it can): the explicit reference fallback's reason."""
    if jax.default_backend() != "gpu":
        return None
    if BWD_TARGET not in _ffi.target_names("CUDA"):
        return "this build has no CUDA attention backward kernel (jax_ops_attention_bwd)"
    if cfg.has_bias:
        return "the CUDA attention backward computes no bias gradient"
    if head_dim not in CUDA_BWD_HEAD_DIMS:
        return f"the CUDA attention backward supports head dims {CUDA_BWD_HEAD_DIMS}, not {head_dim}"
    return None


def _reference_vjp(cfg: _Config, q, k, v, bias, mask, qsl, kvsl, do):
    """Explicit backward fallback (no backward kernel for this platform): the VJP of the reference."""
    window = (cfg.window_left, cfg.window_right)

    def f(q, k, v, bias):
        return reference.dot_product_attention(
            q, k, v, bias, mask, qsl, kvsl, scale=cfg.scale, is_causal=cfg.is_causal, window=window
        )[0]

    _, vjp = jax.vjp(f, q, k, v, bias)
    return vjp(do)


def _attention_bwd(cfg: _Config, res, cts):
    q, k, v, bias, mask, qsl, kvsl, o, lse = res
    do, _ = cts  # the residual (lse) is returned under stop_gradient, as jax.nn does
    do = do.astype(q.dtype)
    reason = _bwd_unsupported_reason(cfg, q.shape[-1])
    if reason is not None:
        _checks.warn_once(
            f"attention:bwd:{reason}",
            f"jax_ops.dot_product_attention: {reason}; the backward pass uses the XLA reference",
        )
        dq, dk, dv, db = _reference_vjp(cfg, q, k, v, bias, mask, qsl, kvsl, do)
        return dq, dk, dv, db, None, None, None
    dq, dk, dv, db = _bwd_op(cfg)(q, k, v, *_fill(cfg, bias, mask, qsl, kvsl), o, lse, do)
    grads = (dq, dk, dv, db if cfg.has_bias else None)
    grads = _vary_like(grads, (q, k, v, bias, mask, qsl, kvsl, o, lse, do), targets=(q, k, v, bias))
    return (*grads, None, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


# ---------------------------------------------------------------------------------------------- public
def dot_product_attention(
    query,
    key,
    value,
    bias=None,
    mask=None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    query_seq_lengths=None,
    key_value_seq_lengths=None,
    local_window_size: int | tuple[int | None, int | None] | None = None,
    implementation: str | None = None,
    return_residual: bool = False,
):
    """Scaled dot-product attention; same signature and layouts as :func:`jax.nn.dot_product_attention`.

    Args:
      query: ``[B, T, N, H]`` or ``[T, N, H]``; float16, bfloat16 or float32 for the kernel.
      key, value: ``[B, S, K, H]`` or ``[S, K, H]``, query's dtype; ``N % K == 0``.
      bias: optional, rank <= 4, broadcastable to ``[B, N, T, S]`` (each dim 1 or full); added to the scaled
        logits. Cast to float32 unless it is float32 or query's dtype. Differentiable.
      mask: optional bool, rank <= 4, broadcastable to ``[B, N, T, S]``; True = attend.
      scale: static float; default ``1 / sqrt(H)``.
      is_causal: key ``s`` is visible to query ``t`` iff ``s <= t`` (top-left aligned, as jax.nn).
      query_seq_lengths, key_value_seq_lengths: integer ``[B]``; rows ``t >= q_len`` / keys ``s >= kv_len``
        are padding (padded query rows return 0).
      local_window_size: ``w`` or ``(left, right)``: keys ``t - left <= s <= t + right``.
      implementation: ``None`` | ``"ffi"`` | ``"xla"`` | ``"cudnn"`` (see the module docstring).
      return_residual: also return the log-sum-exp, shape ``[B, T, N]`` (``[T, N]``), query's dtype, under
        ``stop_gradient``; ``-inf`` on rows with no allowed key.

    Returns:
      The output, shaped like ``query`` (and the residual when ``return_residual``).
    """
    _checks.check_implementation(implementation, IMPLEMENTATIONS)
    if implementation == "cudnn":
        return jax.nn.dot_product_attention(
            query,
            key,
            value,
            bias,
            mask,
            scale=scale,
            is_causal=is_causal,
            query_seq_lengths=query_seq_lengths,
            key_value_seq_lengths=key_value_seq_lengths,
            local_window_size=local_window_size,
            implementation="cudnn",
            return_residual=return_residual,
        )
    out_shape = tuple(jnp.shape(query))
    cfg, (q, k, v, bias, mask, qsl, kvsl) = _normalize(
        query,
        key,
        value,
        bias,
        mask,
        scale,
        is_causal,
        query_seq_lengths,
        key_value_seq_lengths,
        local_window_size,
    )
    use_ffi = implementation != "xla"
    if use_ffi:
        reason = unsupported_reason(q.dtype, q.shape[3])
        if reason is not None:
            if implementation == "ffi":
                raise ValueError(f"dot_product_attention(implementation='ffi'): {reason}")
            _checks.warn_once(
                f"attention:{reason}",
                f"jax_ops.dot_product_attention: {reason}; using the XLA reference "
                "(pass implementation='xla' to silence this warning)",
            )
            use_ffi = False
    if use_ffi:
        o, lse = _attention(cfg, q, k, v, bias, mask, qsl, kvsl)
    else:
        o, lse = reference.dot_product_attention(
            q,
            k,
            v,
            bias,
            mask,
            qsl,
            kvsl,
            scale=cfg.scale,
            is_causal=cfg.is_causal,
            window=(cfg.window_left, cfg.window_right),
        )
    o = o.reshape(out_shape)
    if not return_residual:
        return o
    res = jax.lax.stop_gradient(jnp.transpose(lse, (0, 2, 1)).astype(q.dtype))
    return o, res.reshape(out_shape[:-1])


def shard_map_attention(mesh, *, batch_axis=None, head_axis=None, **kwargs):
    """``jax.shard_map`` version of :func:`dot_product_attention` for ``[B, T, N, H]`` inputs.

    Returns ``f(query, key, value, bias=None, mask=None, query_seq_lengths=None, key_value_seq_lengths=None)``
    whose inputs are sharded as ``P(batch_axis, None, head_axis, None)`` (bias/mask: their batch/head dims when
    full, else replicated; seq lengths ``P(batch_axis)``); each shard runs the kernel on its local block with no
    communication in the forward pass (``head_axis`` must divide the kv heads K). ``kwargs`` are the static
    keywords of :func:`dot_product_attention` (scale, is_causal, local_window_size, implementation, ...).

    In a hand-written ``jax.shard_map``, call :func:`dot_product_attention` on the local blocks the same way;
    differentiate it there with ``check_vma=False`` (jax 0.10 rejects its backward pass under vma checking).
    """

    def bspec(x, B, N):
        if x is None:
            return None
        shape = (1,) * (4 - x.ndim) + tuple(x.shape)
        return P(
            batch_axis if shape[0] == B and B > 1 else None, head_axis if shape[1] == N and N > 1 else None
        )

    def f(query, key, value, bias=None, mask=None, query_seq_lengths=None, key_value_seq_lengths=None):
        B, N = query.shape[0], query.shape[2]
        if bias is not None:
            bias = bias.reshape((1,) * (4 - bias.ndim) + tuple(bias.shape))
        if mask is not None:
            mask = mask.reshape((1,) * (4 - mask.ndim) + tuple(mask.shape))
        qspec = P(batch_axis, None, head_axis, None)
        sspec = P(batch_axis)
        args = (query, key, value, bias, mask, query_seq_lengths, key_value_seq_lengths)
        specs = (qspec, qspec, qspec, bspec(bias, B, N), bspec(mask, B, N), sspec, sspec)
        present = [i for i, a in enumerate(args) if a is not None]
        ret_res = kwargs.get("return_residual", False)
        out_specs = (qspec, P(batch_axis, None, head_axis)) if ret_res else qspec

        def local(*xs):
            full = [None] * len(args)
            for i, x in zip(present, xs):
                full[i] = x
            q, k, v, b, m, qs, ks = full
            return dot_product_attention(
                q, k, v, b, m, query_seq_lengths=qs, key_value_seq_lengths=ks, **kwargs
            )

        # check_vma=False: with jax 0.10 the backward pass of this custom_vjp is rejected under vma checking
        # (its cotangents come back without varying-axes types); the kernel is purely per-shard.
        smap = jax.shard_map(
            local, mesh=mesh, in_specs=tuple(specs[i] for i in present), out_specs=out_specs, check_vma=False
        )
        return smap(*(args[i] for i in present))

    return f


__all__ = ["dot_product_attention", "shard_map_attention", "unsupported_reason"]
