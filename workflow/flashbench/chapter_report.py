"""The chapter's report, reports/<gpu>/report.md and its figures: G3's kernels and the peers, from
results/<gpu>/ alone (the kernels of another line are recorded beside them, but are no part of it)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import attention, claims, findings
from .archive_tables import by_s, nan_as_none, sweep_rows
from .check import METRICS
from .config import sweep_lengths, sweep_steps
from .figures import stalls_figure, sweep_figure, tflops_figure
from .files import write_text
from .gpu import commits
from .profile import TOP_LINES
from .summary import TIMED, case_rows
from .templates import fill

FIGURES = {"tflops": "tflops.png", "sweep": "sweep.png", "stalls": "stalls.png"}
WRITTEN = ("report.md", *FIGURES.values())  # what render writes
LIBRARY_NAMES = {"torch": "torch", "cudnn": "cuDNN", "flash_attn": "flash-attn-4", "cutlass_dsl": "CUTLASS DSL"}


def correctness(checked: pd.DataFrame, order: list[str]) -> list[dict]:
    """One row per kernel and kind of input: how many shapes passed, and the figures of the shape that
    came closest to its bound (the largest margin: error / threshold)."""
    rows = []
    for name in order:
        mine = checked[checked.kernel == name]
        for kind in dict.fromkeys(mine.inputs):
            runs = mine[mine.inputs == kind]
            judged = runs.dropna(subset=["margin"])
            worst = judged.loc[judged.margin.idxmax()] if len(judged) else None
            rows.append({
                "kernel": name, "inputs": kind, "shapes": len(runs), "passed": int((runs.passed == True).sum()),  # noqa: E712
                "failed": int((runs.passed == False).sum()), "skipped": int(runs.passed.isna().sum()),  # noqa: E712
                "worst": None if worst is None else {
                    "shape": _shape(worst.B, worst.H, worst.S), "margin": worst.margin,
                    **{m: worst[m] for m in METRICS}, **{f"yardstick_{m}": worst[f"yardstick_{m}"] for m in METRICS}},
            })
    return rows


def _shape(b, h, s) -> str:
    return f"B={b} H={h} S={s}"


def checked_shapes(checked: pd.DataFrame) -> dict:
    """The shapes of the check beyond the case: `shared_shapes`, those every kernel and peer was checked
    at, and `own_shapes`, {shape: the kernels checked there} for the others (each kernel's smallest S)."""
    beyond = checked[~checked.is_case]
    shapes = {name: {(r.B, r.H, r.S) for r in rows.itertuples()} for name, rows in beyond.groupby("kernel", sort=False)}
    shared = set.intersection(*shapes.values()) if shapes else set()
    own = {}
    for name, mine in shapes.items():
        for shape in sorted(mine - shared):
            own.setdefault(_shape(*shape), []).append(name)
    return {"shared_shapes": [_shape(*shape) for shape in sorted(shared)], "own_shapes": own}


def context(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict, slug: str) -> dict:
    kernels = meta["kernels"]
    provs = [k["provenance"] for k in kernels if k.get("provenance")]
    gpu_name = provs[0]["gpu"] if provs else slug
    checked = summary[summary.series == "check"]
    case = case_rows(summary)
    step = {s["kernel"]: s for s in findings.steps(case, kernels)}
    timed_case = {r.kernel: r.tflops for r in case.itertuples() if pd.notna(r.tflops)}
    baseline = meta.get("baseline")
    published = {k["name"]: k.get("published_tflops") for k in kernels}
    rows = []
    for k in kernels:
        r = case[case.kernel == k["name"]]
        r = r.iloc[0] if len(r) else {}
        row = {**k, **{f: nan_as_none(r.get(f)) for f in (*TIMED, "throttled")}, "step": step.get(k["name"])}
        row["of_baseline"] = (row["tflops"] / timed_case[baseline]
                              if row["tflops"] is not None and baseline in timed_case else None)
        rows.append(row)
    sweep = summary[summary.series == "sweep"]
    order = [k["name"] for k in kernels]
    by_steps, by_graph = by_s(sweep, "tflops", order), by_s(sweep, "tflops_graph", order)
    archs = sorted(resources.arch.unique(), key=lambda a: (a != meta["gpu_arch"], a))
    l2 = provs[0]["l2_bytes"] if provs else None
    inputs = next((k["timing"]["input_bytes"] for k in kernels if k.get("timing")), None)
    return {
        "slug": slug,
        "gpu_name": gpu_name,
        "meta": meta,
        "common": {key: sorted({str(p[key]) for p in provs if key in p}) for key in
                   ("gpu", "pci_bus_id", "arch", "sm_count", "driver", "cuda_driver", "cuda_runtime", "cupy")},
        "commits": commits(provs),
        "torch": sorted({", ".join(f"{LIBRARY_NAMES[key]} {k['identity'][key]}" for key in LIBRARY_NAMES
                                   if key in k["identity"])
                         for k in kernels if k.get("identity", {}).get("torch")}),
        "skipped_peers": [k for k in kernels if k["kind"] == "peer" and k.get("skipped")],
        "nvcc": sorted(resources.nvcc.unique()),
        "rows": rows,
        "baseline": baseline if baseline in timed_case else None,
        "baseline_published": published.get(baseline),
        "longest_checked": int(checked.S.max()) if len(checked) else None,
        "sweep_steps": {S: sweep_steps(meta["sweep"]["steps"], meta["case"]["S"], S)
                        for S in sweep_lengths(meta.get("sweep"))},
        "timing": next((k["timing"] for k in kernels if k.get("timing")), None),
        "l2_bytes": l2,
        "input_bytes": inputs,
        "archs": archs,
        "resources": {(r.kernel, r.arch): r._asdict() for r in resources.itertuples()},
        "correctness": correctness(checked, order=[k["name"] for k in kernels]),
        "failures": [{k: nan_as_none(v) for k, v in row.items()} for row in checked[checked.passed != True].to_dict("records")],  # noqa: E712
        **checked_shapes(checked),
        "throttled": list(dict.fromkeys(r.kernel for r in case[case.throttled == True].itertuples())),  # noqa: E712
        "sweep_lengths": [int(s) for s in by_steps.columns],
        "sweep_rows": sweep_rows(by_steps),
        "sweep_graph_rows": sweep_rows(by_graph),
        "profile": [{k: nan_as_none(v) for k, v in row.items()} for row in profile.to_dict("records")],
        "profiled": {k["name"]: k["profile"] for k in kernels if k.get("profile")},
        "findings": findings.findings(checked, resources, meta, gpu_name),
        "claims": claims.claims(checked, resources, meta),
        "profiler_claims": claims.profiler_claims(profile, resources, meta),
        "conclusions": claims.conclusions(checked, resources, meta, gpu_name, profile),
        "order": order,
        "input_kinds": attention.INPUT_KIND_TEXT,
        "top_lines": TOP_LINES,
        "figures": FIGURES,
    }


def chapter(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict, line: str = "g3"):
    """The chapter's kernels (config `line`, g3 where a record predates it) and the peers: the kernels of
    another line (the Hopper versions after V13) are run and recorded beside them, but are no part
    of G3's table, figures, claims or conclusions."""
    kept = [k for k in meta["kernels"] if k["kind"] == "peer" or k.get("line", "g3") == line]
    names = {k["name"] for k in kept}
    return (summary[summary.kernel.isin(names)], resources[resources.kernel.isin(names)],
            profile[profile.kernel.isin(names)], {**meta, "kernels": kept})


def render(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict, template: Path | str,
           report_dir: Path, slug: str) -> str:
    """report.md and its figures into `report_dir`, from every kernel's tables (the chapter's are
    taken from them); returns the GPU's name as the report gives it."""
    summary, resources, profile, meta = chapter(summary, resources, profile, meta)
    ctx = context(summary, resources, profile, meta, slug)
    text = fill(template, **ctx)
    order = ctx["order"]
    last_version = [k["name"] for k in meta["kernels"] if k["kind"] == "version"][-1:]
    emphasized = {**{n: "the chapter's last" for n in last_version},
                  **({ctx["baseline"]: "the baseline"} if ctx["baseline"] else {})}
    tflops_figure(ctx["rows"], ctx["gpu_name"], meta["case"], report_dir / FIGURES["tflops"])
    sweep_figure(summary[summary.series == "sweep"], order, emphasized, ctx["gpu_name"], meta["case"],
                 report_dir / FIGURES["sweep"])
    stalls_figure(profile, order, report_dir / FIGURES["stalls"])
    write_text(report_dir / "report.md", text)
    return ctx["gpu_name"]
