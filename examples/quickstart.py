"""Runs every jax_ops op on the default device, checks it against the reference, prints timings.

python examples/quickstart.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import jax_ops
from jax_ops import lsmr_kernels
from jax_ops.bench import time_loop


def rel_err(out, ref) -> float:
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))


def check_recurrence() -> None:
    n = 10_000_000 if jax.default_backend() == "gpu" else 1_000_000
    k = jax.random.split(jax.random.key(0), 3)
    h, hbar, x = (jax.random.normal(kk, (n,), jnp.float32) for kk in k)
    c_h, c_x = jnp.float32(0.5), jnp.float32(1e-3)
    out = jax.jit(lsmr_kernels.hbar_x_update)(h, hbar, x, c_h, c_x)
    ref = lsmr_kernels.hbar_x_update(h, hbar, x, c_h, c_x, implementation="xla")
    errs = [rel_err(o, r) for o, r in zip(out, ref)]
    assert max(errs) < 1e-6, errs
    times = {}
    for impl in ("ffi", "xla"):
        step = lambda carry, h, c_h, c_x, impl=impl: lsmr_kernels.hbar_x_update(
            h, *carry, c_h, c_x, implementation=impl
        )
        times[impl] = time_loop(step, (hbar, x), h, c_h, c_x)
    gbps = 5 * n * 4 / times["ffi"] / 1e9
    print(
        f"lsmr_kernels.hbar_x_update  n={n:.0e} f32  rel err {max(errs):.1e}  "
        f"jax_ops {times['ffi'] * 1e6:8.1f} us ({gbps:6.0f} GB/s)  xla {times['xla'] * 1e6:8.1f} us  "
        f"speedup {times['xla'] / times['ffi']:.2f}x"
    )


def check_sparse() -> None:
    from jax.experimental import sparse as jsparse

    m = 1_000_000 if jax.default_backend() == "gpu" else 50_000
    rng = np.random.default_rng(0)
    per_row = 16
    cols = np.sort(rng.integers(0, m, (m, per_row), dtype=np.int32), axis=1).ravel()
    vals = rng.standard_normal(cols.size).astype(np.float32)
    indptr = np.arange(m + 1, dtype=np.int32) * per_row
    A = jsparse.BCSR((jnp.asarray(vals), jnp.asarray(cols), jnp.asarray(indptr)), shape=(m, m))
    pair = jax_ops.sparse.csr_pair(A)
    x = jnp.asarray(rng.standard_normal(m).astype(np.float32))
    out = jax.jit(lambda p, x: p.matvec(x))(pair, x)
    ref = jax.jit(lambda A, x: A @ x)(A, x)
    err = rel_err(out, ref)
    assert err < 1e-5, err
    t_ours = time_loop(lambda c, p: p.matvec(c) * jnp.float32(0.25), x, pair)
    t_jax = time_loop(lambda c, A: (A @ c) * jnp.float32(0.25), x, A)
    print(
        f"sparse.CSRPair.matvec       {m}x{m} 16/row f32  rel err {err:.1e}  jax_ops {t_ours * 1e6:8.1f} us  "
        f"jax BCSR {t_jax * 1e6:8.1f} us  speedup {t_jax / t_ours:.2f}x  (plan {pair.plan.algorithm})"
    )


def check_lsmr() -> None:
    import time

    m, n = (200_000, 4_000) if jax.default_backend() == "gpu" else (20_000, 400)
    rng = np.random.default_rng(1)
    rows = np.repeat(np.arange(m), 8)
    cols = rng.integers(0, n, rows.size)
    vals = rng.standard_normal(rows.size).astype(np.float32)
    import scipy.sparse as sp

    a = sp.csr_matrix((vals, (rows, cols)), shape=(m, n))
    b = rng.standard_normal(m).astype(np.float32)
    pair = jax_ops.sparse.csr_pair(a)
    solve = jax.jit(lambda p, b: jax_ops.lsmr(p, b, atol=1e-5, btol=1e-5))
    res = jax.block_until_ready(solve(pair, jnp.asarray(b)))
    t0 = time.perf_counter()
    res = jax.block_until_ready(solve(pair, jnp.asarray(b)))
    t = time.perf_counter() - t0
    # Optimality: the normal-equation residual ||A^T (b - A x)|| relative to ||A|| ||b - A x||.
    x = np.asarray(res.x, np.float64)
    r = b - a @ x
    normar = np.linalg.norm(a.T @ r) / (sp.linalg.norm(a) * np.linalg.norm(r))
    assert int(res.istop) in (1, 2, 3) and normar < 1e-3, (int(res.istop), normar)
    print(
        f"lsmr                        {m}x{n} nnz={a.nnz} f32  istop {int(res.istop)}  itn {int(res.itn)}  "
        f"|A'r|/(|A||r|) {normar:.1e}  solve {t * 1e3:8.1f} ms"
    )


def check_attention() -> None:
    on_gpu = jax.default_backend() == "gpu"
    B, T, N, D = (1, 2048, 16, 128) if on_gpu else (1, 256, 4, 64)
    dtype = jnp.bfloat16 if on_gpu else jnp.float32
    q, k, v = (jax.random.normal(jax.random.key(i), (B, T, N, D), dtype) for i in range(3))
    out = jax.jit(lambda q, k, v: jax_ops.dot_product_attention(q, k, v, is_causal=True))(q, k, v)
    ref = jax.nn.dot_product_attention(*(a.astype(jnp.float32) for a in (q, k, v)), is_causal=True)
    err = rel_err(out, ref)
    assert err < (1e-2 if dtype == jnp.bfloat16 else 1e-5), err
    t_ours = time_loop(lambda c, k, v: jax_ops.dot_product_attention(c, k, v, is_causal=True), q, k, v)
    t_nn = time_loop(lambda c, k, v: jax.nn.dot_product_attention(c, k, v, is_causal=True), q, k, v)
    print(
        f"dot_product_attention       B{B} T{T} N{N} D{D} causal {jnp.dtype(dtype).name}  rel err {err:.1e}  "
        f"jax_ops {t_ours * 1e6:8.1f} us  jax.nn {t_nn * 1e6:8.1f} us  speedup {t_nn / t_ours:.2f}x"
    )


def main() -> None:
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; CUDA build: {jax_ops.has_cuda_build()}")
    if jax_ops.runtime_info():
        print(f"runtime: {jax_ops.runtime_info()}")
    check_recurrence()
    check_sparse()
    check_lsmr()
    check_attention()
    print("all ops OK")


if __name__ == "__main__":
    main()
