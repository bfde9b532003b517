"""Render reports/<gpu>/report.md and its figures from results/<gpu>/ alone."""
from __future__ import annotations

from pathlib import Path

import jinja2
import pandas as pd

from . import FlashbenchError, claims, conclusions
from .files import read_json, write_text
from .profile import TOP_LINES
from .summary import TIMED

FIGURES = {"tflops": "tflops.png", "sweep": "sweep.png", "stalls": "stalls.png"}


def load(results_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    results_dir = Path(results_dir)
    needed = ("summary.csv", "resources.csv", "profile.csv", "kernels.json")
    missing = [f for f in needed if not (results_dir / f).is_file()]
    if missing:
        raise FlashbenchError(f"{results_dir} lacks {', '.join(missing)}: run the pipeline on that GPU first")
    summary = pd.read_csv(results_dir / "summary.csv")
    resources = pd.read_csv(results_dir / "resources.csv")
    profile = pd.read_csv(results_dir / "profile.csv")
    return summary, resources, profile, read_json(results_dir / "kernels.json")


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


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


def context(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict, slug: str) -> dict:
    kernels = meta["kernels"]
    provs = [k["provenance"] for k in kernels if k.get("provenance")]
    gpu_name = provs[0]["gpu"] if provs else slug
    checked = summary[summary.series == "check"]
    case = checked[checked.is_case]
    step = {s["kernel"]: s for s in conclusions.steps(case, kernels)}
    timed_case = {r.kernel: r.tflops for r in case.itertuples() if pd.notna(r.tflops)}
    baseline = meta.get("baseline")
    published = {k["name"]: k.get("published_tflops") for k in kernels}
    rows = []
    for k in kernels:
        r = case[case.kernel == k["name"]]
        r = r.iloc[0] if len(r) else {}
        row = {**k, **{f: _none(r.get(f)) for f in TIMED}, "step": step.get(k["name"])}
        row["of_baseline"] = (row["tflops"] / timed_case[baseline]
                              if row["tflops"] is not None and baseline in timed_case else None)
        rows.append(row)
    sweep = summary[summary.series == "sweep"]
    order = [k["name"] for k in kernels]
    sweep_table = (sweep.pivot_table(index="kernel", columns="S", values="tflops").reindex(
        [n for n in order if n in set(sweep.kernel)]) if not sweep.empty else pd.DataFrame())
    archs = sorted(resources.arch.unique(), key=lambda a: (a != meta["gpu_arch"], a))
    l2 = provs[0]["l2_bytes"] if provs else None
    inputs = next((k["timing"]["input_bytes"] for k in kernels if k.get("timing")), None)
    return {
        "slug": slug,
        "gpu_name": gpu_name,
        "meta": meta,
        "common": {key: sorted({str(p[key]) for p in provs}) for key in
                   ("gpu", "arch", "sm_count", "driver", "cuda_driver", "cuda_runtime", "cupy", "git_commit")},
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
        "checks": [{k: _none(v) for k, v in row.items()} for row in checked.to_dict("records")],
        "extra_shapes": int((~checked.is_case).sum() // max(1, checked.kernel.nunique())),
        "sweep_lengths": [int(s) for s in sweep_table.columns],
        "sweep_rows": [{"name": name, "tflops": [_none(v) for v in values]}
                       for name, values in zip(sweep_table.index, sweep_table.itertuples(index=False))],
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


def fill(template: Path | str, **context) -> str:
    """A jinja2 template filled in; a name the template uses but is not given is an error."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(template).parent)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    return env.get_template(Path(template).name).render(**context)


def render(results_dir: Path | str, report_dir: Path | str, template: Path | str, slug: str) -> Path:
    summary, resources, profile, meta = load(results_dir)
    ctx = context(summary, resources, profile, meta, slug)
    text = fill(template, **ctx)
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    order = ctx["order"]
    tflops_figure(ctx["rows"], ctx["gpu_name"], meta["case"], report_dir / FIGURES["tflops"])
    sweep_figure(summary[summary.series == "sweep"], order, ctx["gpu_name"], meta["case"], report_dir / FIGURES["sweep"])
    stalls_figure(profile, order, report_dir / FIGURES["stalls"])
    write_text(report_dir / "report.md", text)
    return report_dir / "report.md"
