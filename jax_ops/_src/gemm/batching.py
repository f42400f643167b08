"""``custom_vmap`` of the GEMM op: a mapped axis folds into the kernel's batch (a vmapped weight becomes Bb = B; shared
weights then fold into M in ffi.py), so a vmapped call is one kernel launch, never a loop. A per-example bias or
b_scale has no slot in the contract (one per call), nor a per-example a_scale with batched weights: those calls run
the jnp version, with a one-time warning."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jax_ops import _checks
from jax_ops._src.batching import fold_leading, lead, unfold_leading
from jax_ops._src.gemm.ffi import dims
from jax_ops._src.gemm.reference import gemm_reference
from jax_ops._src.gemm.sharding import partitioned
from jax_ops._src.gemm.validation import Config


def _weight(x, batched: bool, v: int, batch: int):
    """b / b_up for the folded batch v*batch: [v*batch, ...], or unchanged when shared (Bb = 1, unmapped)."""
    bb = x.shape[1] if batched else x.shape[0]
    if not batched and bb == 1:
        return x
    if bb == 1 and batch > 1:  # a mapped weight shared by the inner batch: one copy per folded batch entry
        x = jnp.broadcast_to(x, (v, batch, *x.shape[2:]))
        return x.reshape(v * batch, *x.shape[2:])
    return fold_leading(x, batched, v)


@functools.cache
def gemm_op(cfg: Config):
    """The op ``(a, b, b_up, bias, c, residual, a_scale, b_scale) -> (out, preact)`` on filled operands."""
    part = partitioned(cfg)

    @jax.custom_batching.custom_vmap
    def op(a, b, b_up, bias, c, residual, a_scale, b_scale):
        return part(a, b, b_up, bias, c, residual, a_scale, b_scale)

    @op.def_vmap
    def _rule(axis_size, in_batched, a, b, b_up, bias, c, residual, a_scale, b_scale):
        V = axis_size
        a_b, b_b, up_b, bias_b, c_b, res_b, as_b, bs_b = in_batched
        args = (a, b, b_up, bias, c, residual, a_scale, b_scale)
        if (
            cfg.sum_batch
        ):  # each example sums its own batch: V stays the batch, (B, K) folds into the contraction
            fa, fb = (lead(x, xb, V).reshape(V, -1, x.shape[-1]) for x, xb in ((a, a_b), (b, b_b)))
            out, preact = gemm_op(dataclasses.replace(cfg, sum_batch=False))(fa, fb, *args[2:])
            return (out[:, None], preact), (True, False)
        B, M, N, _ = dims(cfg, a[0] if a_b else a, b[0] if b_b else b)
        # After folding, shared weights (Bb = 1, a not transposed) take a row scale per folded batch entry.
        shared = not b_b and not up_b and b.shape[0] == 1 and not cfg.transpose_a
        if bias_b or bs_b or (as_b and not shared):
            _checks.warn_once(
                "gemm:vmap-bias",
                "jax_ops.gemm under vmap with a per-example bias or scale the kernel cannot fold: running the jnp "
                "version (the kernel takes one bias and one b_scale per call)",
            )
            ref = functools.partial(gemm_reference, cfg)
            out, preact = jax.vmap(ref, in_axes=tuple(0 if x else None for x in in_batched))(*args)
            if not cfg.write_preact:
                return (out, jnp.zeros((0,), cfg.out_dtype)), (True, False)
            return (out, preact), (True, True)
        fa = fold_leading(a, a_b, V)
        fb = _weight(b, b_b, V, B)
        fu = _weight(b_up, up_b, V, B) if b_up.shape != (0,) else b_up
        fc, fr = (fold_leading(x, xb, V) if x.ndim == 3 else x for x, xb in ((c, c_b), (residual, res_b)))
        fs = a_scale
        if as_b or a_scale.ndim == 2:  # a row scale per folded batch entry: [V*B, M]
            rows = lead(a_scale, as_b, V)  # [V, 1], [V, M] or [V, B, M]
            rows = rows.reshape(V, -1, rows.shape[-1])
            fs = jnp.broadcast_to(rows, (V, B, M)).reshape(V * B, M)
        out, preact = op(fa, fb, fu, bias, fc, fr, fs, b_scale)
        if cfg.write_preact:
            preact = unfold_leading(preact, V)
        return (unfold_leading(out, V), preact), (True, cfg.write_preact)

    return op
