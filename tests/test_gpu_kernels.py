"""GPU tests: every configured kernel computes attention on random shapes and every kind of input,
and defects planted into the real kernels fail the check (skipped without a GPU)."""
import importlib.util
import json
import random
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from flashbench import attention, config, elements, gpu
from flashbench.check import Gate, check_kernel
from flashbench.compile import compile_kernel, runnable_build
from flashbench.config import Shape
from flashbench.files import read_json, write_json
from flashbench.launch import AttentionKernel

from conftest import ROOT, made_once

pytestmark = pytest.mark.gpu
KERNELS = [k.name for k in config.load(ROOT / "config.yaml").kernels]
CASE = Shape(1, 64, 1024, 128)


@pytest.fixture(scope="module")
def builds(settings, tmp_path_factory, worker_id, needs_nvcc):
    """Every kernel build (each kernel in each configuration it runs in: v25, v25.causal, v25.bf16, v25.gqa)
    that runs here, by its name, making its inputs in its configuration. Compiled once for every test
    worker (pytest -n), side by side."""
    from concurrent.futures import ThreadPoolExecutor

    here = gpu.require().arch
    runs = []
    for run in settings.kernel_builds():
        k = settings.kernel(run.of)
        arch = runnable_build(k.archs, here) if k.archs else here
        if arch is not None:  # None: e.g. an sm_90a kernel on an SM103: the pipeline skips it too
            runs.append((run, k, arch))

    def compile_all(out):
        def compiled(run, k, arch):
            cubin = out / f"{run.name}.cubin"
            record = compile_kernel(run.name, ROOT / k.source, arch, settings.nvcc_flags, settings.defines(run.name),
                                    cubin)
            write_json(out / f"{run.name}.json", record)

        with ThreadPoolExecutor() as pool:  # nvcc in processes of its own: the builds side by side
            list(pool.map(lambda r: compiled(*r), runs))

    out = made_once(tmp_path_factory, worker_id, f"gpu-cubins-{here}", compile_all)
    return {run.name: AttentionKernel(out / f"{run.name}.cubin", read_json(out / f"{run.name}.json"), run.configuration)
            for run, _, _ in runs}


@pytest.fixture(scope="module")
def build(builds):
    """The kernels' builds without the mask, by build name (a kernel's own name is its build in the first
    configuration: built(build, name))."""
    return {name: kernel for name, kernel in builds.items() if not kernel.causal}


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
        assert r["nonfinite"] == 0 and (0 < r["margin"] or r["S"] == 1) and r["margin"] <= 1  # S = 1: the output is V, exact


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
    computed without its last keys: the kernel's smallest S of them or one key tile, whichever is more;
    under the causal mask one key tile before its diagonal), scale
    (1% too large), unwritten_tile (one block of one head left NaN after a correct run)."""

    defect = None

    def __call__(self, q, k, v, o):
        B, H, S, D = q.shape
        rows = slice(S // 2, S // 2 + self.contract["block_rows"])
        if self.defect == "scale":
            # 1% too large in fp16; as many of bf16's coarser roundings (8%), which 1% hides in at B*H=15
            wrong = 1 + 0.01 * elements.HALF_ULP[self.dtype] / elements.HALF_ULP["fp16"]
            self.launch(self.row_tiles(S), B * H, q, k, v, o, S, scale=wrong * attention.softmax_scale(D),
                        heads_per_batch=H, kv_group=H // k.shape[1])
            return o
        super().__call__(q, k, v, o)
        h, kv = H // 2, (H // 2) // (H // k.shape[1])  # a head, and the K/V head it reads (grouped heads)

        def one_head(length):  # q, k, v and o of that head alone (k and v its K/V head's), their first rows
            return [a[0:1, head:head + 1, :length].copy() for a, head in ((q, h), (k, kv), (v, kv), (o, h))]

        if self.defect == "zero_row":
            o[0, h, S // 2 + 3] = 0
        elif self.defect == "missing_key_tile" and self.causal:
            # under the mask a block's last key tile is its diagonal: the rows from S/2 on, each seeing the
            # keys up to one tile before its own, from a run whose Q is moved back by one tile
            tile = self.contract["block_cols"]
            head = one_head(rows.start)
            head[0][...] = q[0:1, h:h + 1, tile:rows.start + tile]
            super().__call__(*head)
            o[0, h, rows.start:rows.start + tile] = head[3][0, 0, rows.start - tile:rows.start]
        elif self.defect == "missing_key_tile":
            short = S - max(self.smallest_seq_len, self.contract["block_cols"])
            head = one_head(short)
            super().__call__(*head)
            o[0, h, rows] = head[3][0, 0, rows]
        elif self.defect == "unwritten_tile":
            o[0, h, rows] = attention.poisoned_output(self.cp, Shape(1, 1, rows.stop - rows.start, D), self.dtype)[0, 0]
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


@pytest.fixture(scope="module")
def configured_build(builds):
    """The builds in a configuration of another element type or of grouped K/V heads (v25.bf16, v25.gqa,
    and their twins and grouped builds under the mask and at D=64 and 256)."""
    kernels = {name: kernel for name, kernel in builds.items()
               if kernel.configuration.dtype != "fp16" or kernel.configuration.kv_group > 1}
    if not kernels:
        pytest.skip("no build in bf16 or on grouped K/V heads runs on this GPU")
    return kernels


def at_its_d(kernel, shapes: list[Shape]) -> list[Shape]:
    """`shapes` at the head dim of `kernel`'s configuration."""
    return [replace(shape, D=kernel.configuration.D) for shape in shapes]


def test_bf16_and_grouped_kv_builds_pass_at_any_seq_len_on_every_kind_of_input(configured_build, gate, settings):
    """In bf16 against plain bf16 code; on grouped K/V heads at the configuration's group, which leaves 3, 5
    and 7 query heads on one K/V head and 2*SMs+7 on two; each at its configuration's D and mask."""
    for kernel in configured_build.values():
        shapes = at_its_d(kernel, [CASE, Shape(1, 16, 2048, 128), Shape(2, 2 * kernel.sm_count + 8, 384, 128), *RAGGED])
        result = check_kernel(kernel, shapes, gate, smallest=settings.check_smallest, progress=lambda m: None,
                              causal=kernel.causal)
        assert result["passed"], (kernel.name, result["reason"])
        assert {r["inputs"] for r in result["shapes"]} == set(attention.INPUT_KINDS)
        if kernel.configuration.kv_group > 1:
            assert {(r["H"], r["H_kv"]) for r in result["shapes"] if r["S"] == CASE.S} == {(64, 8)}


@pytest.mark.parametrize("defect", ["zero_row", "scale", "unwritten_tile"])
def test_a_defect_planted_in_a_bf16_or_grouped_build_fails_its_check(configured_build, defect, gate):
    for kernel in configured_build.values():
        planted = Planted(kernel.cubin, kernel.record, kernel.configuration)
        planted.defect = defect
        for shape in at_its_d(kernel, [CASE, Shape(3, 5, 1000, 128)]):
            assert check_kernel(kernel, [shape], gate, kinds=["normal"], progress=lambda m: None,
                                causal=kernel.causal)["passed"]
            result = check_kernel(planted, [shape], gate, kinds=["normal"], progress=lambda m: None,
                                  causal=kernel.causal)
            assert not result["passed"], (kernel.name, defect, shape)
            assert ("NaN/Inf" in result["reason"]) if defect == "unwritten_tile" else \
                (f"plain {kernel.dtype}" in result["reason"])


# S that is no multiple of a tile, below one tile, and B*H odd: the last row tile and key tile are partial
# (4000, 1, 16 and 129 end their last key tile at 32 keys or fewer: V25's ragged-first entry; at 16, on
# several heads, D=256's causal row tile 0 has 64 rows past S, which must write nothing; at 129 and 4000
# D=64's causal row tiles, 192 rows from 127 and 96 rows before row 0, are one more than S's)
RAGGED = [Shape(1, 3, 1000, 128), Shape(2, 3, 1500, 128), Shape(1, 2, 4000, 128), Shape(3, 5, 100, 128),
          Shape(1, 1, 1, 128), Shape(2, 3, 16, 128), Shape(1, 7, 129, 128)]


@pytest.mark.parametrize("name", KERNELS)
def test_a_kernel_by_head_passes_at_any_seq_len(build, name, gate):
    kernel = built(build, name)
    if not kernel.by_head:
        pytest.skip(f"{name} takes whole tiles only")
    result = check_kernel(kernel, RAGGED, gate, progress=lambda m: None)
    assert result["passed"], result["reason"]
    assert {r["S"] for r in result["shapes"]} == {s.S for s in RAGGED}


@pytest.fixture(scope="module")
def causal_build(builds):
    """The kernels' builds in the causal configuration (FLASH_CAUSAL=1)."""
    kernels = {name: kernel for name, kernel in builds.items() if kernel.causal}
    if not kernels:
        pytest.skip("no causal kernel runs on this GPU")
    return kernels


class JudgedUnmasked(AttentionKernel):
    """A causal build said to compute attention without the mask (the check refuses a kernel asked in
    another mask than its own before it runs it)."""

    causal = False


def test_a_causal_kernel_passes_under_the_mask_at_any_seq_len_on_every_kind_of_input(causal_build, gate):
    for kernel in causal_build.values():
        assert kernel.causal
        group = kernel.configuration.kv_group  # more heads than SMs, a whole number of K/V heads
        shapes = at_its_d(kernel, [CASE, Shape(1, 2, 8192, 128), Shape(2, -(-(kernel.sm_count + 3) // group) * group,
                                                                     384, 128), *RAGGED])
        result = check_kernel(kernel, shapes, gate, progress=lambda m: None, causal=True)
        assert result["passed"], result["reason"]
        assert {r["inputs"] for r in result["shapes"]} == set(attention.INPUT_KINDS)
        # the mask is what passes: the same kernel, judged against the reference without the mask, fails
        judged_unmasked = JudgedUnmasked(kernel.cubin, kernel.record, kernel.configuration)
        unmasked = check_kernel(judged_unmasked, at_its_d(kernel, [CASE]), gate, kinds=["normal"],
                                progress=lambda m: None)
        assert not unmasked["passed"] and f"plain {kernel.dtype}" in unmasked["reason"], unmasked["reason"]


@pytest.mark.parametrize("defect", ["zero_row", "missing_key_tile", "scale", "unwritten_tile"])
def test_a_defect_planted_in_a_causal_kernel_fails_its_check(causal_build, defect, gate):
    for kernel in causal_build.values():
        planted = Planted(kernel.cubin, kernel.record, kernel.configuration)  # its inputs as its configuration's
        planted.defect = defect
        for shape in at_its_d(kernel, [CASE, Shape(3, 5, 1000, 128)]):
            assert check_kernel(kernel, [shape], gate, kinds=["normal"], progress=lambda m: None, causal=True)["passed"]
            result = check_kernel(planted, [shape], gate, kinds=["normal"], progress=lambda m: None, causal=True)
            assert not result["passed"], (kernel.name, defect, shape)


# At D=64 three consumer warpgroups hold 160 registers each: ptxas keeps two values of the rare path (S
# multiplied again and masked, in the last key tile) in local memory: 8 bytes stored, 8 loaded, in the first entry.
RARE_PATH_SPILL = {64: 16}


@pytest.mark.parametrize("D", [64, 256])
def test_v25_at_head_dims_64_and_256_passes_at_any_seq_len_and_a_planted_defect_fails(D, settings, gate, tmp_path,
                                                                                     needs_nvcc):
    """V25 built with FLASH_HEAD_DIM=64 (one 64-column box a row, PV on wgmma m64n64k16) and =256 (four
    boxes, key tiles of 64, one O tile the consumers share): on shapes at that D, ragged S (at D=256 too
    RAGGED's lengths take both entries: S=1000 ends 40 keys into a key tile of 64, 1500 28) and every kind
    of input; a planted zero row fails."""
    if gpu.require().arch != "sm_90":
        pytest.skip("V25 is built for sm_90a")
    k = settings.kernel("v25")
    record = compile_kernel(f"v25.d{D}", ROOT / k.source, "sm_90a", settings.nvcc_flags, {"FLASH_HEAD_DIM": D},
                            tmp_path / f"v25.d{D}.cubin")
    assert record["launch"]["head_dim"] == D and record["spill_bytes"] == RARE_PATH_SPILL.get(D, 0)
    kernel = AttentionKernel(tmp_path / f"v25.d{D}.cubin", record)
    shapes = [Shape(1, 64, 1024, D), Shape(2, kernel.sm_count + 3, 384, D), *(replace(s, D=D) for s in RAGGED)]
    result = check_kernel(kernel, shapes, gate, smallest=settings.check_smallest, progress=lambda m: None)
    assert result["passed"], result["reason"]
    assert {r["D"] for r in result["shapes"]} == {D} and {r["inputs"] for r in result["shapes"]} == set(attention.INPUT_KINDS)
    planted = Planted(kernel.cubin, record)
    planted.defect = "zero_row"
    assert not check_kernel(planted, [Shape(3, 5, 1000, D)], gate, kinds=["normal"], progress=lambda m: None)["passed"]


# Run in a child process: a trap or a fault leaves the CUDA context unusable for the rest of the process.
MISLAUNCHED = """
import json, sys
import numpy as np
from flashbench.check import Gate, check_shape
from flashbench.config import Shape
from flashbench.files import read_json
from flashbench.launch import AttentionKernel

class Mislaunched(AttentionKernel):
    def _work_list(self, row_tiles, heads, heads_per_batch, seq_len, kv_group=1):
        if sys.argv[3] == "stale_list":  # made for twice the heads: another grid and work tile count
            return super()._work_list(row_tiles, 2 * heads, 2 * heads_per_batch, seq_len, kv_group)
        return super()._work_list(row_tiles, heads, heads_per_batch, seq_len, kv_group)

    def __call__(self, q, k, v, o):
        B, H, S, D = q.shape
        if sys.argv[3] == "stale_list":  # its guard must trap
            self.launch(self.row_tiles(S), B * H, q, k, v, o, S, heads_per_batch=H)
        elif sys.argv[3] == "short_grid":  # one row tile short (a persistent kernel's row_tiles): its guard must trap
            self.launch(S // self.contract["block_rows"] - 1, B * H, q, k, v, o, S)
        else:  # Q at address 0: a fault
            self.launch(S // self.contract["block_rows"], B * H, np.uint64(0), k, v, o, S)
        return o

kernel = Mislaunched(sys.argv[1], read_json(sys.argv[2]))
print(json.dumps(check_shape(kernel, Shape(1, 1, 256, 128), Gate(2, 0.005), seed=1)))
"""


@pytest.mark.parametrize("how", ["short_grid", "address_zero", "stale_list"])
@pytest.mark.parametrize("name", KERNELS)
def test_a_mislaunched_kernel_fails_loudly_and_the_run_goes_on(build, name, how):
    k = built(build, name)
    if how == "address_zero" and name != KERNELS[0]:
        pytest.skip("one kernel is enough for a fault")
    if how == "stale_list" and "work_list" not in k.contract:
        pytest.skip("it walks no work list")
    proc = subprocess.run([sys.executable, "-c", MISLAUNCHED, str(k.cubin), str(k.cubin.with_suffix(".json")), how],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["passed"] and result["fatal"]
    assert result["reason"].startswith("kernel launch failed")


# A call that never ends (one thread waiting on a flag nothing sets, as a kernel waits on a barrier nothing
# arrives at), checked as the check command checks it: the record, then the process left at once.
HANGING = """
import json
import cupy as cp
from flashbench import attention, check, cli
from flashbench.config import Shape

SPIN = cp.RawKernel(r'extern "C" __global__ void spin(volatile int *flag) { while (*flag == 0) { } }', "spin")


class Hangs:
    name, cp, causal, skips_unsupported = "hangs", cp, False, False

    def supports(self, shape):
        return None

    def inputs(self, shape, rng, kind="normal"):
        return attention.random_inputs(cp, shape, rng, kind)

    def __call__(self, q, k, v, o):
        self.flag = cp.zeros(1, cp.int32)
        SPIN((1,), (1,), (self.flag,))
        return o


check.HANG_AFTER_S = 2.0
print(json.dumps(check.check_shape(Hangs(), Shape(1, 1, 256, 128), check.Gate(2, 0.005), seed=1)))
cli._leave_now()
"""


def test_a_call_that_hangs_fails_its_check_in_seconds_and_its_process_ends_with_it():
    proc = subprocess.run([sys.executable, "-c", HANGING], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["passed"] is False and result["fatal"] and result["hung"]
    assert result["reason"] == "the call had not finished after 2 s: it hangs"


# A launch at each of three small ragged shapes with an odd B*H, on far_max (the rare path): what
# compute-sanitizer runs, at the D of the build's configuration. S=230 ends its last key tile at 102 keys (38
# in key tiles of 64, as at D=256), S=150 at 22: a kernel with an entry for a key tile of 1 to 32 keys (V25's
# ragged_first) runs both of its entries; S=16, one short key tile (at D=256 under the mask, row tile 0's
# last 64 rows past S: a store of theirs past the last head's is memcheck's to find).
LAUNCH_ONCE = """
import sys
import cupy as cp
from flashbench import config
from flashbench.config import Shape
from flashbench.files import read_json
from flashbench.launch import AttentionKernel

run = config.load(sys.argv[3]).run(sys.argv[4])  # its inputs in its configuration: 3 query heads on one K/V head in gqa
kernel = AttentionKernel(sys.argv[1], read_json(sys.argv[2]), run.configuration)
for S in (230, 150, 16):
    kernel(*kernel.inputs(Shape(1, 3, S, run.configuration.D), cp.random.default_rng(0), "far_max"))
cp.cuda.runtime.deviceSynchronize()
"""


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
@pytest.mark.parametrize("causal", [False, True])
def test_a_kernel_by_head_is_clean_under_compute_sanitizer(build, causal_build, tmp_path, tool, causal):
    """Each build by head (V25's) but the bf16 twins, whose loads, stores, copies and barriers are their fp16
    build's source, on bf16 elements (test_compile holds each twin to its fp16 build's resources, wgmma
    and turns): eight builds a tool, not sixteen."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found")
    for kernel in (causal_build if causal else build).values():
        if not kernel.by_head or kernel.dtype == "bf16":
            continue
        record = tmp_path / f"{kernel.name}.json"
        write_json(record, kernel.record)
        proc = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "9", sys.executable, "-c", LAUNCH_ONCE,
                               str(kernel.cubin), str(record), str(ROOT / "config.yaml"), kernel.name],
                              capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr  # the sanitizer's report, then the program's
        assert proc.returncode == 0, out[-2000:]
        assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-2000:]


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
