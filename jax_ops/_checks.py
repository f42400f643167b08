"""Trace-time argument checks shared by the op modules. Each raises with the argument's name in the message."""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import jax
import numpy as np

IMPLEMENTATIONS = (None, "ffi", "xla")
_warned: set[str] = set()


def check_implementation(implementation: str | None, allowed: Iterable[str | None] = IMPLEMENTATIONS) -> None:
    allowed = tuple(allowed)
    if implementation not in allowed:
        raise ValueError(f"implementation must be one of {allowed}, got {implementation!r}")


def check_array(
    name: str, value, *, dtypes: Iterable[np.dtype] | None = None, min_rank: int = 0
) -> jax.Array:
    """``value`` as an array; raises TypeError for a non-array or a dtype outside ``dtypes``."""
    if not hasattr(value, "shape") or not hasattr(value, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(value).__name__}")
    dtype = np.dtype(value.dtype)
    if dtypes is not None:
        allowed = tuple(np.dtype(d) for d in dtypes)
        if dtype not in allowed:
            names = ", ".join(str(d) for d in allowed)
            raise TypeError(f"{name} must have dtype in ({names}), got {dtype}")
    if len(value.shape) < min_rank:
        raise ValueError(f"{name} must have rank >= {min_rank}, got shape {tuple(value.shape)}")
    return value


def check_same_shape_dtype(ref_name: str, ref, **others) -> None:
    for name, value in others.items():
        if tuple(value.shape) != tuple(ref.shape):
            raise ValueError(
                f"{name} has shape {tuple(value.shape)} but {ref_name} has shape {tuple(ref.shape)}"
            )
        if np.dtype(value.dtype) != np.dtype(ref.dtype):
            raise TypeError(
                f"{name} has dtype {np.dtype(value.dtype)} but {ref_name} has dtype {np.dtype(ref.dtype)}"
            )


def warn_once(key: str, message: str) -> None:
    """One warning per process for an explicit fallback (``implementation=None`` on unsupported input)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)
