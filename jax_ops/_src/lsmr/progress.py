"""``show=True``: SciPy-style text around a solve that runs outside any trace — the problem before it, the stop
reason and the final estimates after it. The iterations themselves run on the device in one loop, so no line per
iteration is printed; under jit/vmap/grad ``show`` is ignored (with a one-time warning)."""

from __future__ import annotations

import jax
import numpy as np

from jax_ops import _checks
from jax_ops._src.lsmr.types import ISTOP_MESSAGES


def can_print(*trees) -> bool:
    """Whether every array of the solve is concrete (no trace active); warns once when show cannot print."""
    concrete = not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(trees))
    if not concrete:
        _checks.warn_once(
            "lsmr-show", "lsmr: show=True is ignored inside jit/vmap/grad (nothing to print yet)"
        )
    return concrete


def _f(x) -> float:
    return float(np.asarray(x).reshape(-1)[0])


def header(m: int, n: int, damp, atol, btol, conlim, maxiter) -> None:
    print()
    print("LSMR            Least-squares solution of  Ax = b")
    print(f"The matrix A has {m} rows and {n} columns")
    print(f"damp = {_f(damp):20.14e}")
    print(f"atol = {_f(atol):8.2e}                 conlim = {_f(conlim):8.2e}")
    print(f"btol = {_f(btol):8.2e}             maxiter = {int(_f(maxiter)):8d}")


def summary(out) -> None:
    istop = int(out.istop)
    print()
    print("LSMR finished")
    print(ISTOP_MESSAGES[istop])
    print(f"istop ={istop:8d}    normr ={_f(out.normr):8.1e}")
    print(f"    normA ={_f(out.norma):8.1e}    normAr ={_f(out.normar):8.1e}")
    print(f"itn   ={int(out.itn):8d}    condA ={_f(out.conda):8.1e}")
    print(f"    normx ={_f(out.normx):8.1e}")
