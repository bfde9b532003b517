"""Build one kernel for one architecture with nvcc and record what ptxas reports about it.

No GPU is needed: the cubin is built for `arch`, ptxas's -v report is parsed, and the kernel's
launch contract (threads, tile rows, dynamic shared memory) is read by compiling the same file
for the host with -DFLASH_PRINT_LAUNCH_CONTRACT and running it.
"""
from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

from . import FlashbenchError, occupancy, ptxas
from .files import read_json, sha256, write_json

ENTRY = "flash_attention_forward"


def nvcc() -> str:
    path = shutil.which("nvcc")
    if path is None:
        raise FlashbenchError("nvcc not found on PATH: the compile stage needs the CUDA toolkit")
    return path


def nvcc_version() -> str:
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    return next((line.strip() for line in out.splitlines() if "release" in line), out.strip())


class CommandFailed(FlashbenchError):
    """nvcc (or the launch-contract printer) failed. The message is its first lines of error, for
    the console; `transcript` is the command and all it printed, for the log."""

    shown = 10

    def __init__(self, what: str, cmd: list[str], output: str):
        lines = output.strip().splitlines()
        more = [f"... {len(lines) - self.shown} more lines in the log"] if len(lines) > self.shown else []
        super().__init__("\n".join([f"{what} failed:", *lines[: self.shown], *more]))
        self.transcript = f"{shlex.join(cmd)}\n{output.strip()}\n"


def define_flags(defines: dict) -> list[str]:
    return [f"-D{name}={value}" for name, value in sorted(defines.items())]


# Why a kernel built only for an arch-specific target does not run on another GPU.
TARGET_NOTES = {
    "sm_90a": "wgmma and TMA as used here are Hopper's; SM100/SM103's path is tcgen05",
}


def is_specific(arch: str) -> bool:
    """sm_90a and the like: a target with the features of one GPU only (wgmma, setmaxnreg)."""
    return arch.endswith("a")


def runs_on(build_arch: str, gpu_arch: str) -> bool:
    """Whether a cubin built for `build_arch` runs on a GPU of `gpu_arch` (sm_90a on sm_90 only)."""
    return build_arch.removesuffix("a") == gpu_arch


def runnable_build(archs: list[str], gpu_arch: str) -> str | None:
    """The one of a kernel's build archs that the pipeline runs on `gpu_arch` (its own arch first), or None."""
    return next((a for a in archs if a == gpu_arch), None) or next((a for a in archs if runs_on(a, gpu_arch)), None)


def not_runnable_reason(archs: list[str], gpu_arch: str) -> str:
    notes = "; ".join(TARGET_NOTES[a] for a in archs if a in TARGET_NOTES)
    return f"built for {', '.join(archs)} only, not run on {gpu_arch}" + (f": {notes}" if notes else "")


def arch_flags(arch: str, code: str = "sm") -> list[str]:
    """nvcc's target flags. An arch-specific target is named by -gencode: the -arch=compute_90a
    shorthand also runs a plain compute_90 pass, which rejects wgmma and setmaxnreg. `code`: sm (a
    cubin) or compute (PTX only)."""
    if is_specific(arch):
        return [f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch.replace('sm_', code + '_')}"]
    return [f"-arch={arch.replace('sm_', code + '_')}"]


def cubin_command(source: Path, arch: str, flags: list[str], defines: dict, cubin: Path) -> list[str]:
    return [nvcc(), "-cubin", *arch_flags(arch), *flags, "-Xptxas", "-v", *define_flags(defines),
            "-I", str(source.parent), "-o", str(cubin), str(source)]


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CommandFailed(what, cmd, proc.stdout + proc.stderr)
    return proc.stdout + proc.stderr


def launch_contract(source: Path, arch: str, flags: list[str], defines: dict, cache: Path | None = None) -> dict:
    """Compile the kernel file for the host with its contract printer and run it. The contract comes
    from the host pass, where no device arch applies, so the same file, headers, defines and flags
    give it for every arch: it is kept in `cache` under a hash of those, and a kernel's other archs
    read it back instead of building the printer again (half of a compile's time)."""
    host_flags = [f for f in flags if f != "-lineinfo"]
    key = hashlib.sha256(json.dumps([source.read_text(), {h.name: h.read_text() for h in sorted(source.parent.glob("*.cuh"))},
                                     defines, host_flags], sort_keys=True).encode()).hexdigest()
    kept = cache / f"{key}.json" if cache else None
    if kept and kept.exists():
        return read_json(kept)
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "contract"
        # PTX only (compute_XX): ptxas is not needed to read constants off the host side.
        _run([nvcc(), *arch_flags(arch, "compute"), *host_flags, "-DFLASH_PRINT_LAUNCH_CONTRACT", *define_flags(defines),
              "-I", str(source.parent), "-o", str(exe), str(source)], "building the launch-contract printer")
        out = _run([str(exe)], "running the launch-contract printer")
    try:
        contract = json.loads(out)
    except json.JSONDecodeError:
        raise FlashbenchError(f"{source}: FLASH_LAUNCH_CONTRACT printed no JSON: {out!r}") from None
    if kept:
        write_json(kept, contract)
    return contract


def compile_kernel(name: str, source: Path | str, arch: str, flags: list[str], defines: dict, cubin: Path | str) -> dict:
    """Build `cubin` and return the compile record."""
    source, cubin = Path(source), Path(cubin)
    cubin.parent.mkdir(parents=True, exist_ok=True)
    cmd = cubin_command(source, arch, flags, defines, cubin)
    report = _run(cmd, f"compiling {name} for {arch}")
    resources = ptxas.parse(report, ENTRY)
    if resources["arch"] != arch:
        raise FlashbenchError(f"ptxas compiled {name} for {resources['arch']}, asked for {arch}")
    contract = launch_contract(source, arch, flags, defines, cache=cubin.parent.parent / ".contracts")
    smem_total = resources["static_smem_bytes"] + contract["dynamic_smem_bytes"]
    return {
        "kernel": name,
        "arch": arch,
        "source": str(source),
        "defines": defines,
        "nvcc": nvcc_version(),
        "command": shlex.join(cmd),
        "source_sha256": sha256(source),
        "headers_sha256": {p.name: sha256(p) for p in sorted(source.parent.glob("*.cuh"))},
        "cubin_sha256": sha256(cubin),
        **{k: v for k, v in resources.items() if k != "arch"},
        "spill_bytes": resources["spill_store_bytes"] + resources["spill_load_bytes"],
        "launch": contract,
        "smem_bytes": smem_total,
        **occupancy.blocks_per_sm(arch, contract["threads"], resources["registers"], smem_total),
        "ptxas_report": report.strip(),
    }
