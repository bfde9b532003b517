"""nvcc builds every configured kernel for sm_90 and sm_103 (CPU only; nvcc needed)."""
import pytest

from flashbench import FlashbenchError
from flashbench.compile import CommandFailed, compile_kernel
from flashbench.files import read_json

from conftest import ROOT

ARCHS = ["sm_90", "sm_103"]


@pytest.fixture(scope="module")
def records(settings, built):
    """The compile records the pipeline's compile stage wrote (compile_kernel's, as JSON)."""
    return {(k.name, arch): read_json(built / "build" / arch / f"{k.name}.json")
            for k in settings.kernels for arch in ARCHS}


def test_every_kernel_compiles_for_both_archs(records, settings):
    assert set(records) == {(k.name, a) for k in settings.kernels for a in ARCHS}
    for (name, arch), r in records.items():
        assert r["arch"] == arch
        assert 0 < r["registers"] <= 255
        assert r["blocks_per_sm"] >= 1, f"{name} cannot be resident on {arch}"
        assert "-Xptxas -v" in r["command"] and f"-arch={arch}" in r["command"]
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
    assert "nvcc -cubin -arch=sm_90" in failed.value.transcript.splitlines()[0]
    assert nvccs in failed.value.transcript


def test_a_long_error_shows_its_first_lines_and_keeps_the_rest_for_the_log():
    error = CommandFailed("compiling x for sm_90", ["nvcc", "x.cu"], "\n".join(f"line {i}" for i in range(25)))
    assert str(error).splitlines() == ["compiling x for sm_90 failed:", *(f"line {i}" for i in range(10)),
                                       "... 15 more lines in the log"]
    assert error.transcript.splitlines() == ["nvcc x.cu", *(f"line {i}" for i in range(25))]


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
