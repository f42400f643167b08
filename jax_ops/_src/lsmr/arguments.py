"""lsmr's arguments as ``scipy.sparse.linalg.lsmr`` takes them: b/x0 coerced (lists, Python numbers, integer
arrays, an ``(m, 1)`` column), the solve dtype (float64 without ``jax_enable_x64`` warns and runs in float32), and
damp/atol/btol/conlim/maxiter with SciPy's meaning for every value SciPy accepts."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.lsmr.operators import COMPLEX_HINT

_MAXITER_CAP = int(np.iinfo(np.int32).max)


def _as_array(name: str, value):
    """A jax array as is; anything else (NumPy, lists, Python numbers) through np.asarray, as SciPy does."""
    if isinstance(value, jax.Array):
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return value  # NumPy arrays and other array objects
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be an array or a list of numbers, got {type(value).__name__}") from err
    if arr.dtype == object:
        raise TypeError(f"{name} must be an array or a list of numbers, got {type(value).__name__}")
    return arr


def _real_kind(name: str, dtype) -> None:
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.complexfloating):
        raise TypeError(f"{name} is complex ({dtype}): {COMPLEX_HINT}")
    if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer) or dtype == np.bool_):
        raise TypeError(f"{name} must be real (float or integer), got dtype {dtype}")


def solve_dtype(b, b_typed: bool, operator_dtype) -> np.dtype:
    """The precision of the solve: b's dtype when b is a float32/float64 array; otherwise (integer arrays, lists,
    Python numbers: ``b_typed`` False for the last two) the operator's when it is float32/float64, else JAX's
    default float. float64 without ``jax_enable_x64`` warns and gives float32. Other float types (float16,
    bfloat16) run in float32."""
    dtype = np.dtype(b.dtype)
    if not b_typed or not np.issubdtype(dtype, np.floating):
        op = np.dtype(operator_dtype) if operator_dtype is not None else None
        dtype = op if op in (np.dtype(np.float32), np.dtype(np.float64)) else np.dtype(jnp.zeros(()).dtype)
    elif dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
        dtype = np.dtype(np.float32)
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        warnings.warn(
            "lsmr: the problem is float64 but jax_enable_x64 is off, so it is solved in float32 "
            "(enable it with jax.config.update('jax_enable_x64', True), or pass float32 data)",
            UserWarning,
            stacklevel=3,
        )
        dtype = np.dtype(np.float32)
    return dtype


def coerce_b(b):
    """(b as an array of rank 1, whether b came with a dtype): SciPy's ``atleast_1d``, then ``squeeze`` when it
    has more dimensions."""
    typed = hasattr(b, "dtype")
    return _vector_b(_as_array("b", b)), typed


def _vector_b(b):
    _real_kind("b", b.dtype)
    if b.ndim == 0:
        return b.reshape(1)
    if b.ndim > 1:
        squeezed = b.reshape(tuple(d for d in b.shape if d != 1) or (1,))
        if squeezed.ndim != 1:
            raise ValueError(
                f"b must be a vector [m] (or [m, 1]), got shape {tuple(b.shape)}; use jax.vmap for several "
                "right-hand sides"
            )
        return squeezed
    return b


def coerce_x0(x0, n: int, m: int, dtype):
    """x0 as an [n] array of the solve dtype (lists and integer arrays accepted), or None."""
    if x0 is None:
        return None
    x0 = _as_array("x0", x0)
    _real_kind("x0", x0.dtype)
    if tuple(x0.shape) != (n,):
        raise ValueError(
            f"x0 has shape {tuple(x0.shape)} but A has shape ({m}, {n}): x0 must have shape ({n},)"
        )
    return jnp.asarray(x0).astype(dtype)


def scalar(name: str, value, dtype):
    """(value as a [1] array of dtype, its Python float when concrete, else None)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    if isinstance(value, (int, float, np.integer, np.floating)):
        if math.isnan(float(value)):
            raise ValueError(f"{name} must not be NaN")
        return jnp.full((1,), value, dtype), float(value)
    arr = jnp.asarray(value)
    if arr.shape != ():
        raise ValueError(
            f"{name} must be a scalar, got shape {arr.shape} (vmap over it for per-column values)"
        )
    if not jnp.issubdtype(arr.dtype, jnp.floating) and not jnp.issubdtype(arr.dtype, jnp.integer):
        raise TypeError(f"{name} must be a real number, got dtype {arr.dtype}")
    concrete = None if isinstance(arr, jax.core.Tracer) else float(arr)
    return arr.astype(dtype).reshape(1), concrete


def damp_array(damp, dtype):
    """damp as a [1] array: its absolute value (SciPy's recurrence sees damp only through squares and a rotation
    whose sign cancels, so -d gives the same iterates as d)."""
    arr, _ = scalar("damp", damp, dtype)
    return jnp.abs(arr)


def maxiter_array(maxiter, m: int, n: int):
    """maxiter as an int32 [1] array with SciPy's meaning (``while itn < maxiter``): None -> min(m, n); a float
    -> ceil (so 5.5 runs 6 iterations); <= 0 or NaN -> no iteration (istop 0); inf or more than 2^31 - 1 ->
    2^31 - 1."""
    if maxiter is None:
        maxiter = min(m, n)
    if isinstance(maxiter, (bool, np.bool_)):
        raise TypeError(f"maxiter must be a number, got {type(maxiter).__name__}")
    if isinstance(maxiter, (int, float, np.integer, np.floating)):
        f = float(maxiter)
        count = 0 if math.isnan(f) or f <= 0 else _MAXITER_CAP if f >= _MAXITER_CAP else math.ceil(f)
        return jnp.full((1,), count, jnp.int32)
    arr = jnp.asarray(maxiter)
    if arr.shape != ():
        raise ValueError(
            f"maxiter must be a scalar, got shape {arr.shape} (vmap over it for per-column values)"
        )
    if jnp.issubdtype(arr.dtype, jnp.floating):
        c = jnp.ceil(arr)
        unlimited = c >= 2.0**30  # (float32 cannot hold 2^31 - 1; this many iterations is no limit)
        count = jnp.where(jnp.isnan(c) | (c <= 0) | unlimited, 0, c).astype(jnp.int32)
        return jnp.where(unlimited, _MAXITER_CAP, count).reshape(1)
    if not jnp.issubdtype(arr.dtype, jnp.integer):
        raise TypeError(f"maxiter must be a real number, got dtype {arr.dtype}")
    return jnp.clip(arr, 0, _MAXITER_CAP).astype(jnp.int32).reshape(1)


def check_finite(**named) -> None:
    """Outside any trace: ``ValueError`` for a concrete array (b, x0) with NaN or Inf (inside jit: istop -1)."""
    for name, val in named.items():
        if val is not None and not isinstance(val, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(val))):
            raise ValueError(f"{name} contains NaN or Inf")
