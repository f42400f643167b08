"""CSRPair: CSR(A) and CSR(Aᵀ) built once, with both directions' plans and N = 1 forms (slabs, blocks)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src import dispatch
from jax_ops._src.sparse.blocks import _BLOCKS_MIN_ROWS, Blocks, _build_blocks, block_rows
from jax_ops._src.sparse.formats import (
    RowProfile,
    _acc_dtype,
    _as_csr,
    _coef,
    _dense,
    _is_concrete,
    _sanitize_indptr,
    _transpose_csr,
    slab_dtypes,
)
from jax_ops._src.sparse.plan import Plan, plan_pair
from jax_ops._src.sparse.reference import _xla_spmm
from jax_ops._src.sparse.slabs import Slabs, _build_slabs, _slabs_fit_device, slab_model
from jax_ops._src.sparse.vjp import _apply, _Static


def backend(implementation: str | None) -> str:
    """ "ffi" or "xla" for one product (dispatch.choose; on the CPU the twin is faster than the jnp reference on
    every measured size, docs/sparse.md, so None runs it there too)."""
    return dispatch.choose("sparse", implementation, default_on_cpu="ffi")


def _static(default=None):
    return dataclasses.field(default=default, metadata={"static": True})


# The fields that come in an (A, Aᵀ) pair: ``.T`` swaps each with its ``_t`` twin.
_DIRECTED = ("indptr", "indices", "values", "long_rows", "long_ptr", "plan", "profile", "slabs", "blocks")


@dataclasses.dataclass(frozen=True)
class CSRPair:
    """CSR(A) and CSR(Aᵀ) of one matrix with their row profiles and static kernel plans (a registered pytree).

    Build with :meth:`from_matrix` (or :func:`csr_pair`) from a BCSR, BCOO or scipy.sparse matrix. The profile is
    computed on the host when the inputs are concrete (outside ``jit``); inside ``jit`` the plan falls back to
    the static average row length. Gradients w.r.t. values arrive on the leaf the product used (``values`` for
    ``matvec``/``matmat``, ``values_t`` for ``rmatvec``/``rmatmat``; ``blocks.values``/``blocks_t.values`` or
    ``slabs_t.val`` for an N = 1 product that ran on row blocks or column slabs).
    """

    indptr: jax.Array
    indices: jax.Array
    values: jax.Array
    long_rows: jax.Array
    long_ptr: jax.Array
    indptr_t: jax.Array
    indices_t: jax.Array
    values_t: jax.Array
    long_rows_t: jax.Array
    long_ptr_t: jax.Array
    shape: tuple[int, int] = _static()
    plan: Plan = _static()
    plan_t: Plan = _static()
    profile: RowProfile | None = _static()
    profile_t: RowProfile | None = _static()
    implementation: str | None = _static()
    slabs: Slabs | None = None  # column slabs of A, for A x (not built today)
    slabs_t: Slabs | None = None  # column slabs of Aᵀ, for Aᵀ u (rmatvec, N = 1)
    blocks: Blocks | None = None  # A in row blocks, for A x (N = 1; before slabs)
    blocks_t: Blocks | None = None  # Aᵀ in row blocks, for Aᵀ u (N = 1; before slabs)

    @classmethod
    def from_matrix(
        cls,
        A,
        *,
        algorithm: str | None = None,
        transpose_algorithm: str | None = None,
        split_chunk: int | None = None,
        implementation: str | None = None,
        slabs: bool | None = None,
        blocks: bool | None = None,
    ) -> CSRPair:
        """Builds the pair. ``algorithm``/``transpose_algorithm`` override the profile's choice (testing);
        ``split_chunk`` sets the nnz per work unit of the split algorithm. ``slabs``: build the column-slab
        form of Aᵀ used by N = 1 ``rmatvec`` (True), never (False), or when :func:`slab_model` says it pays
        for this shape (None; f32/f64 only). ``blocks``: build the row-block form of A and of Aᵀ where their rows
        come in blocks sharing a column list (block_rows), used by N = 1 products instead of CSR and slabs:
        wherever found (True), never (False), or for blocks of at least 3 rows (None, the measured rule; not for
        Aᵀ when slabs=True asks for slabs). Both need concrete arrays (outside jit); a traced build has neither."""
        dispatch.check_implementation(implementation)
        if isinstance(A, CSRPair):
            has_blocks = A.blocks if A.blocks is not None else A.blocks_t
            for name, opt, have in (("slabs", slabs, A.slabs_t), ("blocks", blocks, has_blocks)):
                if opt is not None and opt != (have is not None):
                    raise ValueError(
                        f"{name}={opt} for a CSRPair built {'with' if have is not None else 'without'} {name}: "
                        f"build the pair from the matrix (BCSR/BCOO/scipy) with the {name} option instead"
                    )
            return A
        indptr, indices, values, m, k, _ = _as_csr(A)
        nnz = int(indices.shape[0])
        indptr = _sanitize_indptr(indptr, nnz)
        indptr_t, indices_t, values_t = _transpose_csr(indptr, indices, values, m, k)
        concrete = _is_concrete(indptr, indptr_t)
        (prof, plan, lr, lp), (prof_t, plan_t, lr_t, lp_t) = plan_pair(
            indptr, indices, values, indptr_t, indices_t, values_t, m, k,
            algorithm=algorithm, transpose_algorithm=transpose_algorithm, split_chunk=split_chunk,
        )  # fmt: skip
        itemsize = np.dtype(values.dtype).itemsize
        slabs_forced = slabs is True  # an explicit slabs=True keeps Aᵀu on slabs unless blocks=True too
        slab_ok = np.dtype(values.dtype) in slab_dtypes()
        if slabs and not slab_ok:
            raise ValueError(
                f"slabs=True needs {' or '.join(d.name for d in slab_dtypes())} values, got {np.dtype(values.dtype)} "
                "(half types use CSR(Aᵀ))"
            )
        if slabs is None:
            slabs = slab_ok and _slabs_fit_device() and slab_model(k, m, nnz, itemsize).use
        # (an empty A has nothing to gather: slabs=True builds none)
        slabs_t = _build_slabs(indptr, indices, values, m, k) if slabs and m > 0 and k > 0 else None
        min_rows = 2 if blocks else _BLOCKS_MIN_ROWS

        def blocks_of(ip, idx, vals):
            r = block_rows(ip, idx, min_rows) if blocks is not False and concrete and nnz > 0 else 1
            return _build_blocks(ip, idx, vals, r) if r >= min_rows else None

        blocks_a = blocks_of(indptr, indices, values)
        blocks_t = blocks_of(indptr_t, indices_t, values_t) if blocks or not slabs_forced else None
        return cls(
            indptr=indptr, indices=indices, values=values, long_rows=lr, long_ptr=lp,
            indptr_t=indptr_t, indices_t=indices_t, values_t=values_t, long_rows_t=lr_t, long_ptr_t=lp_t,
            shape=(m, k), plan=plan, plan_t=plan_t, profile=prof, profile_t=prof_t,
            implementation=implementation, slabs=None, slabs_t=slabs_t, blocks=blocks_a, blocks_t=blocks_t,
        )  # fmt: skip

    # -- properties
    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.values.dtype)

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    @property
    def T(self) -> CSRPair:  # noqa: N802
        swapped = {}
        for name in _DIRECTED:
            swapped[name], swapped[name + "_t"] = getattr(self, name + "_t"), getattr(self, name)
        return dataclasses.replace(self, shape=(self.shape[1], self.shape[0]), **swapped)

    # -- products
    def _product(self, transpose: bool, b, alpha, beta, y, name: str):
        m, k = self.shape
        if transpose:
            m, k = k, m
        b2, vec = _dense(name, b, k, self.dtype, what=f"{'Aᵀ' if transpose else 'A'} of shape {(m, k)}")
        n = b2.shape[1]
        acc = _acc_dtype(self.dtype)
        if y is None:
            y2 = jnp.zeros((0,), self.dtype)
            if beta is not None:
                raise ValueError("beta was given without y")
        else:
            y2, _ = _dense("y", y, m, self.dtype, what="the output")
            if tuple(y2.shape) != (m, n):
                raise ValueError(
                    f"y must have the output's shape {(m,) if vec else (m, n)}, got {tuple(y.shape)}"
                )
        alpha_a = _coef("alpha", alpha, n, acc, 1.0)
        beta_a = _coef("beta", beta, n, acc, 1.0)
        a_arr = (self.indptr, self.indices, self.long_rows, self.long_ptr)
        t_arr = (self.indptr_t, self.indices_t, self.long_rows_t, self.long_ptr_t)
        # the N = 1 form of this direction's matrix: blocks, else column slabs, else none (CSR)
        forms = (self.blocks_t, self.slabs_t) if transpose else (self.blocks, self.slabs)
        alt = next((f for f in forms if f is not None), None) if n == 1 else None
        alt_plan = alt.plan if alt is not None else None
        impl = backend(self.implementation)
        if transpose:
            st = _Static(m, k, self.plan_t, self.plan, impl, alt_plan)
            out = _apply(st, t_arr, a_arr, self.values_t, self.values, alt, b2, alpha_a, beta_a, y2)
        else:
            st = _Static(m, k, self.plan, self.plan_t, impl, alt_plan)
            out = _apply(st, a_arr, t_arr, self.values, self.values_t, alt, b2, alpha_a, beta_a, y2)
        return out[:, 0] if vec else out

    def matvec(self, x, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (A @ x) + beta * y`` for x ``[K]`` (y ``[M]``; without y: ``alpha * A @ x``)."""
        return self._product(False, x, alpha, beta, y, "x")

    def rmatvec(self, u, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (Aᵀ @ u) + beta * y`` for u ``[M]``: a row-major sweep of CSR(Aᵀ) (no atomics)."""
        return self._product(True, u, alpha, beta, y, "u")

    def matmat(self, B, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (A @ B) + beta * y`` for B ``[K, N]``; alpha/beta 0-d or per column ``[N]``."""
        return self._product(False, B, alpha, beta, y, "B")

    def rmatmat(self, U, *, alpha=None, beta=None, y=None) -> jax.Array:
        """``alpha * (Aᵀ @ U) + beta * y`` for U ``[M, N]``."""
        return self._product(True, U, alpha, beta, y, "U")

    def matvec_axpby(self, v, u, beta, alpha=None) -> jax.Array:
        """LSMR's fused update ``alpha * A v + beta * u`` (e.g. ``beta = -alpha_k`` for ``u <- A v - alpha_k u``)."""
        return self._product(False, v, alpha, beta, u, "v")

    def rmatvec_axpby(self, u, v, beta, alpha=None) -> jax.Array:
        """``alpha * Aᵀ u + beta * v`` in one pass."""
        return self._product(True, u, alpha, beta, v, "u")

    __array_ufunc__ = None  # ``u @ pair`` with a NumPy u defers to __rmatmul__

    def __matmul__(self, other):
        return self.matmat(other) if getattr(other, "ndim", 1) == 2 else self.matvec(other)

    def __rmatmul__(self, other):
        """``u @ pair`` = ``(Aᵀ uᵀ)ᵀ`` for u ``[M]`` or ``[N, M]`` (through CSR(Aᵀ), no transpose built)."""
        if getattr(other, "ndim", 1) == 2:
            return self.rmatmat(other.T).T
        return self.rmatvec(other)

    def __repr__(self) -> str:
        forms = [
            n
            for n, f in (("blocks", self.blocks), ("blocks_t", self.blocks_t), ("slabs_t", self.slabs_t))
            if f is not None
        ]
        extra = f", forms={forms}" if forms else ""
        return (
            f"CSRPair(shape={self.shape}, nnz={self.nnz}, dtype={self.dtype.name}, plan={_plan_str(self.plan)}, "
            f"plan_t={_plan_str(self.plan_t)}{extra})"
        )

    def todense(self) -> jax.Array:
        m, k = self.shape
        return _xla_spmm(
            self.indptr,
            self.indices,
            self.values,
            jnp.eye(k, dtype=self.dtype),
            jnp.ones((k,), _acc_dtype(self.dtype)),
            jnp.ones((k,), _acc_dtype(self.dtype)),
            jnp.zeros((0,), self.dtype),
        )


def _plan_str(plan: Plan) -> str:
    parts = [plan.algorithm, f"G={plan.group}"]
    if plan.chunk:
        parts.append(f"chunk={plan.chunk}")
    return " ".join(parts)


jax.tree_util.register_dataclass(CSRPair)


def csr_pair(A, **kwargs) -> CSRPair:
    """:meth:`CSRPair.from_matrix`."""
    return CSRPair.from_matrix(A, **kwargs)
