"""Helpers shared by the CPU sparse tests: the relative error against a float64 reference and a BCSR from scipy."""

import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse


def rel_err(out, ref):
    """||out - ref|| / ||ref|| in float64; asserts that out is finite (an unwritten or poisoned element)."""
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    assert np.all(np.isfinite(out)), "non-finite output"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300)


def bcsr(a, dtype):
    """BCSR of a scipy matrix with values in dtype and int32 indices."""
    a = a.tocsr()
    return jsparse.BCSR(
        (jnp.asarray(a.data, dtype), jnp.asarray(a.indices, jnp.int32), jnp.asarray(a.indptr, jnp.int32)),
        shape=a.shape,
    )
