"""Gather a GPU's raw records (check, bench, sweep, profile, compile) into its tidy tables.

results/<gpu>/summary.csv    one row per kernel or peer and shape: the checked shapes (series
                             "check", timings on the case) and the sweep's lengths (series "sweep")
results/<gpu>/resources.csv  one row per kernel and architecture, from ptxas and the contract
results/<gpu>/profile.csv    one row per profiled kernel: Nsight Compute's readings at the case
results/<gpu>/kernels.json   what each kernel and peer is (kind, change, published figure, its own choices
                             made, where its warps stall) and what the run skipped
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from . import FlashbenchError
from .compile import runnable_build
from .peers import IDENTITY_KEYS
from .profile import METRICS, STALLS
from .validation import Expected, read_record

CHECK_FIGURES = (
    "rel_error", "worst_row_rel_error", "max_abs_error",
    "yardstick_rel_error", "yardstick_worst_row_rel_error", "yardstick_max_abs_error",
    "threshold_rel_error", "threshold_worst_row_rel_error", "threshold_max_abs_error", "margin",
)
TIMED = ("tflops", "tflops_median", "tflops_min", "tflops_max", "tflops_graph", "ms_per_step", "ms_median", "ms_graph",
         "gib_per_s")
# Whether back-to-back calls timed the CPU's dispatch (timing.dispatch_bound): which methods are fair
DISPATCH = ("issue_ms_per_call", "dispatch_bound")
CLOCKS = ("sm_clock_mhz_median", "sm_clock_mhz_min", "power_w_max", "throttled", "throttle_reasons")
SUMMARY_COLUMNS = [
    "kernel", "config", "kind", "series", "B", "H", "S", "D", "inputs", "is_case", "passed", *CHECK_FIGURES, "reason",
    *TIMED, *DISPATCH, *CLOCKS, "arch", "registers", "spill_bytes", "smem_bytes", "blocks_per_sm",
]
RESOURCE_COLUMNS = [
    "kernel", "config", "arch", "registers", "spill_store_bytes", "spill_load_bytes", "stack_frame_bytes",
    "static_smem_bytes", "dynamic_smem_bytes", "smem_bytes", "threads", "block_rows", "blocks_per_sm",
    "limited_by", "nvcc", "command", "cubin_sha256",
]
PROFILE_COLUMNS = ["kernel", "config", *METRICS, *(f"stall_{s}" for s in STALLS), "softmax_share", "softmax_in_top_lines"]
_CHOICE = re.compile(r"^\s*//\s*Choice:\s*(.*)$")


def choices(source: Path | str) -> list[str]:
    """Each `// Choice: ...` paragraph of a kernel file, in order: what it decided where the write-up is
    vague. A paragraph runs to a bare `//`, the next `// Choice:` or the end of the comment."""
    paragraphs, current = [], None
    for line in Path(source).read_text().splitlines():
        body = line.strip()
        if m := _CHOICE.match(line):
            current = [m[1]]
            paragraphs.append(current)
        elif current is not None and body.startswith("//") and body != "//":
            current.append(body[2:].strip())
        else:
            current = None
    return [" ".join(words) for words in paragraphs]


def own_choices(kernels: list[dict], sources: dict[str, str]) -> dict[str, list[str]]:
    """Each kernel's choices (`sources`: its file), less those the version before it states word for
    word: a version's file may restate what it keeps of its predecessor's design (V19's the schedule
    of V18), and that choice is the predecessor's. An ablation, built from its parent's file, has its
    parent's; a kernel's build in another configuration its kernel's."""
    own, previous = {}, set()  # the choices of the version before
    for k in kernels:
        if k["name"] not in sources:  # a peer
            continue
        if k.get("of", k["name"]) in own:
            own[k["name"]] = own[k["of"]]
            continue
        mine = choices(sources[k["name"]])
        if k["kind"] == "version":
            own[k["name"]] = [c for c in mine if c not in previous]
            previous = set(mine)
        else:
            own[k["name"]] = mine
    return own


def resources_table(compile_records: list[dict], config_of: dict) -> pd.DataFrame:
    """One row per build and arch; `config_of`: each build's configuration, by its name."""
    rows = [{
        "config": config_of.get(r["kernel"]),
        **{k: r[k] for k in ("kernel", "arch", "registers", "spill_store_bytes", "spill_load_bytes",
                              "stack_frame_bytes", "static_smem_bytes", "smem_bytes", "blocks_per_sm", "nvcc",
                              "command", "cubin_sha256")},
        "dynamic_smem_bytes": r["launch"]["dynamic_smem_bytes"],
        "threads": r["launch"]["threads"],
        "block_rows": r["launch"]["block_rows"],
        "limited_by": " + ".join(r["limited_by"]),
    } for r in compile_records]
    return pd.DataFrame(rows, columns=RESOURCE_COLUMNS)


def _clocks(timing: dict) -> dict:
    """The NVML readings over one timing, flattened for the table."""
    c = timing.get("clocks") or {}
    if not c.get("samples"):
        return {}
    return {"sm_clock_mhz_median": c["sm_clock_mhz"]["median"], "sm_clock_mhz_min": c["sm_clock_mhz"]["min"],
            "power_w_max": c["power_w"]["max"], "throttled": c["throttled"],
            "throttle_reasons": " ".join(c["throttle_reasons"]) or None}


def builds_run_here(compile_records: list[dict], gpu_arch: str) -> dict:
    """Each kernel's build that runs on `gpu_arch`: the GPU's own arch, or its specific target (sm_90a
    on sm_90); None for a kernel with no build for it."""
    archs = {}
    for r in compile_records:
        archs.setdefault(r["kernel"], []).append(r["arch"])
    return {name: runnable_build(a, gpu_arch) for name, a in archs.items()}


def summary_table(kernels: list[dict], checks: dict, benches: dict, resources: pd.DataFrame, runs_here: dict,
                  gpu_arch: str, case_of, sweeps: dict) -> pd.DataFrame:
    """`kernels` (and peers) in table order; `checks` / `benches` / `sweeps` map a name to its record;
    `runs_here`: builds_run_here; `case_of`: a run's name -> its case (validation.Expected.case_of). A
    check row is one shape and kind of input; the timing at the case sits on its normal-input row."""
    rows = []
    for kernel in kernels:
        name = kernel["name"]
        arch = runs_here.get(name) or gpu_arch
        res = resources[(resources.kernel == name) & (resources.arch == arch)]
        res = res.iloc[0].to_dict() if len(res) else {}
        bench = benches.get(name, {})
        case = case_of(name)
        for shape in checks[name]["shapes"]:
            dims = {d: shape[d] for d in "BHSD"}
            is_case = dims == case
            row = {
                "kernel": name, "config": kernel.get("config"), "kind": kernel["kind"], "series": "check", **dims, "inputs": shape["inputs"],
                "is_case": is_case, "passed": shape["passed"], "reason": shape.get("reason"),
                **{f: shape.get(f) for f in CHECK_FIGURES},
                "arch": arch, **{k: res.get(k) for k in ("registers", "smem_bytes", "blocks_per_sm")},
                "spill_bytes": (res["spill_store_bytes"] + res["spill_load_bytes"]) if res else None,
            }
            if is_case and shape["inputs"] == "normal" and bench.get("timed") and checks[name]["passed"]:
                row.update({k: bench["timing"][k] for k in (*TIMED, *DISPATCH)}, **_clocks(bench["timing"]))
            rows.append(row)
        for point in sweeps.get(name, {}).get("points", []):
            rows.append({"kernel": name, "config": kernel.get("config"), "kind": kernel["kind"], "series": "sweep", **{d: point[d] for d in "BHSD"},
                         "inputs": "normal", "is_case": False, "passed": checks[name]["passed"],
                         "reason": point["reason"], "arch": arch,
                         **({k: point[k] for k in (*TIMED, *DISPATCH)} | _clocks(point) if point["timed"] else {})})
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def case_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The check rows at the case on normal inputs: where the case's timings sit, one per kernel."""
    return summary[(summary.series == "check") & summary.is_case & (summary.inputs == "normal")]


def belong_together(compile_records: list[dict], runs_here: dict, **records: dict) -> None:
    """Refuse records that do not describe one run on one GPU: another GPU, PCI bus id, driver or GPU
    UUID (where records have one: those made before it was recorded have none), or a kernel whose
    check, timing, sweep or profile names a cubin other than the one built now. So the UUID of any
    kernel in kernels.json is the whole run's."""
    seen, uuids = {}, {}
    for stage, by_name in records.items():
        for name, r in by_name.items():
            p = r.get("provenance")
            if p:
                seen.setdefault(f"{p['gpu']} at {p['pci_bus_id']}, driver {p['driver']}", []).append(f"{stage}/{name}")
                if "gpu_uuid" in p:
                    uuids.setdefault(p["gpu_uuid"], []).append(f"{stage}/{name}")
    for groups, what in ((seen, "GPU, PCI bus id or driver"), (uuids, "GPU (by its UUID)")):
        if len(groups) > 1:
            listed = "; ".join(f"{group}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                               for group, names in groups.items())
            raise FlashbenchError(f"these records come from more than one {what} ({listed}): "
                                  f"rerun the GPU stages on one GPU (delete the others' records)")
    built = {r["kernel"]: r["cubin_sha256"] for r in compile_records if r["arch"] == runs_here[r["kernel"]]}
    for stage, by_name in records.items():
        for name, r in by_name.items():
            if name in built and "cubin_sha256" in r and r["cubin_sha256"] != built[name]:
                raise FlashbenchError(f"{stage}/{name} names cubin {r['cubin_sha256'][:12]} but {name}'s build for "
                                      f"{runs_here[name]} is {built[name][:12]}: rerun its GPU stages")


def profile_table(profiles: dict, config_of: dict) -> pd.DataFrame:
    """One row per profiled kernel: its metrics, stall reasons (cycles per issued instruction) and the
    softmax section's share of the sampled stalls; `config_of`: each kernel's configuration."""
    rows = []
    for name, p in profiles.items():
        if not p.get("profiled"):
            continue
        m = p["metrics"]
        rows.append({"kernel": name, "config": config_of.get(name), **{k: m[k] for k in METRICS}, **{f"stall_{s}": m["stalls"][s] for s in STALLS},
                     "softmax_share": p["softmax_share"],
                     "softmax_in_top_lines": (None if p["top_lines"] is None
                                              else sum(line["softmax"] for line in p["top_lines"]))})
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)


def read_records(paths: list, kind: str, expected: Expected) -> dict:
    """Each record of `kind` by the name it is filed under, checked as it is read (validation)."""
    return {Path(p).stem: read_record(p, kind, expected) for p in paths}


def tidy_tables(kernels: list[dict], check_paths: list, bench_paths: list, compile_paths: list, gpu_arch: str,
                case: dict, sweep_paths: list = (), profile_paths: list = (), settings: dict | None = None, *,
                expected: Expected, more_records: dict | None = None
                ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """A GPU's raw records gathered into its tables: summary.csv's, resources.csv's, profile.csv's and
    kernels.json. `kernels`: the config entries of the kernels and peers, in table order. `settings`:
    what the run was asked to do beyond that (baseline, sweep, profile note), carried into
    kernels.json. `expected`: what the records must show the run did (the configured shapes and call
    counts). `more_records`: the records of other stages (stage -> name -> record, read already),
    held to the same GPU and cubins as these."""
    checks = read_records(check_paths, "check", expected)
    benches = read_records(bench_paths, "bench", expected)
    sweeps = read_records(sweep_paths, "sweep", expected)
    profiles = read_records(profile_paths, "profile", expected)
    compile_records = [read_record(p, "compile", expected) for p in compile_paths]  # one per kernel and arch
    unchecked = [k["name"] for k in kernels if k["name"] not in checks]
    if unchecked:
        raise FlashbenchError(f"no check record for {', '.join(unchecked)}: run its check")
    # with Nsight Compute, every kernel is profiled in its first configuration (one it could not profile says why)
    unprofiled = [k["name"] for k in kernels if k["kind"] != "peer" and k.get("of", k["name"]) == k["name"]
                  and k["name"] not in profiles]
    if profiles and unprofiled:
        raise FlashbenchError(f"no profile record for {', '.join(unprofiled)}: run its profile (or give none, for a "
                              "run without Nsight Compute)")
    runs_here = builds_run_here(compile_records, gpu_arch)
    belong_together(compile_records, runs_here, check=checks, bench=benches, sweep=sweeps, profile=profiles,
                    **(more_records or {}))
    config_of = {k["name"]: k.get("config") for k in kernels}
    resources = resources_table(compile_records, config_of)
    summary = summary_table(kernels, checks, benches, resources, runs_here, gpu_arch, expected.case_of, sweeps)
    choices_of = own_choices(kernels, {r["kernel"]: r["source"] for r in compile_records})
    counted = (more_records or {}).get("cycles", {})
    meta = {
        "gpu_arch": gpu_arch,
        "case": case,
        "gate": next(iter(checks.values()))["gate"],
        "inputs": expected.inputs,  # the kinds every kernel and peer is checked on
        "kernel_inputs": expected.kernel_inputs,  # and those the kernels are checked on besides
        **(settings or {}),
        "kernels": [{**k, "choices": choices_of.get(k["name"]),
                     "check_passed": checks[k["name"]]["passed"], "check_reason": checks[k["name"]]["reason"],
                     "skipped": checks[k["name"]].get("skipped"),
                     "identity": {f: checks[k["name"]][f] for f in IDENTITY_KEYS if f in checks[k["name"]]},
                     "timed": checks[k["name"]]["passed"] and benches.get(k["name"], {}).get("timed", False),
                     "not_timed_reason": benches.get(k["name"], {}).get("reason"),
                     "timing": benches.get(k["name"], {}).get("timing"),
                     # a headline version's ragged S against the next multiple of 128, paired (the sweep's)
                     "ragged": sweeps.get(k["name"], {}).get("ragged"),
                     "profile": ({f: profiles[k["name"]].get(f) for f in ("profiled", "reason", "top_lines", "softmax_share",
                                                                          "stall_samples", "lines_reason", "ncu")}
                                 if k["name"] in profiles else None),
                     # whether its cycles were counted (an ncu that could not count it says why)
                     "count": ({f: counted[k["name"]].get(f) for f in ("counted", "reason")}
                               if k["name"] in counted else None),
                     "provenance": benches.get(k["name"], {}).get("provenance")
                     or checks[k["name"]].get("provenance")} for k in kernels],
    }
    return summary, resources, profile_table(profiles, config_of), meta
