"""The sparse family's knobs (test/experiment overrides) and the native constants it shares with the kernels.

Every fact the kernels and Python both need (algorithm codes, caps, the slot rule's thresholds) comes from
``jax_ops._ffi.constants()`` (the ``sparse_*`` entries filled in ``ffi_cuda/registrations_cpu.cc`` from the
family's headers); Python never retypes one.
"""

from __future__ import annotations

import functools
import types

from jax_ops import _ffi
from jax_ops._src.config import Knob, Knobs

KNOBS = Knobs(
    "sparse",
    slab_smem_bytes=Knob(
        None,
        env="JAX_OPS_SPARSE_SLAB_SMEM_BYTES",
        parse=int,
        doc="shared memory per slab CTA for u[slab], which sets the slab width (None: the native default, "
        "sparse_slab_smem_bytes; tests shrink it to get many narrow slabs)",
    ),
)


def overrides(**values):
    """Context manager overriding sparse knobs for a block (``with jax_ops.sparse.overrides(slab_smem_bytes=4096):``)."""
    return KNOBS.override(**values)


@functools.cache
def native() -> types.SimpleNamespace:
    """The ``sparse_*`` native constants, without the prefix (``native().stream_cap``)."""
    prefix = "sparse_"
    return types.SimpleNamespace(
        **{k[len(prefix) :]: v for k, v in _ffi.constants().items() if k.startswith(prefix)}
    )


def slab_smem_bytes() -> int:
    """The slab shared-memory budget in force (the knob, else the native default)."""
    v = KNOBS.slab_smem_bytes
    return native().slab_smem_bytes if v is None else int(v)
