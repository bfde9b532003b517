"""Nsight Compute readings of one kernel at the case: what the chapter's profiler claims rest on.

One `ncu` run (`--clock-control none`: the GPU's clocks as they are) collects the metrics below,
the warp-stall reasons and PC sampling. The sampled stalls are attributed to lines of the kernel
file through `nvdisasm -gi` (the cubins carry -lineinfo), so the report can say which source
lines the warps wait on, and whether the softmax is among them.
"""
from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import FlashbenchError
from .compile import ENTRY
from .config import Shape

KERNEL_NAME = f"regex:^{ENTRY}"  # either entry of a kernel that has two (V25's ragged_first), as the shape picks
SECTIONS = ["WarpStateStats", "SourceCounters", "Occupancy", "LaunchStats"]
METRICS = {  # report name -> ncu metric
    "duration_us": "gpu__time_duration.sum",
    "registers": "launch__registers_per_thread",
    "achieved_occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "lsu_pipe_pct": "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",  # HMMA and HGMMA alike
    "issue_active_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "eligible_warps": "smsp__warps_eligible.avg.per_cycle_active",
    "smem_wavefronts": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "smem_bank_conflicts": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
}
# Warp states ncu reports as cycles per issued instruction (smsp__average_warps_issue_stalled_*).
STALLS = ["barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss", "lg_throttle", "long_scoreboard",
          "math_pipe_throttle", "membar", "mio_throttle", "misc", "no_instruction", "not_selected", "selected",
          "short_scoreboard", "sleeping", "tex_throttle", "wait"]
STALL_METRIC = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio"
TOP_LINES = 5  # ncu's "top stall locations": the stall list the chapter speaks of
SOFTMAX_MARKER = "online softmax"  # the section comment every version opens its softmax with


def command(ncu: str, report: Path, cubin: Path, record: Path, shape: Shape, driver: list[str] = ()) -> list[str]:
    """ncu over `python -m flashbench launch-once` (with `driver`, its further options)."""
    metrics = list(METRICS.values()) + [STALL_METRIC.format(s) for s in STALLS]
    return [ncu, "--clock-control", "none", "--kernel-name", KERNEL_NAME, "--launch-count", "1",
            *[a for s in SECTIONS for a in ("--section", s)], "--metrics", ",".join(metrics),
            "--export", str(report), "--force-overwrite",
            sys.executable, "-m", "flashbench", "launch-once", "--cubin", str(cubin), "--record", str(record),
            "--shape", json.dumps(shape.as_dict()), *driver]


def number(text: str) -> float | None:
    """A figure of ncu's CSV (thousands separated by commas), or None where it is no number."""
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def parse_raw(text: str) -> dict:
    """`ncu --import R --page raw --csv`: metric -> (value, unit) for the one profiled launch."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    header = next((i for i, r in enumerate(rows) if "ID" in r and any("__" in c for c in r)), None)
    if header is None or len(rows) < header + 3:
        raise FlashbenchError("ncu's raw page has no metrics row: the kernel was not profiled")
    names, units, values = rows[header], rows[header + 1], rows[header + 2]
    return {n: (number(v), u) for n, u, v in zip(names, units, values)}


TIME_UNITS_IN_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def microseconds(value: float, unit: str) -> float:
    """A duration ncu gave in `unit`, in microseconds."""
    if unit not in TIME_UNITS_IN_US:
        raise FlashbenchError(f"ncu gave the duration in {unit!r}, a unit this parser does not know")
    return value * TIME_UNITS_IN_US[unit]


def metrics_of(raw: dict) -> dict:
    out = {}
    for name, metric in METRICS.items():
        value, unit = raw.get(metric, (None, ""))
        if value is not None and name == "duration_us":
            value = microseconds(value, unit)
        out[name] = value
    out["stalls"] = {s: raw.get(STALL_METRIC.format(s), (None, ""))[0] for s in STALLS}
    return out


def parse_sass_samples(text: str) -> list[tuple[int, int]]:
    """`ncu --import R --page source --print-source sass --csv`: (offset, stall samples) per instruction."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if r[:1] == ["Address"]), None)
    if start is None:
        raise FlashbenchError("ncu's source page has no SASS table (was -lineinfo / SourceCounters collected?)")
    header = rows[start]
    if "Warp Stall Sampling (All Samples)" not in header:
        raise FlashbenchError("ncu's source page has no stall sampling column (was SourceCounters collected?)")
    column = header.index("Warp Stall Sampling (All Samples)")
    body = [r for r in rows[start + 1 :] if len(r) > column and r[0].startswith("0x")]
    base = int(body[0][0], 16) if body else 0
    return [(int(r[0], 16) - base, int(number(r[column]) or 0)) for r in body]


_ANNOTATION = re.compile(r'//## File "(?P<file>[^"]+)", line (?P<line>\d+)'
                         r'(?P<inlined> inlined at "(?P<at_file>[^"]+)", line (?P<at_line>\d+))?$')
_INSTRUCTION = re.compile(r"^\s*/\*(?P<offset>[0-9a-f]{4,})\*/\s+\S")


def line_map(disassembly: str, source: Path) -> dict[int, int]:
    """`nvdisasm -gi`: instruction offset -> line of `source` it comes from (the outermost frame, so
    an inlined helper's instructions count for the kernel line that called it)."""
    return {offset: outermost for offset, (outermost, _) in _frames(disassembly, source).items()
            if outermost is not None}


def chain_map(disassembly: str, source: Path) -> dict[int, frozenset[int]]:
    """`nvdisasm -gi`: instruction offset -> every line of `source` on its chain of inlined calls (a
    softmax inlined into a batch inlined into the loop: the softmax's, the batch's and the loop's)."""
    return {offset: chain for offset, (_, chain) in _frames(disassembly, source).items()}


def _frames(disassembly: str, source: Path) -> dict[int, tuple[int | None, frozenset[int]]]:
    """Each instruction's outermost line of `source` (None: code from elsewhere) and its chain's lines:
    the annotations before an instruction, innermost first, name one frame each."""
    frames, outermost, chain, after_instruction = {}, None, set(), True
    for text in disassembly.splitlines():
        if m := _ANNOTATION.search(text):
            if after_instruction:  # a new instruction's frames
                chain, after_instruction = set(), False
            for file, line in ((m["file"], m["line"]), (m["at_file"], m["at_line"])):
                if file and Path(file).name == source.name:
                    chain.add(int(line))
            if not m["inlined"]:  # the outermost frame: a line of `source`, or code from elsewhere
                outermost = int(m["line"]) if Path(m["file"]).name == source.name else None
        elif m := _INSTRUCTION.match(text):
            frames[int(m["offset"], 16)] = (outermost, frozenset(chain))
            after_instruction = True
    return frames


def section_lines(source_text: str, marker: str = SOFTMAX_MARKER) -> set[int]:
    """Lines (1-based) of the section whose `// ----` comment names `marker`, up to the next such
    comment; the barrier lines closing it (__syncthreads, cp_async_wait) belong to no phase."""
    lines = source_text.splitlines()
    start = next((i for i, t in enumerate(lines) if "// ----" in t and marker in t), None)
    if start is None:
        return set()
    end = next((i for i in range(start + 1, len(lines)) if "// ----" in lines[i]), len(lines))
    return {i + 1 for i in range(start, end) if not re.search(r"__syncthreads|cp_async_wait", lines[i])}


_SOFTMAX_CALL = re.compile(r"\bsoftmax\w*\(")


def softmax_lines(source_text: str) -> set[int]:
    """The lines the softmax's instructions count for: its `// ---- online softmax` section (V11-V15),
    or, where the softmax is a function inlined at its calls (V16 on: line_map counts an inlined
    function's instructions for the line that called it), the lines that call a softmax* function."""
    if section := section_lines(source_text):
        return section
    return {i + 1 for i, text in enumerate(source_text.splitlines()) if _SOFTMAX_CALL.search(text.split("//")[0])}


def stall_lines(samples: list[tuple[int, int]], offsets: dict[int, int], source_text: str,
                chains: dict[int, frozenset[int]] | None = None) -> dict:
    """Stall samples per source line: the top lines, and the softmax's share of all samples (none where
    the source shows no softmax, softmax_lines): an instruction counts for the softmax where its line,
    or any line on its chain of inlined calls (`chains`, chain_map), is the softmax's."""
    per_line: dict[int | None, int] = {}
    for offset, count in samples:
        line = offsets.get(offset)
        per_line[line] = per_line.get(line, 0) + count
    total = sum(per_line.values())
    softmax = softmax_lines(source_text)
    chains = chains or {}
    in_softmax = sum(c for offset, c in samples
                     if offsets.get(offset) in softmax or chains.get(offset, frozenset()) & softmax)
    code = source_text.splitlines()
    top = sorted(((n, c) for n, c in per_line.items() if n is not None), key=lambda x: -x[1])[:TOP_LINES]
    return {
        "stall_samples": total,
        "softmax_share": in_softmax / total if total and softmax else None,
        "top_lines": [{"line": n, "samples": c, "share": c / total, "code": code[n - 1].strip(),
                       "softmax": n in softmax} for n, c in top],
    }


def run(cmd: list[str], what: str) -> str:
    """`cmd`'s standard output; its last lines of error in one FlashbenchError where it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise FlashbenchError(f"{what} failed: {' / '.join(tail) or f'exit {proc.returncode}'}")
    return proc.stdout


def raw_page(ncu: str, report: str) -> str:
    """An ncu report's raw page as CSV, every figure in base units."""
    return run([ncu, "--import", report, "--page", "raw", "--csv", "--print-units", "base"], "ncu --page raw")


def version(ncu: str) -> str:
    return run([ncu, "--version"], "ncu --version").strip().splitlines()[-1]


def profile(ncu: str, cubin: Path, record: Path, source: Path, shape: Shape, progress=print,
            driver: list[str] = ()) -> dict:
    """Profile one kernel: the metrics, the stall reasons and where in `source` the warps stall
    (that last part needs nvdisasm, from the CUDA toolkit; without it the record says so). The driver
    ncu runs (launch-once, with `driver` its further options) holds the GPU's lock while it launches
    (reading the report and the SASS needs no GPU)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "profile"
        progress(f"profile {cubin.stem}: ncu at {shape} (several replays of one launch)")
        run(command(ncu, report, cubin, record, shape, driver), "ncu")
        rep = f"{report}.ncu-rep"
        raw = parse_raw(raw_page(ncu, rep))
        samples = parse_sass_samples(run([ncu, "--import", rep, "--page", "source", "--print-source", "sass",
                                           "--csv"], "ncu --page source"))
    readings = {"metrics": metrics_of(raw), "ncu": version(ncu)}
    unattributed = {"stall_samples": None, "softmax_share": None, "top_lines": None}
    nvdisasm = shutil.which("nvdisasm")
    if nvdisasm is None:
        return {**readings, **unattributed, "lines_reason": "nvdisasm not found: stalls not attributed to source lines"}
    try:
        disassembly = run([nvdisasm, "-gi", "-c", str(cubin)], "nvdisasm")
    except FlashbenchError as e:  # the metrics stand without the line table
        return {**readings, **unattributed, "lines_reason": f"stalls not attributed to source lines: {e}"}
    lines = stall_lines(samples, line_map(disassembly, source), source.read_text(), chain_map(disassembly, source))
    return {**readings, **lines, "lines_reason": None}
