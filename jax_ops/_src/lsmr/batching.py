"""The block solve's ``custom_vmap`` rule: vmap over ``b`` (and ``x0``, ``damp``, tolerances) folds into the block
of right-hand sides, so a vmapped solve is one loop whose products serve every column (nested vmaps fold into one
block); a batched operator (one matrix per batch element) uses JAX's own batching of the loop."""

from __future__ import annotations

import jax

from jax_ops._src.batching import fold_leading, unfold_leading
from jax_ops._src.lsmr.types import ColParams


def block_vmap(plain):
    """``custom_vmap(plain)`` for ``plain(leaves, B, X0, cp)`` (B [k, m], X0 [k, n] or None, cp [k] each)."""
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
                ColParams(*(0 if f else None for f in cp_b)),
            )
            out = jax.vmap(plain, in_axes=axes)(leaves, B, X0, cp)
            return out, jax.tree_util.tree_map(lambda _: True, out)

        B2 = fold_leading(B, B_b, axis_size)
        X02 = None if X0 is None else fold_leading(X0, X0_b, axis_size)
        cp2 = ColParams(*(fold_leading(a, f, axis_size) for a, f in zip(cp, cp_b)))
        out = solve(leaves, B2, X02, cp2)  # again through custom_vmap: nested vmaps fold into one block
        # unfold_leading uses explicit sizes: a solution x with n = 0 has no elements to infer the axis from
        out = jax.tree_util.tree_map(lambda a: unfold_leading(a, axis_size), out)
        return out, jax.tree_util.tree_map(lambda _: True, out)

    return solve
