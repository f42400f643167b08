"""Helpers shared by the sparse tests: a BCSR from scipy (the relative error is helpers.rel_err)."""

import jax.numpy as jnp
from jax.experimental import sparse as jsparse

from jax_ops import sparse


def bcsr(a, dtype):
    """BCSR of a scipy matrix with values in dtype and int32 indices."""
    a = a.tocsr()
    return jsparse.BCSR(
        (jnp.asarray(a.data, dtype), jnp.asarray(a.indices, jnp.int32), jnp.asarray(a.indptr, jnp.int32)),
        shape=a.shape,
    )


# The CPU-twin tests name their backend: implementation="ffi" (the default None may pick another per platform).
def ffi_pair(A, **kw):
    """sparse.csr_pair(A, implementation="ffi", ...)."""
    return sparse.csr_pair(A, implementation="ffi", **kw)


def ffi_matmul(A, B, **kw):
    """sparse.matmul(A, B, implementation="ffi", ...)."""
    return sparse.matmul(A, B, implementation="ffi", **kw)


def ffi_spmv(A, x, **kw):
    """sparse.spmv(A, x, implementation="ffi", ...)."""
    return sparse.spmv(A, x, implementation="ffi", **kw)


def ffi_spmm(A, B, **kw):
    """sparse.spmm(A, B, implementation="ffi", ...)."""
    return sparse.spmm(A, B, implementation="ffi", **kw)
