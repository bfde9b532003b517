"""Build one kernel for one architecture with nvcc and record what ptxas reports about it.

No GPU is needed: the cubin is built for `arch`, ptxas's -v report is parsed, and the kernel's
launch contract (threads, tile rows, dynamic shared memory, tensor maps) is read from the constant
its FLASH_LAUNCH_CONTRACT put into the cubin.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import struct
import subprocess
from pathlib import Path

from . import FlashbenchError, elf, occupancy, ptxas
from .config import conform
from .files import sha256

ENTRY = "flash_attention_forward"
RAGGED_FIRST_ENTRY = "flash_attention_forward_ragged_first"  # a kernel's entry for S ragged in its first keys (V25 on)


def nvcc() -> str:
    path = shutil.which("nvcc")
    if path is None:
        raise FlashbenchError("nvcc not found on PATH: the compile stage needs the CUDA toolkit")
    return path


def nvcc_version() -> str:
    out = subprocess.run([nvcc(), "--version"], capture_output=True, text=True, check=True).stdout
    return next((line.strip() for line in out.splitlines() if "release" in line), out.strip())


class CommandFailed(FlashbenchError):
    """nvcc failed. The message is its first lines of error, for the console; `transcript` is the
    command and all it printed, for the log."""

    shown = 10

    def __init__(self, what: str, cmd: list[str], output: str):
        lines = output.strip().splitlines()
        more = [f"... {len(lines) - self.shown} more lines in the log"] if len(lines) > self.shown else []
        super().__init__("\n".join([f"{what} failed:", *lines[: self.shown], *more]))
        self.transcript = f"{shlex.join(cmd)}\n{output.strip()}\n"


def define_flags(defines: dict) -> list[str]:
    return [f"-D{name}={value}" for name, value in sorted(defines.items())]


def check_options(flags: list[str], defines: dict) -> None:
    """Only the flags a kernel build needs (the config schema's nvcc_flag: none names a file nvcc
    writes or a program it runs), and -D values that are identifiers or numbers: nvcc hands both on
    through a shell, where `$(...)` or a `;` would run as a command."""
    conform(flags, "properties/nvcc_flags", "nvcc flags")
    conform(defines, "$defs/kernel/properties/defines", "defines")


# nvcc runs its steps through a shell, the paths it was given in their command lines: a `$(...)`, a
# `;` or a space in one would run or split there. So a path nvcc is given is of these alone.
NVCC_PATH = re.compile(r"[A-Za-z0-9_./+-]+")


def _nvcc_takes(path: str, what: str) -> None:
    if not NVCC_PATH.fullmatch(path) or path.startswith("-"):  # a leading - reads as an option
        raise FlashbenchError(f"{what} {path!r}: nvcc hands its paths on through a shell, so a path may hold only "
                              "letters, digits and _ . / + - (and not start with -)")


def _writable(path: Path, suffix: str, what: str) -> None:
    """`path` ends in `suffix` and lies under a folder that exists or can be made here."""
    if path.suffix != suffix:
        raise FlashbenchError(f"{what} {str(path)!r}: not a {suffix} file")
    if path.is_dir():
        raise FlashbenchError(f"{what} {str(path)!r}: is a folder")
    nearest = next(folder for folder in path.parents if folder.exists())
    if not nearest.is_dir() or not os.access(nearest, os.W_OK | os.X_OK):
        raise FlashbenchError(f"{what} {str(path)!r}: its folder cannot be made ({nearest} is "
                              f"{'not writable' if nearest.is_dir() else 'a file'})")


def check_paths(source: Path | str, cubin: Path | str, record: Path | str | None = None) -> None:
    """Before any program runs: `source` is an existing .cu file and `cubin` (and the compile
    `record`, where one is written) a .cubin (.json) file whose folder exists or can be made; and
    each path nvcc is given is one its shell reads as a path and nothing else."""
    source, cubin = Path(source), Path(cubin)
    if source.suffix != ".cu" or not source.is_file():
        raise FlashbenchError(f"source {str(source)!r}: not a .cu file")
    for path, what in ((str(source), "source"), (in_checkout(source), "source"), (str(cubin), "cubin")):
        _nvcc_takes(path, what)
    _writable(cubin, ".cubin", "cubin")
    if record is not None:
        _writable(Path(record), ".json", "record")


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


def arch_flags(arch: str) -> list[str]:
    """nvcc's target flags for a cubin. An arch-specific target is named by -gencode: the
    -arch=sm_90a shorthand also runs a plain compute_90 pass, which rejects wgmma and setmaxnreg."""
    if is_specific(arch):
        return [f"-gencode=arch={arch.replace('sm_', 'compute_')},code={arch}"]
    return [f"-arch={arch}"]


def in_checkout(path: Path | str) -> str:
    """`path` relative to the current folder (the repository, where the pipeline runs) where it lies
    inside it, else absolute: what a build may record of a path and still be the same in every checkout."""
    path, here = Path(os.path.realpath(path)), Path(os.path.realpath(os.getcwd()))
    return str(path.relative_to(here)) if path.is_relative_to(here) else str(path)


def ptx_command(source: Path, arch: str, flags: list[str], defines: dict, ptx: Path) -> list[str]:
    """nvcc to PTX. cicc names internal symbols after the source's path, absolute unless told:
    --orig_src_path_name gives it the path in the checkout."""
    return [nvcc(), "-ptx", *arch_flags(arch), *flags, *define_flags(defines), "-Xcicc",
            f"--orig_src_path_name,{in_checkout(source)}", "-I", str(source.parent), "-o", str(ptx), str(source)]


def cubin_command(ptx: Path, arch: str, flags: list[str], cubin: Path) -> list[str]:
    """The PTX to a cubin (ptxas, whose -v report the record parses)."""
    return [nvcc(), "-cubin", *arch_flags(arch), *flags, "-Xptxas", "-v", "-o", str(cubin), str(ptx)]


_PTX_FILE = re.compile(r'^(\s*\.file\s+\d+\s+)"([^"]+)"(?:\s*,\s*\d+\s*,\s*\d+)?[ \t]*$', re.M)
# A toolkit header, as cicc names it: by the way nvcc reached it, <toolkit>/bin/../targets/<target>/include/<name>
_TOOLKIT_HEADER = re.compile(r"^.+/bin/\.\./targets/[^/]+/include/(?P<name>.+)$")
TOOLKIT_INCLUDE = "<cuda>/include"  # what the line info calls the toolkit's include folder


def line_info_path(path: str) -> str:
    """What the line info names a file by: a toolkit header by its name in the toolkit's include folder
    (TOOLKIT_INCLUDE: where the toolkit is installed, and whether its include/ or its targets/ folder is
    the real one, differs between machines with the same nvcc), any other file as in_checkout does."""
    header = _TOOLKIT_HEADER.match(path)
    return f"{TOOLKIT_INCLUDE}/{header['name']}" if header else in_checkout(path)


def reproducible_line_info(ptx_text: str) -> str:
    """The PTX's `.file` entries (its line info, which -lineinfo carries into the cubin) made the same in
    every checkout and on every machine with the same nvcc: cicc writes absolute paths, and ptxas,
    given no time and size, records the files' own, and a checkout's file times are when it was made.
    Each path becomes line_info_path's, its time 1 (the format's 0 means "look it up") and its size its
    own."""
    def entry(m):
        size = os.path.getsize(m[2]) if os.path.isfile(m[2]) else 0  # 0: unknown, as DWARF has it
        return f'{m[1]}"{line_info_path(m[2])}", 1, {size}'

    return _PTX_FILE.sub(entry, ptx_text)


def as_recorded(command: list[str]) -> str:
    """A command line as a record states it: nvcc by its name, since where it is installed differs
    between machines (the record gives its version), so that the same build gives the same record on
    each."""
    return shlex.join([Path(command[0]).name, *command[1:]])


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise CommandFailed(what, cmd, proc.stdout + proc.stderr)
    return proc.stdout + proc.stderr


CONTRACT_SYMBOL = "flash_launch_contract"
# flash::LaunchContract's int fields, in order (flash_common.cuh)
CONTRACT_FIELDS = ("threads", "block_rows", "block_cols", "dynamic_smem_bytes", "head_dim", "tensor_maps", "box_cols",
                   "q_box_rows", "kv_box_rows", "o_box_rows", "swizzle_bytes", "ctas_per_sm", "tensor_map_rank", "causal",
                   "work_list", "l2_section_bytes", "ragged_first_keys", "bf16", "grouped_kv")


def launch_contract(cubin: Path) -> dict:
    """The launch contract in `cubin`, as the launcher reads it: threads, tile shape, dynamic shared
    memory, head dim; the tensor maps a Hopper kernel takes (q, k, v and maybe o), and their rank where
    they are by head (4, V25 on); for a persistent kernel, its blocks per SM; whether it is causal; for
    one that walks a work list (V25 on), the bytes of K and V a section of its heads may hold; where it
    has a second entry for an S ragged in its first keys, that entry and how many keys it takes; its
    element type where it is bf16 (absent: fp16); and whether it takes grouped K/V heads (V25 on)."""
    try:
        raw = elf.symbol_bytes(cubin, CONTRACT_SYMBOL)
    except elf.NoSuchSymbol as e:
        raise FlashbenchError(f"{e}: the kernel states no FLASH_LAUNCH_CONTRACT") from None
    if len(raw) != 4 * len(CONTRACT_FIELDS):
        raise FlashbenchError(f"{cubin}: {CONTRACT_SYMBOL} is {len(raw)} bytes, not the {4 * len(CONTRACT_FIELDS)} "
                              "of flash::LaunchContract")
    fields = dict(zip(CONTRACT_FIELDS, struct.unpack(f"<{len(CONTRACT_FIELDS)}i", raw)))
    contract = {k: fields[k] for k in ("threads", "block_rows", "block_cols", "dynamic_smem_bytes", "head_dim")}
    if fields["tensor_maps"]:
        rows = {"q": fields["q_box_rows"], "k": fields["kv_box_rows"], "v": fields["kv_box_rows"], "o": fields["o_box_rows"]}
        contract["tensor_maps"] = [{"array": array, "box": [fields["box_cols"], rows[array]],
                                    "swizzle": fields["swizzle_bytes"]} for array in "qkvo"[: fields["tensor_maps"]]]
    if fields["ctas_per_sm"]:
        contract["persistent"] = {"ctas_per_sm": fields["ctas_per_sm"]}
    if fields["tensor_map_rank"] == 4:  # maps by head: any S (absent: maps over the [B*H*S, D] view)
        contract["tensor_map_rank"] = 4
    if fields["causal"]:
        contract["causal"] = True
    if fields["work_list"]:  # it walks the work tiles the launch lists (work_list.py), in sections this size
        contract["work_list"] = {"l2_section_bytes": fields["l2_section_bytes"]}
    if fields["ragged_first_keys"]:  # a second entry for an S whose last key tile holds 1 to this many keys
        contract["ragged_first"] = {"entry": RAGGED_FIRST_ENTRY, "keys": fields["ragged_first_keys"]}
    if fields["bf16"]:
        contract["dtype"] = "bf16"
    if fields["grouped_kv"]:  # K and V of H / kv_group heads (kv_group: the parameter after the heads per batch)
        contract["grouped_kv"] = True
    return contract


def compile_kernel(name: str, source: Path | str, arch: str, flags: list[str], defines: dict, cubin: Path | str) -> dict:
    """Build `cubin` and return the compile record."""
    source, cubin = Path(source), Path(cubin)
    check_options(flags, defines)
    check_paths(source, cubin)
    cubin.parent.mkdir(parents=True, exist_ok=True)
    what = f"compiling {name} for {arch}"
    ptx = cubin.with_suffix(".ptx")  # kept beside the cubin, to read
    commands = [ptx_command(source, arch, flags, defines, ptx), cubin_command(ptx, arch, flags, cubin)]
    _run(commands[0], what)
    ptx.write_text(reproducible_line_info(ptx.read_text()))
    report = _run(commands[1], what)
    resources = ptxas.parse(report, ENTRY)
    if resources["arch"] != arch:
        raise FlashbenchError(f"ptxas compiled {name} for {resources['arch']}, asked for {arch}")
    contract = launch_contract(cubin)
    smem_total = resources["static_smem_bytes"] + contract["dynamic_smem_bytes"]
    return {
        "kernel": name,
        "arch": arch,
        "source": str(source),
        "defines": defines,
        "nvcc": nvcc_version(),
        "command": " && ".join(map(as_recorded, commands)),
        "source_sha256": sha256(source),
        "headers_sha256": {p.name: sha256(p) for p in sorted(source.parent.glob("*.cuh"))},
        "cubin_sha256": sha256(cubin),
        **{k: v for k, v in resources.items() if k != "arch"},
        "spill_bytes": resources["spill_store_bytes"] + resources["spill_load_bytes"],
        "launch": contract,
        "smem_bytes": smem_total,
        **occupancy.blocks_per_sm(arch, contract["threads"], resources["registers"], smem_total),
        **({"ragged_first": {k: v for k, v in ptxas.parse(report, RAGGED_FIRST_ENTRY).items() if k != "arch"}}
           if "ragged_first" in contract else {}),
        # less ptxas's own time, so that the same build gives the same record in any checkout
        "ptxas_report": "\n".join(line for line in report.strip().splitlines() if "Compile time =" not in line),
    }
