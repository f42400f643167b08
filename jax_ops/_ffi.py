"""FFI bridge: loads the compiled modules once, registers every target, and builds ``jax.ffi.ffi_call``s.

The CPU module (``_jax_ops_cpu``) always exists. The CUDA module (``_jax_ops_cuda``) links cuBLASLt and
cuSPARSE, so it is imported only when JAX has a CUDA backend: ``import jax_ops`` works on machines without any
CUDA library. Registration happens lazily, on the first op call (trace time), for every platform present.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib
import importlib.util
import os
import threading
from typing import Any

import jax

_lock = threading.Lock()
_registered_platforms: tuple[str, ...] | None = None


def _cpu_module():
    try:
        return importlib.import_module("jax_ops._jax_ops_cpu")
    except ImportError as e:
        raise ImportError(
            f"jax_ops's compiled CPU module is missing ({e}). jax_ops was imported from "
            f"{os.path.dirname(__file__)}, which has not been built: install it with "
            "`pip install -r requirements-dev.txt && pip install --no-build-isolation -e .` (see README)."
        ) from e


def _has_cuda_backend() -> bool:
    try:
        return len(jax.devices("cuda")) > 0
    except RuntimeError:
        return False


def _preload_cuda_libraries() -> None:
    """Makes cuBLASLt/cuSPARSE from the NVIDIA wheels loadable by soname before the CUDA module imports.

    JAX's CUDA plugin usually has them loaded already; this covers installs where the module's RPATH
    (``$ORIGIN/../nvidia/cu13/lib``) does not point at the wheels (e.g. ``pip install --target``).
    """
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return
    for root in spec.submodule_search_locations:
        for pattern in (
            "cu13/lib/libcublasLt.so.*",
            "cu13/lib/libcusparse.so.*",
            "cublas/lib/libcublasLt.so.*",
            "cusparse/lib/libcusparse.so.*",
            "nvjitlink/lib/libnvJitLink.so.*",
            "cu13/lib/libnvJitLink.so.*",
        ):
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                try:
                    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass


def cuda_module():
    """The compiled CUDA module, or None when this build has none."""
    if importlib.util.find_spec("jax_ops._jax_ops_cuda") is None:
        return None
    try:
        return importlib.import_module("jax_ops._jax_ops_cuda")
    except ImportError:
        _preload_cuda_libraries()
        return importlib.import_module("jax_ops._jax_ops_cuda")


def has_cuda_build() -> bool:
    return importlib.util.find_spec("jax_ops._jax_ops_cuda") is not None


def ensure_registered() -> tuple[str, ...]:
    """Registers all targets (once) for "cpu" and, when a CUDA backend exists, "CUDA". Returns the platforms."""
    global _registered_platforms
    if _registered_platforms is not None:
        return _registered_platforms
    with _lock:
        if _registered_platforms is not None:
            return _registered_platforms
        platforms = ["cpu"]
        for name, capsule in _cpu_module().registrations().items():
            jax.ffi.register_ffi_target(name, capsule, platform="cpu")
        if _has_cuda_backend():
            module = cuda_module()
            if module is None:
                raise RuntimeError(
                    "JAX has a CUDA backend but this jax_ops build has no CUDA kernels (it was built without "
                    "nvcc or with JAX_OPS_CUDA=OFF). Rebuild with `JAX_OPS_CUDA=ON pip install "
                    "--no-build-isolation .` on a machine with nvcc and the cuBLAS/cuSPARSE headers, or run "
                    "on the CPU (JAX_PLATFORMS=cpu)."
                )
            for name, capsule in module.registrations().items():
                jax.ffi.register_ffi_target(name, capsule, platform="CUDA")
            platforms.append("CUDA")
        _registered_platforms = tuple(platforms)
        return _registered_platforms


@functools.cache
def constants() -> dict[str, int | tuple[int, ...]]:
    """The facts the native code and Python share (tile caps, supported head dims, scalar orders), read from the
    CPU module (always built; its constants are the same headers the CUDA module compiles): ``{"<family>_<name>":
    value}``. Python never retypes a native constant."""
    return {
        name: tuple(value) if isinstance(value, (list, tuple)) else value
        for name, value in _cpu_module().constants().items()
    }


def target_names(platform: str) -> list[str]:
    """Names of the targets the build provides for ``platform`` ("cpu" or "CUDA")."""
    if platform == "cpu":
        return sorted(_cpu_module().registrations())
    module = cuda_module()
    return sorted(module.registrations()) if module is not None else []


def ffi_call(
    target: str,
    result_shape_dtypes: Any,
    *args: Any,
    input_output_aliases: dict[int, int] | None = None,
    vmap_method: str = "broadcast_all",
    **attributes: Any,
):
    """Calls the FFI target ``target`` on ``args`` (registering targets first). Attributes must be static."""
    ensure_registered()
    call = jax.ffi.ffi_call(
        target,
        result_shape_dtypes,
        input_output_aliases=input_output_aliases,
        vmap_method=vmap_method,
    )
    return call(*args, **attributes)


@functools.cache
def runtime_info() -> dict[str, int] | None:
    """Device and library versions reported by the CUDA module (None without a CUDA backend).

    Running it creates the cuBLASLt and cuSPARSE handles through the native handle pools.
    """
    if "CUDA" not in ensure_registered():
        return None
    import jax.numpy as jnp

    with jax.default_device(jax.devices("cuda")[0]):
        out = jax.jit(lambda: ffi_call("jax_ops_runtime_info", jax.ShapeDtypeStruct((8,), jnp.int32)))()
    keys = (
        "device",
        "sm_count",
        "cc_major",
        "cc_minor",
        "cublaslt_version",
        "cusparse_version",
        "cudart_version",
        "driver_version",
    )
    return dict(zip(keys, (int(v) for v in out)))
