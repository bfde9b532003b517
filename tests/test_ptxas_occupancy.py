import pytest

from flashbench import FlashbenchError, occupancy, ptxas
from flashbench.gpu import arch_of, slugify

REPORT = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'other_kernel' for 'sm_90'
ptxas info    : Function properties for other_kernel
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 0 barriers, 1024 bytes smem, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'flash_attention_forward' for 'sm_103'
ptxas info    : Function properties for flash_attention_forward
    344 bytes stack frame, 344 bytes spill stores, 392 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 344 bytes cumulative stack size, 37760 bytes smem, 388 bytes cmem[0]
ptxas info    : Compile time = 92.697 ms
"""


def test_parse_reads_the_named_entry_only():
    r = ptxas.parse(REPORT, "flash_attention_forward")
    assert r == {"arch": "sm_103", "registers": 96, "stack_frame_bytes": 344, "spill_store_bytes": 344,
                 "spill_load_bytes": 392, "static_smem_bytes": 37760}
    assert ptxas.parse(REPORT, "other_kernel")["registers"] == 40


def test_parse_without_static_smem_and_unknown_entry():
    text = REPORT.replace(", 37760 bytes smem", "")
    assert ptxas.parse(text, "flash_attention_forward")["static_smem_bytes"] == 0
    with pytest.raises(FlashbenchError, match="no entry function 'missing'"):
        ptxas.parse(REPORT, "missing")


@pytest.mark.parametrize("threads, registers, smem, blocks, limit", [
    (128, 126, 37760, 4, ["registers"]),  # V11 as rebuilt
    (128, 96, 37760, 5, ["registers"]),  # the write-up's V11: about 96 registers, about 5 blocks
    (256, 124, 59392, 2, ["registers"]),  # the write-up's V13: 124 registers, 58 KB, 2 blocks per SM
    (256, 64, 100 * 1024, 2, ["shared memory"]),
    (64, 16, 0, 32, ["threads", "blocks"]),
])
def test_blocks_per_sm(threads, registers, smem, blocks, limit):
    got = occupancy.blocks_per_sm("sm_90", threads, registers, smem)
    assert got == {"blocks_per_sm": blocks, "limited_by": limit}


def test_more_shared_memory_than_a_block_may_have_gives_zero_blocks():
    assert occupancy.blocks_per_sm("sm_103", 256, 64, 240 * 1024)["blocks_per_sm"] == 0


def test_gpu_names_and_archs():
    assert slugify("NVIDIA H200") == "nvidia-h200"
    assert slugify("NVIDIA B300 SXM6 AC") == "nvidia-b300-sxm6-ac"
    assert arch_of("9.0") == "sm_90" and arch_of("10.3") == "sm_103"
