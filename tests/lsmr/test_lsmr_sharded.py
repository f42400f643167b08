"""Row-sharded LSMR on 8 fake CPU devices: ``lsmr(row_sharded(A, mesh, axis), b)`` (a dense RowShardedMatrix or a
sparse RowShardedCSR) and ``lsmr(..., axis_name=)`` inside a hand-written shard_map against the single-device solve
of the same problem.

Two kinds of comparison. Trajectories (atol = btol = conlim = 0, a few iterations, before LSMR's vectors lose
orthogonality): every output equal to rounding. Stops (lsmr_cases' margin-checked cases): istop and itn equal, x
within twice lsmr_cases' bound on x (both solves lie within it of SciPy's), and the estimates, which after the loss of
orthogonality are set by the summation order, within the bounds noted at ``assert_stop_matches``.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import rel_err
from jax.experimental import sparse as jsparse
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from lsmr_cases import CASES, gen, problem, x_bound
from scipy.sparse.linalg import lsmr as scipy_lsmr

import jax_ops
from jax_ops import lsmr_solver
from jax_ops.lsmr_solver import row_sharded

# (data-parallel axis, row axis): the rows over 8, 4, 2 and 1 devices
MESH_SHAPES = [(1, 8), (2, 4), (4, 2), (8, 1)]
FIELDS = ("x", "normr", "normar", "norma", "conda", "normx")


def mesh_of(shape):
    return jax.make_mesh(shape, ("d", "r"))


def operand(a, kind):
    return a.toarray() if kind == "dense" else a


def as_numpy(out):
    return jax.tree_util.tree_map(np.asarray, out)


# ---- trajectories: every output to rounding ----------------------------------------------------------------------


@functools.cache
def trajectory_problem(shape):
    """A 203 x 37 problem (203 rows: uneven over 2, 4 and 8 shards) and an x0."""
    a = gen(*shape, density=0.05, seed=5)
    rng = np.random.default_rng(6)
    return a, rng.standard_normal(shape[0]), rng.standard_normal(shape[1])


TRAJECTORY = dict(atol=0.0, btol=0.0, conlim=0.0, maxiter=12)


def assert_same_trajectory(out, ref, tol=1e-10, fields=FIELDS):
    out, ref = as_numpy(out), as_numpy(ref)
    assert (int(out.istop), int(out.itn)) == (int(ref.istop), int(ref.itn)) == (7, TRAJECTORY["maxiter"])
    for field in fields:
        assert rel_err(getattr(out, field), getattr(ref, field)) <= tol, field


# each mesh shape once; dense and csr, plain (damp 0, no x0) and damped-x0 (damp 0.7, x0) in turn
TRAJECTORY_RUNS = [
    ((1, 8), "dense", "plain"),
    ((2, 4), "csr", "damped-x0"),
    ((4, 2), "dense", "damped-x0"),
    ((8, 1), "csr", "plain"),
]


@pytest.mark.parametrize(
    ("mesh_shape", "kind", "variant"),
    TRAJECTORY_RUNS,
    ids=[f"{d}x{r}-{k}-{v}" for (d, r), k, v in TRAJECTORY_RUNS],
)
def test_trajectory_matches_single_device(x64, mesh_shape, kind, variant):
    damp, with_x0 = (0.7, True) if variant == "damped-x0" else (0.0, False)
    a, b, x0 = trajectory_problem((203, 37))
    x0 = x0 if with_x0 else None
    A = operand(a, kind)
    ref = jax_ops.lsmr(A, b, damp=damp, x0=x0, **TRAJECTORY)
    out = jax_ops.lsmr(row_sharded(A, mesh_of(mesh_shape), "r"), b, damp=damp, x0=x0, **TRAJECTORY)
    assert out.x.shape == (37,) and out.x.dtype == np.float64
    assert_same_trajectory(out, ref)


def test_trajectory_ffi_runs_the_step_iteration(x64):
    """The CPU twin's path: the fused iteration's per-shard partial norms are not summed, so a sharded solve runs
    the "step" iteration (jax_ops_lsmr_step, no partial-norm kernels) and matches the single-device "step" solve
    (CSRPair products on each shard's block)."""
    a, b, x0 = trajectory_problem((203, 37))
    A = operand(a, "csr")
    with lsmr_solver.overrides(iteration="step"):
        ref = jax_ops.lsmr(A, b, x0=x0, implementation="ffi", **TRAJECTORY)
    sharded = row_sharded(A, mesh_of((2, 4)), "r")
    out = jax_ops.lsmr(sharded, b, x0=x0, implementation="ffi", **TRAJECTORY)
    assert_same_trajectory(out, ref)
    hlo = jax.jit(lambda A, b: jax_ops.lsmr(A, b, implementation="ffi")).lower(sharded, b).as_text()
    assert "jax_ops_lsmr_step" in hlo and "jax_ops_lsmr_partial_norms" not in hlo


def test_trajectory_wide_and_axis_tuple(x64):
    """A wide matrix (m < n), its rows over both mesh axes (axis a tuple: 8 shards)."""
    a, b, x0 = trajectory_problem((45, 120))
    mesh = mesh_of((2, 4))
    ref = jax_ops.lsmr(a, b, x0=x0, **TRAJECTORY)
    out = jax_ops.lsmr(row_sharded(a, mesh, ("d", "r")), b, x0=x0, **TRAJECTORY)
    assert_same_trajectory(out, ref)


def test_auto_axes_mesh_and_float32():
    """A mesh of Auto axes (jax.sharding.Mesh's default) and a float32 solve (x64 off)."""
    a, b, _ = trajectory_problem((203, 37))
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(2, 4), ("d", "r"))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ref = jax_ops.lsmr(a32.toarray(), b32, **TRAJECTORY)
    out = jax_ops.lsmr(row_sharded(a32.toarray(), mesh, "r"), b32, **TRAJECTORY)
    assert out.x.dtype == np.float32
    # float32 rounding amplified over 12 iterations; normar and conda, small differences of large terms, move more
    assert_same_trajectory(out, ref, tol=1e-3, fields=("x", "normr", "norma", "normx"))


# ---- stops: the margin-checked cases ---------------------------------------------------------------------------

# tight tolerances: the test below; istop 7 (tall-maxiter) and damping: the trajectories
STOP_CASES = [
    c
    for c in CASES
    if c[0] in ("tall-inconsistent", "tall-consistent", "tall-x0", "wide-consistent", "square-damped")
]


@functools.cache
def case_reference(name, kind):
    case = next(c for c in CASES if c[0] == name)
    a, b, kw, x0 = problem(case)
    scipy_x = scipy_lsmr(a, b, x0=x0, **kw)[0]
    ref = as_numpy(jax_ops.lsmr(operand(a, kind), b, x0=x0, **kw))
    return a, b, kw, x0, ref, x_bound(a, b, kw, scipy_x, x0)


def assert_stop_matches(out, ref, x_tol, normb):
    out = as_numpy(out)
    assert (int(out.istop), int(out.itn)) == (int(ref.istop), int(ref.itn))
    # both within x_tol of SciPy's x, so within 2 x_tol of each other
    assert rel_err(out.x, ref.x) <= 2 * x_tol
    assert abs(out.normx - ref.normx) <= 2 * x_tol * ref.normx
    # normr: at a consistent stop it is ~btol ||b||, set by rounding; normar ~atol normA normr likewise (its
    # spread over summation orders reaches 1e-2 here); norma sums the late alphas/betas (test_lsmr's 1e-3); conda
    # is a max over the rotations (up to 2e-3 here)
    assert abs(out.normr - ref.normr) <= 1e-6 * ref.normr + 1e-9 * normb
    assert abs(out.normar - ref.normar) <= 5e-2 * ref.normar + 1e-12 * ref.norma * normb
    assert abs(out.norma - ref.norma) <= 1e-3 * ref.norma
    assert abs(out.conda - ref.conda) <= 2e-2 * ref.conda


# each case once, the row axis over 8, 4 and 2 devices in turn, dense and csr in turn
STOP_RUNS = [(c, MESH_SHAPES[i % 3], ("dense", "csr")[i % 2]) for i, c in enumerate(STOP_CASES)]


@pytest.mark.parametrize(
    ("case", "mesh_shape", "kind"), STOP_RUNS, ids=[f"{c[0]}-{r}rows-{k}" for c, (_, r), k in STOP_RUNS]
)
def test_stops_match_single_device(x64, case, mesh_shape, kind):
    a, b, kw, x0, ref, x_tol = case_reference(case[0], kind)
    out = jax_ops.lsmr(row_sharded(operand(a, kind), mesh_of(mesh_shape), "r"), b, x0=x0, **kw)
    assert_stop_matches(out, ref, x_tol, np.linalg.norm(b))


@pytest.mark.parametrize(("name", "kind"), [("wide-damped-tight", "csr")])
def test_tight_stops_match_single_device(x64, name, kind):
    """Tight tolerances stop long after the loss of orthogonality: istop, itn and x as above; the estimates'
    rounding spread is larger there (conda's up to 4e-2), so only x and normx are compared."""
    a, b, kw, x0, ref, x_tol = case_reference(name, kind)
    out = as_numpy(jax_ops.lsmr(row_sharded(operand(a, kind), mesh_of((2, 4)), "r"), b, x0=x0, **kw))
    assert (int(out.istop), int(out.itn)) == (int(ref.istop), int(ref.itn))
    assert rel_err(out.x, ref.x) <= 2 * x_tol
    assert abs(out.normx - ref.normx) <= 2 * x_tol * ref.normx


# ---- operators, layouts and transforms -------------------------------------------------------------------------


def test_row_blocks_uneven_and_sparse_formats(x64):
    """Dense row blocks of uneven rows, and sparse matrices of every format (split by jax_ops.sparse.row_sharded
    into a RowShardedCSR, by rows or by nnz), give the single-device solve; the padding is zero rows."""
    a, b, x0 = trajectory_problem((203, 37))
    bounds = [0, 70, 90, 150, 203]
    mesh = mesh_of((2, 4))
    ref = jax_ops.lsmr(a, b, x0=x0, **TRAJECTORY)
    blocks = row_sharded([a[bounds[i] : bounds[i + 1]].toarray() for i in range(4)], mesh, "r")
    assert isinstance(blocks, lsmr_solver.RowShardedMatrix) and blocks.shape == (203, 37)
    assert blocks.rows == (70, 20, 60, 53) and blocks.block_rows == 70
    padded = np.asarray(blocks.a).reshape(4, 70, 37)
    assert not np.any(padded[1, 20:]) and not np.any(padded[3, 53:])
    assert blocks.a.sharding.spec == P("r", None)
    assert_same_trajectory(jax_ops.lsmr(blocks, b, x0=x0, **TRAJECTORY), ref)
    bcsr = jsparse.BCSR.from_scipy_sparse(a)
    variants = {
        "bcoo": (jsparse.BCOO.from_scipy_sparse(a), {}),
        "bcsr-by-nnz": (bcsr, {"balance": "nnz"}),
        "csr_pair": (jax_ops.sparse.csr_pair(bcsr), {}),
    }
    for name, (A, options) in variants.items():
        sharded = row_sharded(A, mesh, "r", **options)
        assert isinstance(sharded, jax_ops.sparse.RowShardedCSR) and sharded.shape == (203, 37), name
        assert_same_trajectory(jax_ops.lsmr(sharded, b, x0=x0, **TRAJECTORY), ref)


def test_inside_a_shard_map(x64):
    """``lsmr(..., axis_name=)`` on each shard's rows in the caller's shard_map, jitted and vmapped over b inside it
    (x0 replicated); the default maxiter is min(m, n) of the whole matrix."""
    m, n = 200, 60  # 25 rows per shard, fewer than n
    a, b, x0 = trajectory_problem((m, n))
    a = a.toarray()
    mesh = mesh_of((1, 8))
    rows = NamedSharding(mesh, P("r"))

    capped = jax.shard_map(
        lambda a, b: jax_ops.lsmr(a, b, atol=0.0, btol=0.0, conlim=0.0, axis_name="r"),
        mesh=mesh, in_specs=(P("r"), P("r")), out_specs=P(),
    )  # fmt: skip
    assert (
        int(capped(jax.device_put(a, rows), jax.device_put(b, rows)).itn) > 25
    )  # the limit is not min(25, n)

    bs = np.stack([b, np.cos(b)])
    block = jax.jit(
        jax.shard_map(
            jax.vmap(
                lambda a, b, x0: jax_ops.lsmr(a, b, x0=x0, axis_name="r", **TRAJECTORY),
                in_axes=(None, 0, None),
            ),
            mesh=mesh,
            in_specs=(P("r"), P(None, "r"), P()),
            out_specs=P(),
        )  # fmt: skip
    )
    outs = block(jax.device_put(a, rows), jax.device_put(bs, NamedSharding(mesh, P(None, "r"))), x0)
    refs = jax.vmap(lambda b: jax_ops.lsmr(a, b, x0=x0, **TRAJECTORY))(bs)
    for i in range(2):
        assert_same_trajectory(*(jax.tree_util.tree_map(lambda v, i=i: v[i], o) for o in (outs, refs)))


def test_vmap_is_one_block_solve(x64):
    a, b, _ = trajectory_problem((203, 37))
    sharded = row_sharded(a, mesh_of((2, 4)), "r")
    bs = np.stack([b, np.sin(b)])
    solve = jax.vmap(lambda b: jax_ops.lsmr(sharded, b, **TRAJECTORY))
    outs = solve(bs)
    for i in range(2):
        assert_same_trajectory(
            jax.tree_util.tree_map(lambda v, i=i: v[i], outs), jax_ops.lsmr(a, bs[i], **TRAJECTORY)
        )
    assert len(re.findall(r" while\(", jax.jit(solve).lower(bs).compile().as_text())) == 1


def test_show_prints_the_whole_problem(x64, capsys):
    a, b, _ = trajectory_problem((203, 37))
    jax_ops.lsmr(row_sharded(a, mesh_of((2, 4)), "r"), b, show=True)
    printed = capsys.readouterr().out
    assert "The matrix A has 203 rows and 37 columns" in printed and "istop =" in printed


# ---- gradients -------------------------------------------------------------------------------------------------

TIGHT = dict(atol=1e-12, btol=1e-12)


@pytest.mark.parametrize(
    ("kind", "damp", "with_x0"), [("dense", 0.0, True), ("csr", 0.5, False)], ids=["dense-x0", "csr-damped"]
)
def test_gradients_match_single_device(x64, kind, damp, with_x0):
    """grad w.r.t. b, x0 and the matrix values through row_sharded (dense entries; a BCSR's data, gathered into
    the shards' blocks) equal the single-device grads: the adjoint solves run sharded too."""
    a, b, x0 = trajectory_problem((90, 20))  # 4 x 23 rows: 2 padding rows
    x0 = x0 if with_x0 else None
    mesh = mesh_of((2, 4))
    bcsr = jsparse.BCSR.from_scipy_sparse(a)
    values = a.toarray() if kind == "dense" else bcsr.data

    def loss(values, b, x0, sharded):
        A = values if kind == "dense" else jsparse.BCSR((values, bcsr.indices, bcsr.indptr), shape=a.shape)
        A = row_sharded(A, mesh, "r") if sharded else A
        return jnp.sum(jnp.sin(jax_ops.lsmr(A, b, damp=damp, x0=x0, **TIGHT).x))

    argnums = (0, 1, 2) if with_x0 else (0, 1)
    with jax.set_mesh(mesh):
        got = jax.grad(loss, argnums=argnums)(values, b, x0, True)
    want = jax.grad(loss, argnums=argnums)(values, b, x0, False)
    tol = dict(rtol=1e-6, atol=1e-8)  # the adjoint solves' accuracy, at atol = btol = 1e-12
    for g, w in zip(got[:2], want[:2]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **tol)
    if with_x0:  # 0 up to the solve's accuracy: the least-squares x does not depend on x0 (damp = 0)
        np.testing.assert_allclose(np.asarray(got[2]), np.asarray(want[2]), atol=1e-7)


def test_gradient_inside_a_shard_map(x64):
    """With the CPU twin's kernels (typed varying where their inputs vary: the adjoint solve's vectors are)."""
    a, b, x0 = trajectory_problem((96, 20))
    a = a.toarray()
    mesh = mesh_of((2, 4))
    rows = NamedSharding(mesh, P("r"))
    solve = jax.shard_map(
        lambda a, b, x0: jax_ops.lsmr(a, b, damp=0.3, x0=x0, axis_name="r", implementation="ffi", **TIGHT).x,
        mesh=mesh, in_specs=(P("r"), P("r"), P()), out_specs=P(),
    )  # fmt: skip
    loss = lambda solve: lambda a, b, x0: jnp.sum(jnp.cos(solve(a, b, x0)))  # noqa: E731
    with jax.set_mesh(mesh):
        got = jax.jit(jax.grad(loss(solve), argnums=(0, 1, 2)))(
            jax.device_put(a, rows), jax.device_put(b, rows), x0
        )
    single = lambda a, b, x0: jax_ops.lsmr(a, b, damp=0.3, x0=x0, implementation="ffi", **TIGHT).x  # noqa: E731
    want = jax.grad(loss(single), argnums=(0, 1, 2))(a, b, x0)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-9)


# ---- communication -------------------------------------------------------------------------------------------

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \(", re.M)
_CALLED = re.compile(r"(?:body|condition|calls|to_apply|branch_computations)=\{?%?([\w.\-]+)")


def computations(hlo: str) -> dict[str, str]:
    starts = [(m.start(), m.group(1)) for m in _COMPUTATION.finditer(hlo)]
    ends = [s for s, _ in starts[1:]] + [len(hlo)]
    return {name: hlo[s:e] for (s, name), e in zip(starts, ends)}


def collectives(hlo: str, names=None) -> dict[str, int]:
    """Counts of each collective op in ``hlo`` (in the computations ``names`` and those they call, if given)."""
    if names is not None:
        comps, todo, seen = computations(hlo), list(names), set()
        while todo:
            name = todo.pop()
            if name not in seen and name in comps:
                seen.add(name)
                todo += _CALLED.findall(comps[name])
        hlo = "\n".join(comps[n] for n in seen)
    ops = (
        "all-reduce",
        "all-gather",
        "all-to-all",
        "collective-permute",
        "reduce-scatter",
        "collective-broadcast",
    )
    return {op: len(re.findall(rf"= [^=]*? {op}(?:-start)?\(", hlo)) for op in ops}


@pytest.mark.parametrize(("kind", "unroll"), [("dense", 1), ("csr", 2)])
def test_hlo_all_reduces_only(x64, kind, unroll):
    """The compiled solve communicates by all-reduce alone: per iteration one for ||u|| and one for A^T u; before
    the loop one for ||b|| and one for A^T u (and one for ||b - A x0|| with x0)."""
    a, b, x0 = trajectory_problem((203, 37))
    sharded = row_sharded(operand(a, kind), mesh_of((2, 4)), "r")
    for with_x0 in (False, True):
        hlo = (
            jax.jit(lambda A, b, x0: jax_ops.lsmr(A, b, x0=x0, unroll=unroll))
            .lower(sharded, b, x0 if with_x0 else None)
            .compile()
            .as_text()
        )
        whiles = re.findall(r" while\(.*?body=%?([\w.\-]+)", hlo)
        assert len(whiles) == 1
        counts = collectives(hlo)
        assert sum(counts.values()) == counts["all-reduce"]
        assert collectives(hlo, whiles)["all-reduce"] == 2 * unroll
        # XLA may combine the initial ||b|| and ||b - A x0|| into one all-reduce of a tuple
        assert 2 <= counts["all-reduce"] - 2 * unroll <= 2 + with_x0


def test_hlo_gradient_all_reduces_only(x64):
    """fwd + bwd: all-reduces alone (rows that divide evenly: with padding rows, returning b's cotangent without
    them gathers it once, after the solves)."""
    a, b, _ = trajectory_problem((96, 20))
    mesh = mesh_of((2, 4))
    sharded = row_sharded(a.toarray(), mesh, "r")
    loss = lambda A, b: jnp.sum(jax_ops.lsmr(A, b, damp=0.1).x ** 2)  # noqa: E731
    with jax.set_mesh(mesh):
        hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(sharded, b).compile().as_text()
    counts = collectives(hlo)
    assert counts["all-reduce"] > 0 and sum(counts.values()) == counts["all-reduce"]
    assert len(re.findall(r" while\(", hlo)) == 3  # the solve and the two adjoint solves


# ---- bad inputs ------------------------------------------------------------------------------------------------


def test_bad_inputs(x64):
    a, b, _ = trajectory_problem((40, 10))
    dense = a.toarray()
    mesh = mesh_of((2, 4))
    with pytest.raises(ValueError, match="names no axis of the mesh"):
        row_sharded(dense, mesh, "rows")
    with pytest.raises(ValueError, match="repeats an axis"):
        row_sharded(dense, mesh, ("r", "r"))
    with pytest.raises(TypeError, match="jax.sharding.Mesh"):
        row_sharded(dense, "mesh", "r")
    with pytest.raises(ValueError, match="3 row blocks for 4 shards"):
        row_sharded([dense[:10], dense[10:20], dense[20:]], mesh, "r")
    with pytest.raises(ValueError, match="one column count"):
        row_sharded([dense[:10, :9], dense[10:20], dense[20:30], dense[30:]], mesh, "r")
    with pytest.raises(TypeError, match="row blocks must be dense"):
        row_sharded([a[:10], a[10:20], a[20:30], a[30:]], mesh, "r")
    with pytest.raises(TypeError, match="takes no options"):
        row_sharded(dense, mesh, "r", balance="nnz")
    with pytest.raises(ValueError, match="2-D"):
        row_sharded(np.ones(5), mesh, "r")
    with pytest.raises(TypeError, match="complex"):
        row_sharded(np.ones((8, 2), np.complex64), mesh, "r")
    with pytest.raises(ValueError, match="transposed RowShardedCSR"):
        jax_ops.lsmr(row_sharded(a, mesh, "r").T, b[:10])
    sharded = row_sharded(dense, mesh, "r")
    with pytest.raises(ValueError, match="b must have length 40"):
        jax_ops.lsmr(sharded, b[:-1])
    with pytest.raises(ValueError, match="NaN or Inf"):
        jax_ops.lsmr(sharded, np.where(np.arange(40) == 3, np.nan, b))
    with pytest.raises(ValueError, match="runs its own shard_map"):
        jax_ops.lsmr(sharded, b, axis_name="r")
    with pytest.raises(ValueError, match="not an axis of an enclosing jax.shard_map"):
        jax_ops.lsmr(a, b, axis_name="r")
    rows = NamedSharding(mesh, P("r"))
    for axis, rhs, message in (
        ("rows", b, "not an axis of an enclosing"),
        ("r", b[:-8], "this shard's rows of A"),
    ):
        solve = jax.shard_map(
            lambda a, b, axis=axis: jax_ops.lsmr(a, b, axis_name=axis).x,
            mesh=mesh,
            in_specs=P("r"),
            out_specs=P(),
        )
        with pytest.raises(ValueError, match=message):
            solve(jax.device_put(dense, rows), jax.device_put(rhs, rows))
