"""Parse the resource report of `nvcc -Xptxas -v` for one entry function."""
from __future__ import annotations

import re

from . import FlashbenchError

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\w+)'")
_FRAME = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, (?P<loads>\d+) bytes spill loads"
)
_USED = re.compile(r"Used (?P<registers>\d+) registers")
_SMEM = re.compile(r"(?P<smem>\d+) bytes smem")


def parse(report: str, entry: str) -> dict:
    """Registers, spills, stack frame and static shared memory of `entry` in a ptxas -v report."""
    lines = report.splitlines()
    start = next((i for i, line in enumerate(lines) if (m := _ENTRY.search(line)) and m["name"] == entry), None)
    if start is None:
        raise FlashbenchError(f"ptxas report has no entry function {entry!r}")
    arch = _ENTRY.search(lines[start])["arch"]
    block = []
    for line in lines[start + 1 :]:
        if _ENTRY.search(line):
            break
        block.append(line)
    text = "\n".join(block)
    frame, used = _FRAME.search(text), _USED.search(text)
    if frame is None or used is None:
        raise FlashbenchError(f"ptxas report for {entry!r} lacks its stack/spill or register line")
    smem = _SMEM.search(used.string[used.start() :].splitlines()[0])
    return {
        "arch": arch,
        "registers": int(used["registers"]),
        "stack_frame_bytes": int(frame["stack"]),
        "spill_store_bytes": int(frame["stores"]),
        "spill_load_bytes": int(frame["loads"]),
        "static_smem_bytes": int(smem["smem"]) if smem else 0,
    }
