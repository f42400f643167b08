"""Argument validation of dot_product_attention and the static configuration of one call."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.attention.config import KNOBS


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The knobs the CUDA handlers take as attributes (the CPU twin accepts and ignores them)."""

    portable: bool = False  # the portable kernels instead of the Hopper ones
    fwd_persistent: int = -1  # the persistent Hopper forward: 1 on, 0 off, -1 the rule (heuristics.h)
    bwd_cluster: int = -1  # the Hopper backward's GQA dK/dV cluster size: 1, 2, 4, or -1 the rule
    hopper_bwd_mods: bool = True  # a masked/biased backward on the Hopper kernels, not portable/reference

    @staticmethod
    def from_knobs() -> Tuning:
        persistent, cluster = KNOBS.fwd_persistent, KNOBS.bwd_cluster
        if persistent not in (None, True, False):
            raise ValueError(f"attention knob fwd_persistent must be None, True or False, got {persistent!r}")
        if cluster not in (None, 1, 2, 4):
            raise ValueError(f"attention knob bwd_cluster must be None, 1, 2 or 4, got {cluster!r}")
        return Tuning(
            portable=bool(KNOBS.portable),
            fwd_persistent=-1 if persistent is None else int(persistent),
            bwd_cluster=-1 if cluster is None else int(cluster),
            hopper_bwd_mods=bool(KNOBS.hopper_bwd_mods),
        )

    def fwd_attrs(self) -> dict[str, Any]:
        return dict(portable=bool(self.portable), fwd_persistent=np.int64(self.fwd_persistent))

    def bwd_attrs(self) -> dict[str, Any]:
        return dict(portable=bool(self.portable), bwd_cluster=np.int64(self.bwd_cluster))


@dataclasses.dataclass(frozen=True)
class Config:
    """Static attributes of one call (hashable: keys the custom_vmap/custom_partitioning caches)."""

    scale: float
    is_causal: bool
    window_left: int  # -1: unbounded
    window_right: int
    has_bias: bool
    has_mask: bool
    has_q_seqlen: bool
    has_kv_seqlen: bool
    tuning: Tuning = Tuning()

    def contract_attrs(self) -> dict[str, Any]:
        """The contract's attributes (params.h), both targets."""
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

    def fwd_attrs(self) -> dict[str, Any]:
        return dict(self.contract_attrs(), **self.tuning.fwd_attrs())

    def bwd_attrs(self) -> dict[str, Any]:
        attrs = dict(self.contract_attrs(), **self.tuning.bwd_attrs())
        if (self.has_mask or self.has_bias) and not self.tuning.hopper_bwd_mods:
            attrs["portable"] = True  # the knob's A/B: the portable kernel for masked/biased backward calls
        return attrs


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


def normalize(query, key, value, bias, mask, scale, is_causal, q_seqlen, kv_seqlen, local_window_size):
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
    cfg = Config(
        scale=scale,
        is_causal=bool(is_causal),
        window_left=wl,
        window_right=wr,
        has_bias=bias is not None,
        has_mask=mask is not None,
        has_q_seqlen=q_seqlen is not None,
        has_kv_seqlen=kv_seqlen is not None,
        tuning=Tuning.from_knobs(),
    )
    return cfg, (query, key, value, bias, mask, q_seqlen, kv_seqlen)
