"""Gradients of the solve: ``custom_vjp`` around the vmappable block solve. The backward pass solves the adjoint
least-squares problems (A^T for b's cotangent, the augmented [A; damp I] for A's) with the same tolerances."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero

from jax_ops._src.lsmr.batching import block_vmap
from jax_ops._src.lsmr.config import LoopConfig
from jax_ops._src.lsmr.loop import solve_block
from jax_ops._src.lsmr.operators import Augmented, Transposed


@functools.lru_cache(maxsize=64)
def block_solver(spec, has_x0: bool, loop: LoopConfig, implementation):
    """custom_vjp(custom_vmap(block solve)) for one static configuration; signature (leaves, B, X0, cp)."""

    def plain(leaves, B, X0, cp):
        return solve_block(spec, has_x0, loop, implementation, leaves, B, X0, cp)

    solve = block_vmap(plain)

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
        y = block_solver(Transposed(spec), False, loop, implementation)(
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
            w = block_solver(Augmented(spec), False, loop, implementation)(
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
