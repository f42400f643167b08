"""RowShardedCSR: a sparse matrix whose rows are split over a mesh axis, one CSRPair row block per shard (stacked
along a leading shard axis, padded to equal rows and nnz), and its products through ``jax.shard_map``: ``A x``
with x replicated needs no communication, ``Aᵀ u`` with u row-sharded is a local product and one psum (or
psum_scatter)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops import _checks
from jax_ops._src import dispatch
from jax_ops._src.sparse.csr_pair import CSRPair
from jax_ops._src.sparse.formats import RowProfile, _as_csr, _dense, _is_concrete
from jax_ops._src.sparse.plan import Plan, choose_algorithm, make_plan

# Plans one static choice can serve on every shard (segmented and stream take per-shard tables, cusparse a
# per-shard standard-CSR check).
SHARDED_ALGORITHMS = ("vector", "warp", "cta", "split")
BALANCES = ("rows", "nnz")


def _static(default=None):
    return dataclasses.field(default=default, metadata={"static": True})


def _axis_names(axis) -> tuple[str, ...]:
    return axis if isinstance(axis, tuple) else (axis,)


def _row_starts(indptr: np.ndarray, m: int, shards: int, balance: str) -> np.ndarray:
    """First row of each shard and M: contiguous blocks of ceil(M / S) rows ("rows"), or blocks of about nnz / S
    entries each ("nnz": for rows of uneven length)."""
    if balance == "rows":
        per = -(-m // shards)
        return np.minimum(np.arange(shards + 1, dtype=np.int64) * per, m)
    targets = np.arange(1, shards, dtype=np.float64) * indptr[-1] / shards
    inner = np.searchsorted(indptr, targets, side="left").clip(0, m)
    return np.concatenate([[0], np.maximum.accumulate(inner), [m]]).astype(np.int64)


def _transposed_block(ip: np.ndarray, idx: np.ndarray, k: int):
    """CSR(A_sᵀ) of one block with a monotone indptr ``ip`` (local rows) and ``idx`` (its entries): (indptr_t,
    row ids, the order of the block's entries), sorted by (column, row) as formats._transpose_csr; entries outside
    [0, K) go past indptr_t[K]."""
    rows = np.repeat(np.arange(ip.shape[0] - 1, dtype=np.int64), np.diff(ip))
    key = np.where((idx >= 0) & (idx < k), idx, k)
    order = np.lexsort((rows, key))
    indptr_t = np.searchsorted(key[order], np.arange(k + 1), side="left")
    return indptr_t, rows[order], order


def _blocks(ip: np.ndarray, idx: np.ndarray, starts: np.ndarray, k: int):
    """Each shard's CSR(A_s) and CSR(A_sᵀ), stacked: ((indptr [S, R + 1], indices [S, W], source [S, W]), the same
    of the transposes with indptr [S, K + 1]), R the largest block's rows, W its largest nnz; ``source`` is each
    stored entry's position in A's values (-1: padding past the last row)."""
    shards = starts.shape[0] - 1
    rows = max(1, int(np.diff(starts).max()))
    first, last = ip[starts[:-1]], ip[starts[1:]]
    width = max(1, int((last - first).max()))
    indptr, indptr_t = np.zeros((shards, rows + 1), np.int64), np.zeros((shards, k + 1), np.int64)
    indices, indices_t = np.zeros((shards, width), np.int64), np.zeros((shards, width), np.int64)
    source, source_t = np.full((shards, width), -1, np.int64), np.full((shards, width), -1, np.int64)
    for s in range(shards):
        count = int(last[s] - first[s])
        local = ip[starts[s] : starts[s + 1] + 1] - first[s]
        indptr[s, : local.shape[0]] = local
        indptr[s, local.shape[0] :] = local[-1]  # padding rows are empty
        indices[s, :count] = idx[first[s] : last[s]]
        source[s, :count] = np.arange(first[s], last[s])
        indptr_t[s], indices_t[s, :count], order = _transposed_block(indptr[s], indices[s, :count], k)
        source_t[s, :count] = source[s, order]
    return (indptr, indices, source), (indptr_t, indices_t, source_t)


def _shared_plan(indptrs: np.ndarray, nnz: int, rows: int, cols: int, itemsize: int, algorithm, split_chunk):
    """One static plan for every shard's block (rows x cols, nnz entries each), chosen from all shards' row
    lengths, with each shard's long-row lists padded to one length (a padding row owns no units, as in a traced
    plan): (Plan, long_rows [S, L], long_ptr [S, L + 1])."""
    lens = np.diff(indptrs, axis=1).reshape(-1)
    profile = RowProfile.from_indptr(np.concatenate([[0], np.cumsum(lens)]))
    alg = algorithm or choose_algorithm(profile, rows, nnz)
    made = [make_plan(ip, nnz, rows, profile, alg, split_chunk, cols, itemsize) for ip in indptrs]
    longest = max(int(lr.shape[0]) for _, lr, _ in made)
    long_rows = np.zeros((len(made), longest), np.int32)
    long_ptr = np.zeros((len(made), longest + 1), np.int32)
    for s, (_, lr, lp) in enumerate(made):
        n = int(lr.shape[0])
        long_rows[s, :n] = np.asarray(lr)
        long_ptr[s, : n + 1] = np.asarray(lp)
        long_ptr[s, n + 1 :] = long_ptr[s, n]
    plan = dataclasses.replace(made[0][0], units=max(p.units for p, _, _ in made))
    return plan, long_rows, long_ptr


@dataclasses.dataclass(frozen=True)
class RowShardedCSR:
    """A sparse M x K matrix with its rows split over ``axis`` of ``mesh`` (a registered pytree).

    Shard s holds rows ``row_starts[s] .. row_starts[s+1]`` as CSR(A_s) and CSR(A_sᵀ) (a CSRPair's arrays with a
    leading shard axis; rows padded to ``rows_per_shard``, entries to the largest shard's nnz). Row-sharded dense
    arrays use the shard layout: ``[S * rows_per_shard, ...]``, shard s's rows first, then its padding rows (zero
    in results, ignored in operands); :meth:`pad_rows` / :meth:`unpad_rows` convert from / to ``[M, ...]`` (the
    same array with ``balance="rows"`` when S divides M). Build with :meth:`from_matrix` or :func:`row_sharded`.
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
    matrix_shape: tuple[int, int] = _static()  # A's (M, K), whichever way ``.T`` points
    row_starts: tuple[int, ...] = _static()
    plan: Plan = _static()
    plan_t: Plan = _static()
    mesh: Mesh = _static()
    axis: str | tuple[str, ...] = _static()
    implementation: str | None = _static()
    transposed: bool = _static(False)

    @classmethod
    def from_matrix(
        cls,
        A,
        mesh: Mesh,
        axis,
        *,
        balance: str = "rows",
        algorithm: str | None = None,
        transpose_algorithm: str | None = None,
        split_chunk: int | None = None,
        implementation: str | None = None,
    ) -> RowShardedCSR:
        """Splits A's rows over ``axis`` (a mesh axis name or a tuple of them) of ``mesh``.

        ``A``: BCSR, BCOO, scipy.sparse or CSRPair. Its index arrays must be concrete (build outside jit: the
        per-shard nnz sizes the arrays); its values may be traced, and gradients w.r.t. them flow through the build.
        ``balance``: "rows" (blocks of ceil(M / S) rows) or "nnz" (blocks of about nnz / S entries).
        ``algorithm`` / ``transpose_algorithm``: one of SHARDED_ALGORITHMS for every shard's A_s / A_sᵀ (None: from
        all shards' row lengths, as a CSRPair's profile picks); ``split_chunk`` as for a CSRPair."""
        dispatch.check_implementation(implementation)
        if not isinstance(mesh, Mesh):
            raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        names = _axis_names(axis)
        if not names or any(n not in mesh.axis_names for n in names):
            raise ValueError(f"axis must name axes of the mesh {mesh.axis_names}, got {axis!r}")
        if balance not in BALANCES:
            raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}")
        for name, alg in (("algorithm", algorithm), ("transpose_algorithm", transpose_algorithm)):
            if alg is not None and alg not in SHARDED_ALGORITHMS:
                raise ValueError(
                    f"{name} must be one of {SHARDED_ALGORITHMS} or None for a row-sharded matrix (one static plan "
                    f"on every shard), got {alg!r}"
                )
        if isinstance(A, CSRPair):
            indptr, indices, values, (m, k) = A.indptr, A.indices, A.values, A.shape
        else:
            indptr, indices, values, m, k, _ = _as_csr(A)
        if not _is_concrete(indptr, indices):
            raise ValueError(
                "row_sharded needs concrete index arrays (the per-shard nnz sizes its arrays): build it outside jit "
                "(its values may be traced)"
            )
        nnz = int(indices.shape[0])
        ip = np.maximum.accumulate(np.clip(np.asarray(indptr, np.int64), 0, nnz))
        idx = np.asarray(indices, np.int64)
        shards = int(np.prod([mesh.shape[n] for n in names]))
        starts = _row_starts(ip, m, shards, balance)
        (indptr_s, indices_s, source), (indptr_ts, indices_ts, source_t) = _blocks(ip, idx, starts, k)
        rows, width = indptr_s.shape[1] - 1, indices_s.shape[1]
        itemsize = np.dtype(values.dtype).itemsize
        plan, lr, lp = _shared_plan(indptr_s, width, rows, k, itemsize, algorithm, split_chunk)
        plan_t, lr_t, lp_t = _shared_plan(
            indptr_ts, width, k, rows, itemsize, transpose_algorithm, split_chunk
        )

        def gather(src):  # differentiable in A's values; padding entries are 0
            if nnz == 0:
                return jnp.zeros(src.shape, values.dtype)
            return jnp.where(src >= 0, values[np.clip(src, 0, nnz - 1)], 0).astype(values.dtype)

        sharding = NamedSharding(mesh, P(axis))
        put = lambda x: jax.device_put(x.astype(np.int32) if isinstance(x, np.ndarray) else x, sharding)  # noqa: E731
        return cls(
            indptr=put(indptr_s), indices=put(indices_s), values=put(gather(source)), long_rows=put(lr),
            long_ptr=put(lp), indptr_t=put(indptr_ts), indices_t=put(indices_ts), values_t=put(gather(source_t)),
            long_rows_t=put(lr_t), long_ptr_t=put(lp_t), matrix_shape=(m, k),
            row_starts=tuple(int(r) for r in starts), plan=plan, plan_t=plan_t, mesh=mesh, axis=axis,
            implementation=implementation,
        )  # fmt: skip

    # -- properties
    @property
    def shape(self) -> tuple[int, int]:
        m, k = self.matrix_shape
        return (k, m) if self.transposed else (m, k)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.values.dtype)

    @property
    def shards(self) -> int:
        return len(self.row_starts) - 1

    @property
    def rows_per_shard(self) -> int:
        return int(self.indptr.shape[-1]) - 1

    @property
    def padded_rows(self) -> int:
        """Rows of a row-sharded dense array in the shard layout: S * rows_per_shard."""
        return self.shards * self.rows_per_shard

    @property
    def spec(self) -> P:
        """The ``in_specs`` entry of this matrix (and of row-sharded operands) in a ``jax.shard_map``."""
        return P(self.axis)

    @property
    def T(self) -> RowShardedCSR:  # noqa: N802
        return dataclasses.replace(self, transposed=not self.transposed)

    def __repr__(self) -> str:
        return (
            f"RowShardedCSR(shape={self.shape}, dtype={self.dtype.name}, shards={self.shards} over {self.axis!r}, "
            f"rows_per_shard={self.rows_per_shard}, transposed={self.transposed})"
        )

    # -- the shard layout of row-sharded dense arrays
    def _layout(self) -> np.ndarray:
        """For each row of the shard layout, its row of A (-1: padding)."""
        rows = self.rows_per_shard
        src = np.full((self.shards, rows), -1, np.int64)
        for s in range(self.shards):
            n = self.row_starts[s + 1] - self.row_starts[s]
            src[s, :n] = np.arange(self.row_starts[s], self.row_starts[s + 1])
        return src.reshape(-1)

    def pad_rows(self, u) -> jax.Array:
        """``u [M, ...]`` (A's rows) in the shard layout ``[S * rows_per_shard, ...]``, zeros in the padding."""
        m = self.matrix_shape[0]
        if u.shape[0] != m:
            raise ValueError(f"u has {u.shape[0]} rows but the matrix has M = {m}")
        src = self._layout()
        if np.array_equal(src[:m], np.arange(m)):  # padding only at the end
            return jnp.pad(u, [(0, src.shape[0] - m)] + [(0, 0)] * (u.ndim - 1))
        keep = (src >= 0).reshape((-1,) + (1,) * (u.ndim - 1))
        return jnp.where(keep, u[np.clip(src, 0, max(m - 1, 0))], 0)

    def unpad_rows(self, y) -> jax.Array:
        """``y`` in the shard layout as ``[M, ...]`` (A's rows)."""
        if y.shape[0] != self.padded_rows:
            raise ValueError(f"y has {y.shape[0]} rows but the shard layout has {self.padded_rows}")
        return y[np.nonzero(self._layout() >= 0)[0]]

    # -- per shard (inside a jax.shard_map over the matrix's axis, with in_specs ``A.spec`` for the matrix)
    def local(self) -> CSRPair:
        """This shard's block as a CSRPair (A_s ``[rows_per_shard, K]``; its transpose when ``.T``)."""
        return self._block().T if self.transposed else self._block()

    def _block(self) -> CSRPair:
        if self.indptr.shape[0] != 1:
            raise ValueError(
                f"local() takes one shard's block (leading axis 1), got {self.indptr.shape[0]}: call it inside "
                "jax.shard_map with in_specs=A.spec for the matrix"
            )
        leaf = lambda x: x[0]  # noqa: E731
        pair = CSRPair(
            indptr=leaf(self.indptr), indices=leaf(self.indices), values=leaf(self.values),
            long_rows=leaf(self.long_rows), long_ptr=leaf(self.long_ptr), indptr_t=leaf(self.indptr_t),
            indices_t=leaf(self.indices_t), values_t=leaf(self.values_t), long_rows_t=leaf(self.long_rows_t),
            long_ptr_t=leaf(self.long_ptr_t), shape=(self.rows_per_shard, self.matrix_shape[1]), plan=self.plan,
            plan_t=self.plan_t, profile=None, profile_t=None, implementation=self.implementation,
        )  # fmt: skip
        return pair

    def _check_scatter(self, transpose: bool, scatter: bool) -> None:
        k = self.matrix_shape[1]
        if scatter and not transpose:
            raise ValueError("scatter applies to Aᵀ u (a reduced result); A x is row-sharded already")
        if scatter and k % self.shards:
            raise ValueError(f"scatter=True needs K = {k} divisible by the {self.shards} shards")

    def _local(self, transpose: bool, b, scatter: bool, name: str):
        """op(A_s) @ b on this shard; for Aᵀ, summed over the axis (psum, or psum_scatter over K)."""
        self._check_scatter(transpose, scatter)
        _checks.check_array(name, b)
        pair = self._block()
        if transpose:
            part = pair.rmatmat(b) if b.ndim == 2 else pair.rmatvec(b)
            if scatter:
                return jax.lax.psum_scatter(part, self.axis, scatter_dimension=0, tiled=True)
            return jax.lax.psum(part, self.axis)
        return pair.matmat(b) if b.ndim == 2 else pair.matvec(b)

    def local_matmul(self, b, *, scatter: bool = False) -> jax.Array:
        """Inside ``jax.shard_map``: ``op(A) @ b`` from this shard's block. A (not ``.T``): b ``[K]`` / ``[K, N]``
        (replicated) -> this shard's rows ``[rows_per_shard, ...]``, no communication. ``A.T``: b this shard's rows
        of u ``[rows_per_shard, ...]`` -> ``Aᵀ u`` ``[K, ...]`` by a local product and one ``psum`` over the axis
        (``scatter=True``: ``psum_scatter``, this shard's ``K / S`` rows)."""
        return self._local(self.transposed, b, scatter, "b")

    def local_rmatmul(self, u, *, scatter: bool = False) -> jax.Array:
        """Inside ``jax.shard_map``: ``op(A)ᵀ @ u`` (``A.T.local_matmul(u)``)."""
        return self._local(not self.transposed, u, scatter, "u")

    # -- global products (a jax.shard_map over the matrix's mesh and axis)
    def _product(self, transpose: bool, b, scatter: bool, name: str) -> jax.Array:
        m, k = self.matrix_shape
        self._check_scatter(transpose, scatter)
        _checks.check_array(name, b)
        _dense(name, b, b.shape[0] if transpose else k, self.dtype, what=f"{'Aᵀ' if transpose else 'A'}")
        if transpose and b.shape[0] not in (m, self.padded_rows):
            raise ValueError(
                f"{name} has shape {tuple(b.shape)} but Aᵀ needs M = {m} rows or the shard layout's "
                f"{self.padded_rows} (pad_rows)"
            )
        if transpose and b.shape[0] != self.padded_rows:
            b = self.pad_rows(b)
        spec = self.spec
        out_spec = P() if transpose and not scatter else spec

        def local(blk, b):
            return blk._local(transpose, b, scatter, name)

        f = jax.shard_map(
            local, mesh=self.mesh, in_specs=(spec, spec if transpose else P()), out_specs=out_spec
        )
        return f(self, b)

    def matvec(self, x, *, scatter: bool = False) -> jax.Array:
        """``op(A) @ x`` for a vector (see :meth:`matmat`)."""
        _checks.check_array("x", x)
        if x.ndim != 1:
            raise ValueError(f"x must be a vector, got shape {tuple(x.shape)} (use matmat)")
        return self._product(self.transposed, x, scatter, "x")

    def matmat(self, B, *, scatter: bool = False) -> jax.Array:
        """``op(A) @ B``. A: B ``[K, N]`` replicated -> ``[S * rows_per_shard, N]`` sharded over the axis (shard
        layout), no communication. ``A.T``: B ``[M, N]`` or in the shard layout -> ``[K, N]`` replicated (one psum),
        or with ``scatter=True`` sharded over the axis (one psum_scatter; S must divide K)."""
        _checks.check_array("B", B)
        if B.ndim != 2:
            raise ValueError(f"B must be a matrix, got shape {tuple(B.shape)} (use matvec)")
        return self._product(self.transposed, B, scatter, "B")

    def rmatvec(self, u, *, scatter: bool = False) -> jax.Array:
        """``op(A)ᵀ @ u`` for a vector (``A.T.matvec(u)``)."""
        return self.T.matvec(u, scatter=scatter)

    def rmatmat(self, U, *, scatter: bool = False) -> jax.Array:
        """``op(A)ᵀ @ U`` (``A.T.matmat(U)``)."""
        return self.T.matmat(U, scatter=scatter)

    __array_ufunc__ = None  # ``u @ A`` with a NumPy u defers to __rmatmul__

    def __matmul__(self, other):
        return self.matmat(other) if getattr(other, "ndim", 1) == 2 else self.matvec(other)

    def __rmatmul__(self, other):
        """``u @ A`` = ``(Aᵀ uᵀ)ᵀ`` for u ``[M]`` or ``[N, M]``."""
        if getattr(other, "ndim", 1) == 2:
            return self.rmatmat(other.T).T
        return self.rmatvec(other)


jax.tree_util.register_dataclass(RowShardedCSR)


def row_sharded(A, mesh: Mesh, axis, **kwargs) -> RowShardedCSR:
    """:meth:`RowShardedCSR.from_matrix`."""
    return RowShardedCSR.from_matrix(A, mesh, axis, **kwargs)
