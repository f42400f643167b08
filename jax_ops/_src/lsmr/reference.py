"""The lsmr family's jax.numpy references of its fused vector updates (``implementation="xla"``); the solver's
jnp recurrence itself is ``recurrence.step``."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def lsmr_hbar_x_update(h: jax.Array, hbar: jax.Array, x: jax.Array, c_h: jax.Array, c_x: jax.Array):
    """hbar' = h - c_h * hbar;  x' = x + c_x * hbar'   (c_* have the vectors' leading shape)."""
    hbar_new = h - c_h[..., None] * hbar
    return hbar_new, x + c_x[..., None] * hbar_new


def lsmr_h_update(v: jax.Array, h: jax.Array, c_v: jax.Array) -> jax.Array:
    """h' = v - c_v * h."""
    return v - c_v[..., None] * h


def lsmr_step_update(vb, v, h, hbar, x, s_v, keep_v, c_h, c_x, c_v):
    """(v', h', hbar', x', partials): v' = where(keep_v, v, vb * s_v), then lsmr_hbar_x_update and
    lsmr_h_update with v'; partials [..., 1] = ||x'|| (squares summed in float64 when x64 is on)."""
    v_new = jnp.where(keep_v[..., None] != 0, v, vb * s_v[..., None])
    hbar_new, x_new = lsmr_hbar_x_update(h, hbar, x, c_h, c_x)
    acc = jnp.float64 if jax.config.jax_enable_x64 else x_new.dtype
    norm = jnp.sqrt(jnp.sum(jnp.square(x_new.astype(acc)), axis=-1, keepdims=True)).astype(x_new.dtype)
    return v_new, lsmr_h_update(v_new, h, c_v), hbar_new, x_new, norm
