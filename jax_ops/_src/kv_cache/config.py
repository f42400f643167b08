"""The kv_cache family's knobs (overrides for tests and experiments, read at trace time); the environment
variable sets the process-wide default. Override for a block with ``jax_ops.kv_cache.overrides(splits=n)``.
``load`` and ``merge`` pick the CUDA decode's TMA load path and in-kernel split merge, which are off by default
until measured on a GPU (docs/kv_cache.md)."""

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
    load=Knob(
        "cp.async",
        env="JAX_OPS_KV_CACHE_LOAD",
        parse=str,
        doc="how the CUDA decode loads key tiles: 'cp.async', or 'tma' (the TMA engine where the page size allows)",
    ),
    merge=Knob(
        "xla",
        env="JAX_OPS_KV_CACHE_MERGE",
        parse=str,
        doc="where split-KV partial outputs merge: 'xla' (a separate log-sum-exp merge), or 'kernel' (inside the "
        "decode kernel, for 2..8 splits)",
    ),
)


def overrides(**values):
    """Context manager overriding kv_cache knobs (``splits``, ``load``, ``merge``) for the calls traced inside it."""
    return KNOBS.override(**values)
