"""Plain jax.numpy reference implementations, used by tests and by ``implementation="xla"``. Each family's
reference lives in ``jax_ops/_src/<family>/reference.py``; this module gathers them."""

from jax_ops._src.attention.reference import dot_product_attention
from jax_ops._src.lsmr.reference import lsmr_h_update, lsmr_hbar_x_update, lsmr_step_update

__all__ = ["dot_product_attention", "lsmr_h_update", "lsmr_hbar_x_update", "lsmr_step_update"]
