"""Cycle counts from Nsight Compute: what a kernel costs with the GPU's clock taken out.

A timing on a power-capped GPU measures the clock as much as the kernel; the cycles a launch takes
(`gpc__cycles_elapsed.max`, the busiest GPC's cycles from its first block to its last) repeat to
under one percent. One `ncu` run per implementation (`--clock-control none`: the clocks as they are,
`--profile-from-start off`: only what the driver below marks) counts `launches` calls at each shape.
A call may be several kernels (a library's preparation kernel and its attention kernel); a marker
kernel between calls tells them apart, and a call's cycles are the sum over its kernels.

    python -m flashbench launch-marked ...   (the driver ncu runs: warm-up unprofiled, then per
                                              shape `launches` calls, each after a marker)

The efficiency per cycle is the share of the dense fp16 tensor peak a call reaches in the cycles it
takes: 4·B·H·S²·D (half that under the causal mask) / (cycles × SMs × 4096), Hopper's dense fp16 FLOP per
SM and cycle.
"""
from __future__ import annotations

import csv
import io
import statistics
import sys
import tempfile
from pathlib import Path

from . import FlashbenchError, attention
from .config import Shape
from .profile import microseconds, number, raw_page, run, version

MARKER = "flashbench_call_marker"
MARKER_SOURCE = f'extern "C" __global__ void {MARKER}() {{}}'
DENSE_FP16_FLOP_PER_SM_CYCLE = 4096  # Hopper (sm_90): 989.4 TFLOPS dense fp16 / (132 SMs x 1830 MHz)
METRICS = {  # record name -> ncu metric, per kernel
    "cycles": "gpc__cycles_elapsed.max",
    "duration_us": "gpu__time_duration.sum",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",  # HMMA and HGMMA alike
    "sm_clock_hz": "gpc__cycles_elapsed.avg.per_second",
}
WARMUP = 2  # unprofiled calls at each shape first (a library's JIT compile, cuDNN's plan)
COLUMNS = ["kernel", "config", "kind", "B", "H", "S", "D", "is_case", "cycles", "cycles_min", "cycles_max", "launches",
           "duration_us", "tensor_pipe_pct", "sm_clock_mhz", "efficiency_per_cycle", "kernels_per_call"]


def command(ncu: str, report: Path, driver: list[str]) -> list[str]:
    return [ncu, "--clock-control", "none", "--profile-from-start", "off", "--metrics", ",".join(METRICS.values()),
            "--export", str(report), "--force-overwrite", *driver]


def driver_command(target: list[str]) -> list[str]:
    """`python -m flashbench launch-marked` for `target` (--settings, and --cubin/--record or --peer: the
    settings say at which shapes and how many launches)."""
    return [sys.executable, "-m", "flashbench", "launch-marked", *target]


def launch_marked(impl, shapes: list[Shape], launches: int) -> list[Shape]:
    """What ncu profiles: per shape, WARMUP unprofiled calls, then `launches` calls each after a
    marker kernel, and a marker after the last, inside the profiler's range. Each launch has inputs
    of its own (other values, other memory), all made before the first, with whatever a peer makes
    of them (FlashAttention's copies in its layout): a launch is the call alone. On one set of
    inputs a kernel's launches at S <= 1024 spread 2.5% and a median of three moved 1.3-1.9%
    between runs; v22's median over seven sets, 0.05-0.13%. A shape the implementation does not
    take (a peer above its max_seq_len) is passed over; returns those run."""
    cp = impl.cp
    marker = cp.RawKernel(MARKER_SOURCE, MARKER)
    ran = []
    for shape in shapes:
        if impl.supports(shape):
            continue
        inputs = [impl.inputs(shape, cp.random.default_rng(seed)) for seed in range(launches)]
        for _ in range(WARMUP):
            impl(*inputs[0])
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.profiler.start()
        for args in inputs:
            marker((1,), (1,), ())
            impl(*args)
        marker((1,), (1,), ())
        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.profiler.stop()
        ran.append(shape)
    return ran


def parse_kernels(text: str) -> list[dict]:
    """`ncu --import R --page raw --csv --print-units base`: one dict per profiled kernel, in launch
    order: its name and the METRICS."""
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    header = next((i for i, r in enumerate(rows) if "ID" in r and "Kernel Name" in r), None)
    if header is None:
        raise FlashbenchError("ncu's raw page has no kernel table: nothing was profiled")
    names = rows[header]
    missing = [m for m in METRICS.values() if m not in names]
    if missing:
        raise FlashbenchError(f"ncu's raw page lacks {', '.join(missing)}")
    column = {n: names.index(n) for n in ["ID", "Kernel Name", *METRICS.values()]}
    us_per_unit = microseconds(1.0, rows[header + 1][column[METRICS["duration_us"]]])  # the units row
    kernels = []
    for r in rows[header + 2:]:  # after the units row
        if not r[column["ID"]].strip().isdigit():
            continue
        k = {"id": int(r[column["ID"]]), "name": r[column["Kernel Name"]],
             **{key: number(r[column[metric]]) for key, metric in METRICS.items()}}
        if None in k.values():
            raise FlashbenchError(f"ncu's raw page has no value of every metric for kernel {k['name']}")
        k["duration_us"] *= us_per_unit
        kernels.append(k)
    return sorted(kernels, key=lambda k: k["id"])


def calls(kernels: list[dict]) -> list[list[dict]]:
    """The profiled kernels split into calls at the markers (a call: the kernels between two)."""
    out, current = [], None
    for k in kernels:
        if k["name"].startswith(MARKER):
            if current:
                out.append(current)
            current = []
        elif current is None:
            raise FlashbenchError(f"ncu profiled {k['name']} before the first marker: not a call the driver made")
        else:
            current.append(k)
    return out


def call_totals(call: list[dict]) -> dict:
    """One call's cycles and duration (summed over its kernels) and tensor-pipe activity (their
    cycle-weighted mean)."""
    cycles = sum(k["cycles"] for k in call)
    return {"cycles": cycles, "duration_us": sum(k["duration_us"] for k in call),
            "tensor_pipe_pct": sum(k["tensor_pipe_pct"] * k["cycles"] for k in call) / cycles,
            "sm_clock_mhz": sum(k["sm_clock_hz"] * k["cycles"] for k in call) / cycles / 1e6,
            "kernels": [k["name"] for k in call]}


def points(kernels: list[dict], shapes: list[Shape], launches: int) -> list[dict]:
    """Per shape, its `launches` calls and their median cycles."""
    split = calls(kernels)
    if len(split) != len(shapes) * launches:
        raise FlashbenchError(f"ncu profiled {len(split)} calls, not {len(shapes)} shapes x {launches} launches")
    out = []
    for i, shape in enumerate(shapes):
        mine = [call_totals(c) for c in split[i * launches:(i + 1) * launches]]
        for n, launch in enumerate(mine[1:], start=2):
            if launch["kernels"] != mine[0]["kernels"]:
                raise FlashbenchError(
                    f"at {shape} launch {n} of {launches} ran {_kernel_names(launch)}, "
                    f"launch 1 {_kernel_names(mine[0])}: each launch must be the same call "
                    "(was an input prepared inside the profiled range?)")
        out.append({**shape.as_dict(), "launches": mine,
                    **{key: statistics.median(c[key] for c in mine)
                       for key in ("cycles", "duration_us", "tensor_pipe_pct", "sm_clock_mhz")}})
    return out


def _kernel_names(launch: dict) -> str:
    return f"{len(launch['kernels'])} kernels ({', '.join(name[:60] for name in launch['kernels'])})"


def efficiency_per_cycle(shape: Shape, cycles: float, sm_count: int, causal: bool = False) -> float:
    """The share of the dense fp16 tensor peak the FLOPs of `shape` (half under a causal mask) come to in
    `cycles` on `sm_count` SMs."""
    return attention.flops(shape, causal) / (cycles * sm_count * DENSE_FP16_FLOP_PER_SM_CYCLE)


def count(ncu: str, target: list[str], shapes: list[Shape], launches: int, progress=print) -> tuple[list[dict], str]:
    """Run ncu over the driver for `target` (driver_command), which makes `launches` calls at each of
    `shapes`: the kernels it profiled (parse_kernels) and ncu's version. The driver holds the GPU's lock
    from its first use of the GPU to its last (cli.cmd_launch_marked); reading the report needs none."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "cycles"
        progress(f"cycles: ncu over {launches} calls at {', '.join(f'S={s.S}' for s in shapes)}")
        run(command(ncu, report, driver_command(target)), "ncu")
        raw = raw_page(ncu, f"{report}.ncu-rep")
    return parse_kernels(raw), version(ncu)


def table(records: list[dict], kernels: list[dict], case_of):
    """cycles.csv: one row per counted implementation and shape, in table order (`kernels`: the config
    entries of the kernels and peers, with their kind; `case_of`: a run's name -> the case it runs, at
    its configuration's D: validation.Expected.case_of)."""
    import pandas as pd

    by_name = {r["kernel"]: r for r in records}
    rows = [row for k in kernels if k["name"] in by_name
            for row in table_rows(by_name[k["name"]], k["kind"], case_of(k["name"]), k.get("config"),
                                  k.get("causal", False))]
    return pd.DataFrame(rows, columns=COLUMNS)


def table_rows(record: dict, kind: str, case: dict, config: str | None = None, causal: bool = False) -> list[dict]:
    """cycles.csv's rows of one implementation's record (none where it was not counted), in its
    configuration `config`, under the causal mask where `causal`."""
    rows = []
    for p in record.get("points", []):
        shape = Shape(**{d: p[d] for d in "BHSD"})
        cycles = [c["cycles"] for c in p["launches"]]
        rows.append({"kernel": record["kernel"], "config": config, "kind": kind, **shape.as_dict(), "is_case": shape.as_dict() == case,
                     "cycles": p["cycles"], "cycles_min": min(cycles), "cycles_max": max(cycles),
                     "launches": len(cycles), "duration_us": p["duration_us"], "tensor_pipe_pct": p["tensor_pipe_pct"],
                     "sm_clock_mhz": p["sm_clock_mhz"],
                     "efficiency_per_cycle": efficiency_per_cycle(shape, p["cycles"], record["sm_count"], causal),
                     "kernels_per_call": len(p["launches"][0]["kernels"])})
    return rows
