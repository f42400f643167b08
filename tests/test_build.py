"""The build and the FFI registration."""

import jax
import pytest

import jax_ops
from jax_ops import _ffi

CPU_TARGETS = {"jax_ops_lsmr_hbar_x", "jax_ops_lsmr_h"}


def test_cpu_module_lists_targets():
    assert CPU_TARGETS <= set(_ffi.target_names("cpu"))


def test_registration_platforms():
    platforms = _ffi.ensure_registered()
    assert "cpu" in platforms
    assert ("CUDA" in platforms) == (jax.default_backend() == "gpu" or _has_cuda())
    assert _ffi.ensure_registered() is platforms  # registers once


def _has_cuda():
    try:
        return bool(jax.devices("cuda"))
    except RuntimeError:
        return False


def test_cuda_module_mirrors_cpu_targets():
    if not jax_ops.has_cuda_build():
        pytest.skip("CPU-only build")
    try:
        names = set(_ffi.target_names("CUDA"))  # imports the CUDA module; needs no GPU, only the libraries
    except ImportError as e:
        pytest.skip(f"CUDA module built but its libraries are not loadable here: {e}")
    # Every CPU target has a CUDA twin; the CUDA module adds CUDA-only diagnostics.
    assert CPU_TARGETS | {"jax_ops_runtime_info"} <= names


def test_runtime_info_without_cuda_is_none():
    if _has_cuda():
        pytest.skip("has a CUDA backend")
    assert jax_ops.runtime_info() is None


def test_gpu_backend_without_cuda_build_raises(monkeypatch):
    monkeypatch.setattr(_ffi, "_registered_platforms", None)
    monkeypatch.setattr(_ffi, "_has_cuda_backend", lambda: True)
    monkeypatch.setattr(_ffi, "cuda_module", lambda: None)
    with pytest.raises(RuntimeError, match="no CUDA kernels"):
        _ffi.ensure_registered()


@pytest.mark.gpu
def test_runtime_info_on_gpu():
    info = jax_ops.runtime_info()
    assert info is not None
    assert info["sm_count"] > 0
    assert info["cc_major"] >= 8
    assert info["cublaslt_version"] > 0
    assert info["cusparse_version"] > 0
    assert info["cudart_version"] >= 12000
