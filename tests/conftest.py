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
