"""Distributed sparse least squares: ``jax_ops.lsmr`` with the rows of A split over every device.

A random sparse tall system (a few entries per row plus a diagonal, b = A x_true + noise) is solved twice: on one
device, and with ``jax_ops.lsmr_solver.row_sharded(A, mesh, "rows")`` (a ``jax_ops.sparse.RowShardedCSR``) over a 1-D
mesh of all ``jax.devices()``, where each device holds a block of A's rows and of b, and the solution x is
replicated. Each iteration's A v is local; A^T u and ||u|| are one ``psum`` each (docs/lsmr.md, "Row-sharded
solves"). The two solves are compared (stop code, iterations, relative x difference) and the residual
||A x - b|| / ||b|| of each is printed; the run fails when they differ by more than rounding.

    python examples/distributed_lsmr.py            # CPU: 8 fake devices (set below unless XLA_FLAGS says), seconds
    python examples/distributed_lsmr.py --rows 4000000 --cols 200000 --dtype float32
                                                   # a multi-GPU machine: every GPU holds rows / devices rows
"""

from __future__ import annotations

import os

# The flag only takes effect before jax is imported (and only on the CPU); a device count already in XLA_FLAGS wins.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    ).strip()

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402
from jax.experimental import sparse as jsparse  # noqa: E402

import jax_ops  # noqa: E402
from jax_ops.lsmr_solver import row_sharded  # noqa: E402


def problem(rows: int, cols: int, per_row: int, dtype, seed: int = 0):
    """A sparse [rows, cols] matrix with ``per_row`` random entries per row plus a diagonal, and b = A x + noise."""
    rng = np.random.default_rng(seed)
    r = np.repeat(np.arange(rows), per_row)
    c = rng.integers(0, cols, rows * per_row)
    v = rng.standard_normal(rows * per_row)
    diag = np.arange(min(rows, cols))
    a = sp.csr_matrix(
        (
            np.concatenate([v, np.full(diag.size, 2.0)]),
            (np.concatenate([r, diag]), np.concatenate([c, diag])),
        ),
        shape=(rows, cols),
    )
    x_true = rng.standard_normal(cols)
    b = a @ x_true + 0.01 * rng.standard_normal(rows)
    return a.astype(dtype), b.astype(dtype)


def timed(solve, *args):
    """(result, seconds) of a jitted call after its compilation and one warm run."""
    jax.block_until_ready(solve(*args))
    t0 = time.perf_counter()
    out = jax.block_until_ready(solve(*args))
    return out, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--cols", type=int, default=2_000)
    ap.add_argument("--per-row", type=int, default=4, help="random entries per row (plus the diagonal)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    ap.add_argument("--damp", type=float, default=0.0)
    args = ap.parse_args(argv)
    with jax.enable_x64(args.dtype == "float64"):
        return run(args)


def run(args) -> dict:
    a, b = problem(args.rows, args.cols, args.per_row, np.dtype(args.dtype))
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("rows",))
    sharded = row_sharded(
        a, mesh, "rows"
    )  # a sparse.RowShardedCSR, split on the host once; b is placed per solve
    print(
        f"A: {a.shape[0]} x {a.shape[1]}, nnz {a.nnz}, {args.dtype}; {len(devices)} {devices[0].platform} devices, "
        f"{sharded.rows_per_shard} rows each"
    )

    tol = 1e-8 if args.dtype == "float64" else 1e-6
    kw = dict(damp=args.damp, atol=tol, btol=tol)
    bcsr = jsparse.BCSR.from_scipy_sparse(a)
    single_op = jax_ops.sparse.csr_pair(bcsr) if devices[0].platform == "gpu" else bcsr  # jit arguments
    single, t_single = timed(jax.jit(lambda A, b: jax_ops.lsmr(A, b, **kw)), single_op, jnp.asarray(b))
    ours, t_sharded = timed(jax.jit(lambda A, b: jax_ops.lsmr(A, b, **kw)), sharded, b)

    a64, b64 = a.astype(np.float64), b.astype(np.float64)

    def residual(x):
        return float(np.linalg.norm(a64 @ np.asarray(x, np.float64) - b64) / np.linalg.norm(b64))

    x_diff = float(
        np.linalg.norm(np.asarray(ours.x) - np.asarray(single.x)) / np.linalg.norm(np.asarray(single.x))
    )
    print(f"{'':12s} {'istop':>5s} {'itn':>5s} {'time':>9s} {'|Ax-b|/|b|':>12s}")
    for name, out, t in (("one device", single, t_single), ("row-sharded", ours, t_sharded)):
        print(f"{name:12s} {int(out.istop):5d} {int(out.itn):5d} {t * 1e3:7.1f}ms {residual(out.x):12.6e}")
    print(f"|x_sharded - x_single| / |x_single| = {x_diff:.2e}")
    result = {
        "devices": len(devices),
        "single": (int(single.istop), int(single.itn), residual(single.x)),
        "sharded": (int(ours.istop), int(ours.itn), residual(ours.x)),
        "x_diff": x_diff,
    }
    # the same solve to rounding: stop code, iterations (float32: within 2 %), residual and x
    close_itn = abs(int(ours.itn) - int(single.itn)) <= (
        0 if args.dtype == "float64" else max(1, int(single.itn) // 50)
    )
    x_tol = 1e-6 if args.dtype == "float64" else 1e-2
    ok = int(ours.istop) == int(single.istop) and close_itn and x_diff <= x_tol
    ok = ok and abs(result["sharded"][2] - result["single"][2]) <= 1e-4 * result["single"][2]
    if not ok:
        raise SystemExit(f"FAIL: the row-sharded solve differs from the single-device one: {result}")
    print("PASS")
    return result


if __name__ == "__main__":
    main()
