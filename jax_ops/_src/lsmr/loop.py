"""The solve's while loop on a block of k right-hand sides: the fused iteration (``step_kernels``: the two
products and five launches of our kernels) or the jnp recurrence's (``recurrence.step``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_ops._src.lsmr import kernels
from jax_ops._src.lsmr.heuristics import use_columns
from jax_ops._src.lsmr.kernels import scalar_order
from jax_ops._src.lsmr.recurrence import init_state, pack, step, unpack
from jax_ops._src.lsmr.types import LSMRResult
from jax_ops._src.vma import varying_axes


def solve_block(spec, has_x0, loop, implementation, leaves, B, X0, cp):
    """The block solve: B [k, m] (X0 [k, n]) -> LSMRResult with a leading k."""
    state, normb = init_state(spec, leaves, B, X0 if has_x0 else None, cp, implementation)
    # A row-sharded spec runs the "step" iteration: the fused kernels' partial norms are per shard, not summed.
    if loop.iteration == "kernels" and implementation != "xla" and spec.axis_name is None:
        return solve_block_kernels(
            spec, leaves, cp, state, normb, loop.unroll, columns=use_columns(B.shape[0])
        )
    pack_, unpack_ = (pack, unpack) if loop.pack_scalars else (lambda st: st, lambda st: st)
    iteration = "step" if loop.iteration == "kernels" else loop.iteration

    def body(st):
        st = unpack_(st)
        for _ in range(loop.unroll):
            st = step(spec, leaves, cp, normb, st, implementation, iteration)
        return pack_(st)

    carry = pack_(state)
    if spec.axis_name is not None:
        carry = vary_like_body(body, carry)
    state = unpack_(jax.lax.while_loop(lambda st: ~jnp.all(st["done"]), body, carry))
    return LSMRResult(
        state["x"], state["istop"], state["itn"], state["normr"], state["normar"], state["normA"],
        state["condA"], state["normx"],
    )  # fmt: skip


def vary_like_body(body, carry):
    """``carry`` typed varying wherever ``body`` makes it vary (inside ``jax.shard_map`` a while loop's carry must
    keep its type: x and hbar start as invariant zeros but vary when the solution's space is sharded, as in the
    adjoint solve for A^T; with the damping rows of [A; damp I] every vector and scalar does)."""
    for _ in range(len(jax.tree_util.tree_leaves(carry))):  # each round adds varying axes or ends
        out = jax.eval_shape(body, carry)
        grown = jax.tree_util.tree_map(lambda c, o: varying_axes(o) - varying_axes(c), carry, out)
        if not any(jax.tree_util.tree_leaves(grown, is_leaf=lambda a: isinstance(a, frozenset))):
            return carry
        carry = jax.tree_util.tree_map(
            lambda c, axes: jax.lax.pcast(c, tuple(sorted(axes)), to="varying") if axes else c,
            carry, grown, is_leaf=lambda a: isinstance(a, frozenset),
        )  # fmt: skip
    return carry


def step_kernels(spec, leaves, cp, params, c, columns=False):
    """One guarded iteration of the fused loop (``iteration="kernels"``): the two products and five launches.

    ``c`` is the carry: vectors ``x, u, v, h, hbar`` (rows ``[k, L]``, or with ``columns`` a block solve's
    column layout ``[L, k]``, which the products' SpMM takes and gives without transposes), the scalars ``sc``
    [k, len(scalar_order())], ``ints`` [k, 3] (itn, istop, done) and ``neg_alpha`` [k] (-alpha, the next product's
    coefficient). The arithmetic is ``step``'s (ffi_cuda/lsmr/scalar_recurrence.h mirrors it statement by
    statement); only the norms' summation order differs.
    """
    mv, rmv = (spec.mv_axpby_cols, spec.rmv_axpby_cols) if columns else (spec.mv_axpby, spec.rmv_axpby)
    ub = mv(leaves, c["v"], c["u"], c["neg_alpha"], cp)  # A v - alpha u
    u, beta, vb_coef = kernels.normalize(ub, kernels.partial_norms(ub, columns=columns), columns=columns)
    # A^T u - beta v; when beta = 0, u = 0 and vb_coef = 1: vb = v, the v SciPy keeps (no copy of v needed).
    vb = rmv(leaves, u, c["v"], vb_coef, cp)
    vb_parts = kernels.partial_norms(vb, columns=columns)
    v, h, hbar, x, x_parts = kernels.iteration_step(
        vb, c["h"], c["hbar"], c["x"], vb_parts, c["sc"], c["ints"], beta, params, columns=columns
    )
    sc, ints, neg_alpha = kernels.iteration_scalars(
        c["sc"], c["ints"], c["neg_alpha"], beta, params, cp.maxiter, vb_parts, x_parts
    )
    return {"x": x, "u": u, "v": v, "h": h, "hbar": hbar, "sc": sc, "ints": ints, "neg_alpha": neg_alpha}


def solve_block_kernels(spec, leaves, cp, state, normb, unroll, columns):
    """The while loop of the fused iteration, from ``init_state``'s state (vectors transposed to the column layout
    once, before the loop, when ``columns``)."""
    dt = state["x"].dtype
    vec = (lambda a: a.T) if columns else (lambda a: a)
    ints = {"itn": state["itn"], "istop": state["istop"], "done": state["done"].astype(jnp.int32)}
    carry = {
        **{key: vec(state[key]) for key in ("x", "u", "v", "h", "hbar")},
        "sc": jnp.stack([state[key] for key in scalar_order()], axis=-1),
        "ints": jnp.stack([ints[key] for key in kernels.INTS], axis=-1),
        "neg_alpha": -state["alpha"],
    }
    # Loop invariants, in the native order (kernels.PARAMS).
    invariants = {"damp": cp.damp, "atol": cp.atol, "btol": cp.btol, "conlim": cp.conlim, "normb": normb}
    params = jnp.stack([invariants[key] for key in kernels.PARAMS], axis=-1).astype(dt)
    slot = {key: i for i, key in enumerate(kernels.INTS)}

    def body(c):
        for _ in range(unroll):
            c = step_kernels(spec, leaves, cp, params, c, columns)
        return c

    c = jax.lax.while_loop(lambda c: ~jnp.all(c["ints"][:, slot["done"]] != 0), body, carry)
    sc = {key: c["sc"][:, i] for i, key in enumerate(scalar_order())}
    return LSMRResult(
        vec(c["x"]), c["ints"][:, slot["istop"]], c["ints"][:, slot["itn"]], sc["normr"], sc["normar"], sc["normA"], sc["condA"],
        sc["normx"],
    )  # fmt: skip
