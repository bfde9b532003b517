"""GPU tests: every configured kernel computes attention on random shapes (skipped without a GPU)."""
import random

import pytest

from flashbench import config, gpu
from flashbench.check import check_kernel, check_shape
from flashbench.compile import compile_kernel
from flashbench.config import Shape
from flashbench.launch import AttentionKernel

from conftest import ROOT

pytestmark = pytest.mark.gpu
KERNELS = [k.name for k in config.load(ROOT / "config.yaml").kernels]


@pytest.fixture(scope="module")
def build(settings, tmp_path_factory, needs_nvcc):
    arch = gpu.require().arch
    out = tmp_path_factory.mktemp("cubins")
    kernels = {}
    for k in settings.kernels:
        cubin = out / f"{k.name}.cubin"
        record = compile_kernel(k.name, ROOT / k.source, arch, settings.nvcc_flags, k.defines, cubin)
        kernels[k.name] = AttentionKernel(cubin, record)
    return kernels


def random_shapes(seed: int, count: int = 3) -> list[Shape]:
    rng = random.Random(seed)
    return [Shape(B=rng.randint(1, 3), H=rng.randint(1, 6), S=128 * rng.randint(1, 24), D=128) for _ in range(count)]


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_matches_fp32_reference_on_random_shapes(build, name, settings):
    shapes = random_shapes(random.randrange(1 << 30)) + [Shape(1, 2, 8192, 128)]
    result = check_kernel(build[name], shapes, settings.tolerance, progress=lambda m: None)
    assert result["passed"], result["reason"]
    for r in result["shapes"]:
        assert 0 < r["rel_error"] < settings.tolerance
        assert r["nonfinite"] == 0


class _SkipsLastBlockRow(AttentionKernel):
    """Launches one query tile short: the rows it never writes must stay poisoned and fail."""

    def __call__(self, q, k, v, o):
        B, H, S, D = q.shape
        c = self.contract
        import numpy as np

        from flashbench.attention import LOG2E, SCALE

        self.function((S // c["block_rows"] - 1, B * H), (c["threads"],),
                      (q, k, v, o, np.int32(S), np.float32(SCALE * LOG2E)), shared_mem=self.dynamic_smem)


@pytest.mark.parametrize("name", KERNELS)
def test_unwritten_output_fails_the_check(build, name, settings):
    good = build[name]
    broken = _SkipsLastBlockRow.__new__(_SkipsLastBlockRow)
    broken.__dict__.update(good.__dict__)
    result = check_shape(broken, Shape(1, 2, 512, 128), settings.tolerance, seed=1)
    assert not result["passed"]
    assert result["nonfinite"] == 2 * good.contract["block_rows"] * 128  # one row tile per head unwritten
