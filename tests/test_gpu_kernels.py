"""GPU tests: every configured kernel computes attention on random shapes and every kind of input,
and defects planted into the real kernels fail the check (skipped without a GPU)."""
import importlib.util
import json
import random
import subprocess
import sys

import pytest

from flashbench import attention, config, gpu
from flashbench.check import Gate, check_kernel
from flashbench.compile import compile_kernel, runnable_build
from flashbench.config import Shape
from flashbench.files import write_json
from flashbench.launch import AttentionKernel

from conftest import ROOT

pytestmark = pytest.mark.gpu
KERNELS = [k.name for k in config.load(ROOT / "config.yaml").kernels]
CASE = Shape(1, 64, 1024, 128)


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


def built(build, name):
    if name not in build:
        pytest.skip(f"{name} has no build for this GPU")
    return build[name]


@pytest.fixture(scope="module")
def gate(settings):
    return Gate(settings.check_factor, settings.tolerance)


def random_shapes(seed: int, count: int = 3) -> list[Shape]:
    rng = random.Random(seed)
    return [Shape(B=rng.randint(1, 3), H=rng.randint(1, 6), S=128 * rng.randint(1, 24), D=128) for _ in range(count)]


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_passes_on_random_shapes_and_every_kind_of_input(build, name, gate, settings):
    shapes = random_shapes(random.randrange(1 << 30)) + [Shape(1, 2, 8192, 128)]
    result = check_kernel(built(build, name), shapes, gate, smallest=settings.check_smallest, progress=lambda m: None)
    assert result["passed"], result["reason"]
    assert {r["inputs"] for r in result["shapes"]} == set(attention.INPUT_KINDS)
    for r in result["shapes"]:
        assert r["nonfinite"] == 0 and 0 < r["margin"] <= 1


@pytest.mark.parametrize("name", KERNELS)
def test_a_persistent_kernel_passes_with_several_work_tiles_per_block(build, name, gate):
    """A persistent kernel carries its barrier phases, turns and O stores from one work tile to the
    next. More work tiles than SMs makes blocks take two or more: with one key tile per work tile
    (the turns and phases then change every tile) and with three."""
    kernel = built(build, name)
    if not kernel.persistent:
        pytest.skip(f"{name} is not a persistent kernel")
    shapes = [Shape(1, 2 * kernel.sm_count + 7, 128, 128), Shape(2, kernel.sm_count + 3, 384, 128)]
    result = check_kernel(kernel, shapes, gate, progress=lambda m: None)
    assert result["passed"], result["reason"]
    assert {(r["H"], r["S"]) for r in result["shapes"]} == {(s.H, s.S) for s in shapes}


class Planted(AttentionKernel):
    """The real kernel with one defect planted: zero_row, missing_key_tile (one block of one head
    computed without its last keys: the kernel's smallest S of them, one or two key tiles), scale
    (1% too large), unwritten_tile (one block of one head left NaN after a correct run)."""

    defect = None

    def __call__(self, q, k, v, o):
        B, H, S, D = q.shape
        rows = slice(S // 2, S // 2 + self.contract["block_rows"])
        if self.defect == "scale":
            self.launch(S // self.contract["block_rows"], B * H, q, k, v, o, S,
                        scale=1.01 * attention.softmax_scale(D))
            return o
        super().__call__(q, k, v, o)
        if self.defect == "zero_row":
            o[0, H // 2, S // 2 + 3] = 0
        elif self.defect == "missing_key_tile":
            short = S - self.smallest_seq_len
            head = [a[0:1, H // 2:H // 2 + 1, :short].copy() for a in (q, k, v, o)]
            super().__call__(*head)
            o[0, H // 2, rows] = head[3][0, 0, rows]
        elif self.defect == "unwritten_tile":
            o[0, H // 2, rows] = attention.poisoned_output(self.cp, Shape(1, 1, rows.stop - rows.start, D))[0, 0]
        return o


@pytest.mark.parametrize("defect", ["zero_row", "missing_key_tile", "scale", "unwritten_tile"])
@pytest.mark.parametrize("name", KERNELS)
def test_a_defect_planted_in_the_real_kernel_fails_its_check(build, name, defect, gate):
    planted = Planted(built(build, name).cubin, build[name].record)
    planted.defect = defect
    for shape in (CASE, Shape(3, 5, 512, 128)):
        assert check_kernel(build[name], [shape], gate, kinds=["normal"], progress=lambda m: None)["passed"]
        result = check_kernel(planted, [shape], gate, kinds=["normal"], progress=lambda m: None)
        assert not result["passed"], (name, defect, shape)
        # failed by the gate itself: NaN where nothing was written, else an error above its bound
        assert ("NaN/Inf" in result["reason"]) if defect == "unwritten_tile" else ("plain fp16" in result["reason"])


# Run in a child process: a trap or a fault leaves the CUDA context unusable for the rest of the process.
MISLAUNCHED = """
import json, sys
import numpy as np
from flashbench.check import Gate, check_shape
from flashbench.config import Shape
from flashbench.files import read_json
from flashbench.launch import AttentionKernel

class Mislaunched(AttentionKernel):
    def __call__(self, q, k, v, o):
        B, H, S, D = q.shape
        if sys.argv[3] == "short_grid":  # one row tile short (a persistent kernel's row_tiles): its guard must trap
            self.launch(S // self.contract["block_rows"] - 1, B * H, q, k, v, o, S)
        else:  # Q at address 0: a fault
            self.launch(S // self.contract["block_rows"], B * H, np.uint64(0), k, v, o, S)
        return o

kernel = Mislaunched(sys.argv[1], read_json(sys.argv[2]))
print(json.dumps(check_shape(kernel, Shape(1, 1, 256, 128), Gate(2, 0.005), seed=1)))
"""


@pytest.mark.parametrize("how", ["short_grid", "address_zero"])
@pytest.mark.parametrize("name", KERNELS)
def test_a_mislaunched_kernel_fails_loudly_and_the_run_goes_on(build, name, how):
    k = built(build, name)
    if how == "address_zero" and name != KERNELS[0]:
        pytest.skip("one kernel is enough for a fault")
    proc = subprocess.run([sys.executable, "-c", MISLAUNCHED, str(k.cubin), str(k.cubin.with_suffix(".json")), how],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["passed"] and result["fatal"]
    assert result["reason"].startswith("kernel launch failed")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_the_fp32_reference_agrees_with_torch_sdpa_in_fp32():
    import cupy as cp
    import torch

    q, k, v, _ = attention.random_inputs(cp, Shape(2, 3, 1024, 128), cp.random.default_rng(3), "late_max")
    ref = attention.reference(q, k, v, cp)
    with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_mem_efficient=False, enable_math=True) \
            if hasattr(torch.backends.cuda, "sdp_kernel") else torch.nn.attention.sdpa_kernel(
                torch.nn.attention.SDPBackend.MATH):
        theirs = torch.nn.functional.scaled_dot_product_attention(
            *(torch.from_dlpack(a).double() for a in (q, k, v)))
    err = attention.errors(ref, cp.from_dlpack(theirs.contiguous()), cp)
    assert err["rel_error"] < 1e-5 and err["max_abs_error"] < 1e-4  # fp32 against fp64: rounding only
