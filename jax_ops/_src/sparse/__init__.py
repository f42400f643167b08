"""The sparse family (public names: jax_ops.sparse)."""
