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


def main() -> None:
    print(f"jax {jax.__version__} on {jax.devices()[0].device_kind}; CUDA build: {jax_ops.has_cuda_build()}")
    if jax_ops.runtime_info():
        print(f"runtime: {jax_ops.runtime_info()}")
    check_recurrence()
    print("all ops OK")


if __name__ == "__main__":
    main()
