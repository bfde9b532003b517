"""Render reports/<gpu>/report.md and its figures from results/<gpu>/ alone."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2
import pandas as pd

from . import FlashbenchError, archives, claims, conclusions, hopper, markdown
from .files import staged, staged_folder, write_text
from .gpu import commits
from .profile import TOP_LINES
from .check import METRICS
from .summary import DISPATCH, PROFILE_COLUMNS, RESOURCE_COLUMNS, SUMMARY_COLUMNS, TIMED, case_rows
from .validation import BadRecord, read_record, read_table, summary_problem

FIGURES = {"tflops": "tflops.png", "sweep": "sweep.png", "stalls": "stalls.png"}
HOPPER_FIGURES = {"tflops": "hopper_tflops.png", "sweep": "hopper_sweep.png"}
HOPPER_TEMPLATE = "hopper.md.j2"  # beside the chapter's template
REPORT_FILES = ["report.md", "hopper.md", *FIGURES.values(), *HOPPER_FIGURES.values()]  # what render writes


def read_summary(results_dir: Path | str) -> tuple[pd.DataFrame, dict]:
    """summary.csv and kernels.json, each checked and checked against the other (validation): a table
    cut short, from an older pipeline or edited is refused with one line."""
    results_dir = Path(results_dir)
    summary = read_table(results_dir / "summary.csv", [c for c in SUMMARY_COLUMNS if c not in DISPATCH])
    for column in DISPATCH:  # taken since the head-to-head was added; an archive from before has none
        if column not in summary.columns:
            summary[column] = None
    meta = read_record(results_dir / "kernels.json", "kernels")
    if problem := summary_problem(summary, meta):
        raise BadRecord(f"{results_dir / 'summary.csv'}: {problem}; run summarize on that GPU again")
    return summary, meta


def load(results_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    results_dir = Path(results_dir)
    archives.require_tables(results_dir)
    summary, meta = read_summary(results_dir)
    resources = read_table(results_dir / "resources.csv", RESOURCE_COLUMNS)
    profile = read_table(results_dir / "profile.csv", PROFILE_COLUMNS)
    return summary, resources, profile, meta


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    try:
        with staged(path) as tmp:
            fig.savefig(tmp, dpi=120)
    finally:
        plt.close(fig)


def _axes(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def _nothing_to_plot(ax, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


PUBLISHED = "write-up, B300"


def bars_figure(bars: list[dict], order: list[str], title: str, path: Path) -> None:
    """Grouped bars of TFLOPS: `bars` are {kernel, TFLOPS, source}, one hue per source, the kernels
    and peers in `order`."""
    import seaborn as sns

    sources = list(dict.fromkeys(b["source"] for b in bars))
    fig, ax = _axes(max(6.0, 1.5 + 0.55 * len(order) * max(2, len(sources))), 4.4)
    if bars:
        sns.barplot(data=pd.DataFrame(bars), x="kernel", y="TFLOPS", hue="source", order=order, ax=ax)
        for container in ax.containers:
            ax.bar_label(container, fmt="%.0f", fontsize=7)
        ax.legend(title=None, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(len(sources), 4),
                  frameon=False)
        ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("")
    _save(fig, path)


def tflops_figure(rows: list[dict], gpu_name: str, case: dict, path: Path) -> None:
    """Bars of measured TFLOPS per kernel and peer, the write-up's B300 figures beside them."""
    bars = []
    for r in rows:
        if r["tflops"] is not None:
            bars.append({"kernel": r["name"], "TFLOPS": r["tflops"], "source": f"measured, {gpu_name}"})
        if r["published_tflops"] is not None:
            bars.append({"kernel": r["name"], "TFLOPS": r["published_tflops"], "source": PUBLISHED})
    bars_figure(bars, [r["name"] for r in rows],
                f"Attention forward, B={case['B']} H={case['H']} S={case['S']} D={case['D']}, fp16", path)


def sweep_figure(sweep: pd.DataFrame, order: list[str], gpu_name: str, case: dict, path: Path) -> None:
    """TFLOPS against S, one line per kernel or peer (dashed: peers)."""
    import seaborn as sns

    fig, ax = _axes(8.0, 4.8)
    timed = sweep.dropna(subset=["tflops"])
    if timed.empty:
        _nothing_to_plot(ax, "no sweep in this run")
    else:
        styles = {name: ("peer" if kind == "peer" else "kernel") for name, kind in zip(timed.kernel, timed.kind)}
        data = timed.assign(implementation=timed.kernel, what=timed.kernel.map(styles))
        sns.lineplot(data=data, x="S", y="tflops", hue="implementation", style="what", markers=True,
                     hue_order=[n for n in order if n in styles], ax=ax)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(timed.S.unique()), [str(s) for s in sorted(timed.S.unique())])
        ax.set_ylabel("TFLOPS")
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
        ax.set_title(f"TFLOPS against S on the {gpu_name}, B={case['B']} H={case['H']} D={case['D']}", fontsize=10)
    _save(fig, path)


def stalls_figure(profile: pd.DataFrame, order: list[str], path: Path, shown: int = 7) -> None:
    """Stacked bars: cycles each kernel's warps spend per issued instruction in each stall reason."""
    fig, ax = _axes(8.0, 4.6)
    columns = [c for c in profile.columns if c.startswith("stall_") and c != "stall_selected"]
    if profile.empty:
        _nothing_to_plot(ax, "not profiled in this run")
    else:
        data = profile.set_index("kernel").reindex([n for n in order if n in set(profile.kernel)])[columns]
        data.columns = [c.removeprefix("stall_") for c in columns]
        top = data.sum().sort_values(ascending=False).index[:shown]
        data = data[list(top)].assign(other=data.drop(columns=list(top)).sum(axis=1))
        data.plot(kind="bar", stacked=True, ax=ax, colormap="tab10", width=0.7)
        ax.set_ylabel("stall cycles per issued instruction")
        ax.set_xlabel("")
        ax.tick_params(axis="x", labelrotation=0)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
        ax.set_title("Warp stall reasons at the case (Nsight Compute)", fontsize=10)
    _save(fig, path)


def _none(x):
    return None if x is None or (isinstance(x, float) and pd.isna(x)) else x


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
                    "shape": f"B={worst.B} H={worst.H} S={worst.S}", "margin": worst.margin,
                    **{m: worst[m] for m in METRICS}, **{f"yardstick_{m}": worst[f"yardstick_{m}"] for m in METRICS}},
            })
    return rows


def context(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict, slug: str) -> dict:
    kernels = meta["kernels"]
    provs = [k["provenance"] for k in kernels if k.get("provenance")]
    gpu_name = provs[0]["gpu"] if provs else slug
    checked = summary[summary.series == "check"]
    case = case_rows(summary)
    step = {s["kernel"]: s for s in conclusions.steps(case, kernels)}
    timed_case = {r.kernel: r.tflops for r in case.itertuples() if pd.notna(r.tflops)}
    baseline = meta.get("baseline")
    published = {k["name"]: k.get("published_tflops") for k in kernels}
    rows = []
    for k in kernels:
        r = case[case.kernel == k["name"]]
        r = r.iloc[0] if len(r) else {}
        row = {**k, **{f: _none(r.get(f)) for f in (*TIMED, "throttled")}, "step": step.get(k["name"])}
        row["of_baseline"] = (row["tflops"] / timed_case[baseline]
                              if row["tflops"] is not None and baseline in timed_case else None)
        rows.append(row)
    sweep = summary[summary.series == "sweep"]
    order = [k["name"] for k in kernels]
    def sweep_table(figure: str) -> pd.DataFrame:
        return (sweep.pivot_table(index="kernel", columns="S", values=figure).reindex(
            [n for n in order if n in set(sweep.kernel)]) if not sweep.empty else pd.DataFrame())

    by_steps, by_graph = sweep_table("tflops"), sweep_table("tflops_graph")
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
        "torch": sorted({f"torch {k['identity']['torch']}, cuDNN {k['identity']['cudnn']}"
                         for k in kernels if k.get("identity", {}).get("torch")}),
        "skipped_peers": [k for k in kernels if k["kind"] == "peer" and k.get("skipped")],
        "nvcc": sorted(resources.nvcc.unique()),
        "rows": rows,
        "baseline": baseline if baseline in timed_case else None,
        "baseline_published": published.get(baseline),
        "longest_checked": int(checked.S.max()) if len(checked) else None,
        "timing": next((k["timing"] for k in kernels if k.get("timing")), None),
        "l2_bytes": l2,
        "input_bytes": inputs,
        "archs": archs,
        "resources": {(r.kernel, r.arch): r._asdict() for r in resources.itertuples()},
        "correctness": correctness(checked, order=[k["name"] for k in kernels]),
        "failures": [{k: _none(v) for k, v in row.items()} for row in checked[checked.passed != True].to_dict("records")],  # noqa: E712
        "extra_shapes": sorted({(r.B, r.H, r.S) for r in checked[~checked.is_case].itertuples()}),
        "throttled": list(dict.fromkeys(r.kernel for r in case[case.throttled == True].itertuples())),  # noqa: E712
        "sweep_lengths": [int(s) for s in by_steps.columns],
        "sweep_rows": [{"name": name, "tflops": [_none(v) for v in values]}
                       for name, values in zip(by_steps.index, by_steps.itertuples(index=False))],
        "sweep_graph_rows": [{"name": name, "tflops": [_none(v) for v in values]}
                             for name, values in zip(by_graph.index, by_graph.itertuples(index=False))],
        "profile": [{k: _none(v) for k, v in row.items()} for row in profile.to_dict("records")],
        "profiled": {k["name"]: k["profile"] for k in kernels if k.get("profile")},
        "findings": conclusions.findings(checked, resources, meta, gpu_name),
        "claims": claims.claims(checked, resources, meta, gpu_name),
        "profiler_claims": claims.profiler_claims(profile, resources, meta),
        "conclusions": claims.conclusions(checked, resources, meta, gpu_name, profile),
        "order": order,
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


@functools.cache
def _templates(folder: str) -> jinja2.Environment:
    """The templates of one folder, every value they put out escaped for markdown (markdown.text;
    `| code` for a code span). Kept for the process: jinja2 compiles a template once per
    environment (a tenth of a report's render, paid again on every render in a process that renders
    several, as the tests do) and compiles it again when its file changes."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, finalize=markdown.text)
    env.filters["code"] = markdown.code
    return env


def fill(template: Path | str, **context) -> str:
    """A jinja2 template filled in; a name the template uses but is not given is an error."""
    return _templates(str(Path(template).parent)).get_template(Path(template).name).render(**context)


def render(results_dir: Path | str, report_dir: Path | str, template: Path | str, slug: str) -> Path:
    """report.md (the chapter) and hopper.md (the sm_90a line after it) with their figures."""
    everything = load(results_dir)
    summary, resources, profile, meta = chapter(*everything)
    ctx = context(summary, resources, profile, meta, slug)
    text = fill(template, **ctx)
    report_dir = Path(report_dir)
    order = ctx["order"]
    # Everything is rendered first, beside the folder: a render that fails leaves the report as it was
    paired = read_paired(results_dir)
    with staged_folder(report_dir, REPORT_FILES) as staging:
        tflops_figure(ctx["rows"], ctx["gpu_name"], meta["case"], staging / FIGURES["tflops"])
        sweep_figure(summary[summary.series == "sweep"], order, ctx["gpu_name"], meta["case"], staging / FIGURES["sweep"])
        stalls_figure(profile, order, staging / FIGURES["stalls"])
        write_text(staging / "report.md", text)
        render_hopper(*everything, Path(template).with_name(HOPPER_TEMPLATE), staging, slug, ctx["gpu_name"], paired)
    return report_dir / "report.md"


def read_paired(results_dir: Path | str) -> dict:
    """head_to_head.csv and cycles.csv, where the run made them (an archive of an older pipeline has
    neither: its report says so)."""
    from .cycles import COLUMNS as CYCLES_COLUMNS
    from .headtohead import COLUMNS as HEAD_TO_HEAD_COLUMNS

    tables = {}
    for name, columns in (("head_to_head", HEAD_TO_HEAD_COLUMNS), ("cycles", CYCLES_COLUMNS)):
        path = Path(results_dir) / f"{name}.csv"
        tables[name] = pd.read_csv(path) if path.is_file() else None
        if tables[name] is not None and (missing := [c for c in columns if c not in tables[name].columns]):
            raise FlashbenchError(f"{path} lacks the columns {', '.join(missing)}: run the GPU stages on that GPU again")
    return tables


def render_hopper(summary, resources, profile, meta, template: Path, report_dir: Path, slug: str, gpu_name: str,
                  paired: dict) -> None:
    ctx = hopper.context(summary, resources, profile, meta, **paired)
    names = set(ctx["order"])
    checked = summary[(summary.series == "check") & summary.kernel.isin([k["name"] for k in ctx["line"]])]
    rows = [{"name": n, "tflops": hopper.tflops_of(case_rows(summary), n), "published_tflops": None}
            for n in ctx["order"]]
    tflops_figure(rows, gpu_name, meta["case"], report_dir / HOPPER_FIGURES["tflops"])
    sweep = summary[(summary.series == "sweep") & summary.kernel.isin(names)]
    sweep_figure(sweep, ctx["order"], gpu_name, meta["case"], report_dir / HOPPER_FIGURES["sweep"])
    measured = commits([k["provenance"] for k in meta["kernels"] if k.get("provenance")])
    text = fill(template, **ctx, meta=meta, slug=slug, gpu_name=gpu_name, figures=HOPPER_FIGURES, commits=measured,
        correctness=correctness(checked, [k["name"] for k in ctx["line"]]))
    write_text(report_dir / "hopper.md", text)
