"""The build and the FFI registration."""

import pathlib
import re

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


# ---------------------------------------------------------------- the CMake source lists
ROOT = pathlib.Path(__file__).resolve().parent.parent
FFI = ROOT / "ffi_cuda"
_LISTED = re.compile(r'"\$\{CMAKE_CURRENT_LIST_DIR\}/([^"]+)"')


def _listed_sources() -> set[pathlib.Path]:
    """Every file the families' sources.cmake name (paths are ${CMAKE_CURRENT_LIST_DIR}/...)."""
    out = set()
    for cmake in FFI.rglob("sources.cmake"):
        for rel in _LISTED.findall(cmake.read_text()):
            out.add((cmake.parent / rel).resolve())
    return out


def test_sources_cmake_lists_every_translation_unit():
    """CMake has no globs: a .cu / _cpu.cc that no sources.cmake names is not built. Tools build from
    ffi_cuda/tools/CMakeLists.txt; registrations_*.cc from the top-level CMakeLists.txt."""
    listed = _listed_sources()
    units = [
        p.resolve()
        for p in FFI.rglob("*")
        if (p.suffix == ".cu" or p.name.endswith("_cpu.cc"))
        and "tools" not in p.relative_to(FFI).parts
        and p.parent != FFI
    ]
    assert units, "no translation units found"
    missing = sorted(str(p.relative_to(ROOT)) for p in units if p not in listed)
    assert not missing, f"not named by any ffi_cuda/<family>/sources.cmake (so not built): {missing}"
    gone = sorted(str(p) for p in listed if not p.exists())
    assert not gone, f"sources.cmake names files that do not exist: {gone}"


def test_every_family_sources_cmake_is_included():
    """A family folder with a sources.cmake is in JAX_OPS_FAMILIES, and a nested one (e.g. a generated
    instantiations/sources.cmake) is include()d by its family's list (else the list is never read)."""
    top = (ROOT / "CMakeLists.txt").read_text()
    families = re.search(r"set\(JAX_OPS_FAMILIES ([^)]*)\)", top).group(1).split()
    lists = [p.relative_to(FFI) for p in FFI.rglob("sources.cmake")]
    assert {p.parent.as_posix() for p in lists if len(p.parts) == 2} == set(families), (lists, families)
    for nested in (p for p in lists if len(p.parts) > 2):
        family_list = (FFI / nested.parts[0] / "sources.cmake").read_text()
        assert (
            f'include("${{CMAKE_CURRENT_LIST_DIR}}/{nested.parent.relative_to(nested.parts[0]).as_posix()}/sources.cmake")'
            in family_list
        ), nested
    assert "GLOB" not in top


def test_tools_cmake_names_the_harnesses():
    """ffi_cuda/tools/CMakeLists.txt builds exactly the family-prefixed harnesses, and each source exists."""
    text = (FFI / "tools" / "CMakeLists.txt").read_text()
    tools = dict(re.findall(r"jax_ops_add_tool\((\w+) (\S+\.cu)", text))
    assert tools == {
        "attention_fwd_bench": "attention_fwd_bench.cu",
        "attention_bwd_bench": "attention_bwd_bench.cu",
        "sparse_spmv_bench": "sparse_spmv_bench.cu",
        "lsmr_bench": "lsmr_bench.cu",
        "gemm_bench": "gemm_bench.cu",
        "kv_cache_bench": "kv_cache_bench.cu",
    }
    assert all((FFI / "tools" / src).exists() for src in tools.values())
    # .ci/gpu builds them from the same CMake build (no nvcc line of its own).
    gpu = (ROOT / ".ci" / "gpu").read_text()
    assert "JAX_OPS_TOOLS=ON" in gpu and "nvcc " not in gpu
