"""Suite ``lsmr_kernels``: the fused LSMR update (hbar, x) against the same expression in jnp (XLA fuses it too).

Bytes counted: 5 vectors (read h, hbar, x; write hbar, x).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jax_ops import lsmr_kernels
from jax_ops.bench.harness import time_loop


def run(ctx) -> list[dict]:
    on_gpu = jax.default_backend() == "gpu"
    sizes = [10**5, 10**6, 10**7, 10**8] if on_gpu else [10**5, 10**6, 10**7]
    if ctx.quick:
        sizes = sizes[:-1]
    dtypes = [jnp.float32, jnp.float64] if jax.config.jax_enable_x64 else [jnp.float32]
    rows = []
    progress = ctx.progress(len(sizes) * len(dtypes) * 2, "lsmr_kernels", rows)
    for dtype in dtypes:
        for n in sizes:
            keys = jax.random.split(jax.random.key(n), 3)
            h, hbar, x = (jax.random.normal(k, (n,), dtype) for k in keys)
            c_h = jnp.asarray(0.5, dtype)
            c_x = jnp.asarray(1e-3, dtype)
            nbytes = 5 * n * jnp.dtype(dtype).itemsize
            times = {}
            for impl in ("jax_ops", "xla"):
                implementation = "ffi" if impl == "jax_ops" else "xla"

                def step(carry, h, c_h, c_x, implementation=implementation):
                    hbar, x = carry
                    return lsmr_kernels.hbar_x_update(h, hbar, x, c_h, c_x, implementation=implementation)

                times[impl] = time_loop(step, (hbar, x), h, c_h, c_x)
                progress.step(f"{impl} n={n:.0e} {jnp.dtype(dtype).name}")
            for impl, t in times.items():
                gbps = nbytes / t / 1e9
                rows.append(
                    {
                        "case": f"n={n:.0e} {jnp.dtype(dtype).name}",
                        "impl": impl,
                        "time_us": t * 1e6,
                        "GB/s": gbps,
                        "frac_copy": gbps / ctx.ceilings.copy_gbps,
                        "speedup_vs_xla": times["xla"] / t,
                    }
                )
    return rows
