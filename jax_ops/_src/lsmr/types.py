"""The solver's result, its per-column parameters and the istop codes."""

from __future__ import annotations

from typing import NamedTuple

import jax

# istop codes (SciPy's 0..7, plus ours for non-finite values).
ISTOP_MESSAGES = {
    -1: "Non-finite value met (b, x0, A*x0 or A contains NaN/Inf); x is not a solution",
    0: "The exact solution is x = 0, or x = x0, if x0 was given",
    1: "Ax - b is small enough, given atol, btol",
    2: "The least-squares solution is good enough, given atol",
    3: "The estimate of cond(Abar) has exceeded conlim",
    4: "Ax - b is small enough for this machine",
    5: "The least-squares solution is good enough for this machine",
    6: "Cond(Abar) seems to be too large for this machine",
    7: "The iteration limit has been reached",
}


class LSMRResult(NamedTuple):
    """Result of :func:`lsmr` (a pytree). Fields as in ``scipy.sparse.linalg.lsmr``'s return tuple.

    x: ``[n]`` solution (``[..., n]`` under vmap). istop: int32 stop reason (see ``ISTOP_MESSAGES``).
    itn: int32 iterations. normr: ``||b - A x||`` estimate (with damp: of the augmented residual).
    normar: ``||A^T (b - A x) - damp^2 x||`` estimate. norma: ``||Abar||_F`` estimate. conda: ``cond(Abar)``
    estimate. normx: ``||x||``. Floats have ``b``'s dtype.
    """

    x: jax.Array
    istop: jax.Array
    itn: jax.Array
    normr: jax.Array
    normar: jax.Array
    norma: jax.Array
    conda: jax.Array
    normx: jax.Array


class ColParams(NamedTuple):
    """Per-column ([k]) parameters of a block solve."""

    damp: jax.Array
    atol: jax.Array
    btol: jax.Array
    conlim: jax.Array
    maxiter: jax.Array  # int32
    aux: jax.Array  # operator parameter per column (the augmented operator's scale), else zeros
