"""The raw FFI calls of the two targets (contract: ffi_cuda/attention/params.h) and the dummy buffers of absent
optional inputs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_ops import _ffi
from jax_ops._src import dispatch
from jax_ops._src.attention.heuristics import BWD_TARGET, FWD_TARGET
from jax_ops._src.attention.validation import Config


def mask_words(keys: int) -> int:
    """Words per line of the packed mask (params.h MaskWords): whole groups of 128 keys."""
    return -(-keys // 128) * 4


def packed_mask(cfg: Config, mask, keys: int):
    """The contract's mask operand: a bool ``[mB, mN, mT, 1|S]`` mask bit-packed along the keys into uint32
    ``[mB, mN, mT, mask_words(S)]`` (key s = bit s % 32 of word s // 32, the bits past S clear); a dummy
    ``[1, 1, 1, 1]`` word without a mask. One fused XLA pass reading the mask once."""
    if not cfg.has_mask:
        return jnp.zeros((1, 1, 1, 1), jnp.uint32)
    lead = mask.shape[:3]
    words = mask_words(keys)
    bits = jnp.broadcast_to(mask, (*lead, keys))
    bits = jnp.pad(bits, ((0, 0),) * 3 + ((0, words * 32 - keys),)).reshape(*lead, words, 32)
    shifts = jnp.arange(32, dtype=jnp.uint32)
    return jnp.sum(bits.astype(jnp.uint32) << shifts, axis=-1, dtype=jnp.uint32)


def fwd_ffi(cfg: Config, q, k, v, bias, mask, qsl, kvsl):
    B, T, N, _ = q.shape
    out = (jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((B, N, T), jnp.float32))
    words = packed_mask(cfg, mask, k.shape[1])
    return tuple(_ffi.ffi_call(FWD_TARGET, out, q, k, v, bias, words, qsl, kvsl, **cfg.fwd_attrs()))


def writes_dbias_scores(cfg: Config) -> bool:
    """Whether the backward writes dbias as dS [B, N, T, S] float32 (the CUDA form), not in the bias's shape."""
    return cfg.has_bias and dispatch.platform() == "gpu" and cfg.tuning.hopper_bwd_mods


def bwd_ffi(cfg: Config, q, k, v, bias, mask, qsl, kvsl, o, lse, do):
    """(dq, dk, dv, dbias), dbias in the bias's shape and dtype. On a GPU the kernel writes dbias as dS
    [B, N, T, S] float32 (the only form the CUDA backward has) and XLA sums it over the bias's broadcast dims."""
    B, T, N, _ = q.shape
    full = (B, N, T, k.shape[1])
    scores = writes_dbias_scores(cfg)
    db = jax.ShapeDtypeStruct(full, jnp.float32) if scores else jax.ShapeDtypeStruct(bias.shape, bias.dtype)
    out = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k.shape, k.dtype),
        jax.ShapeDtypeStruct(v.shape, v.dtype),
        db,
    )
    words = packed_mask(cfg, mask, k.shape[1])
    dq, dk, dv, db = _ffi.ffi_call(
        BWD_TARGET, out, q, k, v, bias, words, qsl, kvsl, o, lse, do, **cfg.bwd_attrs()
    )
    if scores:
        axes = tuple(i for i in range(4) if bias.shape[i] == 1 and full[i] > 1)
        db = jnp.sum(db, axis=axes, keepdims=True).astype(bias.dtype)
    return dq, dk, dv, db


def fill(cfg: Config, bias, mask, qsl, kvsl):
    """Dummy 1-element buffers for absent optional inputs (the kernel ignores them; see ffi_cuda/attention/params.h)."""
    bias = bias if cfg.has_bias else jnp.zeros((1, 1, 1, 1), jnp.float32)
    mask = mask if cfg.has_mask else jnp.ones((1, 1, 1, 1), bool)
    qsl = qsl if cfg.has_q_seqlen else jnp.zeros((1,), jnp.int32)
    kvsl = kvsl if cfg.has_kv_seqlen else jnp.zeros((1,), jnp.int32)
    return bias, mask, qsl, kvsl
