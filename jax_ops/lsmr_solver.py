"""LSMR for sparse/dense least squares, matching ``scipy.sparse.linalg.lsmr`` (``jax_ops.lsmr``).

Solves ``min ||A x - b||^2 + damp^2 ||x||^2`` with the Golub-Kahan bidiagonalisation of Fong & Saunders, in one
jitted ``jax.lax.while_loop`` whose state (vectors *and* scalars) stays on the device: no host round trip per
iteration. The recurrence is SciPy's, statement by statement (same rotations, same estimates of ``||r||``,
``||A^T r||``, ``||A||``, ``cond(A)``, same order of the stopping tests), so ``istop``/``itn`` agree with SciPy.

Design (see ``docs/lsmr.md`` for the full story):

* The solver runs internally on *blocks*: ``B`` is ``[k, m]``, every vector of the recurrence is ``[k, n]`` or
  ``[k, m]`` and every scalar is a ``[k]`` vector (one per right-hand side). The plain call uses ``k = 1``;
  ``jax.vmap`` over ``b`` (a ``custom_vmap`` rule) turns into one block solve with ``k`` = batch size: one
  SpMM (dense A: one GEMM) per half-step serves all columns, each column keeps its own scalars and stops on
  its own. A converged column is frozen (its scalars by ``jnp.where``, its ``x`` by zero coefficients of the
  fused update); the loop runs until every column is done.
* Per iteration: ``u <- A v - alpha u`` and ``v <- A^T u - beta v`` (a fused matvec-with-beta when the operator
  has one), then five launches of our kernels (``_step_kernels``): partial norms of u's update, u's
  normalisation, partial norms of v's update, one vector update (v's normalisation, h, hbar, x, partial norms
  of x; each CTA derives its coefficients from the scalar state), and one scalar kernel (the rotations, the
  estimates, the stopping tests) -- no XLA reductions or scalar fusions in the loop.
* ``unroll`` guarded iterations per ``while_loop`` trip amortise the loop-condition round trip on GPUs; the
  result does not depend on it (a finished column is frozen inside the trip).

Operators (``A``):
  * a dense ``[m, n]`` array (numpy or jax);
  * ``jax.experimental.sparse.BCOO`` / ``BCSR`` (converted once, outside the loop, to ``jax_ops.sparse.CSRPair``
    when that module exists, else used through ``jax.experimental.sparse`` products), ``scipy.sparse`` matrices
    (converted to BCOO on the host);
  * ``jax_ops.sparse.CSRPair`` or any object with ``shape`` (``(m, n)``), ``matvec(v[n]) -> [m]`` and
    ``rmatvec(u[m]) -> [n]`` (jax-traceable, vmappable). Optional fused forms, used when present:
    ``matvec_axpby(v, y, beta) -> A v + beta*y`` and ``rmatvec_axpby(u, y, beta) -> A^T u + beta*y``
    (``beta`` is a scalar array). Register the object as a pytree (e.g. a NamedTuple or
    ``jax.tree_util.register_dataclass``) so its arrays are arguments of the jitted solve (no recompile for new
    values, gradients w.r.t. them); a non-pytree object is used as a static closure.

Precision: vectors, matvecs and the scalar recurrence run in ``b``'s dtype (float32 or float64). The fused
iteration's kernels accumulate the sums of squares behind the norms in float64 always; the jnp loops ("step",
``implementation="xla"``) do so for float32 problems when ``jax_enable_x64`` is on (a convert fused into the
reduction) and use XLA's float32 tree reductions without it.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from jax_ops import _checks, lsmr_kernels

__all__ = ["LSMRResult", "lsmr"]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))

# istop codes (SciPy's 0..7, plus ours for non-finite values).
ISTOP_MESSAGES = {
    -1: "Non-finite value met (b, x0, A*x0 or A contains NaN/Inf); x is not a solution",
    0: "The exact solution is x = 0, or x = x0, if x0 was given",
    1: "Ax - b is small enough, given atol, btol",
    2: "The least-squares solution is good enough, given atol",
    3: "The estimate of cond(Abar) has exceeded conlim",
    4: "Ax - b is small enough for this machine",
    5: "The least-squares solution is good enough for this machine",
    6: "Cond(Abar) seems to be too large for this machine",
    7: "The iteration limit has been reached",
}


class LSMRResult(NamedTuple):
    """Result of :func:`lsmr` (a pytree). Fields as in ``scipy.sparse.linalg.lsmr``'s return tuple.

    x: ``[n]`` solution (``[..., n]`` under vmap). istop: int32 stop reason (see ``ISTOP_MESSAGES``).
    itn: int32 iterations. normr: ``||b - A x||`` estimate (with damp: of the augmented residual).
    normar: ``||A^T (b - A x) - damp^2 x||`` estimate. norma: ``||Abar||_F`` estimate. conda: ``cond(Abar)``
    estimate. normx: ``||x||``. Floats have ``b``'s dtype.
    """

    x: jax.Array
    istop: jax.Array
    itn: jax.Array
    normr: jax.Array
    normar: jax.Array
    norma: jax.Array
    conda: jax.Array
    normx: jax.Array


class _ColParams(NamedTuple):
    """Per-column ([k]) parameters of a block solve."""

    damp: jax.Array
    atol: jax.Array
    btol: jax.Array
    conlim: jax.Array
    maxiter: jax.Array  # int32
    aux: jax.Array  # operator parameter per column (the augmented operator's scale), else zeros


# ----------------------------------------------------------------------------------------------------------
# Operators. A spec is static and hashable; its arrays ("leaves") are passed separately as jit arguments.
# Block products: V [k, n] -> [k, m] (mv) and U [k, m] -> [k, n] (rmv).
# ----------------------------------------------------------------------------------------------------------


class _Spec(abc.ABC):
    m: int
    n: int

    @abc.abstractmethod
    def mv(self, leaves, V, cp):
        """A V for the block V [k, n] -> [k, m]."""

    @abc.abstractmethod
    def rmv(self, leaves, U, cp):
        """A^T U for the block U [k, m] -> [k, n]."""

    def mv_axpby(self, leaves, V, U, beta, cp):
        """A V + beta[:, None] * U (LSMR's A v - alpha u with beta = -alpha)."""
        return self.mv(leaves, V, cp) + beta[:, None] * U

    def rmv_axpby(self, leaves, U, V, beta, cp):
        """A^T U + beta[:, None] * V."""
        return self.rmv(leaves, U, cp) + beta[:, None] * V

    # The same on blocks in the column layout (V [n, k], U [m, k]: the fused iteration's block solves).
    def mv_axpby_cols(self, leaves, V, U, beta, cp):
        """A V + U * beta[None, :] for column blocks (by default through mv_axpby on transposes)."""
        return self.mv_axpby(leaves, V.T, U.T, beta, cp).T

    def rmv_axpby_cols(self, leaves, U, V, beta, cp):
        """A^T U + V * beta[None, :] for column blocks."""
        return self.rmv_axpby(leaves, U.T, V.T, beta, cp).T


@dataclasses.dataclass(frozen=True)
class _Dense(_Spec):
    m: int
    n: int

    def mv(self, leaves, V, cp):
        (a,) = leaves
        return jnp.matmul(V, a.T, precision=jax.lax.Precision.HIGHEST)

    def rmv(self, leaves, U, cp):
        (a,) = leaves
        return jnp.matmul(U, a, precision=jax.lax.Precision.HIGHEST)

    def mv_axpby_cols(self, leaves, V, U, beta, cp):
        (a,) = leaves
        return jnp.matmul(a, V, precision=jax.lax.Precision.HIGHEST) + U * beta[None, :]

    def rmv_axpby_cols(self, leaves, U, V, beta, cp):
        (a,) = leaves
        return jnp.matmul(a.T, U, precision=jax.lax.Precision.HIGHEST) + V * beta[None, :]


@dataclasses.dataclass(frozen=True)
class _BCOO(_Spec):
    """jax.experimental.sparse BCOO (n_batch = n_dense = 0), used when jax_ops.sparse.CSRPair is unavailable."""

    m: int
    n: int
    treedef: Any

    def _a(self, leaves):
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def mv(self, leaves, V, cp):
        from jax.experimental import sparse

        return sparse.bcoo_dot_general(self._a(leaves), V, dimension_numbers=(((1,), (1,)), ((), ()))).T

    def rmv(self, leaves, U, cp):
        from jax.experimental import sparse

        return sparse.bcoo_dot_general(self._a(leaves), U, dimension_numbers=(((0,), (1,)), ((), ()))).T


@dataclasses.dataclass(frozen=True)
class _Protocol(_Spec):
    """An object with shape/matvec/rmatvec (pytree: leaves are its arrays; else held statically)."""

    m: int
    n: int
    treedef: Any  # None for a static (non-pytree) object
    obj: Any = dataclasses.field(default=None, compare=False, hash=False)
    dtype: Any = None

    def __eq__(self, other):  # static objects compare by identity
        return (
            type(other) is _Protocol
            and (self.m, self.n, self.treedef, self.dtype) == (other.m, other.n, other.treedef, other.dtype)
            and (self.treedef is not None or self.obj is other.obj)
        )

    def __hash__(self):
        return hash((self.m, self.n, self.treedef, self.dtype, id(self.obj) if self.treedef is None else 0))

    def _a(self, leaves):
        return self.obj if self.treedef is None else jax.tree_util.tree_unflatten(self.treedef, leaves)

    def mv(self, leaves, V, cp):
        a = self._a(leaves)
        return jax.vmap(a.matvec)(V).astype(self.dtype)

    def rmv(self, leaves, U, cp):
        a = self._a(leaves)
        return jax.vmap(a.rmatvec)(U).astype(self.dtype)

    def mv_axpby(self, leaves, V, U, beta, cp):
        a = self._a(leaves)
        if hasattr(a, "matvec_axpby"):
            return jax.vmap(a.matvec_axpby)(V, U, beta).astype(self.dtype)
        return super().mv_axpby(leaves, V, U, beta, cp)

    def rmv_axpby(self, leaves, U, V, beta, cp):
        a = self._a(leaves)
        if hasattr(a, "rmatvec_axpby"):
            return jax.vmap(a.rmatvec_axpby)(U, V, beta).astype(self.dtype)
        return super().rmv_axpby(leaves, U, V, beta, cp)

    # A CSRPair multiplies column blocks directly (one SpMM over the k columns, no transposes).
    def mv_axpby_cols(self, leaves, V, U, beta, cp):
        a = self._a(leaves)
        if _is_csr_pair(a):
            return a.matmat(V, beta=beta, y=U).astype(self.dtype)
        return super().mv_axpby_cols(leaves, V, U, beta, cp)

    def rmv_axpby_cols(self, leaves, U, V, beta, cp):
        a = self._a(leaves)
        if _is_csr_pair(a):
            return a.rmatmat(U, beta=beta, y=V).astype(self.dtype)
        return super().rmv_axpby_cols(leaves, U, V, beta, cp)


def _is_csr_pair(a) -> bool:
    try:
        from jax_ops.sparse import CSRPair
    except ImportError:
        return False
    return isinstance(a, CSRPair)


@dataclasses.dataclass(frozen=True)
class _Transposed(_Spec):
    """A^T (the adjoint solve of the backward pass)."""

    inner: _Spec

    @property
    def m(self):
        return self.inner.n

    @property
    def n(self):
        return self.inner.m

    def mv(self, leaves, V, cp):
        return self.inner.rmv(leaves, V, cp)

    def rmv(self, leaves, U, cp):
        return self.inner.mv(leaves, U, cp)

    def mv_axpby(self, leaves, V, U, beta, cp):
        return self.inner.rmv_axpby(leaves, V, U, beta, cp)

    def rmv_axpby(self, leaves, U, V, beta, cp):
        return self.inner.mv_axpby(leaves, U, V, beta, cp)

    def mv_axpby_cols(self, leaves, V, U, beta, cp):
        return self.inner.rmv_axpby_cols(leaves, V, U, beta, cp)

    def rmv_axpby_cols(self, leaves, U, V, beta, cp):
        return self.inner.mv_axpby_cols(leaves, U, V, beta, cp)


@dataclasses.dataclass(frozen=True)
class _Augmented(_Spec):
    """[A; diag(cp.aux) I] of shape (m + n, n): per column d = cp.aux (the backward pass' damped solve)."""

    inner: _Spec

    @property
    def m(self):
        return self.inner.m + self.inner.n

    @property
    def n(self):
        return self.inner.n

    def mv(self, leaves, V, cp):
        return jnp.concatenate([self.inner.mv(leaves, V, cp), cp.aux[:, None] * V], axis=1)

    def rmv(self, leaves, U, cp):
        m = self.inner.m
        return self.inner.rmv(leaves, U[:, :m], cp) + cp.aux[:, None] * U[:, m:]


def _as_operator(A, dtype, implementation):
    """(spec, leaves) for ``A``; dense and sparse values are cast to ``dtype``."""
    from jax.experimental import sparse

    try:
        import scipy.sparse as sp

        if sp.issparse(A):
            A = sparse.BCOO.from_scipy_sparse(A)
    except ImportError:
        pass
    if isinstance(A, (sparse.BCOO, sparse.BCSR)):
        if A.ndim != 2 or A.n_batch or A.n_dense:
            raise ValueError(
                f"sparse A must be a 2-D matrix without batch/dense dimensions, got shape {A.shape} "
                f"(n_batch={A.n_batch}, n_dense={A.n_dense})"
            )
        _check_float_dtype("A", A.dtype)
        if np.dtype(A.dtype) != dtype:
            A = type(A)((A.data.astype(dtype), *A._bufs[1:]), shape=A.shape)  # noqa: SLF001
        if implementation != "xla":
            # Converted once, outside the loop: both products become row-major sweeps.
            from jax_ops.sparse import CSRPair

            A = CSRPair.from_matrix(A, implementation=implementation)
        else:
            bcoo = A.to_bcoo() if isinstance(A, sparse.BCSR) else A
            leaves, treedef = jax.tree_util.tree_flatten(bcoo)
            return _BCOO(int(A.shape[0]), int(A.shape[1]), treedef), leaves
    if hasattr(A, "matvec") and hasattr(A, "rmatvec") and hasattr(A, "shape"):
        if len(tuple(A.shape)) != 2:
            raise ValueError(f"A.shape must be (m, n), got {tuple(A.shape)}")
        m, n = (int(s) for s in A.shape)
        leaves, treedef = jax.tree_util.tree_flatten(A)
        if all(isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves) and not (
            len(leaves) == 1 and leaves[0] is A
        ):
            return _Protocol(m, n, treedef, None, dtype), leaves
        return _Protocol(m, n, None, A, dtype), []
    if hasattr(A, "shape") and hasattr(A, "dtype"):
        if len(A.shape) != 2:
            raise ValueError(f"A must be a 2-D matrix, got shape {tuple(A.shape)}")
        if not (
            np.issubdtype(np.dtype(A.dtype), np.floating) or np.issubdtype(np.dtype(A.dtype), np.integer)
        ):
            raise TypeError(f"A must be real (float or integer), got dtype {np.dtype(A.dtype)}")
        a = jnp.asarray(A, dtype=dtype)
        return _Dense(int(A.shape[0]), int(A.shape[1])), [a]
    raise TypeError(
        "A must be a dense array, a jax.experimental.sparse BCOO/BCSR, a scipy.sparse matrix, a "
        f"jax_ops.sparse.CSRPair or an object with shape/matvec/rmatvec; got {type(A).__name__}"
    )


def _check_float_dtype(name, dtype):
    if np.dtype(dtype) not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got {np.dtype(dtype)}")


# ----------------------------------------------------------------------------------------------------------
# The block recurrence.
# ----------------------------------------------------------------------------------------------------------


def _norm(x):
    """Row norms of [k, len]; float32 sums of squares accumulated in float64 when x64 is enabled."""
    if x.dtype == jnp.float32 and jax.config.jax_enable_x64:
        x64 = x.astype(jnp.float64)
        return jnp.sqrt(jnp.sum(x64 * x64, axis=-1)).astype(jnp.float32)
    return jnp.sqrt(jnp.sum(x * x, axis=-1))


def _sym_ortho(a, b):
    """SciPy's _sym_ortho (stable Givens rotation), elementwise: returns c, s, r with [c s; -s c][a; b] = [r; 0]."""
    one = jnp.ones_like(a)
    tau1 = a / b
    s1 = jnp.sign(b) / jnp.sqrt(one + tau1 * tau1)
    c1 = s1 * tau1
    r1 = b / s1
    tau2 = b / a
    c2 = jnp.sign(a) / jnp.sqrt(one + tau2 * tau2)
    s2 = c2 * tau2
    r2 = a / c2
    big_b = jnp.abs(b) > jnp.abs(a)
    c = jnp.where(big_b, c1, c2)
    s = jnp.where(big_b, s1, s2)
    r = jnp.where(big_b, r1, r2)
    a0 = a == 0
    c = jnp.where(a0, 0, c)
    s = jnp.where(a0, jnp.sign(b), s)
    r = jnp.where(a0, jnp.abs(b), r)
    b0 = b == 0
    c = jnp.where(b0, jnp.sign(a), c)
    s = jnp.where(b0, 0, s)
    r = jnp.where(b0, jnp.abs(a), r)
    return c, s, r


# How an iteration's work after the two products runs (``_LoopConfig.iteration``; benchmark A/B knob):
#   "kernels": the fused iteration (``_step_kernels``): the norms of u's and v's updates as partial norms, u's
#     normalisation, the vector update and the whole scalar recurrence in five launches of our own kernels
#     (``lsmr_kernels.partial_norms``/``normalize``/``iteration_step``/``iteration_scalars``), instead of XLA's
#     two-pass reductions and scalar fusions. The default with the FFI kernels. A block solve (k > 1, vmap) keeps
#     its vectors in the column layout [L, k] that the products' SpMM takes and gives: in the row layout [k, L]
#     the vmap fold's transposes around each product become separate copies that XLA could fuse only into its
#     own vector fusions (measured on the H200, ba-like x16: 573.7 us per iteration in the row layout against
#     488.5 with "step").
#   "step": XLA's norms and scalar recurrence (``_step``) with the vector update as ``lsmr_kernels.step_update``.
#   "unfused": ``_step`` with XLA's v update, ``hbar_x_update``, ``h_update`` and XLA's ``||x||``.
# "step" and "unfused" give bitwise the same iterates; "kernels" sums the norms in another order (float64 sums of
# float partial norms) and so agrees with them to rounding. ``implementation="xla"`` always runs ``_step`` with the
# jnp reference of each kernel.
ITERATIONS = ("kernels", "step", "unfused")


@dataclasses.dataclass(frozen=True)
class _LoopConfig:
    """Static loop structure: ``unroll`` guarded iterations per trip; ``pack_scalars`` carries ``_step``'s
    scalars as one stacked array (``_pack``); ``iteration`` (see ITERATIONS) picks the iteration's kernels."""

    unroll: int
    pack_scalars: bool = True
    iteration: str = "kernels"


# XLA GPU command-buffer (CUDA graph) settings, as compiler_options. A repeated enum flag is given as a comma
# separated list that *replaces* XLA's default list (FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN; no "+WHILE"
# syntax there, that is XLA_FLAGS only); "" disables command buffers.
COMMAND_BUFFER_OPTIONS = {
    "default": {},
    "off": {"xla_gpu_enable_command_buffer": ""},
    # The whole while loop as one graph with a device-side conditional node (no host round trip per trip).
    "while": {
        "xla_gpu_enable_command_buffer": "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,WHILE,CONDITIONAL",
        "xla_gpu_graph_min_graph_size": 1,
    },
}

# What a top-level GPU solve compiles with (docs/lsmr.md, measured on the H200 2026-12-01: with unroll 2 the
# loop as one CUDA graph is 3-6 % faster per iteration than XLA's default and compiles in half the time of
# unroll 4). A caller that jits a function around lsmr passes these to its own jit for the same loop.
LOOP_COMPILER_OPTIONS = COMMAND_BUFFER_OPTIONS["while"]
GPU_UNROLL = 2

# Private tuning knobs, read by lsmr() at call time (benchmarks flip them; not public API):
#   pack_scalars, iteration: see _LoopConfig.
#   compiler_options: XLA options (e.g. command buffers, see COMMAND_BUFFER_OPTIONS) for a GPU solve that runs as
#     its own top-level executable (lsmr called outside any jit); inside a caller's jit they cannot apply (JAX
#     takes compiler options only on the top-level jit): pass them to that jit instead.
_TUNING: dict[str, Any] = {
    "pack_scalars": True,
    "iteration": "kernels",
    "compiler_options": LOOP_COMPILER_OPTIONS,
}

_SCALARS = (
    "alpha", "beta", "zetabar", "alphabar", "rho", "rhobar", "cbar", "sbar", "betadd", "betad", "rhodold",
    "tautildeold", "thetatilde", "zeta", "d", "normA2", "maxrbar", "minrbar", "normA", "condA", "normx",
    "normr", "normar",
)  # fmt: skip


def _fused(implementation):
    return "xla" if implementation == "xla" else None


def _init(spec, leaves, B, X0, cp, implementation):
    dt = B.dtype
    k, n = B.shape[0], spec.n
    zeros_k = jnp.zeros((k,), dt)
    ones_k = jnp.ones((k,), dt)
    normb = _norm(B)
    if X0 is None:
        x = jnp.zeros((k, n), dt)
        u = B
        beta = normb
    else:
        x = X0
        u = B - spec.mv(leaves, X0, cp)
        beta = _norm(u)
    pos_b = beta > 0
    u = u * jnp.where(pos_b, 1 / beta, 1)[:, None]
    v = jnp.where(pos_b[:, None], spec.rmv(leaves, u, cp), 0)
    alpha = jnp.where(pos_b, _norm(v), 0)
    v = v * jnp.where(alpha > 0, 1 / alpha, 1)[:, None]

    s = {
        "alpha": alpha, "beta": beta, "zetabar": alpha * beta, "alphabar": alpha, "rho": ones_k,
        "rhobar": ones_k, "cbar": ones_k, "sbar": zeros_k, "betadd": beta, "betad": zeros_k, "rhodold": ones_k,
        "tautildeold": zeros_k, "thetatilde": zeros_k, "zeta": zeros_k, "d": zeros_k,
        "normA2": alpha * alpha, "maxrbar": zeros_k, "minrbar": jnp.full((k,), min(1e100, float(jnp.finfo(dt).max)), dt),
        "normA": jnp.sqrt(alpha * alpha), "condA": ones_k, "normx": zeros_k, "normr": beta,
        "normar": alpha * beta,
    }  # fmt: skip
    istop = jnp.zeros((k,), jnp.int32)
    # SciPy: normar == 0 -> return x (x0); else normb == 0 -> return x = 0. Both istop 0, itn 0.
    done = (s["normar"] == 0) | (normb == 0) | (cp.maxiter <= 0)
    x = jnp.where(((s["normar"] != 0) & (normb == 0))[:, None], 0, x)
    bad = ~(jnp.isfinite(normb) & jnp.isfinite(beta))
    istop = jnp.where(bad, -1, istop)
    done = done | bad
    x = jnp.where(bad[:, None], jnp.nan, x)
    state = {
        "x": x, "u": u, "v": v, "h": v, "hbar": jnp.zeros((k, n), dt), "itn": jnp.zeros((k,), jnp.int32),
        "istop": istop, "done": done, **s,
    }  # fmt: skip
    return state, normb


def _step(spec, leaves, cp, normb, st, implementation, iteration="step"):
    """One guarded LSMR iteration for every column (a done column keeps its state)."""
    dt = st["x"].dtype
    active = ~st["done"]
    new = dict(st)
    alpha, u, v = st["alpha"], st["u"], st["v"]
    itn = st["itn"] + 1

    # Bidiagonalisation: beta*u = A v - alpha*u ; alpha*v = A^T u - beta*v.
    ub = spec.mv_axpby(leaves, v, u, -alpha, cp)
    beta = _norm(ub)
    pos_b = beta > 0
    u = ub * jnp.where(pos_b, 1 / beta, 1)[:, None]
    vb = spec.rmv_axpby(leaves, u, v, -beta, cp)
    alpha_raw = _norm(vb)
    alpha = jnp.where(pos_b, alpha_raw, alpha)
    # v = vb / alpha (kept when beta = 0) is applied by the fused update below.
    s_v = jnp.where(alpha_raw > 0, 1 / alpha_raw, 1).astype(dt)
    keep_v = (~pos_b).astype(dt)

    # Rotations.
    chat, shat, alphahat = _sym_ortho(st["alphabar"], cp.damp)
    rhoold = st["rho"]
    c, s, rho = _sym_ortho(alphahat, beta)
    thetanew = s * alpha
    alphabar = c * alpha
    rhobarold = st["rhobar"]
    zetaold = st["zeta"]
    thetabar = st["sbar"] * rho
    rhotemp = st["cbar"] * rho
    cbar, sbar, rhobar = _sym_ortho(st["cbar"] * rho, thetanew)
    zeta = cbar * st["zetabar"]
    zetabar = -sbar * st["zetabar"]

    # v, h, hbar, x and partial norms of x in one fused kernel; zero coefficients freeze a finished column's x.
    c_h = jnp.where(active, thetabar * rho / (rhoold * rhobarold), 0).astype(dt)
    c_x = jnp.where(active, zeta / (rho * rhobar), 0).astype(dt)
    c_v = jnp.where(active, thetanew / rho, 0).astype(dt)
    if iteration != "unfused":
        v, h, hbar, x, x_parts = lsmr_kernels.step_update(
            vb,
            v,
            st["h"],
            st["hbar"],
            st["x"],
            s_v,
            keep_v,
            c_h,
            c_x,
            c_v,
            implementation=_fused(implementation),
        )
    else:
        v = jnp.where(keep_v[:, None] != 0, v, vb * s_v[:, None])
        hbar, x = lsmr_kernels.hbar_x_update(
            st["h"], st["hbar"], st["x"], c_h, c_x, implementation=_fused(implementation)
        )
        h = lsmr_kernels.h_update(v, st["h"], c_v, implementation=_fused(implementation))
        x_parts = x

    # Estimate ||r||.
    betadd = st["betadd"]
    betaacute = chat * betadd
    betacheck = -shat * betadd
    betahat = c * betaacute
    betadd = -s * betaacute
    thetatildeold = st["thetatilde"]
    ctildeold, stildeold, rhotildeold = _sym_ortho(st["rhodold"], thetabar)
    thetatilde = stildeold * rhobar
    rhodold = ctildeold * rhobar
    betad = -stildeold * st["betad"] + ctildeold * betahat
    tautildeold = (zetaold - thetatildeold * st["tautildeold"]) / rhotildeold
    taud = (zeta - thetatilde * tautildeold) / rhodold
    d = st["d"] + betacheck * betacheck
    normr = jnp.sqrt(d + (betad - taud) ** 2 + betadd * betadd)

    # Estimate ||A|| and cond(A).
    normA2 = st["normA2"] + beta * beta
    normA = jnp.sqrt(normA2)
    normA2 = normA2 + alpha * alpha
    maxrbar = jnp.maximum(st["maxrbar"], rhobarold)
    minrbar = jnp.where(itn > 1, jnp.minimum(st["minrbar"], rhobarold), st["minrbar"])
    condA = jnp.maximum(maxrbar, rhotemp) / jnp.minimum(minrbar, rhotemp)

    # Convergence tests (SciPy's order: later tests win).
    normar = jnp.abs(zetabar)
    normx = _norm(x_parts)  # the norm of x's partial norms (of x itself when "unfused") is ||x||
    test1 = normr / normb
    nr = normA * normr
    test2 = jnp.where(nr != 0, normar / jnp.where(nr != 0, nr, 1), jnp.inf)
    test3 = 1 / condA
    t1 = test1 / (1 + normA * normx / normb)
    rtol = cp.btol + cp.atol * normA * normx / normb
    ctol = jnp.where(cp.conlim > 0, 1 / cp.conlim, 0).astype(dt)
    one = jnp.ones_like(test1)
    istop = jnp.zeros_like(st["istop"])
    istop = jnp.where(itn >= cp.maxiter, 7, istop)
    istop = jnp.where(one + test3 <= one, 6, istop)
    istop = jnp.where(one + test2 <= one, 5, istop)
    istop = jnp.where(one + t1 <= one, 4, istop)
    istop = jnp.where(test3 <= ctol, 3, istop)
    istop = jnp.where(test2 <= cp.atol, 2, istop)
    istop = jnp.where(test1 <= rtol, 1, istop)
    finite = jnp.isfinite(normr) & jnp.isfinite(normar) & jnp.isfinite(normx) & jnp.isfinite(normA)
    istop = jnp.where(finite, istop, -1)

    upd = {
        "alpha": alpha, "beta": beta, "zetabar": zetabar, "alphabar": alphabar, "rho": rho, "rhobar": rhobar,
        "cbar": cbar, "sbar": sbar, "betadd": betadd, "betad": betad, "rhodold": rhodold,
        "tautildeold": tautildeold, "thetatilde": thetatilde, "zeta": zeta, "d": d, "normA2": normA2,
        "maxrbar": maxrbar, "minrbar": minrbar, "normA": normA, "condA": condA, "normx": normx, "normr": normr,
        "normar": normar, "itn": itn, "istop": istop,
    }  # fmt: skip
    for key, val in upd.items():
        new[key] = jnp.where(active, val.astype(st[key].dtype), st[key])
    new["done"] = st["done"] | (new["istop"] != 0)
    new.update(u=u, v=v, h=h, hbar=hbar, x=x)
    return new


def _pack(st):
    """The loop carry with the scalars stacked: ``sc`` [len(_SCALARS), k] and ``ints`` [2, k] (itn, istop).

    One carried buffer instead of ~25 tiny ones: copy insertion then adds at most a copy or two of [.., k] per
    loop trip instead of one per scalar (each a separate device copy on a GPU). Stacking is exact, so the
    floating-point sequence of the recurrence is unchanged.
    """
    rest = {key: val for key, val in st.items() if key not in _SCALARS and key not in ("itn", "istop")}
    return {
        **rest,
        "sc": jnp.stack([st[key] for key in _SCALARS]),
        "ints": jnp.stack([st["itn"], st["istop"]]),
    }


def _unpack(st):
    rest = {key: val for key, val in st.items() if key not in ("sc", "ints")}
    return {**rest, **{key: st["sc"][i] for i, key in enumerate(_SCALARS)}, "itn": st["ints"][0],
            "istop": st["ints"][1]}  # fmt: skip


def _solve_block(spec, has_x0, loop, implementation, leaves, B, X0, cp):
    """The block solve: B [k, m] (X0 [k, n]) -> LSMRResult with a leading k."""
    state, normb = _init(spec, leaves, B, X0 if has_x0 else None, cp, implementation)
    if loop.iteration == "kernels" and implementation != "xla":
        return _solve_block_kernels(spec, leaves, cp, state, normb, loop.unroll, columns=B.shape[0] > 1)
    pack, unpack = (_pack, _unpack) if loop.pack_scalars else (lambda st: st, lambda st: st)
    iteration = "step" if loop.iteration == "kernels" else loop.iteration

    def body(st):
        st = unpack(st)
        for _ in range(loop.unroll):
            st = _step(spec, leaves, cp, normb, st, implementation, iteration)
        return pack(st)

    state = unpack(jax.lax.while_loop(lambda st: ~jnp.all(st["done"]), body, pack(state)))
    return LSMRResult(
        state["x"], state["istop"], state["itn"], state["normr"], state["normar"], state["normA"],
        state["condA"], state["normx"],
    )  # fmt: skip


def _step_kernels(spec, leaves, cp, params, c, columns=False):
    """One guarded iteration of the fused loop (``iteration="kernels"``): the two products and five launches.

    ``c`` is the carry: vectors ``x, u, v, h, hbar`` (rows ``[k, L]``, or with ``columns`` a block solve's
    column layout ``[L, k]``, which the products' SpMM takes and gives without transposes), the scalars ``sc``
    [k, len(_SCALARS)], ``ints`` [k, 3] (itn, istop, done) and ``neg_alpha`` [k] (-alpha, the next product's
    coefficient). The arithmetic is ``_step``'s (ffi_cuda/lsmr/scalar_recurrence.h mirrors it statement by
    statement); only the norms' summation order differs.
    """
    mv, rmv = (spec.mv_axpby_cols, spec.rmv_axpby_cols) if columns else (spec.mv_axpby, spec.rmv_axpby)
    ub = mv(leaves, c["v"], c["u"], c["neg_alpha"], cp)  # A v - alpha u
    u, beta, vb_coef = lsmr_kernels.normalize(
        ub, lsmr_kernels.partial_norms(ub, columns=columns), columns=columns
    )
    # A^T u - beta v; when beta = 0, u = 0 and vb_coef = 1: vb = v, the v SciPy keeps (no copy of v needed).
    vb = rmv(leaves, u, c["v"], vb_coef, cp)
    vb_parts = lsmr_kernels.partial_norms(vb, columns=columns)
    v, h, hbar, x, x_parts = lsmr_kernels.iteration_step(
        vb, c["h"], c["hbar"], c["x"], vb_parts, c["sc"], c["ints"], beta, params, columns=columns
    )
    sc, ints, neg_alpha = lsmr_kernels.iteration_scalars(
        c["sc"], c["ints"], c["neg_alpha"], beta, params, cp.maxiter, vb_parts, x_parts
    )
    return {"x": x, "u": u, "v": v, "h": h, "hbar": hbar, "sc": sc, "ints": ints, "neg_alpha": neg_alpha}


def _solve_block_kernels(spec, leaves, cp, state, normb, unroll, columns):
    """The while loop of the fused iteration, from ``_init``'s state (vectors transposed to the column layout
    once, before the loop, when ``columns``)."""
    dt = state["x"].dtype
    vec = (lambda a: a.T) if columns else (lambda a: a)
    carry = {
        **{key: vec(state[key]) for key in ("x", "u", "v", "h", "hbar")},
        "sc": jnp.stack([state[key] for key in _SCALARS], axis=-1),
        "ints": jnp.stack([state["itn"], state["istop"], state["done"].astype(jnp.int32)], axis=-1),
        "neg_alpha": -state["alpha"],
    }
    # Loop invariants, in the order of ffi_cuda/lsmr/scalar_recurrence.h's Param.
    params = jnp.stack([cp.damp, cp.atol, cp.btol, cp.conlim, normb], axis=-1).astype(dt)

    def body(c):
        for _ in range(unroll):
            c = _step_kernels(spec, leaves, cp, params, c, columns)
        return c

    c = jax.lax.while_loop(lambda c: ~jnp.all(c["ints"][:, 2] != 0), body, carry)
    sc = {key: c["sc"][:, i] for i, key in enumerate(_SCALARS)}
    return LSMRResult(
        vec(c["x"]), c["ints"][:, 1], c["ints"][:, 0], sc["normr"], sc["normar"], sc["normA"], sc["condA"],
        sc["normx"],
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _block_solver(spec, has_x0: bool, loop: _LoopConfig, implementation):
    """custom_vjp(custom_vmap(block solve)) for one static configuration; signature (leaves, B, X0, cp)."""

    def plain(leaves, B, X0, cp):
        return _solve_block(spec, has_x0, loop, implementation, leaves, B, X0, cp)

    solve = jax.custom_batching.custom_vmap(plain)

    @solve.def_vmap
    def _rule(axis_size, in_batched, leaves, B, X0, cp):
        leaves_b, B_b, X0_b, cp_b = in_batched
        if any(jax.tree_util.tree_leaves(leaves_b)):
            # A batched operator (one matrix per batch element): JAX's own batching of the while loop.
            axes = (
                [0 if f else None for f in leaves_b],
                0 if B_b else None,
                None if X0 is None else (0 if X0_b else None),
                _ColParams(*(0 if f else None for f in cp_b)),
            )
            out = jax.vmap(plain, in_axes=axes)(leaves, B, X0, cp)
            return out, jax.tree_util.tree_map(lambda _: True, out)

        def flat(a, batched):
            a = a if batched else jnp.broadcast_to(a, (axis_size, *a.shape))
            return a.reshape(axis_size * a.shape[1], *a.shape[2:])

        B2 = flat(B, B_b)
        X02 = None if X0 is None else flat(X0, X0_b)
        cp2 = _ColParams(*(flat(a, f) for a, f in zip(cp, cp_b)))
        out = solve(leaves, B2, X02, cp2)  # again through custom_vmap: nested vmaps fold into one block
        # explicit sizes, not -1: a solution x with n = 0 has no elements to infer the axis from
        out = jax.tree_util.tree_map(
            lambda a: a.reshape(axis_size, a.shape[0] // axis_size, *a.shape[1:]), out
        )
        return out, jax.tree_util.tree_map(lambda _: True, out)

    primal = jax.custom_vjp(solve)

    def fwd(leaves, B, X0, cp):
        val = lambda t: jax.tree_util.tree_map(lambda p: p.value, t)  # noqa: E731
        need_a = any(p.perturbed for p in jax.tree_util.tree_leaves(leaves, is_leaf=_is_primal))
        lv, Bv, X0v, cpv = val(leaves), val(B), None if X0 is None else val(X0), val(cp)
        out = solve(lv, Bv, X0v, cpv)
        return out, (lv, Bv, X0v, cpv, out.x, () if need_a else None)

    def bwd(res, g):
        leaves, B, X0, cp, x, need_a = res
        gx = g.x
        if isinstance(gx, SymbolicZero):
            gx = jnp.zeros(x.shape, x.dtype)
        zero_aux = jnp.zeros_like(cp.aux)
        # b̄ = A (A^T A + damp^2 I)^{-1} g: the damped least-squares solution for A^T with right-hand side g.
        y = _block_solver(_Transposed(spec), False, loop, implementation)(
            leaves, gx, None, cp._replace(aux=zero_aux)
        ).x
        gX0 = None if X0 is None else gx - spec.rmv(leaves, y, cp)
        g_leaves = [None] * len(leaves)
        if need_a is not None:
            # w = (A^T A + damp^2 I)^{-1} g from one solve on [A; damp I] (damp > 0: rhs [0; g/damp]);
            # damp == 0: w = A^+ y. Then Ā = r w^T - b̄ x^T with r = b - A x (contracted through A's matvec).
            d = cp.damp
            pos = d > 0
            rhs = jnp.where(
                pos[:, None],
                jnp.concatenate([jnp.zeros_like(y), gx / jnp.where(pos, d, 1)[:, None]], axis=1),
                jnp.concatenate([y, jnp.zeros_like(gx)], axis=1),
            )
            w = _block_solver(_Augmented(spec), False, loop, implementation)(
                leaves, rhs, None, cp._replace(damp=jnp.zeros_like(d), aux=d)
            ).x
            r = B - spec.mv(leaves, x, cp)
            _, pull = jax.vjp(lambda lv: (spec.mv(lv, w, cp), spec.mv(lv, x, cp)), list(leaves))
            (g_leaves,) = pull((r, -y))
            g_leaves = [
                None if (not jnp.issubdtype(jnp.asarray(l0).dtype, jnp.inexact)) else gl
                for l0, gl in zip(leaves, g_leaves)
            ]
        return g_leaves, y, gX0, None

    primal.defvjp(fwd, bwd, symbolic_zeros=True)
    return primal


def _is_primal(x):
    return type(x).__name__ == "CustomVJPPrimal"


def _solve(spec, has_x0, loop, implementation, leaves, B, X0, cp):
    return _block_solver(spec, has_x0, loop, implementation)(leaves, B, X0, cp)


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


# ----------------------------------------------------------------------------------------------------------
# Public API.
# ----------------------------------------------------------------------------------------------------------


def _scalar(name, value, dtype):
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


def lsmr(
    A: Any,
    b: jax.Array,
    damp: float | jax.Array = 0.0,
    atol: float | jax.Array = 1e-6,
    btol: float | jax.Array = 1e-6,
    conlim: float | jax.Array = 1e8,
    maxiter: int | jax.Array | None = None,
    x0: jax.Array | None = None,
    *,
    implementation: str | None = None,
    unroll: int | None = None,
) -> LSMRResult:
    """Iterative solver for least-squares problems, ``scipy.sparse.linalg.lsmr`` semantics, jittable.

    Solves ``min_x ||b - A x||_2^2 + damp^2 ||x - x0||_2^2``-style problems exactly as SciPy does (with ``x0``,
    LSMR solves for the correction ``x - x0`` and damps the correction).

    Args:
      A: ``[m, n]`` operator: dense array, ``jax.experimental.sparse.BCOO``/``BCSR``, ``scipy.sparse`` matrix,
        ``jax_ops.sparse.CSRPair``, or an object with ``shape``, ``matvec`` and ``rmatvec`` (see module doc).
      b: ``[m]`` float32 or float64 right-hand side; its dtype sets the precision. ``jax.vmap`` over ``b``
        (and/or ``x0``, ``damp``, ``atol``, ...) runs one block solve for all right-hand sides.
      damp, atol, btol, conlim: as in SciPy (Python numbers or scalar arrays; traced values do not recompile).
      maxiter: iteration limit, default ``min(m, n)`` (SciPy's default).
      x0: optional ``[n]`` initial guess.
      implementation: ``None`` (fused FFI kernels, CSRPair for sparse inputs when available), ``"ffi"`` (raise
        when a kernel path is unavailable) or ``"xla"`` (jnp recurrences and jax.experimental.sparse products).
      unroll: LSMR iterations per ``while_loop`` trip (default 1 on CPU, 2 on GPU); results do not depend on it.

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
    _checks.check_implementation(implementation)
    _checks.check_array("b", b)
    b = jnp.asarray(b)
    _check_float_dtype("b", b.dtype)
    if b.ndim != 1:
        raise ValueError(
            f"b must be a vector [m], got shape {tuple(b.shape)}; use jax.vmap for several right-hand sides"
        )
    dtype = np.dtype(b.dtype)
    spec, leaves = _as_operator(A, dtype, implementation)
    m, n = spec.m, spec.n
    if b.shape[0] != m:
        raise ValueError(f"b has shape {tuple(b.shape)} but A has shape ({m}, {n}): b must have length {m}")
    if x0 is not None:
        _checks.check_array("x0", x0)
        x0 = jnp.asarray(x0)
        if x0.shape != (n,):
            raise ValueError(
                f"x0 has shape {tuple(x0.shape)} but A has shape ({m}, {n}): x0 must have shape ({n},)"
            )
        if not jnp.issubdtype(x0.dtype, jnp.floating):
            raise TypeError(f"x0 must be a float array, got dtype {x0.dtype}")
        x0 = x0.astype(dtype)
    damp_a, damp_c = _scalar("damp", damp, dtype)
    if damp_c is not None and damp_c < 0:
        raise ValueError(f"damp must be >= 0, got {damp_c}")
    atol_a, atol_c = _scalar("atol", atol, dtype)
    btol_a, btol_c = _scalar("btol", btol, dtype)
    for name, c in (("atol", atol_c), ("btol", btol_c)):
        if c is not None and c < 0:
            raise ValueError(f"{name} must be >= 0, got {c}")
    conlim_a, _ = _scalar("conlim", conlim, dtype)
    if maxiter is None:
        maxiter = min(m, n)
    if isinstance(maxiter, (bool, np.bool_)) or (
        isinstance(maxiter, float) and not float(maxiter).is_integer()
    ):
        raise TypeError(f"maxiter must be an integer, got {maxiter!r}")
    if isinstance(maxiter, (int, np.integer, float)):
        if maxiter < 0:
            raise ValueError(f"maxiter must be >= 0, got {maxiter}")
        maxiter_a = jnp.full((1,), min(int(maxiter), np.iinfo(np.int32).max), jnp.int32)
    else:
        maxiter_a = jnp.asarray(maxiter).astype(jnp.int32).reshape(1)
    for name, val in (("b", b), ("x0", x0)):
        if val is not None and not isinstance(val, jax.core.Tracer) and not bool(jnp.all(jnp.isfinite(val))):
            raise ValueError(f"{name} contains NaN or Inf")
    if unroll is None:
        unroll = GPU_UNROLL if jax.default_backend() == "gpu" else 1
    if int(unroll) < 1:
        raise ValueError(f"unroll must be >= 1, got {unroll}")
    cp = _ColParams(damp_a, atol_a, btol_a, conlim_a, maxiter_a, jnp.zeros((1,), dtype))
    X0 = None if x0 is None else x0[None]
    if _TUNING["iteration"] not in ITERATIONS:
        raise ValueError(f"_TUNING['iteration'] must be one of {ITERATIONS}, got {_TUNING['iteration']!r}")
    loop = _LoopConfig(int(unroll), bool(_TUNING["pack_scalars"]), _TUNING["iteration"])
    solve_jit = _solve_jit
    options = _TUNING["compiler_options"]
    if options and jax.default_backend() == "gpu" and _at_top_level():
        solve_jit = _solve_jit_with(tuple(sorted(options.items())))
    out = solve_jit(spec, x0 is not None, loop, implementation, leaves, b[None], X0, cp)
    return jax.tree_util.tree_map(lambda a: a[0], out)
