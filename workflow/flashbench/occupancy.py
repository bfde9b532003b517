"""Blocks per SM that a kernel's registers, shared memory and threads allow, per architecture."""
from __future__ import annotations

from dataclasses import dataclass

from . import FlashbenchError


@dataclass(frozen=True)
class SMLimits:
    registers: int = 65536
    register_unit: int = 256  # registers are given to each warp in units of this many
    max_threads: int = 2048
    max_blocks: int = 32
    smem_bytes: int = 233472  # 228 KiB per SM
    smem_per_block_max: int = 232448  # 227 KiB a block may opt in to
    smem_reserved_per_block: int = 1024  # the runtime's own share of each block
    smem_unit: int = 128


# A block's shared memory past this is dynamic and opted in to (cudaFuncAttributeMaxDynamicSharedMemorySize):
# what a kernel without the opt-in may use, static shared memory at most, on every architecture here
SMEM_WITHOUT_OPT_IN = 48 * 1024

# CUDA occupancy tables (compute capability 9.0, 10.x, 12.x); sm_120 has 100 KiB per SM.
LIMITS = {
    "sm_90": SMLimits(),
    "sm_100": SMLimits(),
    "sm_103": SMLimits(),
    "sm_120": SMLimits(max_threads=1536, smem_bytes=102400, smem_per_block_max=101376),
}


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _limits(arch: str) -> SMLimits:
    arch = arch.removesuffix("a")  # sm_90a: an sm_90 with its own features, the same SM
    if arch not in LIMITS:
        raise FlashbenchError(f"no occupancy limits known for {arch}")
    return LIMITS[arch]


def blocks_by_shared_memory(arch: str, smem_bytes: int) -> int:
    """Blocks per SM that `smem_bytes` of shared memory per block allow, other limits aside."""
    lim = _limits(arch)
    if smem_bytes > lim.smem_per_block_max:
        return 0
    return lim.smem_bytes // _round_up(smem_bytes + lim.smem_reserved_per_block, lim.smem_unit)


def blocks_per_sm(arch: str, threads: int, registers: int, smem_bytes: int) -> dict:
    """Resident blocks per SM and which resource limits them (ties name every binding limit)."""
    lim = _limits(arch)
    warps = -(-threads // 32)
    regs_per_warp = _round_up(max(registers, 1) * 32, lim.register_unit)
    by = {
        "registers": lim.registers // (regs_per_warp * warps),
        "shared memory": blocks_by_shared_memory(arch, smem_bytes),
        "threads": lim.max_threads // threads,
        "blocks": lim.max_blocks,
    }
    blocks = min(by.values())
    return {"blocks_per_sm": blocks, "limited_by": [k for k, v in by.items() if v == blocks]}
