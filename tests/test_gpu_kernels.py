"""GPU tests: every configured kernel computes attention on random shapes (skipped without a GPU)."""
import json
import random
import subprocess
import sys

import pytest

from flashbench import config, gpu
from flashbench.check import check_kernel, check_shape
from flashbench.compile import compile_kernel, runnable_build
from flashbench.config import Shape
from flashbench.files import write_json
from flashbench.launch import AttentionKernel

from conftest import ROOT

pytestmark = pytest.mark.gpu
KERNELS = [k.name for k in config.load(ROOT / "config.yaml").kernels]


@pytest.fixture(scope="module")
def build(settings, tmp_path_factory, needs_nvcc):
    here = gpu.require().arch
    out = tmp_path_factory.mktemp("cubins")
    kernels = {}
    for k in settings.kernels:
        arch = runnable_build(k.archs, here) if k.archs else here
        if arch is None:  # e.g. an sm_90a kernel on an SM103: the pipeline skips it too
            continue
        cubin = out / f"{k.name}.cubin"
        record = compile_kernel(k.name, ROOT / k.source, arch, settings.nvcc_flags, k.defines, cubin)
        write_json(out / f"{k.name}.json", record)
        kernels[k.name] = AttentionKernel(cubin, record)
    return kernels


def random_shapes(seed: int, count: int = 3) -> list[Shape]:
    rng = random.Random(seed)
    return [Shape(B=rng.randint(1, 3), H=rng.randint(1, 6), S=128 * rng.randint(1, 24), D=128) for _ in range(count)]


def built(build, name):
    if name not in build:
        pytest.skip(f"{name} has no build for this GPU")
    return build[name]


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_matches_fp32_reference_on_random_shapes(build, name, settings):
    kernel = built(build, name)
    shapes = random_shapes(random.randrange(1 << 30)) + [Shape(1, 2, 8192, 128)]
    result = check_kernel(kernel, shapes, settings.tolerance, progress=lambda m: None)
    assert result["passed"], result["reason"]
    for r in result["shapes"]:
        assert 0 < r["rel_error"] < settings.tolerance
        assert r["nonfinite"] == 0


class _SkipsLastRowTile(AttentionKernel):
    """Launches one query tile short: the rows it never writes must stay poisoned and fail."""

    def __call__(self, q, k, v, o):
        B, H, S, D = q.shape
        self.launch(S // self.contract["block_rows"] - 1, B * H, q, k, v, o, S)
        return o


@pytest.mark.parametrize("name", KERNELS)
def test_unwritten_output_fails_the_check(build, name, settings):
    good = built(build, name)
    broken = _SkipsLastRowTile(good.cubin, good.record)
    result = check_shape(broken, Shape(1, 2, 512, 128), settings.tolerance, seed=1)
    assert not result["passed"]
    assert result["nonfinite"] == 2 * good.contract["block_rows"] * 128  # one row tile per head unwritten


# Run in a child process: a kernel fault leaves the CUDA context unusable for the rest of the process.
READS_ADDRESS_ZERO = """
import json, sys
import numpy as np
from flashbench.check import check_shape
from flashbench.config import Shape
from flashbench.files import read_json
from flashbench.launch import AttentionKernel

class ReadsAddressZero(AttentionKernel):
    def __call__(self, q, k, v, o):
        B, H, S, D = q.shape
        self.launch(S // self.contract["block_rows"], B * H, np.uint64(0), k, v, o, S)
        return o

kernel = ReadsAddressZero(sys.argv[1], read_json(sys.argv[2]))
print(json.dumps(check_shape(kernel, Shape(1, 1, 256, 128), 0.01, seed=1)))
"""


@pytest.mark.parametrize("name", KERNELS[:1])
def test_a_faulting_kernel_fails_its_check_and_the_run_goes_on(build, name):
    k = build[name]
    proc = subprocess.run([sys.executable, "-c", READS_ADDRESS_ZERO, str(k.cubin), str(k.cubin.with_suffix(".json"))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["passed"] and result["fatal"]
    assert result["reason"].startswith("kernel launch failed")
