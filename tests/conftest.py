import shutil
from pathlib import Path

import pytest

from flashbench import config, gpu

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    if gpu.detect() is None:
        skip = pytest.mark.skip(reason="no NVIDIA GPU found")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def settings():
    return config.load(ROOT / "config.yaml")


@pytest.fixture(scope="session")
def needs_nvcc():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")


@pytest.fixture(scope="session")
def gpu_held():
    """The GPU's lock for the whole test session: no pipeline run times beside the GPU tests."""
    import cupy as cp

    from flashbench import gpulock

    with gpulock.hold(cp.cuda.Device().pci_bus_id, "GPU tests"):
        yield


@pytest.fixture(autouse=True)
def _hold_the_gpu_in_gpu_tests(request):
    if request.node.get_closest_marker("gpu"):
        request.getfixturevalue("gpu_held")
