"""Row-sharded LSMR: a matrix whose rows are split over a mesh axis and the solve that runs ``jax.shard_map`` for
the caller (``solve``, what ``lsmr`` does with one). Two kinds: a dense ``RowShardedMatrix`` (``row_sharded`` of a
dense array or of per-shard dense blocks) and the sparse family's ``jax_ops.sparse.RowShardedCSR`` (``row_sharded``
of a sparse matrix builds one: each shard's CSR(A_s) + CSR(A_sᵀ) with one plan for every shard).

Inside the shard_map every shard holds its row block of A and of b, and the whole x; each iteration's A v is local,
A^T u is the local product summed by one ``psum``, and ||u|| a psum of local sums of squares
(``operators.RowSharded``). Uneven row counts are padded with zero rows (zero rows of A and b change neither the
least-squares problem nor LSMR's iterates: they add exact zeros to every product and sum).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_ops._src.lsmr import arguments, progress
from jax_ops._src.lsmr.config import KNOBS
from jax_ops._src.lsmr.operators import check_real_dtype
from jax_ops._src.lsmr.types import LSMRResult


def axis_names(axis) -> tuple[str, ...]:
    """A mesh axis name or a tuple of them, as a tuple."""
    return tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)


def hashable_axis(axis):
    """A mesh axis name as is, a list of them as a tuple (a static, hashable part of the solve)."""
    return tuple(axis) if isinstance(axis, list) else axis


def bound_axis_size(axis_name) -> int:
    """The number of shards over ``axis_name`` of the enclosing ``jax.shard_map``; a clear error outside one."""
    try:
        return int(jax.lax.axis_size(axis_name))
    except NameError as err:
        raise ValueError(
            f"lsmr: axis_name={axis_name!r} is not an axis of an enclosing jax.shard_map; call lsmr with axis_name "
            "on this shard's rows inside jax.shard_map, or pass jax_ops.lsmr_solver.row_sharded(A, mesh, axis) as "
            "A outside one"
        ) from err


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=("a",), meta_fields=("shape", "rows", "mesh", "axis")
)
@dataclasses.dataclass(frozen=True)
class RowShardedMatrix:
    """A dense ``[m, n]`` matrix whose rows are split over ``axis`` of ``mesh`` (build with :func:`row_sharded`; a
    pytree: its array is an argument of the jitted solve, and receives gradients).

    ``a`` ``[shards * block_rows, n]``, sharded as ``P(axis, None)``: shard i holds ``rows[i]`` rows of A followed
    by zero rows up to ``block_rows``; the shards' real rows in order are A's rows in order.
    """

    a: jax.Array
    shape: tuple[int, int]
    rows: tuple[int, ...]
    mesh: Any
    axis: Any

    @property
    def dtype(self):
        return self.a.dtype

    @property
    def shards(self) -> int:
        return len(self.rows)

    @property
    def block_rows(self) -> int:
        return max(max(self.rows), 1)

    def local(self):
        """Inside the shard_map over ``axis``: this shard's ``[block_rows, n]`` block."""
        return self.a

    def pad_rows(self, b):
        """``b [m]`` in the shards' padded row order ``[shards * block_rows]`` (zeros in the padding rows)."""
        r, total = self.block_rows, self.shards * self.block_rows
        if self.rows == _split_rows(sum(self.rows), self.shards):
            return jnp.pad(b, (0, total - b.shape[0]))  # a whole matrix's split pads only at the end
        where = np.concatenate([i * r + np.arange(rows) for i, rows in enumerate(self.rows)]).astype(np.int32)
        return jnp.zeros((total,), b.dtype).at[where].set(b)


def is_row_sharded(A) -> bool:
    """A matrix ``lsmr`` solves by running its own shard_map: a RowShardedMatrix or a sparse RowShardedCSR."""
    return isinstance(A, RowShardedMatrix) or type(A).__name__ == "RowShardedCSR"


def _split_rows(m: int, shards: int) -> tuple[int, ...]:
    """Rows per shard of a whole matrix split in contiguous blocks of ceil(m / shards) rows (at least one)."""
    per = max(-(-m // shards), 1)
    return tuple(min(max(m - i * per, 0), per) for i in range(shards))


def _row_spec(axis) -> P:
    return P(axis if isinstance(axis, str) else tuple(axis))


def _place(x, mesh, spec: P):
    """``x`` laid out as ``spec`` on ``mesh`` (shard_map takes inputs only in its in_specs' layout on Explicit mesh
    axes: jax.reshard there; Auto axes take a sharding constraint)."""
    sharding = NamedSharding(mesh, spec)
    named = [a for entry in spec if entry is not None for a in axis_names(entry)]
    types = dict(zip(mesh.axis_names, mesh.axis_types))
    explicit = any(t == AxisType.Explicit for t in mesh.axis_types)
    if explicit and all(types[a] == AxisType.Explicit for a in named):
        return jax.reshard(x, sharding)
    if isinstance(x, jax.core.Tracer):
        return jax.lax.with_sharding_constraint(x, sharding)
    return jax.device_put(x, sharding)


def _check_mesh(mesh, axis) -> int:
    if not isinstance(mesh, jax.sharding.Mesh):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    names = axis_names(axis)
    if not names or any(a not in mesh.axis_names for a in names):
        raise ValueError(f"axis={axis!r} names no axis of the mesh, whose axes are {mesh.axis_names}")
    if len(set(names)) != len(names):
        raise ValueError(f"axis={axis!r} repeats an axis")
    return math.prod(mesh.shape[a] for a in names)


def _is_sparse(a) -> bool:
    from jax.experimental import sparse

    if isinstance(a, (sparse.BCOO, sparse.BCSR)) or type(a).__name__ == "CSRPair":
        return True
    return type(a).__module__.startswith("scipy.sparse") and hasattr(a, "tocsr")


def row_sharded(A, mesh, axis, **sparse_options):
    """A matrix with its rows split over ``axis`` (a mesh axis name or a tuple of them) of ``mesh``, for
    ``jax_ops.lsmr(row_sharded(A, mesh, axis), b, ...)``.

    ``A``: a dense ``[m, n]`` array (a jax array already sharded by rows on ``mesh`` is used in place) or a list of
    one dense row block per shard (``n`` columns each, any row counts), giving a :class:`RowShardedMatrix`; or a
    sparse matrix (``scipy.sparse``, ``BCOO``/``BCSR``, ``jax_ops.sparse.CSRPair``; concrete indices), giving
    ``jax_ops.sparse.row_sharded(A, mesh, axis, **sparse_options)``, a ``RowShardedCSR`` (``sparse_options``:
    ``balance``, ``algorithm``, ... as there). A whole dense matrix is split in contiguous blocks of
    ``ceil(m / shards)`` rows. Row counts that do not divide evenly are padded with zero rows (exact for least
    squares; ``b`` is padded to match by the solve).
    """
    axis = hashable_axis(axis)
    shards = _check_mesh(mesh, axis)
    pieces = list(A) if isinstance(A, (list, tuple)) else None
    if pieces is None and _is_sparse(A):
        from jax_ops._src.sparse.sharded import row_sharded as sparse_row_sharded

        return sparse_row_sharded(A, mesh, axis, **sparse_options)
    if sparse_options:
        raise TypeError(f"row_sharded of a dense matrix takes no options, got {sorted(sparse_options)}")
    if pieces is not None and len(pieces) != shards:
        raise ValueError(f"row_sharded got {len(pieces)} row blocks for {shards} shards over {axis!r}")
    for i, p in enumerate(pieces or [A]):
        what = f"row block {i}" if pieces is not None else "A"
        if pieces is not None and _is_sparse(p):
            raise TypeError(
                f"{what} is sparse: row blocks must be dense; pass the whole sparse matrix (row_sharded splits it "
                "with jax_ops.sparse.row_sharded, balance='rows' or 'nnz')"
            )
        if not hasattr(p, "shape") or len(p.shape) != 2:
            raise ValueError(f"{what} must be a 2-D matrix, got {type(p).__name__} {getattr(p, 'shape', '')}")
    if pieces is not None:
        n = int(pieces[0].shape[1])
        if any(int(p.shape[1]) != n for p in pieces):
            raise ValueError(
                f"row blocks must have one column count, got {[int(p.shape[1]) for p in pieces]}"
            )
        rows = tuple(int(p.shape[0]) for p in pieces)
    else:
        n = int(A.shape[1])
        rows = _split_rows(int(A.shape[0]), shards)
    block_rows = max(max(rows), 1)
    m = sum(rows)
    if pieces is None:
        a = jnp.asarray(A)
        a = jnp.pad(a, ((0, shards * block_rows - m), (0, 0))) if shards * block_rows != m else a
    else:
        a = jnp.concatenate([jnp.pad(jnp.asarray(p), ((0, block_rows - p.shape[0]), (0, 0))) for p in pieces])
    check_real_dtype("A", a.dtype)
    if not isinstance(a, jax.core.Tracer):  # placed once here; a traced one at each solve
        a = _place(a, mesh, _row_spec(axis))
    return RowShardedMatrix(a, (m, n), rows, mesh, axis)


def solve(A, b, damp, atol, btol, conlim, maxiter, show, x0, *, implementation, unroll):
    """``lsmr`` of a row-sharded matrix (``is_row_sharded``): the arguments checked as ``lsmr`` checks them
    (against the true shape: b ``[m]``, default maxiter ``min(m, n)``), then one jitted shard_map of
    ``lsmr(..., axis_name=axis)`` on each shard's rows (b padded like A's rows, x0 and the parameters
    replicated); the result is replicated."""
    if getattr(A, "transposed", False):
        raise ValueError("lsmr: the rows of a transposed RowShardedCSR are not split; pass the matrix itself")
    m, n = A.shape
    b, b_typed = arguments.coerce_b(b)
    dtype = arguments.solve_dtype(b, b_typed, A.dtype)
    b = jnp.asarray(b).astype(dtype)
    if b.shape[0] != m:
        raise ValueError(f"b has shape {tuple(b.shape)} but A has shape ({m}, {n}): b must have length {m}")
    x0 = arguments.coerce_x0(x0, n, m, dtype)
    params = (
        arguments.damp_array(damp, dtype),
        *(
            arguments.scalar(name, v, dtype)[0]
            for name, v in (("atol", atol), ("btol", btol), ("conlim", conlim))
        ),
        arguments.maxiter_array(maxiter, m, n),
    )
    arguments.check_finite(b=b, x0=x0)
    printing = show and progress.can_print(b, x0, A, params)
    if printing:
        progress.header(m, n, *params)
    # the knobs lsmr reads when traced, in the jit's cache key
    knobs = (KNOBS.iteration, bool(KNOBS.pack_scalars))
    out = _solve_jit(A, b, x0, params, implementation=implementation, unroll=unroll, knobs=knobs)
    if printing:
        progress.summary(out)
    return out


def _solve(A, b, x0, params, *, implementation, unroll, knobs):
    from jax_ops._src.lsmr.api import lsmr

    del knobs
    mesh, spec = A.mesh, _row_spec(A.axis)
    A = jax.tree_util.tree_map(lambda leaf: _place(leaf, mesh, spec), A)
    b = _place(A.pad_rows(b), mesh, spec)
    x0 = None if x0 is None else _place(x0, mesh, P())
    params = tuple(_place(p, mesh, P()) for p in params)

    def local(block, b, x0, params):
        damp, atol, btol, conlim, maxiter = (p[0] for p in params)
        return lsmr(
            block.local(), b, damp, atol, btol, conlim, maxiter, False, x0,
            implementation=implementation, unroll=unroll, axis_name=A.axis,
        )  # fmt: skip

    smap = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(spec, spec, P(), (P(),) * len(params)),
        out_specs=LSMRResult(*([P()] * len(LSMRResult._fields))),
    )
    return smap(A, b, x0, params)


_solve_jit = jax.jit(_solve, static_argnames=("implementation", "unroll", "knobs"))
