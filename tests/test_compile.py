"""nvcc builds every configured kernel for sm_90 and sm_103, or for its own archs (the Hopper line:
sm_90a), with no GPU (CPU only; nvcc needed)."""
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from flashbench import FlashbenchError, cli, config
from flashbench.compile import CommandFailed, compile_kernel
from flashbench.files import read_json

from conftest import ROOT

ARCHS = ["sm_90", "sm_103"]


def kernel_archs(kernel):
    return kernel.archs or ARCHS


def builds(settings) -> set[tuple[str, str]]:
    """(build, arch) of every kernel in each configuration it runs in (v25 and v25.causal)."""
    return {(run.name, arch) for run in settings.kernel_builds() for arch in kernel_archs(settings.kernel(run.of))}


@pytest.fixture(scope="module")
def records(settings, built):
    """The compile records the pipeline's compile stage wrote (compile_kernel's, as JSON)."""
    return {(name, arch): read_json(built / "build" / arch / f"{name}.json") for name, arch in builds(settings)}


def test_every_kernel_compiles_for_its_archs(records, settings):
    assert set(records) == builds(settings)
    for (name, arch), r in records.items():
        assert r["arch"] == arch
        assert 0 < r["registers"] <= 255
        assert r["blocks_per_sm"] >= 1, f"{name} cannot be resident on {arch}"
        target = f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}" if arch.endswith("a") else f"-arch={arch}"
        assert "-Xptxas -v" in r["command"] and target in r["command"]
        assert "release 13." in r["nvcc"]
        assert len(r["cubin_sha256"]) == 64 and len(r["source_sha256"]) == 64


def test_launch_contract_comes_from_the_kernel(records):
    v11 = records[("v11", "sm_90")]
    assert v11["launch"] == {"threads": 128, "block_rows": 32, "block_cols": 64, "dynamic_smem_bytes": 0,
                             "head_dim": 128}
    # V11 keeps Q, KV, P, logits and the row statistics in about 36 KB of static shared memory
    assert 34 * 1024 <= v11["static_smem_bytes"] <= 40 * 1024
    assert v11["spill_bytes"] == 0


def test_a_kernel_that_does_not_compile_is_a_clear_error(tmp_path, settings, needs_nvcc):
    broken = tmp_path / "broken.cu"
    broken.write_text('#include "flash_common.cuh"\nthis is not CUDA\n')
    (tmp_path / "flash_common.cuh").write_text((ROOT / "kernels" / "flash_common.cuh").read_text())
    with pytest.raises(FlashbenchError, match="compiling broken for sm_90 failed") as failed:
        compile_kernel("broken", broken, "sm_90", settings.nvcc_flags, {}, tmp_path / "broken.cubin")
    # nvcc's own words come first, for the console; the command and all of it, for the log
    first, nvccs = str(failed.value).splitlines()[:2]
    assert first == "compiling broken for sm_90 failed:" and nvccs.startswith(f"{broken}(2): error")
    assert "nvcc -ptx -arch=sm_90" in failed.value.transcript.splitlines()[0]
    assert nvccs in failed.value.transcript


def test_the_launch_contract_is_read_from_the_cubin(tmp_path, settings, needs_nvcc):
    """A kernel's FLASH_LAUNCH_CONTRACT lands in its cubin as a constant, read back field by field; a
    kernel that states none is a clear error, not a launch with made-up numbers."""
    (tmp_path / "flash_common.cuh").write_text((ROOT / "kernels" / "flash_common.cuh").read_text())
    kernel = ('#include "flash_common.cuh"\n{}\n'
              'extern "C" __global__ void flash_attention_forward(float* x) {{ x[threadIdx.x] = 1.f; }}\n')
    stated = tmp_path / "stated.cu"
    stated.write_text(kernel.format("FLASH_LAUNCH_CONTRACT(96, 48, 80, 1234)"))
    r = compile_kernel("stated", stated, "sm_90", settings.nvcc_flags, {}, tmp_path / "stated.cubin")
    assert r["launch"] == {"threads": 96, "block_rows": 48, "block_cols": 80, "dynamic_smem_bytes": 1234,
                           "head_dim": 128}
    silent = tmp_path / "silent.cu"
    silent.write_text(kernel.format(""))
    with pytest.raises(FlashbenchError, match="no symbol flash_launch_contract: the kernel states no FLASH_LAUNCH_"):
        compile_kernel("silent", silent, "sm_90", settings.nvcc_flags, {}, tmp_path / "silent.cubin")


def test_a_long_error_shows_its_first_lines_and_keeps_the_rest_for_the_log():
    error = CommandFailed("compiling x for sm_90", ["nvcc", "x.cu"], "\n".join(f"line {i}" for i in range(25)))
    assert str(error).splitlines() == ["compiling x for sm_90 failed:", *(f"line {i}" for i in range(10)),
                                       "... 15 more lines in the log"]
    assert error.transcript.splitlines() == ["nvcc x.cu", *(f"line {i}" for i in range(25))]


@pytest.fixture
def compile_command(monkeypatch, settings):
    """The compile command's arguments for v11, its source as given: the settings the command reads
    name it (the config schema would take only kernels/<name>.cu: this is the command's own check)."""
    import dataclasses

    def command(source="kernels/v11.cu", cubin="build/v11.cubin", record="build/v11.json"):
        kernels = [dataclasses.replace(k, source=source) if k.name == "v11" else k for k in settings.kernels]
        monkeypatch.setattr(cli, "load_settings", lambda path: dataclasses.replace(settings, kernels=kernels))
        return ["compile", "--settings", "settings.json", "--kernel", "v11", "--arch", "sm_90", f"--cubin={cubin}",
                f"--record={record}"]

    return command


def test_a_source_path_that_a_shell_would_run_is_refused_before_any_program_runs(tmp_path, capsys, monkeypatch,
                                                                                  compile_command):
    """nvcc runs its steps through a shell, paths and all: `$(touch ...)` in a path is refused, not
    run, and said in one line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "$(touch ran).cu").write_text((ROOT / "kernels" / "v11.cu").read_text())
    assert cli.main(compile_command("$(touch ran).cu")) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: source '$(touch ran).cu': nvcc hands its paths on through a shell, so a path may hold only letters, "
        "digits and _ . / + - (and not start with -)"]
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("args, message", [
    (("kernels/nope.cu",), "source 'kernels/nope.cu': not a .cu file"),
    (("kernels",), "source 'kernels': not a .cu file"),
    (("kernels/flash_common.cuh",), "source 'kernels/flash_common.cuh': not a .cu file"),
    (("odd name.cu",), "source 'odd name.cu': nvcc hands its paths on through a shell"),
    (("-G.cu",), "source '-G.cu': nvcc hands its paths on"),
    (("kernels/v11.cu", "build/$(touch ran).cubin"), "cubin 'build/$(touch ran).cubin': nvcc hands its paths on"),
    (("kernels/v11.cu", "build/v11.ptx"), "cubin 'build/v11.ptx': not a .cubin file"),
    (("kernels/v11.cu", "kernels/v11.cu/v11.cubin"), "cubin 'kernels/v11.cu/v11.cubin': its folder cannot be made "
                                                     "(kernels/v11.cu is a file)"),
    (("kernels/v11.cu", "build/v11.cubin", "build/v11.csv"), "record 'build/v11.csv': not a .json file"),
    (("kernels/v11.cu", "build/v11.cubin", "kernels/v11.cu/a/v11.json"), "record 'kernels/v11.cu/a/v11.json': its "
                                                                         "folder cannot be made (kernels/v11.cu is a file)"),
])
def test_compile_takes_a_cu_file_and_outputs_it_can_write(tmp_path, capsys, monkeypatch, args, message, compile_command):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kernels").mkdir()
    for name in ("v11.cu", "flash_common.cuh", "odd name.cu", "-G.cu"):
        (tmp_path / "kernels" / name).write_text("")
    for name in ("odd name.cu", "-G.cu"):
        (tmp_path / name).write_text("")
    assert cli.main(compile_command(*args)) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "build").exists() and not (tmp_path / "ran").exists()


# ---- the chapter's static facts, from ptxas, for both archs ---------------------------------------

@pytest.mark.parametrize("arch", ARCHS)
def test_v12_owns_whole_rows_with_twice_the_rows_of_v11(records, arch):
    v11, v12 = records[("v11", arch)], records[("v12", arch)]
    assert v12["launch"]["threads"] == 256 and v12["launch"]["block_rows"] == 2 * v11["launch"]["block_rows"] == 64
    # no logits buffer any more: Q 16 + KV 16 + P 8 KB, static
    assert v12["launch"]["dynamic_smem_bytes"] == 0 and 40 * 1024 <= v12["static_smem_bytes"] <= 42 * 1024
    assert v12["spill_bytes"] == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_v13_fits_two_blocks_per_sm_without_spilling(records, arch):
    v13 = records[("v13", arch)]
    assert v13["registers"] <= 65536 // (256 * 2) == 128  # __launch_bounds__(256, 2)
    assert v13["spill_bytes"] == 0 and v13["stack_frame_bytes"] == 0
    # about 58 KB: past the 48 KB static limit, so dynamic with the opt-in
    assert v13["static_smem_bytes"] == 0 and v13["launch"]["dynamic_smem_bytes"] > 48 * 1024
    assert abs(v13["smem_bytes"] - 58 * 1024) <= 3 * 1024
    assert v13["blocks_per_sm"] >= 2


@pytest.mark.parametrize("arch", ARCHS)
def test_br128_spills_under_the_same_register_cap(records, arch):
    v13, br128 = records[("v13", arch)], records[("br128", arch)]
    assert br128["launch"]["block_rows"] == 128 and br128["registers"] <= v13["registers"] <= 128
    assert br128["spill_store_bytes"] > 0 and br128["spill_load_bytes"] > 0 and br128["stack_frame_bytes"] > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_hybrid_smem_removes_the_spill_with_more_shared_memory(records, arch):
    v13, br128, hybrid = records[("v13", arch)], records[("br128", arch)], records[("hybrid_smem", arch)]
    assert hybrid["launch"]["block_rows"] == 128 and hybrid["registers"] <= 128
    assert hybrid["spill_bytes"] == 0 and hybrid["stack_frame_bytes"] == 0
    assert hybrid["smem_bytes"] > br128["smem_bytes"] > v13["smem_bytes"]
    assert hybrid["blocks_per_sm"] >= 2


def test_ablations_are_compile_time_parameters_of_their_parent(settings):
    kernels = {k.name: k for k in settings.kernels}
    assert kernels["br128"].source == kernels["hybrid_smem"].source == kernels["v13"].source
    assert kernels["br128"].defines == {"BLOCK_ROWS": 128}
    assert kernels["hybrid_smem"].defines == {"BLOCK_ROWS": 128, "HYBRID_SMEM": 1}


# ---- the Hopper line (sm_90a) -------------------------------------------------------------------

def _cuobjdump() -> str | None:
    """cuobjdump from PATH, else from the nvidia-cuda-cuobjdump wheel (the test extra), with its nvdisasm."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    wheel_bin = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" \
        / "nvidia" / "cu13" / "bin"
    return str(wheel_bin / "cuobjdump") if (wheel_bin / "cuobjdump").is_file() else None


HOPPER = [k.name for k in config.load(ROOT / "config.yaml").kernels if k.archs and "sm_90a" in k.archs]


@pytest.mark.parametrize("name", HOPPER)
def test_hopper_kernels_multiply_with_wgmma(records, built, name):
    """Every sm_90a kernel's SASS has HGMMA (wgmma) and no HMMA (mma.sync), and loads with TMA."""
    sass = _sass(records[(name, "sm_90a")], built)
    assert "HGMMA." in sass and "HMMA." not in sass
    assert "UTMALDG" in sass


# The stack of a kernel whose rare path (S multiplied again on the FMA pipe) is a rolled loop into a
# local array of a thread's 64 elements of S, off the main path: V25's
ROLLED_RARE_PATH_STACK = {"v25": 64 * 4}


@pytest.mark.parametrize("name", HOPPER)
def test_hopper_kernels_build_clean_with_one_block_per_sm(records, name):
    r = records[(name, "sm_90a")]
    assert r["spill_bytes"] == 0 and r["stack_frame_bytes"] == ROLLED_RARE_PATH_STACK.get(name, 0)
    # C7508: setmaxnreg ignored; C7510, C7515: every wgmma serialized; C7517: a wgmma wait injected
    assert not [code for code in ("C7508", "C7510", "C7515", "C7517") if code in r["ptxas_report"]]
    assert "warning" not in r["ptxas_report"].lower()
    assert r["static_smem_bytes"] == 0 and r["launch"]["dynamic_smem_bytes"] > 128 * 1024
    assert [m["array"] for m in r["launch"]["tensor_maps"]] in (["q", "k", "v"], ["q", "k", "v", "o"])  # o: V19 on
    assert all(m["swizzle"] == 128 and m["box"][0] * 2 <= 128 for m in r["launch"]["tensor_maps"])
    assert r["blocks_per_sm"] == 1


def test_v14_is_two_warpgroups_of_64_rows(records):
    v14 = records[("v14", "sm_90a")]
    assert v14["launch"]["threads"] == 256 and v14["launch"]["block_rows"] == 128 and v14["launch"]["block_cols"] == 128
    # Q 32 KB + 2 stages x (K 32 + V 32) KB, the barriers, and 1 KB to align the base
    assert v14["launch"]["dynamic_smem_bytes"] == 160 * 1024 + 56 + 1024


def _sass(record, built) -> str:
    """The SASS of a kernel the session's compile stage built (under `built`)."""
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        try:  # installed without the test extra: no SASS to read here
            importlib.metadata.version("nvidia-cuda-cuobjdump")
        except importlib.metadata.PackageNotFoundError:
            pytest.skip("cuobjdump not found (the test extra installs it)")
        pytest.fail("the test extra's nvidia-cuda-cuobjdump is installed, but its cuobjdump is not where it is looked for")
    return _disassemble(cuobjdump, built / "build" / record["arch"] / f"{record['kernel']}.cubin",
                        built / "sass" / f"{record['arch']}-{record['kernel']}.sass")


@functools.cache
def _disassemble(cuobjdump: str, cubin: Path, kept: Path) -> str:
    """cuobjdump -sass of one cubin, once per test run: several tests, on either test worker, read the
    same kernel's SASS, and each disassembly takes most of a second. Kept in `kept`, outside the build
    the pipeline tests copy (written whole, then renamed into place: a worker reads all of it or none)."""
    if kept.exists():
        return kept.read_text()
    env = {**os.environ, "PATH": f"{Path(cuobjdump).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, env=env, check=True).stdout
    kept.parent.mkdir(exist_ok=True)
    partial = kept.with_suffix(f".sass.{os.getpid()}")
    partial.write_text(sass)
    partial.replace(kept)
    return sass


def _instructions(sass_text: str) -> list[str]:
    """The instruction lines of cuobjdump's SASS (each opens with its address, /*0a30*/)."""
    return [line for line in sass_text.splitlines() if re.match(r"\s*/\*[0-9a-f]{4,}\*/", line)]


def test_v15_is_a_producer_and_two_consumer_warpgroups(records, built):
    v15 = records[("v15", "sm_90a")]
    assert v15["launch"]["threads"] == 384 and v15["launch"]["block_rows"] == 128 and v15["launch"]["block_cols"] == 128
    # all that __launch_bounds__(384, 1) allows a thread, for setmaxnreg to move between the roles
    assert v15["registers"] == 168
    # Q 32 KB + 3 stages x (K 32 + V 32) KB, 13 barriers, and 1 KB to align the base: within the 227 KB opt-in
    assert v15["launch"]["dynamic_smem_bytes"] == 224 * 1024 + 13 * 8 + 1024 <= 232448
    sass = _sass(v15, built)
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in sass and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0" in sass


def test_v16_takes_turns_on_named_barriers(records, built):
    v15, v16 = records[("v15", "sm_90a")], records[("v16", "sm_90a")]
    assert v16["launch"] == v15["launch"] and v16["registers"] == 168
    sass = _sass(v16, built)
    assert "BAR.ARV" in sass and "BAR.SYNC.DEFER_BLOCKING R" in sass  # turn ids in a register: 1 + consumer
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in sass and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0" in sass


def test_v17_runs_its_softmax_between_the_two_waits(records, built):
    """The exps of the softmax sit after a wait_group 1 and before the next wait_group 0 in the SASS:
    ptxas has not moved the wait for PV above them."""
    v16, v17 = records[("v16", "sm_90a")], records[("v17", "sm_90a")]
    assert v17["launch"] == v16["launch"] and v17["registers"] == 168
    sass = _instructions(_sass(v17, built))
    waits = [i for i, line in enumerate(sass) if "WARPGROUP.DEPBAR.LE" in line]
    overlapped = [sum("MUFU.EX2" in line for line in sass[a:b]) for a, b in zip(waits, waits[1:])
                  if "gsb0, 0x1" in sass[a]]
    assert overlapped and all(n >= 64 for n in overlapped)


def assert_softmax_between_the_waits_and_the_guard_first(sass_text: str) -> None:
    """Every wait_group 1 (QK done, PV still running) is followed by the softmax's exps (64 of them or
    more) before the next wait; and the grid guard traps before the barriers are set up, the roles
    split, or anyone waits."""
    sass = _instructions(sass_text)
    waits = [i for i, line in enumerate(sass) if "WARPGROUP.DEPBAR.LE" in line]
    overlapped = [sum("MUFU.EX2" in line for line in sass[a:b]) for a, b in zip(waits, waits[1:])
                  if "gsb0, 0x1" in sass[a]]
    assert overlapped and all(n >= 64 for n in overlapped)
    first_trap = next(i for i, line in enumerate(sass) if "BPT.TRAP" in line)
    assert first_trap < min(i for i, line in enumerate(sass) if "SYNCS.EXCH" in line)


def test_v18_is_v17_on_a_persistent_grid(records, built):
    """V18 states a persistent launch (one block per SM), keeps V17's shape and shared memory plus
    one barrier (q_empty), and its softmax still runs between the two waits of each batch."""
    v17, v18 = records[("v17", "sm_90a")], records[("v18", "sm_90a")]
    assert v18["launch"] == {**v17["launch"], "dynamic_smem_bytes": v17["launch"]["dynamic_smem_bytes"] + 8,
                             "persistent": {"ctas_per_sm": 1}}
    assert v18["launch"]["dynamic_smem_bytes"] <= 232448 and v18["registers"] == 168
    sass_text = _sass(v18, built)
    assert "USETMAXREG.DEALLOC.CTAPOOL 0x18" in sass_text and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0" in sass_text
    assert_softmax_between_the_waits_and_the_guard_first(sass_text)


def test_v19_stores_o_through_shared_memory_with_tma(records, built):
    """V19 is V18's launch plus a tensor map over o (64-row boxes, one per consumer warpgroup and half),
    with a 2-stage K/V ring and a 32 KB O tile: 64 KB of K/V and one stage's 4 barriers less, 32 KB of
    O more. Its SASS writes O with stmatrix and TMA stores, and has no plain global stores left."""
    v18, v19 = records[("v18", "sm_90a")], records[("v19", "sm_90a")]
    o_map = {"array": "o", "box": [64, 64], "swizzle": 128}
    assert v19["launch"] == {**v18["launch"], "tensor_maps": v18["launch"]["tensor_maps"] + [o_map],
                             "dynamic_smem_bytes": v18["launch"]["dynamic_smem_bytes"] - 64 * 1024 + 32 * 1024 - 4 * 8}
    assert v19["launch"]["dynamic_smem_bytes"] <= 232448 and v19["registers"] == 168
    assert v19["spill_bytes"] == 0 and "C7508" not in v19["ptxas_report"]
    sass_text = _sass(v19, built)
    assert "HGMMA." in sass_text and "USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xf0" in sass_text
    assert "UTMASTG" in sass_text and "STSM" in sass_text and "FENCE.VIEW.ASYNC.S" in sass_text
    assert not re.search(r"\bSTG\.", sass_text)  # O leaves through TMA only
    assert_softmax_between_the_waits_and_the_guard_first(sass_text)


def _turns(sass_text: str, wgmma: int = 16) -> list[list[str]]:
    """The instructions from each turn's sync (BAR.SYNC on a register id, 256 threads) to its arrive
    (BAR.ARV) that issue a full batch, QK and PV: `wgmma` of them (16 at D=128), i.e. the tile loop's turn."""
    lines = _instructions(sass_text)
    held = []
    for i, line in enumerate(lines):
        if re.search(r"BAR\.SYNC\.DEFER_BLOCKING R\d+, 0x100", line):
            end = next(j for j in range(i, len(lines)) if "BAR.ARV" in lines[j])
            if sum("HGMMA" in x for x in lines[i:end]) == wgmma:
                held.append(lines[i:end])
    return held


def assert_the_turn_holds_the_wgmma_issue_alone(turn: list[str]) -> None:
    """No O rescale (FMUL), P packing (F2FP) or descriptor move into uniform registers (R2UR) while
    the other warpgroup waits for the turn (V20 on)."""
    assert not any(op in line for line in turn for op in ("FMUL", "F2FP", "R2UR"))


def test_v20_holds_the_turn_for_the_wgmma_issue_alone(records, built):
    """V20 is V19's launch. In the tile loop, V19's turn holds the O rescale's multiplies and the moves
    of the Q descriptor into uniform registers (R2UR); V20's holds neither, and fewer than half the
    instructions. Its softmax still runs between the two waits of each batch."""
    v19, v20 = records[("v19", "sm_90a")], records[("v20", "sm_90a")]
    assert v20["launch"] == v19["launch"] and v20["registers"] == 168 and v20["spill_bytes"] == 0
    v20_sass = _sass(v20, built)
    (v19_turn,), (v20_turn,) = _turns(_sass(v19, built)), _turns(v20_sass)
    assert any("FMUL" in line for line in v19_turn) and any("R2UR" in line for line in v19_turn)
    assert_the_turn_holds_the_wgmma_issue_alone(v20_turn)
    assert 2 * len(v20_turn) < len(v19_turn)
    assert_softmax_between_the_waits_and_the_guard_first(v20_sass)


def test_v21_changes_the_producer_only(records, built):
    """V21 reorders the producer's loads: the launch, the registers and the consumers' turn are V20's.
    The producer issues its loads from four places (K, V and Q in the loop, the last V after it), two
    boxes each, where V20's has three (Q, K, V)."""
    v20, v21 = records[("v20", "sm_90a")], records[("v21", "sm_90a")]
    assert v21["launch"] == v20["launch"] and v21["registers"] == v20["registers"] and v21["spill_bytes"] == 0
    v20_sass, v21_sass = _sass(v20, built), _sass(v21, built)
    assert v20_sass.count("UTMALDG") == 3 * 2 and v21_sass.count("UTMALDG") == 4 * 2
    (v20_turn,), (v21_turn,) = _turns(v20_sass), _turns(v21_sass)
    assert len(v21_turn) == len(v20_turn)
    assert_the_turn_holds_the_wgmma_issue_alone(v21_turn)
    assert_softmax_between_the_waits_and_the_guard_first(v21_sass)


def _fmuls_branched_over(sass_text: str) -> list[int]:
    """For each predicated forward branch, the FMULs between it and its target: the code it skips."""
    lines = _instructions(sass_text)
    address = [int(re.match(r"\s*/\*([0-9a-f]+)\*/", line)[1], 16) for line in lines]
    skipped = []
    for i, line in enumerate(lines):
        if m := re.search(r"@!?U?P\d+\s+BRA 0x([0-9a-f]+)", line):
            target = int(m[1], 16)
            if target > address[i]:
                skipped.append(sum("FMUL" in x for x, a in zip(lines[i:], address[i:]) if a < target))
    return skipped


def test_v22_rescales_o_only_when_a_row_max_moved(records, built):
    """V22's O rescale (64 multiplies per thread) sits behind a branch on a warp vote, before the turn
    in the tile loop and in the last batch; V21's runs in every batch."""
    v21, v22 = records[("v21", "sm_90a")], records[("v22", "sm_90a")]
    assert v22["launch"] == v21["launch"] and v22["registers"] == v21["registers"] and v22["spill_bytes"] == 0
    v21_sass, v22_sass = _sass(v21, built), _sass(v22, built)
    assert "VOTE.ANY" in v22_sass and "VOTE.ANY" not in v21_sass
    assert _fmuls_branched_over(v22_sass).count(64) == 2 and 64 not in _fmuls_branched_over(v21_sass)
    (v22_turn,) = _turns(v22_sass)
    assert_the_turn_holds_the_wgmma_issue_alone(v22_turn)
    assert_softmax_between_the_waits_and_the_guard_first(v22_sass)


def test_a_hopper_kernel_does_not_build_for_a_plain_arch(tmp_path, settings, needs_nvcc):
    with pytest.raises(FlashbenchError, match="needs sm_90a"):
        compile_kernel("v14", ROOT / "kernels" / "v14.cu", "sm_90", settings.nvcc_flags, {}, tmp_path / "v14.cubin")


def test_the_compile_stage_says_why_the_hopper_line_is_built_for_sm_90a_alone(built, settings):
    hopper = [k.name for k in settings.kernels if k.archs == ["sm_90a"]]
    log = (built / "logs" / "compile" / "all-built.log").read_text()
    assert f"{', '.join(hopper)} built for sm_90a only (wgmma and TMA as used here are Hopper's; SM100/SM103's path is tcgen05)" in log
    assert not any((built / "build" / "sm_103" / f"{name}.cubin").exists() for name in hopper)


def _fmnmx_before_the_exps(sass_text: str) -> list[int]:
    """For each wait for a QK (wait_group 1) in the tile loop: the FMNMX before its softmax's 64th exp."""
    sass = _instructions(sass_text)
    counts = []
    for i, line in enumerate(sass):
        if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in line:
            exps = [j for j in range(i, len(sass)) if "MUFU.EX2" in sass[j]][:64]
            counts.append(sum("FMNMX" in x for x in sass[i:exps[-1]]))
    return counts


def test_v23_takes_the_tiles_max_only_after_the_exps(records, built):
    """V23 is V22's launch and registers. After the wait for each QK of the tile loop, V22 takes the
    tile's max (64 FMNMX and more) before its exps; V23's 64 exps come first, with no max among them.
    Its rare path multiplies S again from shared memory (LDS, which V22's consumers never issue). The
    turn still holds no O rescale (64 FMUL; one of the softmax's two m * scale products may be scheduled
    there) and no descriptor move, though ptxas now packs P inside it."""
    v22, v23 = records[("v22", "sm_90a")], records[("v23", "sm_90a")]
    assert v23["launch"] == v22["launch"] and v23["registers"] == v22["registers"] and v23["spill_bytes"] == 0
    v22_sass, v23_sass = _sass(v22, built), _sass(v23, built)
    assert all(n >= 64 for n in _fmnmx_before_the_exps(v22_sass))
    assert _fmnmx_before_the_exps(v23_sass) == [0]
    assert "LDS" in v23_sass and "LDS" not in v22_sass
    (v23_turn,) = _turns(v23_sass)
    assert sum("FMUL" in line for line in v23_turn) <= 2 and not any("R2UR" in line for line in v23_turn)
    assert any("F2FP" in line for line in v23_turn)
    assert_softmax_between_the_waits_and_the_guard_first(v23_sass)


def test_v24_loads_each_consumer_warpgroups_rows_of_q_on_their_own(records, built):
    """V24 is V23 but for Q: 64-row boxes (one full and one empty barrier more, 16 bytes), so that each
    consumer warpgroup's rows are loaded on their own; the producer's SASS holds more TMA loads (four
    boxes of Q a work tile, not two), and the consumers' turn is V23's (no O rescale, no descriptor
    move). Its offsets and byte counts are the GPU tests' to check."""
    v23, v24 = records[("v23", "sm_90a")], records[("v24", "sm_90a")]
    q_map, *other_maps = v23["launch"]["tensor_maps"]
    assert q_map == {"array": "q", "box": [64, 128], "swizzle": 128}
    assert v24["launch"] == {**v23["launch"], "dynamic_smem_bytes": v23["launch"]["dynamic_smem_bytes"] + 16,
                             "tensor_maps": [{**q_map, "box": [64, 64]}, *other_maps]}
    assert v24["registers"] == v23["registers"] and v24["spill_bytes"] == 0
    v23_sass, v24_sass = _sass(v23, built), _sass(v24, built)
    assert v24_sass.count("UTMALDG") == v23_sass.count("UTMALDG") + 2
    (v23_turn,), (v24_turn,) = _turns(v23_sass), _turns(v24_sass)
    assert abs(len(v24_turn) - len(v23_turn)) <= 2 and not any("R2UR" in line for line in v24_turn)
    assert sum("HGMMA" in line for line in v24_turn) == 16 and sum("FMUL" in line for line in v24_turn) <= 2
    assert_softmax_between_the_waits_and_the_guard_first(v24_sass)


def _functions(sass_text: str) -> dict[str, str]:
    """A cubin's SASS by entry function (cuobjdump's "Function : name" sections)."""
    parts = re.split(r"\n\s*Function : (\w+)\n", sass_text)
    return dict(zip(parts[1::2], parts[2::2]))


def test_v25_is_v24s_schedule_on_maps_by_head_and_its_causal_build_masks(records, built):
    """V25 keeps V24's shared memory, registers and turn (in both copies of a batch: the loop's and the
    last key tile's), and loads and stores through 4-D tensor maps (by head: any S); its build in the
    causal configuration (FLASH_CAUSAL=1) is the causal kernel, which its contract says, from the same
    source and with the same resources. The mask's selects (-inf) are in both builds. Each build has a
    second entry for an S whose last key tile holds 1 to 32 keys, which its contract names: the same
    resources and turns, its QK(0) of 32 keys (wgmma N=32) where the first entry's are all 128."""
    v24, v25, causal = records[("v24", "sm_90a")], records[("v25", "sm_90a")], records[("v25.causal", "sm_90a")]
    ragged_first = {"entry": "flash_attention_forward_ragged_first", "keys": 32}
    # + 8 bytes: the O tile's read barrier (used where the consumers share one O tile, at D = 256)
    assert v25["launch"] == {**v24["launch"], "tensor_map_rank": 4, "work_list": {"l2_section_bytes": 0},
                             "ragged_first": ragged_first, "dynamic_smem_bytes": v24["launch"]["dynamic_smem_bytes"] + 8}
    assert v25["registers"] == v24["registers"] and v25["spill_bytes"] == 0
    assert v25["stack_frame_bytes"] == causal["stack_frame_bytes"] == ROLLED_RARE_PATH_STACK["v25"]
    assert causal["launch"] == {**v25["launch"], "causal": True, "work_list": {"l2_section_bytes": 16 << 20}}
    assert causal["defines"] == {"FLASH_CAUSAL": 1}
    assert causal["registers"] == v25["registers"] and causal["spill_bytes"] == 0
    for build in (v25, causal):
        assert build["ragged_first"] == {"registers": v25["registers"], "stack_frame_bytes": v25["stack_frame_bytes"],
                                         "spill_store_bytes": 0, "spill_load_bytes": 0, "static_smem_bytes": 0}
    v24_sass = _sass(v24, built)
    (v24_turn,), v24_loads = _turns(v24_sass), v24_sass.count("UTMALDG")
    for build in (v25, causal):
        entries = _functions(_sass(build, built))
        assert set(entries) == {"flash_attention_forward", "flash_attention_forward_ragged_first"}
        for name, sass_text in entries.items():
            assert "UTMALDG.4D" in sass_text and "UTMALDG.2D" not in sass_text and "UTMASTG.4D" in sass_text
            assert sass_text.count("UTMALDG") == v24_loads
            assert "-INF" in sass_text.split("FSEL", 1)[1]
            turns = _turns(sass_text)
            assert 1 <= len(turns) <= 2  # the loop's batch and the peeled last key tile's (one, where alike)
            for turn in turns:  # no longer than V24's, and the Q descriptor in uniform registers already
                assert len(turn) <= len(v24_turn) + 2 and not any("R2UR" in line for line in turn)
            assert_softmax_between_the_waits_and_the_guard_first(sass_text)
            narrow = sum("HGMMA.64x32x16" in line for line in _instructions(sass_text))
            assert narrow == (8 if name.endswith("ragged_first") else 0)  # QK(0)'s 8 k-steps, 32 keys wide
        assert len(_turns(entries["flash_attention_forward"])) == 2


def test_v25_in_bf16_and_on_grouped_kv_heads_keeps_the_fp16_builds_turns(records, built):
    """The bf16 build (FLASH_BF16=1) is the fp16 one with bf16 inputs to every wgmma; the grouped build
    (FLASH_GROUPED_KV=1) the fp16 one with each K and V load's head divided by the group. Both keep its
    resources, entries and turns (no wgmma serialised), and their contracts say what they take."""
    v25 = records[("v25", "sm_90a")]
    bf16, gqa = records[("v25.bf16", "sm_90a")], records[("v25.gqa", "sm_90a")]
    assert bf16["launch"] == {**v25["launch"], "dtype": "bf16"} and bf16["defines"] == {"FLASH_BF16": 1}
    assert gqa["launch"] == {**v25["launch"], "grouped_kv": True} and gqa["defines"] == {"FLASH_GROUPED_KV": 1}
    fp16_entries = _functions(_sass(v25, built))
    fp16_turns = {name: [len(turn) for turn in _turns(text)] for name, text in fp16_entries.items()}
    for build in (bf16, gqa):
        for key in ("registers", "spill_bytes", "stack_frame_bytes"):
            assert build[key] == v25[key], key
        for name, sass_text in _functions(_sass(build, built)).items():
            gmma = [line for line in _instructions(sass_text) if "HGMMA" in line]
            assert len(gmma) == sum("HGMMA" in line for line in _instructions(fp16_entries[name]))
            assert all((".BF16" in line) == (build is bf16) for line in gmma)
            assert [len(turn) for turn in _turns(sass_text)] == pytest.approx(fp16_turns[name], abs=2)


@pytest.mark.parametrize("fp16, bf16", [("v25", "v25.bf16"), ("v25.causal", "v25.causal_bf16"),
                                        ("v25.gqa", "v25.gqa_bf16"), ("v25.d64", "v25.d64_bf16"),
                                        ("v25.d256", "v25.d256_bf16"), ("v25.gqa_causal", "v25.gqa_causal_bf16"),
                                        ("v25.d64_causal", "v25.d64_causal_bf16"),
                                        ("v25.d256_causal", "v25.d256_causal_bf16"),
                                        ("v25.gqa_d64", "v25.gqa_d64_bf16"), ("v25.gqa_d256", "v25.gqa_d256_bf16"),
                                        ("v25.gqa_d64_causal", "v25.gqa_d64_causal_bf16"),
                                        ("v25.gqa_d256_causal", "v25.gqa_d256_causal_bf16")])
def test_each_bf16_twin_is_its_fp16_configurations_build_on_bf16_wgmma(records, built, fp16, bf16):
    """bf16 in every configuration: each configuration's bf16 twin builds as it does in fp16, with the same
    registers, spill and stack, the same wgmma in each entry, every one of them on bf16, and its turns."""
    twin, base = records[(bf16, "sm_90a")], records[(fp16, "sm_90a")]
    assert twin["launch"] == {**base["launch"], "dtype": "bf16"}
    assert twin["defines"] == {**base["defines"], "FLASH_BF16": 1}
    for key in ("registers", "spill_bytes", "stack_frame_bytes", "smem_bytes"):
        assert twin[key] == base[key], key
    base_entries = _functions(_sass(base, built))
    for name, sass_text in _functions(_sass(twin, built)).items():
        gmma = [line for line in _instructions(sass_text) if "HGMMA" in line]
        assert len(gmma) == sum("HGMMA" in line for line in _instructions(base_entries[name])) and gmma
        assert all(".BF16" in line for line in gmma)
        assert [len(turn) for turn in _turns(sass_text)] == pytest.approx(
            [len(turn) for turn in _turns(base_entries[name])], abs=2)


def test_v25_at_head_dims_64_and_256_takes_its_tiles_from_d(records, built):
    """FLASH_HEAD_DIM=64: one box of 64 head columns a row, QK on wgmma N=128 over 4 k-steps, PV on N=64,
    three consumer warpgroups (row tiles of 192);
    =256: four boxes, key tiles of 64 (QK on N=64 over 16 k-steps, PV on N=256) and one O
    tile of 64 rows that the consumers take in turns. Each builds clean, within a block's shared memory,
    with V25's three copies of QK and of PV (batch 0 or the loop's, the peeled last, the final PV), the
    ragged-first entry's QK(0) 32 keys wide, and a TMA per box of each load and of the O store."""
    v25 = records[("v25", "sm_90a")]
    for D, block_cols, qk, pv in ((64, 128, "64x128x16", "64x64x16"), (256, 64, "64x64x16", "64x256x16")):
        r = records[(f"v25.d{D}", "sm_90a")]
        consumers = 3 if D == 64 else 2  # at D=64 three consumer warpgroups of 64 rows, 160 registers each
        assert r["defines"] == {"FLASH_HEAD_DIM": D} and r["launch"]["threads"] == 128 * (1 + consumers)
        assert r["registers"] == (128 if D == 64 else v25["registers"])  # 65536 / threads, as launched
        assert r["spill_bytes"] == (16 if D == 64 else 0)  # the rare path's mask: 8 bytes stored, 8 loaded
        assert r["launch"]["head_dim"] == D and r["launch"]["block_cols"] == block_cols
        assert r["launch"]["block_rows"] == 64 * consumers and r["launch"]["dynamic_smem_bytes"] <= 232448
        # the rare path's S, a thread's part of a key tile (and at D=64 its spill)
        assert r["stack_frame_bytes"] == block_cols // 2 * 4 + (16 if D == 64 else 0)
        for name, sass_text in _functions(_sass(r, built)).items():
            shapes = Counter(m.group(1) for m in re.finditer(r"HGMMA\.(64x\d+x16)", sass_text))
            narrow = D // 16 if name.endswith("ragged_first") else 0  # QK(0) of 32 keys
            assert shapes == Counter({qk: 3 * D // 16 - narrow, pv: 3 * block_cols // 16, "64x32x16": narrow})
            loads = sass_text.count("UTMALDG")  # K's, V's (in the loop and the last) and Q's, each a TMA per box
            assert sass_text.count("UTMASTG") == D // 64 and loads % (D // 64) == 0 and loads >= 4 * D // 64


@pytest.mark.parametrize("D", [64, 256])
def test_v25_at_head_dims_64_and_256_under_the_mask_keeps_its_schedule(records, built, D):
    """FLASH_HEAD_DIM=64 or 256 with FLASH_CAUSAL=1: a row tile's diagonal crosses its last two key tiles (192
    rows on tiles of 128 keys at D=64, 128 rows on 64 at D=256), both masked in a loop of the masked batch (one
    copy), and at D=256 the shared O tile goes to the other consumer after a store or, for causal row tile 0
    of the ragged-first entry, a copy. The build keeps its D's registers, shared memory and wgmma, no wgmma
    serialised (ptxas warns where it does, and, as it did at D=64 here without a warning, waits in the turn
    for each wgmma it issues), and its contract says causal. At D=64 it spills nothing: the rare path's S is
    masked in local memory (kMaskRolled), where masked in registers it had a row sum spilled through every
    batch."""
    dense, causal = records[(f"v25.d{D}", "sm_90a")], records[(f"v25.d{D}_causal", "sm_90a")]
    assert causal["launch"] == {**dense["launch"], "causal": True, "work_list": {"l2_section_bytes": 16 << 20}}
    assert causal["defines"] == {"FLASH_CAUSAL": 1, "FLASH_HEAD_DIM": D}
    for key in ("registers", "smem_bytes") + (() if D == 64 else ("spill_bytes", "stack_frame_bytes")):
        assert causal[key] == dense[key], key
    if D == 64:  # both entries clean; D=64 without the mask keeps the 8 bytes its rare path's mask spills
        second = causal["ragged_first"]
        assert causal["spill_bytes"] == 0 and second["spill_store_bytes"] == second["spill_load_bytes"] == 0
        assert causal["stack_frame_bytes"] == 128 // 2 * 4  # the rare path's S alone
    assert "warning" not in causal["ptxas_report"].lower()
    dense_entries = _functions(_sass(dense, built))
    for name, sass_text in _functions(_sass(causal, built)).items():
        gmma = Counter(m.group(1) for m in re.finditer(r"HGMMA\.(64x\d+x16)", sass_text))
        assert gmma == Counter(m.group(1) for m in re.finditer(r"HGMMA\.(64x\d+x16)", dense_entries[name]))
        turns = _turns(sass_text, wgmma=D // 16 + 128 // 16 if D == 64 else 256 // 16 + 64 // 16)  # QK's, PV's
        assert len(turns) == 2 and all(not any("WARPGROUP.DEPBAR" in line for line in turn) for turn in turns)


@pytest.mark.parametrize("mask", ["", "_causal"])
@pytest.mark.parametrize("D", [64, 256])
def test_v25_on_grouped_kv_heads_at_head_dims_64_and_256_keeps_its_ds_build(records, built, D, mask):
    """FLASH_GROUPED_KV=1 at D=64 and 256, without the mask and under it: the build of that D on full heads
    with each K and V load's head worked out from the group, as at D=128: its registers, spill, shared memory
    and wgmma, no wgmma waited on in a turn, and a contract that says grouped_kv. One register more spilled
    in one entry: at D=64 without the mask the ragged-first entry (1 to 32 keys in S's last key tile) stores
    the thread's swizzle term for the O tile once at its start and loads it in each work tile's epilogue
    (4 bytes; in the SASS, the LDL before the stores' XORs)."""
    full, grouped = records[(f"v25.d{D}{mask}", "sm_90a")], records[(f"v25.gqa_d{D}{mask}", "sm_90a")]
    assert grouped["launch"] == {**full["launch"], "grouped_kv": True}
    assert grouped["defines"] == {**full["defines"], "FLASH_GROUPED_KV": 1}
    for key in ("registers", "spill_bytes", "stack_frame_bytes", "smem_bytes"):
        assert grouped[key] == full[key], key
    epilogue_spill = 4 if (D, mask) == (64, "") else 0
    assert grouped["ragged_first"]["spill_store_bytes"] == full["ragged_first"]["spill_store_bytes"] + epilogue_spill
    assert "warning" not in grouped["ptxas_report"].lower()
    full_entries = _functions(_sass(full, built))
    for name, sass_text in _functions(_sass(grouped, built)).items():
        gmma = Counter(m.group(1) for m in re.finditer(r"HGMMA\.(64x\d+x16)", sass_text))
        assert gmma == Counter(m.group(1) for m in re.finditer(r"HGMMA\.(64x\d+x16)", full_entries[name]))
        turns = _turns(sass_text, wgmma=D // 16 + 128 // 16 if D == 64 else 256 // 16 + 64 // 16)
        assert len(turns) == 2 and all(not any("WARPGROUP.DEPBAR" in line for line in turn) for turn in turns)


@pytest.mark.parametrize("build, contract, message", [
    ("v25.causal", {"head_dim": 128}, "built for the configuration causal, its launch contract says causal False "
                                      "(asked True)"),
    ("v25", {"head_dim": 128, "causal": True}, "built for the configuration dense, its launch contract says causal True "
                                               "(asked False)"),
    ("v25.bf16", {"head_dim": 128}, "says dtype fp16 (asked bf16)"),
    ("v25.gqa", {"head_dim": 128}, "says grouped_kv False (asked True)"),
])
def test_a_build_whose_contract_states_another_configuration_is_refused(tmp_path, capsys, monkeypatch, settings, build,
                                                                        contract, message):
    """A kernel in a configuration is built with the configuration's parameters (FLASH_CAUSAL=1 for the
    causal one, FLASH_BF16=1 for bf16), and its launch contract must say the mask, the element type and
    the head dim back, and take grouped K/V heads where the configuration groups them: a source that
    ignores a parameter would be checked and timed as what it does not compute. No record is written."""
    import flashbench.compile

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(cli, "load_settings", lambda path: settings)
    given = {}

    def fake_compile(name, source, arch, flags, defines, cubin):
        given.update(name=name, defines=defines)
        return {"launch": contract}

    monkeypatch.setattr(flashbench.compile, "compile_kernel", fake_compile)
    record = tmp_path / "out.json"
    assert cli.main(["compile", "--settings", "settings.json", "--kernel", build, "--arch", "sm_90a",
                     f"--cubin={tmp_path / 'out.cubin'}", f"--record={record}"]) == 1
    assert given == {"name": build, "defines": settings.run(build).configuration.defines}
    assert given["defines"] == {"v25.causal": {"FLASH_CAUSAL": 1}, "v25.bf16": {"FLASH_BF16": 1},
                                "v25.gqa": {"FLASH_GROUPED_KV": 1}}.get(build, {})
    assert message in capsys.readouterr().err and not record.exists()
