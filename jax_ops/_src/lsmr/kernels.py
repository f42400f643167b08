"""The lsmr family's FFI wrappers: the fused LSMR vector recurrences (public as ``jax_ops.lsmr_kernels`` for
testing and benchmarks) and the fused iteration's kernels.

``step_update`` is one LSMR iteration's whole vector update (what the solver runs: v's normalisation, h, hbar,
x and partial norms for ||x||); ``hbar_x_update`` and ``h_update`` are its h/hbar/x part as two kernels.
They take float32 or float64 vectors of shape ``[..., n]`` and coefficients that are scalars or arrays
of the vectors' leading shape ``[...]`` (one coefficient per row, as a block LSMR needs). Coefficients are
run-time values (device buffers), so they can come from inside ``jax.lax.while_loop``. Results are aliased to
the updated inputs (``hbar``/``x``, ``h``): under ``jit`` with donated inputs, or inside a loop carry, the
update runs in place.

Partitioning: elementwise; vmap adds leading rows (``vmap_method="broadcast_all"``), and under ``shard_map``
each shard runs the kernel on its local block (results typed varying where the inputs vary).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops import _checks, _ffi
from jax_ops._src.lsmr import reference
from jax_ops._src.vma import vary_like

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
    res = _ffi.ffi_call(
        "jax_ops_lsmr_hbar_x", (out, out), h, hbar, x, c_h, c_x, input_output_aliases={1: 0, 2: 1}
    )
    return vary_like(res, (h, hbar, x, c_h, c_x))


def h_update(v, h, c_v, *, implementation: str | None = None) -> jax.Array:
    """Returns ``h' = v - c_v*h`` (aliased to ``h``). Arguments as in :func:`hbar_x_update`."""
    _checks.check_implementation(implementation)
    v, h = _vectors(v=v, h=h)
    c_v = _coefficient("c_v", c_v, v)
    if implementation == "xla":
        return reference.lsmr_h_update(v, h, c_v)
    out = jax.ShapeDtypeStruct(h.shape, h.dtype)
    res = _ffi.ffi_call("jax_ops_lsmr_h", out, v, h, c_v, input_output_aliases={1: 0})
    return vary_like((res,), (v, h, c_v))[0]


def norm_partials(n: int, dtype, unroll: int = 1) -> int:
    """Length of the last axis of a kernel's partial norms of rows of length ``n``: :func:`step_update`'s and
    :func:`iteration_step`'s (``unroll`` 1), :func:`partial_norms`' (``unroll`` = the exported
    ``partial_norms_unroll``). The CUDA kernel's CTAs per row (``NormPartials`` in ffi_cuda/lsmr/heuristics.h, from
    its exported constants)."""
    c = native()
    per_cta = c["norm_threads"] * (c["norm_vector_bytes"] // np.dtype(dtype).itemsize) * unroll
    return 1 if n == 0 else -(-n // per_cta)


def columns_partials(n: int, k: int) -> int:
    """Partial norms per column of a column-layout block [n, k] (``columns=True`` below): one per CTA, each taking
    ``columns_cta_elems // k`` rows (``ColumnsPartials`` in ffi_cuda/lsmr/heuristics.h, from its exported
    constants)."""
    budget = native()["columns_cta_elems"]
    per_cta = 1 if k >= budget else budget // max(k, 1)
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
    res = _ffi.ffi_call(
        "jax_ops_lsmr_step",
        (out, out, out, out, partials),
        vb, v, h, hbar, x, *coefs,
        input_output_aliases={1: 0, 2: 1, 3: 2, 4: 3},
    )  # fmt: skip
    return vary_like(res, (vb, v, h, hbar, x, *coefs))


# ---- The fused LSMR iteration (``jax_ops.lsmr``'s default loop on a GPU, ``loop.step_kernels``). FFI only: the
# reference is the solver's jnp recurrence (``implementation="xla"``). The scalar state's layout is the native
# one (``SCALARS``, ``INTS``, ``PARAMS`` below, exported by ffi_cuda/lsmr/scalar_recurrence.h): ``sc``
# [..., len(SCALARS)], ``ints`` int32 [..., len(INTS)] (itn, istop, done), ``params`` [..., len(PARAMS)] (damp,
# atol, btol, conlim, normb), ``maxiter`` int32 [...].
# Vectors come in the row layout ``[..., n]`` (one right-hand side per row; the state's leading shape is
# ``[...]``) or, with ``columns=True``, in a block solve's column layout ``[n, k]`` (the k right-hand sides
# interleaved, as the products' SpMM takes and gives them; the state's leading shape is ``[k]``).


@functools.cache
def native() -> dict:
    """The lsmr family's native constants (``jax_ops._ffi.constants()["lsmr_*"]`` without the prefix)."""
    return {k[len("lsmr_") :]: v for k, v in _ffi.constants().items() if k.startswith("lsmr_")}


def scalar_order() -> tuple[str, ...]:
    """The names of the scalar state's slots in order (the native ``Scalar`` enum)."""
    return native()["scalars"]


_LAZY = {
    "SCALARS": lambda: native()["scalars"],
    "INTS": lambda: native()["ints"],
    "PARAMS": lambda: native()["params"],
    "NUM_SCALARS": lambda: len(native()["scalars"]),
    "NUM_INTS": lambda: len(native()["ints"]),
    "NUM_PARAMS": lambda: len(native()["params"]),
}


def __getattr__(name: str):  # the native constants, read on first use (importing loads nothing native)
    if name in _LAZY:
        return _LAZY[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _lead_and_parts(vec: jax.Array, columns: bool, unroll: int) -> tuple[tuple[int, ...], int]:
    """The state's leading shape and the partial norms' length for vectors ``vec`` (see the layouts above; the
    column layout may have leading batch dims, as vmap over a batched matrix adds)."""
    if columns:
        if vec.ndim < 2:
            raise ValueError(f"the column layout takes [..., n, k] blocks, got shape {tuple(vec.shape)}")
        return (*vec.shape[:-2], vec.shape[-1]), columns_partials(vec.shape[-2], vec.shape[-1])
    return tuple(vec.shape[:-1]), norm_partials(vec.shape[-1], vec.dtype, unroll)


def partial_norms(vec: jax.Array, *, columns: bool = False) -> jax.Array:
    """Norms of pieces of each row (each column with ``columns``) of ``vec``: ``[..., P]`` (each accumulated in
    float64), so a row's norm is the norm of its partials over the last axis. P = ``norm_partials(n, dtype, 4)``
    (``columns_partials(n, k)``)."""
    (vec,) = _vectors(vec=vec)
    lead, count = _lead_and_parts(vec, columns, native()["partial_norms_unroll"])
    parts = jax.ShapeDtypeStruct((*lead, count), vec.dtype)
    res = _ffi.ffi_call("jax_ops_lsmr_partial_norms", parts, vec, columns=np.int32(columns))
    return vary_like((res,), (vec,))[0]


def normalize(ub: jax.Array, ub_partials: jax.Array, *, columns: bool = False):
    """SciPy's ``beta = ||ub||; u = ub * (1/beta)`` (``u = ub`` when beta = 0) per row (column), from
    ``partial_norms(ub)``.

    Returns ``(u, beta, vb_coef)``; ``u`` aliases ``ub``, ``beta`` has the state's leading shape. ``vb_coef`` is
    the coefficient of v in the next product ``vb = A^T u + vb_coef * v``: ``-beta``, or 1 when beta = 0 (u is then
    0, so vb is v itself, the v SciPy keeps; :func:`iteration_step` then takes v from vb and needs no old v).
    """
    (ub,) = _vectors(ub=ub)
    lead, _ = _lead_and_parts(ub, columns, native()["partial_norms_unroll"])
    row = jax.ShapeDtypeStruct(lead, ub.dtype)
    ws = jax.ShapeDtypeStruct((*lead, 1) if columns else (0,), ub.dtype)  # per-column coefficients (columns)
    u, beta, vb_coef, _ = _ffi.ffi_call(
        "jax_ops_lsmr_normalize",
        (jax.ShapeDtypeStruct(ub.shape, ub.dtype), row, row, ws),
        ub,
        ub_partials,
        input_output_aliases={0: 0},
        columns=np.int32(columns),
    )
    return vary_like((u, beta, vb_coef), (ub, ub_partials))


def iteration_step(vb, h, hbar, x, vb_partials, sc, ints, beta, params, *, columns: bool = False):
    """:func:`step_update` with v' taken from ``vb`` itself when beta = 0 (see :func:`normalize`) and its
    coefficients derived in the kernel: ``alpha_raw = ||vb||`` from ``vb_partials`` (:func:`partial_norms`), then
    the rotations from the scalar state ``sc``/``ints``, this iteration's ``beta`` and ``params``' damp. Returns
    ``(v', h', hbar', x', x_partials)`` (results alias vb, h, hbar, x; ``x_partials``: norms of pieces of x', P =
    ``norm_partials(n, dtype)`` or ``columns_partials(n, k)``)."""
    vb, h, hbar, x = _vectors(vb=vb, h=h, hbar=hbar, x=x)
    lead, count = _lead_and_parts(h, columns, 1)
    out = jax.ShapeDtypeStruct(h.shape, h.dtype)
    x_parts = jax.ShapeDtypeStruct((*lead, count), h.dtype)
    ws = jax.ShapeDtypeStruct((*lead, 5) if columns else (0,), h.dtype)
    *res, _ = _ffi.ffi_call(
        "jax_ops_lsmr_iteration_step",
        (out, out, out, out, x_parts, ws),
        vb, h, hbar, x, vb_partials, sc, ints, beta, params,
        input_output_aliases={0: 0, 1: 1, 2: 2, 3: 3},
        columns=np.int32(columns),
    )  # fmt: skip
    return vary_like(res, (vb, h, hbar, x, vb_partials, sc, ints, beta, params))


def iteration_scalars(sc, ints, neg_alpha, beta, params, maxiter, vb_partials, x_partials):
    """The rest of an LSMR iteration's scalar recurrence for every row (in place): the rotations again (the same
    bits as :func:`iteration_step`'s), the estimates of ``||r||``, ``||A||``, ``cond(A)``, ``||x||`` (from
    ``x_partials``), the stopping tests and the guarded state update. Returns ``(sc', ints', -alpha')``."""
    ins = (sc, ints, neg_alpha, beta, params, maxiter, vb_partials, x_partials)
    res = _ffi.ffi_call(
        "jax_ops_lsmr_scalars",
        (
            jax.ShapeDtypeStruct(sc.shape, sc.dtype),
            jax.ShapeDtypeStruct(ints.shape, ints.dtype),
            jax.ShapeDtypeStruct(neg_alpha.shape, neg_alpha.dtype),
        ),
        *ins,
        input_output_aliases={0: 0, 1: 1, 2: 2},
    )
    return vary_like(res, ins)
