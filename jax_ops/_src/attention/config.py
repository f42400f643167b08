"""The attention family's knobs: overrides for tests and experiments, read at trace time.

The environment variables set the process-wide defaults; they are read here (once, at first use) and nowhere
else: the CUDA handlers get ``portable``, ``fwd_persistent`` and ``bwd_cluster`` as FFI attributes. Override
them for a block with ``jax_ops.attention.overrides(**kw)``.
"""

from __future__ import annotations

from jax_ops._src.config import Knob, Knobs


def _flag(raw: str) -> bool:
    return raw == "1"


def _tristate(raw: str) -> bool | None:
    return True if raw == "1" else False if raw == "0" else None


def _cluster(raw: str) -> int | None:
    if raw in ("0", "off", "1"):
        return 1
    return int(raw) if raw in ("2", "4") else None


KNOBS = Knobs(
    "attention",
    kv_splits=Knob(
        None,
        env="JAX_OPS_ATTENTION_KV_SPLITS",
        parse=int,
        doc="force the split-KV forward's chunk count on any backend (None: the policy, GPU only)",
    ),
    portable=Knob(
        False,
        env="JAX_OPS_ATTENTION_PORTABLE",
        parse=_flag,
        doc="CUDA: run the portable mma.sync kernels, forward and backward, instead of the Hopper ones",
    ),
    fwd_persistent=Knob(
        None,
        env="JAX_OPS_ATTENTION_FWD_PERSISTENT",
        parse=_tristate,
        doc="CUDA: force the persistent Hopper forward on (True, env 1) or off (False, env 0); None: per shape",
    ),
    jnp_block=Knob(
        None,
        env="JAX_OPS_ATTENTION_JNP_BLOCK",
        parse=int,
        doc="the jnp path in blocks of this many queries x keys (None: dense while its logits fit 64 MiB, "
        "else blocks of 512)",
    ),
    hopper_bwd_mods=Knob(
        True,
        env="JAX_OPS_ATTENTION_HOPPER_BWD_MODS",
        parse=_flag,
        doc="CUDA: run the backward of calls with a mask or a bias on the Hopper kernels' per-element variant "
        "(dbias from dS); off (env 0): a masked backward runs the portable kernel and a bias gradient the "
        "reference VJP",
    ),
    bwd_cluster=Knob(
        None,
        env="JAX_OPS_ATTENTION_BWD_CLUSTER",
        parse=_cluster,
        doc="CUDA: the Hopper backward's GQA dK/dV cluster size J (1, 2 or 4; env 0/off = 1); None: the rule",
    ),
)


def overrides(**values):
    """Context manager overriding attention knobs (``kv_splits``, ``portable``, ``fwd_persistent``,
    ``hopper_bwd_mods``, ``bwd_cluster``, ``jnp_block``) for the calls traced inside it."""
    return KNOBS.override(**values)
