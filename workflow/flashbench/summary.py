"""Gather a GPU's raw records (check, bench, compile) into its tidy tables.

results/<gpu>/summary.csv    one row per kernel and checked shape, timings on the timed case
results/<gpu>/resources.csv  one row per kernel and architecture, from ptxas and the contract
results/<gpu>/kernels.json   what each kernel is (kind, change, published figure, choices made)
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from .files import read_json

SUMMARY_COLUMNS = [
    "kernel", "kind", "B", "H", "S", "D", "is_case", "passed", "rel_error", "max_abs_error", "reason",
    "tflops", "tflops_median", "tflops_min", "tflops_max", "ms_per_step", "ms_median", "gib_per_s",
    "arch", "registers", "spill_bytes", "smem_bytes", "blocks_per_sm",
]
RESOURCE_COLUMNS = [
    "kernel", "arch", "registers", "spill_store_bytes", "spill_load_bytes", "stack_frame_bytes",
    "static_smem_bytes", "dynamic_smem_bytes", "smem_bytes", "threads", "block_rows", "blocks_per_sm",
    "limited_by", "nvcc", "command", "cubin_sha256",
]
_CHOICE = re.compile(r"^\s*//\s*Choice:\s*(.*)$")


def choices(source: Path | str) -> str | None:
    """The `// Choice: ...` paragraph of a kernel file: what it decided where the write-up is vague."""
    lines, text = Path(source).read_text().splitlines(), []
    for i, line in enumerate(lines):
        if m := _CHOICE.match(line):
            text.append(m[1])
            for follow in lines[i + 1 :]:
                body = follow.strip()
                if not body.startswith("//") or body == "//":
                    break
                text.append(body[2:].strip())
            break
    return " ".join(text) or None


def resources_table(compile_records: list[dict]) -> pd.DataFrame:
    rows = [{
        **{k: r[k] for k in ("kernel", "arch", "registers", "spill_store_bytes", "spill_load_bytes",
                              "stack_frame_bytes", "static_smem_bytes", "smem_bytes", "blocks_per_sm", "nvcc",
                              "command", "cubin_sha256")},
        "dynamic_smem_bytes": r["launch"]["dynamic_smem_bytes"],
        "threads": r["launch"]["threads"],
        "block_rows": r["launch"]["block_rows"],
        "limited_by": " + ".join(r["limited_by"]),
    } for r in compile_records]
    return pd.DataFrame(rows, columns=RESOURCE_COLUMNS)


def summary_table(kernels: list[dict], checks: dict, benches: dict, resources: pd.DataFrame, gpu_arch: str,
                  case: dict) -> pd.DataFrame:
    """`kernels` in table order; `checks` / `benches` map kernel name to its record."""
    rows = []
    for kernel in kernels:
        name = kernel["name"]
        res = resources[(resources.kernel == name) & (resources.arch == gpu_arch)]
        res = res.iloc[0].to_dict() if len(res) else {}
        bench = benches.get(name, {})
        for shape in checks[name]["shapes"]:
            dims = {d: shape[d] for d in "BHSD"}
            is_case = dims == case
            row = {
                "kernel": name, "kind": kernel["kind"], **dims, "is_case": is_case,
                "passed": shape["passed"], "rel_error": shape.get("rel_error"),
                "max_abs_error": shape.get("max_abs_error"), "reason": shape.get("reason"),
                "arch": gpu_arch, **{k: res.get(k) for k in ("registers", "smem_bytes", "blocks_per_sm")},
                "spill_bytes": (res["spill_store_bytes"] + res["spill_load_bytes"]) if res else None,
            }
            if is_case and bench.get("timed") and checks[name]["passed"]:
                row.update({k: bench["timing"][k] for k in ("tflops", "tflops_median", "tflops_min", "tflops_max",
                                                              "ms_per_step", "ms_median", "gib_per_s")})
            rows.append(row)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)


def summarize(kernels: list[dict], check_paths: list, bench_paths: list, compile_paths: list, gpu_arch: str,
              case: dict) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    checks = {(r := read_json(p))["kernel"]: r for p in check_paths}
    benches = {(r := read_json(p))["kernel"]: r for p in bench_paths}
    compile_records = [read_json(p) for p in compile_paths]
    resources = resources_table(compile_records)
    summary = summary_table(kernels, checks, benches, resources, gpu_arch, case)
    sources = {r["kernel"]: r["source"] for r in compile_records}
    meta = {
        "gpu_arch": gpu_arch,
        "case": case,
        "tolerance": next(iter(checks.values()))["tolerance"],
        "kernels": [{**k, "choices": choices(sources[k["name"]]) if k["name"] in sources else None,
                     "check_passed": checks[k["name"]]["passed"], "check_reason": checks[k["name"]]["reason"],
                     "timed": checks[k["name"]]["passed"] and benches.get(k["name"], {}).get("timed", False),
                     "not_timed_reason": benches.get(k["name"], {}).get("reason"),
                     "timing": benches.get(k["name"], {}).get("timing"),
                     "provenance": benches.get(k["name"], {}).get("provenance")} for k in kernels],
    }
    return summary, resources, meta
