"""nvcc builds every configured kernel for sm_90 and sm_103 (CPU only; nvcc needed)."""
import pytest

from flashbench import FlashbenchError
from flashbench.compile import compile_kernel

from conftest import ROOT

ARCHS = ["sm_90", "sm_103"]


@pytest.fixture(scope="module")
def records(settings, needs_nvcc, tmp_path_factory):
    out = tmp_path_factory.mktemp("build")
    return {(k.name, arch): compile_kernel(k.name, ROOT / k.source, arch, settings.nvcc_flags, k.defines,
                                           out / arch / f"{k.name}.cubin")
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
    with pytest.raises(FlashbenchError, match="compiling broken for sm_90 failed"):
        compile_kernel("broken", broken, "sm_90", settings.nvcc_flags, {}, tmp_path / "broken.cubin")
