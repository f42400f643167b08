"""jax_ops implementation: one subpackage per op family (attention, sparse, lsmr), plus the pieces they share.

Public modules (``jax_ops.attention``, ``jax_ops.sparse``, ``jax_ops.lsmr_solver``, ...) only re-export from here.
"""
