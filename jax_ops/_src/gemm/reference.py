"""The jnp version of the op (``implementation="xla"``, and the fallback of per-example bias/scales under vmap),
on the op's operand layout (validation.Call): XLA's dot with the contract's accumulator, then the epilogue of
params.h in f32 (f64 for f64 inputs), rounded once to the out dtype. Zero-element operands count as absent."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.gemm.activations import ACTIVATIONS
from jax_ops._src.gemm.validation import BF16, F32, F64, Config, kind


def present(x) -> bool:
    return x is not None and x.size > 0


def _op(x, transpose: bool):
    return jnp.swapaxes(x, -1, -2) if transpose else x


def gemm_reference(cfg: Config, a, b, b_up, bias, c, residual, a_scale, b_scale, *, compute_dtype=None):
    """Returns ``(out, preact)`` (preact [B, M, N], gated [B, M, 2, N], in the out dtype).

    ``compute_dtype``: None runs the contract's precision (f32 accumulate; int32 for int8; TF32 only when
    ``cfg.tf32``); a float dtype (tests: float64) upcasts both operands and does everything in it."""
    k = kind(a.dtype)
    if compute_dtype is not None:
        a, b = a.astype(compute_dtype), b.astype(compute_dtype)
        b_up = b_up.astype(compute_dtype) if present(b_up) else b_up
        acc_dtype = epi_dtype = np.dtype(compute_dtype)
        precision = jax.lax.Precision.HIGHEST
    else:
        if k == "fp8":  # e4m3fn / e5m2 widen to bf16 exactly
            a, b = a.astype(BF16), b.astype(BF16)
        acc_dtype = {"f64": F64, "int8": np.dtype(jnp.int32)}.get(k, F32)
        epi_dtype = F64 if k == "f64" else F32
        exact = k == "f64" or (k == "f32" and not cfg.tf32)
        precision = jax.lax.Precision.HIGHEST if exact else jax.lax.Precision.DEFAULT

    def accumulate(w):
        acc = jnp.matmul(
            _op(a, cfg.transpose_a),
            _op(w, cfg.transpose_b),
            preferred_element_type=acc_dtype,
            precision=precision,
        )
        if cfg.sum_batch:
            acc = acc.sum(axis=0, keepdims=True)
        return acc.astype(epi_dtype)

    if cfg.gated == "none":
        weights = [b]
    elif cfg.gated == "separate":
        weights = [b, b_up]
    else:  # packed [Bb, K, 2, N]
        weights = [b[:, :, 0], b[:, :, 1]]
    return epilogue(cfg, [accumulate(w) for w in weights], bias, c, residual, a_scale, b_scale)


def epilogue(cfg: Config, accs, bias, c, residual, a_scale, b_scale):
    """params.h's epilogue on accumulated products (one per weight: gate and up when gated), each ``[..., M, N]``
    in the epilogue dtype (f32; f64 for f64): ``(out, preact)`` as :func:`gemm_reference`. Also the epilogue of a
    K-sharded product (sharding.py), after the reduction of its partial sums."""
    epi_dtype = accs[0].dtype
    a_s = 1.0
    if present(a_scale):
        a_s = a_scale.astype(epi_dtype)
        a_s = a_s[..., None] if a_s.size > 1 else a_s.reshape(())  # per row ([M] or [B, M]) or per tensor
    zs = []
    for i, acc in enumerate(accs):
        s = 1.0
        if present(b_scale):
            bs = b_scale.astype(epi_dtype).reshape(-1)
            s = bs[0] if bs.shape[0] == 1 else bs.reshape(len(accs), -1)[i]
        z = cfg.alpha * (acc * (a_s * s))
        if present(bias):
            z = z + bias.astype(epi_dtype).reshape(len(accs), -1)[i]
        zs.append(z)
    if present(c) and cfg.beta != 0:
        zs[0] = zs[0] + cfg.beta * c.astype(epi_dtype)
    fn = ACTIVATIONS[cfg.activation].fn
    y = fn(zs[0]) if cfg.gated == "none" else fn(zs[0]) * zs[1]
    if present(residual):
        y = y + residual.astype(epi_dtype)
    preact = zs[0] if cfg.gated == "none" else jnp.stack(zs, axis=2)
    return y.astype(cfg.out_dtype), preact.astype(cfg.out_dtype)
