"""The LSMR recurrence in jax.numpy (SciPy's, statement by statement) on blocks of k columns: the state's
initialisation, one guarded iteration (``step``; the ``"step"``/``"unfused"`` iterations and
``implementation="xla"``) and the packed scalar carry."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_ops._src.lsmr import kernels
from jax_ops._src.lsmr.kernels import scalar_order


def sum_squares(x):
    """Row sums of squares of [k, len] in the accumulator dtype: float64 for float32 when x64 is enabled."""
    if x.dtype == jnp.float32 and jax.config.jax_enable_x64:
        x = x.astype(jnp.float64)
    return jnp.sum(x * x, axis=-1)


def norm(x):
    """Row norms of [k, len]; float32 sums of squares accumulated in float64 when x64 is enabled."""
    return jnp.sqrt(sum_squares(x)).astype(x.dtype)


def sym_ortho(a, b):
    """SciPy's sym_ortho (stable Givens rotation), elementwise: returns c, s, r with [c s; -s c][a; b] = [r; 0]."""
    one = jnp.ones_like(a)
    tau1 = a / b
    s1 = jnp.sign(b) / jnp.sqrt(one + tau1 * tau1)
    c1 = s1 * tau1
    r1 = b / s1
    tau2 = b / a
    c2 = jnp.sign(a) / jnp.sqrt(one + tau2 * tau2)
    s2 = c2 * tau2
    r2 = a / c2
    big_b = jnp.abs(b) > jnp.abs(a)
    c = jnp.where(big_b, c1, c2)
    s = jnp.where(big_b, s1, s2)
    r = jnp.where(big_b, r1, r2)
    a0 = a == 0
    c = jnp.where(a0, 0, c)
    s = jnp.where(a0, jnp.sign(b), s)
    r = jnp.where(a0, jnp.abs(b), r)
    b0 = b == 0
    c = jnp.where(b0, jnp.sign(a), c)
    s = jnp.where(b0, 0, s)
    r = jnp.where(b0, jnp.abs(a), r)
    return c, s, r


def fused(implementation):
    return "xla" if implementation == "xla" else None


def init_state(spec, leaves, B, X0, cp, implementation):
    dt = B.dtype
    k, n = B.shape[0], spec.n
    zeros_k = jnp.zeros((k,), dt)
    ones_k = jnp.ones((k,), dt)
    normb = spec.range_norm(B)
    if X0 is None:
        x = jnp.zeros((k, n), dt)
        u = B
        beta = normb
    else:
        x = X0
        u = B - spec.mv(leaves, X0, cp)
        beta = spec.range_norm(u)
    pos_b = beta > 0
    u = u * jnp.where(pos_b, 1 / beta, 1)[:, None]
    v = jnp.where(pos_b[:, None], spec.rmv(leaves, u, cp), 0)
    alpha = jnp.where(pos_b, spec.domain_norm(v), 0)
    v = v * jnp.where(alpha > 0, 1 / alpha, 1)[:, None]

    s = {
        "alpha": alpha, "beta": beta, "zetabar": alpha * beta, "alphabar": alpha, "rho": ones_k,
        "rhobar": ones_k, "cbar": ones_k, "sbar": zeros_k, "betadd": beta, "betad": zeros_k, "rhodold": ones_k,
        "tautildeold": zeros_k, "thetatilde": zeros_k, "zeta": zeros_k, "d": zeros_k,
        "normA2": alpha * alpha, "maxrbar": zeros_k, "minrbar": jnp.full((k,), min(1e100, float(jnp.finfo(dt).max)), dt),
        "normA": jnp.sqrt(alpha * alpha), "condA": ones_k, "normx": zeros_k, "normr": beta,
        "normar": alpha * beta,
    }  # fmt: skip
    istop = jnp.zeros((k,), jnp.int32)
    # SciPy: normar == 0 -> return x (x0); else normb == 0 -> return x = 0. Both istop 0, itn 0.
    done = (s["normar"] == 0) | (normb == 0) | (cp.maxiter <= 0)
    x = jnp.where(((s["normar"] != 0) & (normb == 0))[:, None], 0, x)
    bad = ~(jnp.isfinite(normb) & jnp.isfinite(beta))
    istop = jnp.where(bad, -1, istop)
    done = done | bad
    x = jnp.where(bad[:, None], jnp.nan, x)
    state = {
        "x": x, "u": u, "v": v, "h": v, "hbar": jnp.zeros((k, n), dt), "itn": jnp.zeros((k,), jnp.int32),
        "istop": istop, "done": done, **s,
    }  # fmt: skip
    return state, normb


def step(spec, leaves, cp, normb, st, implementation, iteration="step"):
    """One guarded LSMR iteration for every column (a done column keeps its state)."""
    dt = st["x"].dtype
    active = ~st["done"]
    new = dict(st)
    alpha, u, v = st["alpha"], st["u"], st["v"]
    itn = st["itn"] + 1

    # Bidiagonalisation: beta*u = A v - alpha*u ; alpha*v = A^T u - beta*v.
    ub = spec.mv_axpby(leaves, v, u, -alpha, cp)
    beta = spec.range_norm(ub)
    pos_b = beta > 0
    u = ub * jnp.where(pos_b, 1 / beta, 1)[:, None]
    vb = spec.rmv_axpby(leaves, u, v, -beta, cp)
    alpha_raw = spec.domain_norm(vb)
    alpha = jnp.where(pos_b, alpha_raw, alpha)
    # v = vb / alpha (kept when beta = 0) is applied by the fused update below.
    s_v = jnp.where(alpha_raw > 0, 1 / alpha_raw, 1).astype(dt)
    keep_v = (~pos_b).astype(dt)

    # Rotations.
    chat, shat, alphahat = sym_ortho(st["alphabar"], cp.damp)
    rhoold = st["rho"]
    c, s, rho = sym_ortho(alphahat, beta)
    thetanew = s * alpha
    alphabar = c * alpha
    rhobarold = st["rhobar"]
    zetaold = st["zeta"]
    thetabar = st["sbar"] * rho
    rhotemp = st["cbar"] * rho
    cbar, sbar, rhobar = sym_ortho(st["cbar"] * rho, thetanew)
    zeta = cbar * st["zetabar"]
    zetabar = -sbar * st["zetabar"]

    # v, h, hbar, x and partial norms of x in one fused kernel; zero coefficients freeze a finished column's x.
    c_h = jnp.where(active, thetabar * rho / (rhoold * rhobarold), 0).astype(dt)
    c_x = jnp.where(active, zeta / (rho * rhobar), 0).astype(dt)
    c_v = jnp.where(active, thetanew / rho, 0).astype(dt)
    if iteration != "unfused":
        v, h, hbar, x, x_parts = kernels.step_update(
            vb,
            v,
            st["h"],
            st["hbar"],
            st["x"],
            s_v,
            keep_v,
            c_h,
            c_x,
            c_v,
            implementation=fused(implementation),
        )
    else:
        v = jnp.where(keep_v[:, None] != 0, v, vb * s_v[:, None])
        hbar, x = kernels.hbar_x_update(
            st["h"], st["hbar"], st["x"], c_h, c_x, implementation=fused(implementation)
        )
        h = kernels.h_update(v, st["h"], c_v, implementation=fused(implementation))
        x_parts = x

    # Estimate ||r||.
    betadd = st["betadd"]
    betaacute = chat * betadd
    betacheck = -shat * betadd
    betahat = c * betaacute
    betadd = -s * betaacute
    thetatildeold = st["thetatilde"]
    ctildeold, stildeold, rhotildeold = sym_ortho(st["rhodold"], thetabar)
    thetatilde = stildeold * rhobar
    rhodold = ctildeold * rhobar
    betad = -stildeold * st["betad"] + ctildeold * betahat
    tautildeold = (zetaold - thetatildeold * st["tautildeold"]) / rhotildeold
    taud = (zeta - thetatilde * tautildeold) / rhodold
    d = st["d"] + betacheck * betacheck
    normr = jnp.sqrt(d + (betad - taud) ** 2 + betadd * betadd)

    # Estimate ||A|| and cond(A).
    normA2 = st["normA2"] + beta * beta
    normA = jnp.sqrt(normA2)
    normA2 = normA2 + alpha * alpha
    maxrbar = jnp.maximum(st["maxrbar"], rhobarold)
    minrbar = jnp.where(itn > 1, jnp.minimum(st["minrbar"], rhobarold), st["minrbar"])
    condA = jnp.maximum(maxrbar, rhotemp) / jnp.minimum(minrbar, rhotemp)

    # Convergence tests (SciPy's order: later tests win).
    normar = jnp.abs(zetabar)
    normx = spec.domain_norm(x_parts)  # the norm of x's partial norms (of x itself when "unfused") is ||x||
    test1 = normr / normb
    nr = normA * normr
    test2 = jnp.where(nr != 0, normar / jnp.where(nr != 0, nr, 1), jnp.inf)
    test3 = 1 / condA
    t1 = test1 / (1 + normA * normx / normb)
    rtol = cp.btol + cp.atol * normA * normx / normb
    ctol = jnp.where(cp.conlim > 0, 1 / cp.conlim, 0).astype(dt)
    one = jnp.ones_like(test1)
    istop = jnp.zeros_like(st["istop"])
    istop = jnp.where(itn >= cp.maxiter, 7, istop)
    istop = jnp.where(one + test3 <= one, 6, istop)
    istop = jnp.where(one + test2 <= one, 5, istop)
    istop = jnp.where(one + t1 <= one, 4, istop)
    istop = jnp.where(test3 <= ctol, 3, istop)
    istop = jnp.where(test2 <= cp.atol, 2, istop)
    istop = jnp.where(test1 <= rtol, 1, istop)
    finite = jnp.isfinite(normr) & jnp.isfinite(normar) & jnp.isfinite(normx) & jnp.isfinite(normA)
    istop = jnp.where(finite, istop, -1)

    upd = {
        "alpha": alpha, "beta": beta, "zetabar": zetabar, "alphabar": alphabar, "rho": rho, "rhobar": rhobar,
        "cbar": cbar, "sbar": sbar, "betadd": betadd, "betad": betad, "rhodold": rhodold,
        "tautildeold": tautildeold, "thetatilde": thetatilde, "zeta": zeta, "d": d, "normA2": normA2,
        "maxrbar": maxrbar, "minrbar": minrbar, "normA": normA, "condA": condA, "normx": normx, "normr": normr,
        "normar": normar, "itn": itn, "istop": istop,
    }  # fmt: skip
    for key, val in upd.items():
        new[key] = jnp.where(active, val.astype(st[key].dtype), st[key])
    new["done"] = st["done"] | (new["istop"] != 0)
    new.update(u=u, v=v, h=h, hbar=hbar, x=x)
    return new


def pack(st):
    """The loop carry with the scalars stacked: ``sc`` [len(scalar_order()), k] and ``ints`` [2, k] (itn, istop).

    One carried buffer instead of ~25 tiny ones: copy insertion then adds at most a copy or two of [.., k] per
    loop trip instead of one per scalar (each a separate device copy on a GPU). Stacking is exact, so the
    floating-point sequence of the recurrence is unchanged.
    """
    rest = {key: val for key, val in st.items() if key not in scalar_order() and key not in ("itn", "istop")}
    return {
        **rest,
        "sc": jnp.stack([st[key] for key in scalar_order()]),
        "ints": jnp.stack([st["itn"], st["istop"]]),
    }


def unpack(st):
    rest = {key: val for key, val in st.items() if key not in ("sc", "ints")}
    return {**rest, **{key: st["sc"][i] for i, key in enumerate(scalar_order())}, "itn": st["ints"][0],
            "istop": st["ints"][1]}  # fmt: skip
