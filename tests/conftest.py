"""Test set-up: 8 fake CPU devices (for shard_map tests) and the `gpu` marker's skip rule.

XLA_FLAGS must be set before jax is imported anywhere.
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax  # noqa: E402
import pytest  # noqa: E402


def _has_cuda() -> bool:
    try:
        return len(jax.devices("cuda")) > 0
    except RuntimeError:
        return False


HAS_CUDA = _has_cuda()


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `pytest -m gpu` on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


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
