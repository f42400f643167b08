"""Plain jax.numpy reference implementations: used by tests and by ``implementation="xla"``."""

from __future__ import annotations

import jax


def lsmr_hbar_x_update(h: jax.Array, hbar: jax.Array, x: jax.Array, c_h: jax.Array, c_x: jax.Array):
    """hbar' = h - c_h * hbar;  x' = x + c_x * hbar'   (c_* have the vectors' leading shape)."""
    hbar_new = h - c_h[..., None] * hbar
    return hbar_new, x + c_x[..., None] * hbar_new


def lsmr_h_update(v: jax.Array, h: jax.Array, c_v: jax.Array) -> jax.Array:
    """h' = v - c_v * h."""
    return v - c_v[..., None] * h
