"""Helpers shared by every family's tests: the relative error against a higher-precision reference, output
poisoning, and the default tolerances by dtype (families may tighten them)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

# ||out - ref|| / ||ref|| bounds against a float64 (or float32 for half types) reference.
TOL = {np.float64: 1e-12, np.float32: 1e-5, np.float16: 2e-3, jnp.bfloat16: 1e-2}


def tol(dtype) -> float:
    """The default relative-error bound of ``dtype``."""
    for key, value in TOL.items():
        if np.dtype(key) == np.dtype(dtype):
            return value
    raise KeyError(f"no default tolerance for dtype {dtype}")


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; asserts that ``out`` is finite (an unwritten or poisoned element)."""
    out = np.asarray(jnp.asarray(out).astype(jnp.float32) if jnp.asarray(out).dtype == jnp.bfloat16 else out)
    out = out.astype(np.float64)
    ref = np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite output (an unwritten or poisoned element)"
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))


def poisoned(shape, dtype):
    """An output buffer filled with NaN (or the integer type's max), for aliased-output tests."""
    dtype = jnp.dtype(dtype)
    fill = np.nan if jnp.issubdtype(dtype, jnp.inexact) else np.iinfo(dtype).max
    return jnp.full(shape, fill, dtype)
