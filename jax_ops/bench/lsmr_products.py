"""Suite ``lsmr_products`` (not part of ``all``): the sparse products of LSMR's iteration, one and 16 RHS.

    python -m jax_ops.bench lsmr_products [--only 11kv --only ba] [--json out.json]

For LSMR's problems (``jax_ops.bench.lsmr``'s generators; ``--quick`` or a CPU run uses the small versions) it
builds the CSRPair and times, each in a dependent loop inside one jit (``time_loop``; the output feeds the next
call's y, aliased like LSMR's fused updates):

  * ``A V``: ``matmat`` of V [n, 16] into y [m, 16] (the N = 16 SpMM alone, no transposes);
  * ``At U``: ``rmatmat`` of U [m, 16] into y [n, 16];
  * ``vmap A v`` / ``vmap At u``: ``jax.vmap(matvec_axpby)`` / ``jax.vmap(rmatvec_axpby)`` over [16, n] / [16, m]
    vectors: the 16-RHS block solve's call (the sparse vmap rule folds the batch into N = 16, transposes included);
  * ``A v`` / ``At u``: the single-RHS fused products.

Rows carry the plans (``plan`` for A, ``plan_t`` for Aᵀ) so a change of dispatch is visible next to its time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jax_ops.bench import lsmr as lsmr_bench
from jax_ops.bench.harness import time_loop

K = 16  # right-hand sides of the block solve


def _products(pair, m: int, n: int):
    """(name, step, carry, operand) for each timed product."""
    rng = np.random.default_rng(0)
    v = jnp.asarray(rng.standard_normal((n, K)), jnp.float32)  # [n, 16]
    u = jnp.asarray(rng.standard_normal((m, K)), jnp.float32)  # [m, 16]
    vt, ut = v.T.copy(), u.T.copy()  # [16, n], [16, m]: LSMR's block layout
    return [
        ("A V", lambda c, p, x: p.matmat(x, beta=-0.5, y=c), u, v),
        ("At U", lambda c, p, x: p.rmatmat(x, beta=-0.5, y=c), v, u),
        ("vmap A v", lambda c, p, x: jax.vmap(p.matvec_axpby, in_axes=(0, 0, None))(x, c, -0.5), ut, vt),
        ("vmap At u", lambda c, p, x: jax.vmap(p.rmatvec_axpby, in_axes=(0, 0, None))(x, c, -0.5), vt, ut),
        ("A v", lambda c, p, x: p.matvec_axpby(x, c, -0.5), ut[0], vt[0]),
        ("At u", lambda c, p, x: p.rmatvec_axpby(x, c, -0.5), vt[0], ut[0]),
    ]


def run(ctx) -> list[dict]:
    problems = [
        p for p in lsmr_bench._problems(ctx.quick, jax.default_backend() == "gpu") if ctx.selected(p.name)
    ]
    rows: list[dict] = []
    progress = ctx.progress(len(problems) * 6, "lsmr_products", rows)
    for p in problems:
        a, _ = lsmr_bench._build(p)
        pair, kind = lsmr_bench._operator(a)
        if kind != "CSRPair":
            raise RuntimeError(f"lsmr_products needs jax_ops.sparse ({kind})")
        m, n = a.shape
        case = f"{p.name} nnz={a.nnz / 1e6:.2f}M"
        note = f"plan {pair.plan.algorithm}/{pair.plan.group}, plan_t {pair.plan_t.algorithm}/{pair.plan_t.group}"
        for name, step, carry, operand in _products(pair, m, n):
            seconds = time_loop(step, carry, pair, operand, min_seconds=0.05, repeats=3)
            rows.append({"case": case, "impl": name, "time_us": seconds * 1e6, "note": note})
            progress.step(f"{p.name} {name}: {seconds * 1e6:.1f} us")
    return rows
