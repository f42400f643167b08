"""The kv_cache family's knobs (overrides for tests and experiments, read at trace time); the environment
variable sets the process-wide default. Override for a block with ``jax_ops.kv_cache.overrides(splits=n)``."""

from __future__ import annotations

from jax_ops._src.config import Knob, Knobs

KNOBS = Knobs(
    "kv_cache",
    splits=Knob(
        None,
        env="JAX_OPS_KV_CACHE_SPLITS",
        parse=int,
        doc="force the paged decode's split-KV count on any backend (None: heuristics.splits)",
    ),
)


def overrides(**values):
    """Context manager overriding kv_cache knobs (``splits``) for the calls traced inside it."""
    return KNOBS.override(**values)
