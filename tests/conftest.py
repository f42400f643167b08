"""Test set-up: 8 fake CPU devices (for shard_map tests) and the `gpu` and `gpu_multi` markers' skip rules.

XLA_FLAGS must be set before jax is imported anywhere.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import pytest  # noqa: E402


def _cuda_count() -> int:
    try:
        return len(jax.devices("cuda"))
    except RuntimeError:
        return 0


CUDA_COUNT = _cuda_count()
HAS_CUDA = CUDA_COUNT > 0


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA device (run `pytest -m gpu` on the GPU machine)")
    few_gpus = pytest.mark.skip(reason=f"needs 2 or more CUDA devices; this machine has {CUDA_COUNT}")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(no_gpu)
        elif "gpu_multi" in item.keywords and CUDA_COUNT < 2:
            item.add_marker(few_gpus)


@pytest.fixture
def x64():
    """Runs the test with float64 enabled."""
    with jax.enable_x64(True):
        yield


def pytest_report_header(config):
    import jax_ops

    where = os.path.dirname(jax_ops.__file__)
    return [
        f"jax {jax.__version__}, backend {jax.default_backend()}, jax_ops from {where}, "
        f"CUDA build: {jax_ops.has_cuda_build()}"
    ]
