"""LSMR for sparse/dense least squares, matching ``scipy.sparse.linalg.lsmr`` (``jax_ops.lsmr``).

Solves ``min ||A x - b||^2 + damp^2 ||x||^2`` with the Golub-Kahan bidiagonalisation of Fong & Saunders, in one
jitted ``jax.lax.while_loop`` whose state (vectors *and* scalars) stays on the device: no host round trip per
iteration. The recurrence is SciPy's, statement by statement (same rotations, same estimates of ``||r||``,
``||A^T r||``, ``||A||``, ``cond(A)``, same order of the stopping tests), so ``istop``/``itn`` agree with SciPy.

Design (``docs/design/lsmr.md``):

* The solver runs internally on *blocks*: ``B`` is ``[k, m]``, every vector of the recurrence is ``[k, n]`` or
  ``[k, m]`` and every scalar is a ``[k]`` vector (one per right-hand side). The plain call uses ``k = 1``;
  ``jax.vmap`` over ``b`` (a ``custom_vmap`` rule) turns into one block solve with ``k`` = batch size: one
  SpMM (dense A: one GEMM) per half-step serves all columns, each column keeps its own scalars and stops on
  its own. A converged column is frozen (its scalars by ``jnp.where``, its ``x`` by zero coefficients of the
  fused update); the loop runs until every column is done.
* Per iteration: ``u <- A v - alpha u`` and ``v <- A^T u - beta v`` (a fused matvec-with-beta when the operator
  has one), then five launches of our kernels (``loop.step_kernels``): partial norms of u's update, u's
  normalisation, partial norms of v's update, one vector update (v's normalisation, h, hbar, x, partial norms
  of x; each CTA derives its coefficients from the scalar state), and one scalar kernel (the rotations, the
  estimates, the stopping tests) -- no XLA reductions or scalar fusions in the loop.
* ``unroll`` guarded iterations per ``while_loop`` trip amortise the loop-condition round trip on GPUs; the
  result does not depend on it (a finished column is frozen inside the trip).

Operators (``A``):
  * a dense ``[m, n]`` array (numpy or jax);
  * ``jax.experimental.sparse.BCOO`` / ``BCSR`` (converted once, outside the loop, to ``jax_ops.sparse.CSRPair``
    when that module exists, else used through ``jax.experimental.sparse`` products), ``scipy.sparse`` matrices
    (their CSR to a CSRPair);
  * ``scipy.sparse.linalg.LinearOperator``: the matrix it wraps (``aslinearoperator(S)``), else its host
    matmat/rmatmat through ``jax.pure_callback`` (``operators.HostOperator``);
  * ``jax_ops.sparse.CSRPair`` or any object with ``shape`` (``(m, n)``), ``matvec(v[n]) -> [m]`` and
    ``rmatvec(u[m]) -> [n]`` (jax-traceable, vmappable). Optional fused forms, used when present:
    ``matvec_axpby(v, y, beta) -> A v + beta*y`` and ``rmatvec_axpby(u, y, beta) -> A^T u + beta*y``
    (``beta`` is a scalar array). Register the object as a pytree (e.g. a NamedTuple or
    ``jax.tree_util.register_dataclass``) so its arrays are arguments of the jitted solve (no recompile for new
    values, gradients w.r.t. them); a non-pytree object is used as a static closure.
  * a row-sharded matrix (``jax_ops.lsmr_solver.row_sharded``: a dense ``RowShardedMatrix`` or a
    ``jax_ops.sparse.RowShardedCSR``): lsmr runs a ``jax.shard_map`` over its mesh axis (``sharded.py``); inside a
    shard_map of your own, pass each shard's rows with ``axis_name``.

Precision: vectors, matvecs and the scalar recurrence run in ``b``'s dtype (float32 or float64). The fused
iteration's kernels accumulate the sums of squares behind the norms in float64 always; the jnp loops ("step",
``implementation="xla"``) do so for float32 problems when ``jax_enable_x64`` is on (a convert fused into the
reduction) and use XLA's float32 tree reductions without it.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from jax_ops._src import dispatch
from jax_ops._src.lsmr import arguments, progress, sharded
from jax_ops._src.lsmr.config import ITERATIONS, KNOBS, LoopConfig
from jax_ops._src.lsmr.heuristics import DEFAULT_ON_CPU, default_unroll
from jax_ops._src.lsmr.operators import RowSharded, as_operator
from jax_ops._src.lsmr.types import ColParams, LSMRResult
from jax_ops._src.lsmr.vjp import block_solver


def _solve(spec, has_x0, loop, implementation, leaves, B, X0, cp):
    return block_solver(spec, has_x0, loop, implementation)(leaves, B, X0, cp)


_solve_jit = jax.jit(_solve, static_argnums=(0, 1, 2, 3))


@functools.lru_cache(maxsize=8)
def _solve_jit_with(compiler_options: tuple):
    """The solve jitted with XLA compiler options (only usable as a top-level jit: JAX rejects them on a
    nested one, so a caller's own jit must carry them instead)."""
    return jax.jit(_solve, static_argnums=(0, 1, 2, 3), compiler_options=dict(compiler_options))


def _at_top_level() -> bool:
    """True when no jit/vmap/grad trace is active (the solve then is its own top-level executable)."""
    try:
        from jax._src import core as _core

        return bool(_core.trace_state_clean())
    except Exception:  # noqa: BLE001 - private API moved: never attach options
        return False


def lsmr(
    A: Any,
    b: jax.Array,
    damp: float | jax.Array = 0.0,
    atol: float | jax.Array = 1e-6,
    btol: float | jax.Array = 1e-6,
    conlim: float | jax.Array = 1e8,
    maxiter: int | jax.Array | None = None,
    show: bool = False,
    x0: jax.Array | None = None,
    *,
    implementation: str | None = None,
    unroll: int | None = None,
    axis_name: Any = None,
) -> LSMRResult:
    """Iterative solver for least-squares problems, ``scipy.sparse.linalg.lsmr`` semantics, jittable.

    Solves ``min_x ||b - A x||_2^2 + damp^2 ||x - x0||_2^2``-style problems exactly as SciPy does (with ``x0``,
    LSMR solves for the correction ``x - x0`` and damps the correction).

    Args:
      A: ``[m, n]`` operator: dense array, ``jax.experimental.sparse.BCOO``/``BCSR``, ``scipy.sparse`` matrix,
        ``jax_ops.sparse.CSRPair``, a ``scipy.sparse.linalg.LinearOperator`` (``aslinearoperator(S)``: S is
        used on the device; any other: its matmat/rmatmat on the host through ``jax.pure_callback``), or an
        object with ``shape``, ``matvec`` and ``rmatvec`` (see module doc).
      b: ``[m]`` right-hand side, coerced as SciPy does (``[m, 1]``, lists, Python numbers, integer arrays). A
        float32/float64 ``b`` sets the precision; otherwise A's float dtype does, else JAX's default float.
        float64 without ``jax_enable_x64`` warns and runs in float32; complex raises ``TypeError``.
        ``jax.vmap`` over ``b`` (and/or ``x0``, ``damp``, ``atol``, ...) runs one block solve for all of them.
      damp, atol, btol, conlim: as in SciPy (Python numbers or scalar arrays; traced values do not recompile):
        a negative damp acts as ``|damp|``, a negative atol/btol never stops the solve by its own test.
      maxiter: iteration limit, default ``min(m, n)``; SciPy's meaning for any number (a float runs
        ``ceil(maxiter)`` iterations, <= 0 or NaN none, inf without limit).
      show: outside any trace, print SciPy-style text before and after the solve (not per iteration: the loop
        runs on the device); ignored under jit/vmap/grad.
      x0: optional ``[n]`` initial guess.
      implementation: ``None`` (the fastest correct path for the platform: on a GPU the fused FFI kernels with
        CSRPair products for sparse inputs; on the CPU the ``"xla"`` path, measured faster than the CPU twin),
        ``"ffi"`` (our kernels, the CPU twin on the CPU; raises when a kernel path is unavailable) or ``"xla"``
        (jnp recurrences and jax.experimental.sparse products).
      unroll: LSMR iterations per ``while_loop`` trip (default 1 on CPU, 2 on GPU); results do not depend on it.
      axis_name: inside ``jax.shard_map``, the mesh axis (or tuple of axes) that splits A's rows: ``A`` and ``b``
        are then this shard's rows, ``x0`` and the result are whole (replicated); A^T u and the m-space norms are
        summed over the axis by ``psum``. Outside a shard_map, pass ``row_sharded(A, mesh, axis)`` (a
        ``RowShardedMatrix`` or ``jax_ops.sparse.RowShardedCSR``) as ``A`` instead: lsmr then runs the shard_map
        (docs/lsmr.md, "Row-sharded solves").

    Returns:
      :class:`LSMRResult` ``(x, istop, itn, normr, normar, norma, conda, normx)``. ``istop`` is SciPy's code
      0..7, or -1 when a non-finite value is met inside ``jit`` (then ``x`` is NaN or not a solution); outside
      ``jit`` a non-finite ``b``/``x0`` raises ``ValueError`` instead.

    Gradients: ``x`` is differentiable w.r.t. ``b`` and the matrix values (dense entries, sparse ``data``, a pytree
    operator's float leaves) by a ``custom_vjp`` that solves the adjoint least-squares problems with the same
    tolerances, assuming the forward solve converged and ``A`` has full column rank or ``damp > 0``
    (``b``'s cotangent is exact for any rank at ``damp = 0``). ``x0`` gets the cotangent of
    ``x = x0 + (A^T A + damp^2 I)^{-1} A^T (b - A x0)``; ``damp``/tolerances and the other outputs are not
    differentiated.
    """
    if sharded.is_row_sharded(A):
        if axis_name is not None:
            raise ValueError(
                f"lsmr: a {type(A).__name__} runs its own shard_map; inside one, pass this shard's rows of A "
                "(its .local()) with axis_name instead"
            )
        return sharded.solve(
            A, b, damp, atol, btol, conlim, maxiter, show, x0, implementation=implementation, unroll=unroll
        )
    chosen = dispatch.choose("lsmr", implementation, default_on_cpu=DEFAULT_ON_CPU)
    # "ffi" chosen for None keeps None downstream: the products (CSRPair) keep their own fallbacks
    implementation = "xla" if chosen == "xla" else implementation
    b, b_typed = arguments.coerce_b(b)
    dtype = arguments.solve_dtype(b, b_typed, getattr(A, "dtype", None))
    b = jnp.asarray(b).astype(dtype)
    spec, leaves = as_operator(A, dtype, implementation)
    m, n = spec.m, spec.n
    shards = 1
    if axis_name is not None:
        axis_name = sharded.hashable_axis(axis_name)
        shards = sharded.bound_axis_size(axis_name)
        spec = RowSharded(spec, axis_name)
    if b.shape[0] != m:
        whose = "this shard's rows of A have" if axis_name is not None else "A has"
        raise ValueError(f"b has shape {tuple(b.shape)} but {whose} shape ({m}, {n}): b must have length {m}")
    x0 = arguments.coerce_x0(x0, n, m, dtype)
    damp_a = arguments.damp_array(damp, dtype)
    atol_a, _ = arguments.scalar("atol", atol, dtype)
    btol_a, _ = arguments.scalar("btol", btol, dtype)
    conlim_a, _ = arguments.scalar("conlim", conlim, dtype)
    maxiter_a = arguments.maxiter_array(maxiter, m * shards, n)  # min(m, n) of the whole (sharded) matrix
    arguments.check_finite(b=b, x0=x0)
    if unroll is None:
        unroll = default_unroll(dispatch.platform())
    if int(unroll) < 1:
        raise ValueError(f"unroll must be >= 1, got {unroll}")
    cp = ColParams(damp_a, atol_a, btol_a, conlim_a, maxiter_a, jnp.zeros((1,), dtype))
    X0 = None if x0 is None else x0[None]
    iteration = KNOBS.iteration
    if iteration not in ITERATIONS:
        raise ValueError(f"the iteration knob must be one of {ITERATIONS}, got {iteration!r}")
    loop = LoopConfig(int(unroll), bool(KNOBS.pack_scalars), iteration)
    solve_jit = _solve_jit
    options = KNOBS.compiler_options
    if options and dispatch.platform() == "gpu" and _at_top_level():
        solve_jit = _solve_jit_with(tuple(sorted(options.items())))
    printing = show and progress.can_print(b, x0, leaves, cp)
    if printing:
        progress.header(m, n, damp_a, atol_a, btol_a, conlim_a, maxiter_a)
    out = solve_jit(spec, x0 is not None, loop, implementation, leaves, b[None], X0, cp)
    out = jax.tree_util.tree_map(lambda a: a[0], out)
    if printing:
        progress.summary(out)
    return out
