"""One ``implementation=`` vocabulary for every family, and the one place that picks a backend.

``None`` picks the fastest correct path for the platform (the family says which one that is on the CPU),
``"ffi"`` forces our kernel (the CUDA kernel on a GPU, the CPU twin on the CPU) and raises when it cannot run the
inputs, ``"xla"`` forces the plain jax.numpy reference.
"""

from __future__ import annotations

import warnings

import jax

IMPLEMENTATIONS = (None, "ffi", "xla")

_warned: set[tuple[str, str]] = set()


def check_implementation(implementation: str | None) -> None:
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")


DEFAULT_SM_COUNT = 132  # H100/H200 SXM: what the launch-shape rules assume when no GPU is visible


def sm_count() -> int:
    """Streaming multiprocessors of the first visible GPU (DEFAULT_SM_COUNT when there is none)."""
    count = getattr(first_gpu(), "core_count", None)
    return int(count) if count else DEFAULT_SM_COUNT


def first_gpu():
    """The first visible GPU device, or None."""
    try:
        return next((d for d in jax.devices() if d.platform == "gpu"), None)
    except RuntimeError:
        return None


def compute_capability(device) -> tuple[int, int] | None:
    """(major, minor) of a GPU device; None for None or a device that does not say."""
    try:
        major, minor = (int(x) for x in str(device.compute_capability).split(".")[:2])
    except (AttributeError, TypeError, ValueError):
        return None
    return major, minor


def platform() -> str:
    """The platform traced code runs on: "gpu" or "cpu" (JAX's default backend)."""
    return "gpu" if jax.default_backend() in ("gpu", "cuda", "rocm") else "cpu"


def choose(
    op: str,
    implementation: str | None,
    *,
    unsupported: str | None = None,
    default_on_cpu: str = "ffi",
) -> str:
    """Returns "ffi" or "xla" for one call of ``op``.

    ``unsupported``: why the kernel cannot run these inputs (None when it can). With ``implementation=None``
    that falls back to XLA with a one-time warning naming the reason; with ``"ffi"`` it raises ``ValueError``.
    ``default_on_cpu``: what ``None`` runs on the CPU when the kernel could run ("xla" where XLA's CPU code is
    faster than the single-threaded CPU twin).
    """
    check_implementation(implementation)
    if implementation == "xla":
        return "xla"
    if unsupported is not None:
        if implementation == "ffi":
            raise ValueError(f"{op}: implementation='ffi' cannot run these inputs: {unsupported}")
        key = (op, unsupported)
        if key not in _warned:
            _warned.add(key)
            warnings.warn(f"{op}: running the XLA reference path ({unsupported})", stacklevel=3)
        return "xla"
    if implementation is None and platform() == "cpu":
        return default_on_cpu
    return "ffi"
