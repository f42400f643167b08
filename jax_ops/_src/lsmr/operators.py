"""Operators (``A``): a spec is static and hashable; its arrays ("leaves") are passed separately as jit
arguments. Block products: V [k, n] -> [k, m] (mv) and U [k, m] -> [k, n] (rmv)."""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops._src.lsmr.recurrence import sum_squares
from jax_ops._src.vma import vary_like

COMPLEX_HINT = (
    "jax_ops.lsmr solves real problems only; solve the real form [[Re A, -Im A], [Im A, Re A]] [Re x; Im x] = "
    "[Re b; Im b] instead"
)


# ----------------------------------------------------------------------------------------------------------


class Spec(abc.ABC):
    m: int
    n: int
    # The mesh axis (or axes) whose shards hold the rows of A, for a spec inside jax.shard_map; None: all local.
    axis_name = None

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

    # The row norms of the recurrence's vectors: range (m-space: b, u) and domain (n-space: v, x) blocks.
    def range_sum_squares(self, U):
        """Row sums of squares of U [k, m] in the accumulator dtype (a sharded spec sums over its shards)."""
        return sum_squares(U)

    def domain_sum_squares(self, V):
        """Row sums of squares of V [k, n] in the accumulator dtype."""
        return sum_squares(V)

    def range_norm(self, U):
        return jnp.sqrt(self.range_sum_squares(U)).astype(U.dtype)

    def domain_norm(self, V):
        return jnp.sqrt(self.domain_sum_squares(V)).astype(V.dtype)


@dataclasses.dataclass(frozen=True)
class Dense(Spec):
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
class BCOOSpec(Spec):
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
class Protocol(Spec):
    """An object with shape/matvec/rmatvec (pytree: leaves are its arrays; else held statically)."""

    m: int
    n: int
    treedef: Any  # None for a static (non-pytree) object
    obj: Any = dataclasses.field(default=None, compare=False, hash=False)
    dtype: Any = None

    def __eq__(self, other):  # static objects compare by identity
        return (
            type(other) is Protocol
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


@dataclasses.dataclass(frozen=True, eq=False)
class HostOperator(Spec):
    """A ``scipy.sparse.linalg.LinearOperator`` that wraps no matrix (its matvec is host Python): each block
    product is one ``jax.pure_callback`` to its ``matmat`` / ``rmatmat`` (a host round trip per product, inside
    jit too). Held statically, compared by identity."""

    m: int
    n: int
    obj: Any
    dtype: Any

    def __eq__(self, other):
        return type(other) is HostOperator and self.obj is other.obj and self.dtype == other.dtype

    def __hash__(self):
        return hash((id(self.obj), self.dtype))

    def _call(self, method: str, X, rows: int):
        out_type = jax.ShapeDtypeStruct((X.shape[0], rows), self.dtype)

        def host(x):
            y = getattr(self.obj, method)(np.asarray(x).T)
            return np.asarray(y).T.astype(self.dtype).reshape(out_type.shape)

        return jax.pure_callback(host, out_type, X, vmap_method="sequential")

    def mv(self, leaves, V, cp):
        return self._call("matmat", V, self.m)

    def rmv(self, leaves, U, cp):
        return self._call("rmatmat", U, self.n)


def _linear_operator(A):
    """The matrix a ``scipy.sparse.linalg.LinearOperator`` wraps (``aslinearoperator(S)`` of a sparse or dense S),
    or None for any other operator (and for non-LinearOperator objects)."""
    try:
        from scipy.sparse.linalg import LinearOperator
    except ImportError:
        return None, False
    if not isinstance(A, LinearOperator):
        return None, False
    inner = getattr(A, "A", None)  # MatrixLinearOperator keeps the matrix it wraps as .A
    if type(A).__name__ == "MatrixLinearOperator" and inner is not None:
        return inner, True
    return None, True


def _is_csr_pair(a) -> bool:
    try:
        from jax_ops.sparse import CSRPair
    except ImportError:
        return False
    return isinstance(a, CSRPair)


@dataclasses.dataclass(frozen=True)
class Transposed(Spec):
    """A^T (the adjoint solve of the backward pass)."""

    inner: Spec

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

    @property
    def axis_name(self):
        return self.inner.axis_name

    def range_sum_squares(self, U):
        return self.inner.domain_sum_squares(U)

    def domain_sum_squares(self, V):
        return self.inner.range_sum_squares(V)


@dataclasses.dataclass(frozen=True)
class Augmented(Spec):
    """[A; diag(cp.aux) I] of shape (m + n, n): per column d = cp.aux (the backward pass' damped solve)."""

    inner: Spec

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

    @property
    def axis_name(self):
        return self.inner.axis_name

    def range_sum_squares(self, U):
        if self.inner.axis_name is None:
            return sum_squares(U)  # one reduction over A's rows and the damping rows
        # A's rows are this shard's block (summed over the shards); the damping rows are whole on every shard.
        m = self.inner.m
        return self.inner.range_sum_squares(U[:, :m]) + sum_squares(U[:, m:])

    def domain_sum_squares(self, V):
        return self.inner.domain_sum_squares(V)


@dataclasses.dataclass(frozen=True)
class RowSharded(Spec):
    """This shard's row block of A inside ``jax.shard_map``, the rows of A split over ``axis_name``: A v is local
    (v, the n-space vectors, are whole on every shard; u, the m-space ones, are this shard's rows), A^T u is the
    local product summed over the shards (one ``psum``), and the m-space norms are psums of local sums of squares.
    ``m`` is the local row count."""

    inner: Spec
    axis_name: Any  # a mesh axis name or a tuple of them

    @property
    def m(self):
        return self.inner.m

    @property
    def n(self):
        return self.inner.n

    def _local(self, out, leaves, X):
        # a product typed varying like A's block and its operand (FFI results come back typed invariant; a psum of
        # an invariant value would multiply it by the axis size instead of summing the shards' blocks)
        return vary_like((out,), (*leaves, X))[0]

    def mv(self, leaves, V, cp):
        return self._local(self.inner.mv(leaves, V, cp), leaves, V)

    def rmv(self, leaves, U, cp):
        return jax.lax.psum(self._local(self.inner.rmv(leaves, U, cp), leaves, U), self.axis_name)

    def mv_axpby(self, leaves, V, U, beta, cp):
        return self._local(self.inner.mv_axpby(leaves, V, U, beta, cp), leaves, U)

    def rmv_axpby(self, leaves, U, V, beta, cp):
        # beta * V is added once, after the sum: V is whole on every shard
        return self.rmv(leaves, U, cp) + beta[:, None] * V

    def mv_axpby_cols(self, leaves, V, U, beta, cp):
        return self._local(self.inner.mv_axpby_cols(leaves, V, U, beta, cp), leaves, U)

    def range_sum_squares(self, U):
        return jax.lax.psum(self.inner.range_sum_squares(U), self.axis_name)

    def domain_sum_squares(self, V):
        return self.inner.domain_sum_squares(V)


def as_operator(A, dtype, implementation):
    """(spec, leaves) for ``A``; dense and sparse values are cast to ``dtype``."""
    from jax.experimental import sparse

    inner, is_linear_operator = _linear_operator(A)
    if inner is not None:  # the wrapped matrix, on the device (no host callback)
        return as_operator(inner, dtype, implementation)
    if is_linear_operator:
        if A.dtype is not None:
            check_real_dtype("A", A.dtype)
        m, n = (int(s) for s in A.shape)
        return HostOperator(m, n, A, np.dtype(dtype)), []

    try:
        import scipy.sparse as sp

        if sp.issparse(A):
            if len(A.shape) != 2:
                raise ValueError(f"sparse A must be a 2-D matrix, got shape {A.shape}")
            check_real_dtype("A", A.dtype)
            A = A.tocsr().astype(dtype)
            if implementation != "xla":  # its CSR as is (no sort); the transpose sorted once on device
                from jax_ops.sparse import CSRPair

                A = CSRPair.from_matrix(A, implementation=implementation)
            else:
                A = sparse.BCOO.from_scipy_sparse(A)
    except ImportError:
        pass
    if isinstance(A, (sparse.BCOO, sparse.BCSR)):
        if A.ndim != 2 or A.n_batch or A.n_dense:
            raise ValueError(
                f"sparse A must be a 2-D matrix without batch/dense dimensions, got shape {A.shape} "
                f"(n_batch={A.n_batch}, n_dense={A.n_dense})"
            )
        check_real_dtype("A", A.dtype)
        if np.dtype(A.dtype) != dtype and isinstance(A, sparse.BCOO):  # keeping its sorted/unique flags
            A = sparse.BCOO(
                (A.data.astype(dtype), A.indices), shape=A.shape,
                indices_sorted=A.indices_sorted, unique_indices=A.unique_indices,
            )  # fmt: skip
        elif np.dtype(A.dtype) != dtype:
            A = sparse.BCSR((A.data.astype(dtype), A.indices, A.indptr), shape=A.shape)
        if implementation != "xla":
            # Converted once, outside the loop: both products become row-major sweeps.
            from jax_ops.sparse import CSRPair

            A = CSRPair.from_matrix(A, implementation=implementation)
        else:
            bcoo = A.to_bcoo() if isinstance(A, sparse.BCSR) else A
            leaves, treedef = jax.tree_util.tree_flatten(bcoo)
            return BCOOSpec(int(A.shape[0]), int(A.shape[1]), treedef), leaves
    if hasattr(A, "matvec") and hasattr(A, "rmatvec") and hasattr(A, "shape"):
        if len(tuple(A.shape)) != 2:
            raise ValueError(f"A.shape must be (m, n), got {tuple(A.shape)}")
        m, n = (int(s) for s in A.shape)
        leaves, treedef = jax.tree_util.tree_flatten(A)
        if all(isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves) and not (
            len(leaves) == 1 and leaves[0] is A
        ):
            return Protocol(m, n, treedef, None, dtype), leaves
        return Protocol(m, n, None, A, dtype), []
    if hasattr(A, "shape") and hasattr(A, "dtype"):
        if len(A.shape) != 2:
            raise ValueError(f"A must be a 2-D matrix, got shape {tuple(A.shape)}")
        check_real_dtype("A", A.dtype)
        a = jnp.asarray(A, dtype=dtype)
        return Dense(int(A.shape[0]), int(A.shape[1])), [a]
    raise TypeError(
        "A must be a dense array, a jax.experimental.sparse BCOO/BCSR, a scipy.sparse matrix, a "
        f"jax_ops.sparse.CSRPair or an object with shape/matvec/rmatvec; got {type(A).__name__}"
    )


def check_real_dtype(name, dtype):
    """A real (float or integer) dtype, which is cast to the solve dtype; complex is not supported."""
    if np.issubdtype(np.dtype(dtype), np.complexfloating):
        raise TypeError(f"{name} is complex ({np.dtype(dtype)}): {COMPLEX_HINT}")
    if not (np.issubdtype(np.dtype(dtype), np.floating) or np.issubdtype(np.dtype(dtype), np.integer)):
        raise TypeError(f"{name} must be real (float or integer), got dtype {np.dtype(dtype)}")
