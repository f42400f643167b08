"""Helpers shared by the sparse tests: a BCSR from scipy (the relative error is helpers.rel_err)."""

import jax.numpy as jnp
from jax.experimental import sparse as jsparse


def bcsr(a, dtype):
    """BCSR of a scipy matrix with values in dtype and int32 indices."""
    a = a.tocsr()
    return jsparse.BCSR(
        (jnp.asarray(a.data, dtype), jnp.asarray(a.indices, jnp.int32), jnp.asarray(a.indptr, jnp.int32)),
        shape=a.shape,
    )
