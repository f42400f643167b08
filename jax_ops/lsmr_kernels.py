"""Fused LSMR vector recurrences (internal kernels of ``jax_ops.lsmr``; public for testing and benchmarks).

``step_update`` is one LSMR iteration's whole vector update (what the solver runs: v's normalisation, h, hbar,
x and partial norms for ||x||); ``hbar_x_update`` and ``h_update`` are its h/hbar/x part as two kernels.
They take float32 or float64 vectors of shape ``[..., n]`` and coefficients that are scalars or arrays
of the vectors' leading shape ``[...]`` (one coefficient per row, as a block LSMR needs). Coefficients are
run-time values (device buffers), so they can come from inside ``jax.lax.while_loop``. Results are aliased to
the updated inputs (``hbar``/``x``, ``h``): under ``jit`` with donated inputs, or inside a loop carry, the
update runs in place.

Partitioning: elementwise; vmap adds leading rows (``vmap_method="broadcast_all"``), and under ``shard_map``
each shard runs the kernel on its local block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops import _checks, _ffi, reference

_DTYPES = (np.float32, np.float64)


def _coefficient(name: str, c, vec: jax.Array) -> jax.Array:
    """A coefficient as an array of the vectors' leading shape and dtype."""
    lead = tuple(vec.shape[:-1])
    if isinstance(c, (int, float)) and not isinstance(c, bool):
        return jnp.full(lead, c, dtype=vec.dtype)
    _checks.check_array(name, c)
    if np.dtype(c.dtype) != np.dtype(vec.dtype):
        raise TypeError(f"{name} must have the vectors' dtype {np.dtype(vec.dtype)}, got {np.dtype(c.dtype)}")
    if tuple(c.shape) not in ((), lead):
        raise ValueError(
            f"{name} must be a scalar or have the vectors' leading shape {lead}, got {tuple(c.shape)}"
        )
    return jnp.broadcast_to(c, lead)


def _vectors(**named) -> list[jax.Array]:
    (first_name, first), *rest = named.items()
    _checks.check_array(first_name, first, dtypes=_DTYPES, min_rank=1)
    for name, value in rest:
        _checks.check_array(name, value, dtypes=_DTYPES, min_rank=1)
    _checks.check_same_shape_dtype(first_name, first, **dict(rest))
    return [jnp.asarray(v) for v in named.values()]


def hbar_x_update(h, hbar, x, c_h, c_x, *, implementation: str | None = None):
    """Returns ``(hbar', x')`` with ``hbar' = h - c_h*hbar`` and ``x' = x + c_x*hbar'`` in one pass.

    Args:
      h, hbar, x: float32 or float64 arrays of one shape ``[..., n]``.
      c_h, c_x: Python scalars or arrays of the vectors' dtype, shape ``()`` or ``[...]``.
      implementation: ``None``/``"ffi"`` (the kernel) or ``"xla"`` (the jnp reference).
    """
    _checks.check_implementation(implementation)
    h, hbar, x = _vectors(h=h, hbar=hbar, x=x)
    c_h = _coefficient("c_h", c_h, h)
    c_x = _coefficient("c_x", c_x, h)
    if implementation == "xla":
        return reference.lsmr_hbar_x_update(h, hbar, x, c_h, c_x)
    out = jax.ShapeDtypeStruct(h.shape, h.dtype)
    return tuple(
        _ffi.ffi_call(
            "jax_ops_lsmr_hbar_x", (out, out), h, hbar, x, c_h, c_x, input_output_aliases={1: 0, 2: 1}
        )
    )


def h_update(v, h, c_v, *, implementation: str | None = None) -> jax.Array:
    """Returns ``h' = v - c_v*h`` (aliased to ``h``). Arguments as in :func:`hbar_x_update`."""
    _checks.check_implementation(implementation)
    v, h = _vectors(v=v, h=h)
    c_v = _coefficient("c_v", c_v, v)
    if implementation == "xla":
        return reference.lsmr_h_update(v, h, c_v)
    out = jax.ShapeDtypeStruct(h.shape, h.dtype)
    return _ffi.ffi_call("jax_ops_lsmr_h", out, v, h, c_v, input_output_aliases={1: 0})


def norm_partials(n: int, dtype) -> int:
    """Length of the last axis of :func:`step_update`'s ``partials`` (the CUDA kernel's CTAs per row; mirrors
    ``NormPartials`` in ffi_cuda/lsmr/recurrence_params.h)."""
    per_cta = 256 * (16 // np.dtype(dtype).itemsize)
    return 1 if n == 0 else -(-n // per_cta)


def step_update(vb, v, h, hbar, x, s_v, keep_v, c_h, c_x, c_v, *, implementation: str | None = None):
    """One LSMR iteration's vector update after its two products, in one pass.

    Returns ``(v', h', hbar', x', partials)`` with ``v' = v if keep_v else vb*s_v``, ``hbar' = h - c_h*hbar``,
    ``x' = x + c_x*hbar'`` and ``h' = v' - c_v*h`` (bitwise the same as XLA's ``jnp.where(keep_v, v, vb*s_v)``
    followed by :func:`hbar_x_update` and :func:`h_update`), and ``partials`` ``[..., norm_partials(n)]``:
    norms of pieces of each row of x' (each accumulated in float64), so ``||x'|| = ||partials||`` over the last
    axis.

    Args:
      vb, v, h, hbar, x: float32 or float64 arrays of one shape ``[..., n]``; results alias v, h, hbar, x.
      s_v, c_h, c_x, c_v: coefficients (Python scalars or arrays of the vectors' dtype, shape ``()`` or ``[...]``).
      keep_v: a coefficient of the same kind: nonzero keeps ``v`` (SciPy's ``beta == 0`` case), 0 takes
        ``vb*s_v``.
      implementation: ``None``/``"ffi"`` (the kernel) or ``"xla"`` (the jnp reference).
    """
    _checks.check_implementation(implementation)
    vb, v, h, hbar, x = _vectors(vb=vb, v=v, h=h, hbar=hbar, x=x)
    coefs = [
        _coefficient(name, c, vb)
        for name, c in (("s_v", s_v), ("keep_v", keep_v), ("c_h", c_h), ("c_x", c_x), ("c_v", c_v))
    ]
    if implementation == "xla":
        return reference.lsmr_step_update(vb, v, h, hbar, x, *coefs)
    out = jax.ShapeDtypeStruct(h.shape, h.dtype)
    partials = jax.ShapeDtypeStruct((*h.shape[:-1], norm_partials(h.shape[-1], h.dtype)), h.dtype)
    return tuple(
        _ffi.ffi_call(
            "jax_ops_lsmr_step",
            (out, out, out, out, partials),
            vb, v, h, hbar, x, *coefs,
            input_output_aliases={1: 0, 2: 1, 3: 2, 4: 3},
        )
    )  # fmt: skip
