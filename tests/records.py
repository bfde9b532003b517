"""Synthetic raw records shaped like the pipeline's, for CPU tests of summarize and render.
The numbers are test inputs, not measurements: nothing here is written under results/."""
import hashlib

from flashbench import attention
from flashbench.config import Kernel, Peer, Settings, Shape, sweep_steps
from flashbench.files import read_json, write_json, write_text
from flashbench.headtohead import design_rounds
from flashbench.occupancy import blocks_per_sm
from flashbench.summary import tidy_tables
from flashbench.validation import Expected

from conftest import shipped_settings

CASE = {"B": 1, "H": 64, "S": 1024, "D": 128}
EXTRA = {"B": 2, "H": 16, "S": 2048, "D": 128}
KERNELS = [
    {"name": "v11", "kind": "version", "source": "kernels/v11.cu", "change": "G2's final state",
     "published_tflops": 144.41, "published_registers": 96, "parent": None},
    {"name": "v12", "kind": "version", "source": "kernels/v12.cu", "change": "fragment reshape",
     "published_tflops": 219.15, "parent": None},
    {"name": "v13", "kind": "version", "source": "kernels/v13.cu", "change": "warp specialisation",
     "published_tflops": 226.83, "parent": None},
    {"name": "br128", "kind": "ablation", "source": "kernels/v13.cu", "change": "Br 64 -> 128",
     "published_tflops": 198.96, "parent": "v13", "defines": {"BLOCK_ROWS": 128}},
    {"name": "hybrid_smem", "kind": "ablation", "source": "kernels/v13.cu", "change": "Br=128, state in smem",
     "published_tflops": 226.35, "parent": "br128", "defines": {"BLOCK_ROWS": 128, "HYBRID_SMEM": 1}},
]
HOPPER = [  # the line after V13, built for sm_90a only
    {"name": "v14", "kind": "version", "line": "hopper", "source": "kernels/v14.cu", "change": "TMA + wgmma",
     "published_tflops": None, "parent": None, "archs": ["sm_90a"]},
    {"name": "v15", "kind": "version", "line": "hopper", "source": "kernels/v15.cu", "change": "warp specialisation",
     "published_tflops": None, "parent": None, "archs": ["sm_90a"]},
]
PEERS = [
    {"name": "sdpa_auto", "kind": "peer", "backend": "auto", "change": "torch SDPA", "published_tflops": 1156.54,
     "max_seq_len": None},
    {"name": "unfused", "kind": "peer", "backend": "unfused", "change": "unfused PyTorch", "published_tflops": 156.5,
     "max_seq_len": 1024},
]
PEER_TFLOPS = {"sdpa_auto": 560.0, "unfused": 120.0}
SWEEP_S = (512, 1024, 2048)
BENCH = {"steps": 100, "repeats": 10, "warmup": 2, "graph_replays": 5}
SWEEP = {"S": list(SWEEP_S), "steps": 20, "repeats": 20, "warmup": 3, "graph_replays": 10}
HEADLINE = ["v15", "v14"]
RIVALS = ["sdpa_auto"]
SETTINGS = {"baseline": "sdpa_auto", "sweep": SWEEP, "profile_note": None, "headline": HEADLINE,
            "head_to_head": {"rivals": RIVALS, "rounds": 12, "min_timing_ms": 50, "lead_in_ms": 100, "warmup": 10, "energy_rounds": 2,
                             "energy_window_s": 1.0, "confidence": 0.95, "resamples": 4000, "level_within": 0.01},
            "cycles": {"launches": 3}, "cycles_note": None}
CLOCK_HZ = 1.8e9  # the clock the synthetic cycle counts assume
INPUTS = ["normal", "late_max"]
GATE = {"factor": 2.0, "tolerance": 5e-3}
EXPECTED = Expected(case=CASE, check_shapes=[CASE, EXTRA], inputs=INPUTS, gate=GATE, bench=BENCH, sweep=SWEEP,
                    peers=[p["name"] for p in PEERS])
# ptxas-like resources per kernel: registers, spilled bytes (each way), threads, Br, static and dynamic smem
RESOURCES = {
    "v11": (126, 0, 128, 32, 37760, 0),
    "v12": (128, 0, 256, 64, 41472, 0),
    "v13": (128, 0, 256, 64, 0, 57860),
    "br128": (128, 64, 256, 128, 0, 82948),
    "hybrid_smem": (128, 0, 256, 128, 0, 83456),
    "v14": (177, 0, 256, 128, 0, 164920),
    "v15": (168, 0, 384, 128, 0, 230000),  # as ptxas reports a kernel that sets its warpgroups' registers
}
# Published-like TFLOPS: every claim of the chapter holds for these
LIKE_THE_WRITEUP = {"v11": 144.0, "v12": 219.0, "v13": 227.0, "br128": 199.0, "hybrid_smem": 226.0}


def provenance(kernel: str, gpu: str = "NVIDIA H200", pci_bus_id: str = "0000:19:00.0", driver: str = "580.1",
               gpu_uuid: str | None = None) -> dict:
    """A record's provenance; `gpu_uuid` where given (the archive's records were made before it was recorded)."""
    return {"gpu": gpu, **({"gpu_uuid": gpu_uuid} if gpu_uuid else {}), "pci_bus_id": pci_bus_id, "arch": "sm_90",
            "sm_count": 132, "l2_bytes": 62914560, "driver": driver, "cuda_driver": "13.0", "cuda_runtime": "13.0",
            "cupy": "14.2.0", "sm_clock_max_mhz": "1980", "power_limit_w": "700.00", "git_commit": "abc123",
            "date": "2026-01-01T00:00:00+00:00"}


def clocks(throttled: bool = False) -> dict:
    return {"samples": 12, "sm_clock_mhz": {"min": 1755, "median": 1980, "max": 1980},
            "mem_clock_mhz": {"min": 3201, "median": 3201, "max": 3201},
            "power_w": {"min": 300.0, "median": 450.0, "max": 520.0},
            "temperature_c": {"min": 40, "median": 45, "max": 50},
            "throttled": throttled, "throttle_reasons": ["sw_power_cap"] if throttled else []}


def timing(tflops: float, throttled: bool = False, shape: dict = CASE, counts: dict = BENCH, causal: bool = False
           ) -> dict:
    """A timing of `tflops` at `shape` with `counts` (under the causal mask: half the FLOPs): its times,
    and what they come to, agree."""
    shape = Shape(**shape)
    ms = attention.flops(shape, causal) / (tflops * 1e12) * 1e3
    return {**shape.as_dict(), **{c: counts[c] for c in ("steps", "repeats", "warmup", "graph_replays")},
            "causal": causal,
            "total_s": ms * counts["steps"] / 1e3,
            "ms_per_step": ms, "ms_median": ms * 1.01, "ms_min": ms * 0.99, "ms_max": ms * 1.2, "ms_graph": ms * 0.98,
            "tflops": tflops, "tflops_median": tflops / 1.01, "tflops_min": tflops / 1.2, "tflops_max": tflops / 0.99,
            "tflops_graph": tflops / 0.98, "gib_per_s": attention.gib_per_s(shape, ms / 1e3),
            "input_bytes": attention.input_bytes(shape), "issue_ms_per_call": ms / 10, "dispatch_bound": False,
            "clocks": clocks(throttled)}


def check_row(shape: dict, kind: str, passed: bool) -> dict:
    """One shape and kind of input as the check records it (errors a tenth of plain fp16's, or 5x its bound)."""
    yardstick = {"rel_error": 7e-4, "worst_row_rel_error": 2e-3, "max_abs_error": 6e-4}
    thresholds = {m: 2 * v + 4.9e-4 for m, v in yardstick.items()}
    errors = {m: (0.1 if passed else 5.0) * t for m, t in thresholds.items()}
    return {**shape, "inputs": kind, "seed": 1, "passed": passed, **errors, "nonfinite": 0,
            **{f"yardstick_{m}": v for m, v in yardstick.items()}, **{f"threshold_{m}": v for m, v in thresholds.items()},
            "margin": 0.1 if passed else 5.0,
            "reason": None if passed else "worst row's relative error 2.2e-02 above 4.5e-03 (plain fp16 2.0e-03)"}


def compile_record(name: str, arch: str, source: str = "kernels/v11.cu") -> dict:
    registers, spill, threads, block_rows, static_smem, dynamic_smem = RESOURCES[name]
    occupancy = blocks_per_sm(arch, threads, registers, static_smem + dynamic_smem)
    return {"kernel": name, "arch": arch, "source": source, "defines": {}, "nvcc": "release 13.0",
            "command": "nvcc ...", "cubin_sha256": hashlib.sha256(f"{name} {arch}".encode()).hexdigest(), "registers": registers,
            "stack_frame_bytes": spill, "spill_store_bytes": spill, "spill_load_bytes": spill,
            "static_smem_bytes": static_smem, "spill_bytes": 2 * spill,
            "launch": {"threads": threads, "block_rows": block_rows, "block_cols": 64,
                       "dynamic_smem_bytes": dynamic_smem, "head_dim": 128},
            "smem_bytes": static_smem + dynamic_smem, **occupancy, "ptxas_report": ""}


# Profiler-like readings: V11 stalls in its softmax (lines 150-152) and keeps the LSU busy, V12 not
LSU = {"v11": 50.0, "v12": 20.0, "v13": 22.0, "br128": 29.0, "hybrid_smem": 21.0, "v14": 8.0, "v15": 6.0}


def profile_record(name: str, registers: int) -> dict:
    from flashbench.profile import METRICS, STALLS

    softmax_in_top = name == "v11"
    top = [{"line": 150 + i, "samples": 100 - 10 * i, "share": (100 - 10 * i) / 1000, "code": f"x = {i};",
            "softmax": softmax_in_top and i < 2} for i in range(5)]
    metrics = {**{m: 1.0 for m in METRICS}, "lsu_pipe_pct": LSU[name], "registers": registers,
               "achieved_occupancy_pct": 24.0, "smem_wavefronts": 2e7, "smem_bank_conflicts": 1e5,
               "stalls": {s: 0.5 + 0.1 * i for i, s in enumerate(STALLS)}}
    return {"kernel": name, "profiled": True, "reason": None, **CASE, "metrics": metrics, "ncu": "Version 2025.3",
            "stall_samples": 1000, "softmax_share": 0.3 if softmax_in_top else 0.05, "top_lines": top,
            "lines_reason": None}


def write(tmp, tflops: dict, failing: str | None = None, skipped: str | None = None, kernels=KERNELS) -> dict:
    """Write check, bench, sweep, profile and compile records for KERNELS and PEERS; `failing` fails
    its check, `skipped` (a peer) is skipped as where torch is missing; a kernel entry with a "D" (a run of
    a configuration at another head dim) takes every shape at that D. Returns the paths by kind."""
    paths = {"checks": [], "benches": [], "sweeps": [], "profiles": [], "compiled": []}
    tflops = {**PEER_TFLOPS, **tflops}
    for k in kernels + PEERS:
        name, causal = k["name"], k.get("causal", False)
        case, extra = ({**shape, "D": k.get("D", shape["D"])} for shape in (CASE, EXTRA))
        passed = name != failing
        shapes = [check_row(s, kind, passed) for s in (case, extra) for kind in INPUTS]
        if name == skipped:
            check = {"kernel": name, "gate": GATE, "passed": False, "skipped": "torch is not installed",
                     "reason": "skipped: torch is not installed", "shapes": []}
            not_timed = {"kernel": name, "timed": False, "reason": "skipped: torch is not installed"}
            for kind, record in (("checks", check), ("benches", not_timed), ("sweeps", not_timed)):
                write_json(tmp / kind / f"{name}.json", record)
                paths[kind].append(tmp / kind / f"{name}.json")
            continue
        archs = k.get("archs") or ("sm_90", "sm_103")
        identity = ({"torch": "2.11.0", "cudnn": "91900", "backend": k["backend"]} if k["kind"] == "peer" else
                    {"cubin_sha256": compile_record(name, archs[0])["cubin_sha256"]})
        check = {"kernel": name, "gate": GATE, "inputs": INPUTS, "passed": passed,
                 "reason": None if passed else "B=1 H=64 S=1024 normal: worst row's relative error 2.2e-02 above 4.5e-03",
                 "shapes": shapes, **identity, "provenance": provenance(name)}
        bench = ({"kernel": name, "timed": True, "reason": None, **identity,
                  "timing": timing(tflops[name], shape=case, causal=causal),
                  "provenance": provenance(name)} if passed else
                 {"kernel": name, "timed": False, "reason": "failed its check: ..."})
        points = [({**timing(tflops[name] * (S / 1024) ** 0.2, shape={**case, "S": S},
                            counts={**SWEEP, "steps": sweep_steps(SWEEP["steps"], CASE["S"], S)}, causal=causal),
                    "timed": True,
                    "reason": None}
                   if not k.get("max_seq_len") or S <= k["max_seq_len"] else
                   {**case, "S": S, "timed": False, "reason": f"S={S} is above {name}'s max_seq_len"})
                  for S in SWEEP_S]
        sweep = ({"kernel": name, "timed": True, "reason": None, **identity, "points": points,
                  "provenance": provenance(name)} if passed else
                 {"kernel": name, "timed": False, "reason": "failed its check: ..."})
        records = [("checks", check), ("benches", bench), ("sweeps", sweep)]
        if k["kind"] != "peer":
            records.append(("profiles", {**profile_record(name, RESOURCES[name][0]), **identity,
                                         "provenance": provenance(name)} if passed else
                            {"kernel": name, "profiled": False, "reason": "failed its check: ..."}))
        for kind, record in records:
            path = tmp / kind / f"{name}.json"
            write_json(path, record)
            paths[kind].append(path)
        if k["kind"] == "peer":
            continue
        for arch in archs:
            path = tmp / "build" / arch / f"{name}.json"
            write_json(path, compile_record(name, arch, k["source"]))
            paths["compiled"].append(path)
    return paths


def gather(paths: dict, kernels=KERNELS, settings: dict = SETTINGS):
    """tidy_tables of `write`'s records (`paths`): summary, resources, profile tables and kernels.json."""
    return tidy_tables(kernels + PEERS, paths["checks"], paths["benches"], paths["compiled"], "sm_90", CASE,
                       paths["sweeps"], paths["profiles"], settings, expected=EXPECTED)


def settings() -> Settings:
    """The run these records describe, as the commands get it from their settings file. Built directly:
    the config schema asks for more check shapes than these records need."""
    peer_fields = ("backend", "change", "published_tflops", "max_seq_len")
    kernel_fields = ("kind", "source", "change", "published_tflops", "published_registers", "parent", "defines", "archs",
                     "line")
    return Settings(
        gpu=None, gpu_arch=None, archs=["sm_103", "sm_90"], nvcc_flags=["-O3"],
        kernels=[Kernel(name=k["name"], **{f: k[f] for f in kernel_fields if f in k},
                        configurations=("dense",)) for k in KERNELS + HOPPER],
        case=Shape(**CASE), check_shapes=[Shape(**CASE), Shape(**EXTRA)], check_inputs=INPUTS,
        check_smallest=(3, 5), check_factor=GATE["factor"], tolerance=GATE["tolerance"], bench=BENCH,
        peers=[Peer(name=p["name"], **{f: p[f] for f in peer_fields}) for p in PEERS], baseline=SETTINGS["baseline"],
        sweep=SWEEP, headline=HEADLINE, head_to_head=SETTINGS["head_to_head"], cycles=SETTINGS["cycles"],
        goal=shipped_settings().goal)


def edit(path, change) -> None:
    """Change the record at `path` in place: `change` edits the loaded record."""
    record = read_json(path)
    change(record)
    write_json(path, record)


def seconds(shape: dict, tflops: float) -> float:
    return 4 * shape["B"] * shape["H"] * shape["S"] ** 2 * shape["D"] / (tflops * 1e12)


def head_to_head_record(shape: dict, tflops: dict, seed: int, back_to_back: bool = True) -> dict:
    """A point of the head-to-head: each contestant at `tflops` (by graph; back to back 2% slower,
    where it timed calls back to back), with 0.5% noise per round, at 650 W."""
    import numpy as np

    rng = np.random.default_rng(seed)
    contestants = {}
    for name, t in tflops.items():
        graph = seconds(shape, t)
        rounds = [{"step_s": graph * 1.02 * (1 + 0.005 * a), "graph_s": graph * (1 + 0.005 * b),
                   "issue_s": graph / 10, "dispatch_bound": False,
                   "clocks": {"step": clocks(), "graph": clocks()}}
                  for a, b in rng.standard_normal((design_rounds(SETTINGS["head_to_head"]["rounds"], len(tflops)), 2))]
        if not back_to_back:
            rounds = [{"graph_s": r["graph_s"], "clocks": {"graph": r["clocks"]["graph"]}} for r in rounds]
        calls = int(1.0 / graph) + 1  # a window of a second or more, 1% slower than the 50 ms timings
        contestants[name] = {"identity": {}, "calls_per_timing": 100, "rounds": rounds,
                             "energy": [{"calls": calls, "seconds": calls * graph * 1.01,
                                         "joules": calls * graph * 1.01 * 650.0, "watts": 650.0}]}
    return {**shape, "is_case": shape == CASE, **({} if back_to_back else {"methods": ["graph"]}), "order": list(tflops),
            "contestants": contestants, "excluded": {}, "provenance": provenance("head_to_head")}


def cycles_record(name: str, shapes: list[dict], tflops: float) -> dict:
    """Cycle counts of `name` at `shapes`, as if it ran at `tflops` at CLOCK_HZ (three launches, 0.2% apart)."""
    points = []
    for shape in shapes:
        n = seconds(shape, tflops) * CLOCK_HZ
        launches = [{"cycles": n * f, "duration_us": n * f / CLOCK_HZ * 1e6, "tensor_pipe_pct": 70.0,
                     "sm_clock_mhz": CLOCK_HZ / 1e6, "kernels": ["flash_attention_forward"]} for f in (0.998, 1.0, 1.002)]
        points.append({**shape, "launches": launches, "cycles": n, "duration_us": n / CLOCK_HZ * 1e6,
                       "tensor_pipe_pct": 70.0, "sm_clock_mhz": CLOCK_HZ / 1e6})
    return {"kernel": name, "counted": True, "reason": None, "sm_count": 132, "points": points, "ncu": "Version 2025.3",
            "provenance": provenance(name)}


def paired_tables(kernels, tflops: dict, paired: dict | None, not_counted=()):
    """head_to_head.csv and cycles.csv of a run whose headline versions and rivals ran at `paired`
    ({name: TFLOPS} at every point), every other kernel and peer at `tflops` at the case only. Without
    `paired`, a run without a head-to-head: its headline versions counted at every point all the same
    (config.Settings.cycle_shapes). `not_counted`: those that did not pass their checks."""
    from flashbench import cycles, headtohead

    shapes = [CASE, *({**CASE, "S": S} for S in SWEEP_S if S != CASE["S"])]
    contestants = paired or {}
    points = [head_to_head_record(shape, contestants, seed) for seed, shape in enumerate(shapes)] if paired else []
    everywhere = set(contestants) | set(HEADLINE)
    every = {**PEER_TFLOPS, **tflops}
    counts = [cycles_record(k["name"], shapes if k["name"] in everywhere else [CASE],
                            contestants.get(k["name"], every.get(k["name"], 100.0)))
              for k in kernels + PEERS if k["name"] not in not_counted]
    return headtohead.table(points, SETTINGS), cycles.table(counts, kernels + PEERS, EXPECTED.case_of)


def results_folder(tmp, tflops: dict, failing: str | None = None, skipped: str | None = None,
                   slug: str = "nvidia-h200", kernels=KERNELS, paired: dict | None = None):
    """What summarize makes of `write`'s records: tmp/results/<slug>/ with its tables, as archived;
    `paired`: the head-to-head's contestants at their TFLOPS (none: no head-to-head in the run)."""
    settings = SETTINGS if paired else {**SETTINGS, "head_to_head": None}
    summary, resources, profile, meta = gather(write(tmp, tflops, failing, skipped, kernels), kernels, settings)
    out = tmp / "results" / slug
    head_to_head, cycle_counts = paired_tables(kernels, tflops, paired, not_counted=(failing, skipped))
    write_text(out / "head_to_head.csv", head_to_head.to_csv(index=False))
    write_text(out / "cycles.csv", cycle_counts.to_csv(index=False))
    write_text(out / "summary.csv", summary.to_csv(index=False))
    write_text(out / "resources.csv", resources.to_csv(index=False))
    write_text(out / "profile.csv", profile.to_csv(index=False))
    write_json(out / "kernels.json", meta)
    return out
