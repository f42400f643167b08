"""The lsmr family: ``jax_ops.lsmr`` (SciPy's LSMR as one jitted loop) and its fused kernels.

api (the public function and its validation), types (result, per-column parameters, istop codes), operators (the
``A`` specs), recurrence (the jnp recurrence), loop (the while loops), kernels (the FFI wrappers and the native
constants), batching (the block solve's custom_vmap rule), vjp (gradients), config (knobs), reference (jnp
references of the kernels).
"""
