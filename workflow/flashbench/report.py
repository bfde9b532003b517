"""Render reports/<gpu>/report.md and its figure from results/<gpu>/ alone."""
from __future__ import annotations

from pathlib import Path

import jinja2
import pandas as pd

from . import FlashbenchError, claims, conclusions
from .files import read_json, write_text

FIGURE = "tflops.png"


def load(results_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    results_dir = Path(results_dir)
    missing = [f for f in ("summary.csv", "resources.csv", "kernels.json") if not (results_dir / f).is_file()]
    if missing:
        raise FlashbenchError(f"{results_dir} lacks {', '.join(missing)}: run the pipeline on that GPU first")
    summary = pd.read_csv(results_dir / "summary.csv")
    resources = pd.read_csv(results_dir / "resources.csv")
    return summary, resources, read_json(results_dir / "kernels.json")


def tflops_figure(rows: list[dict], gpu_name: str, case: dict, path: Path) -> None:
    """Bars of measured TFLOPS per kernel, the write-up's B300 figures beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    long = []
    for r in rows:
        if r["tflops"] is not None:
            long.append({"kernel": r["name"], "TFLOPS": r["tflops"], "source": f"measured, {gpu_name}"})
        if r["published_tflops"] is not None:
            long.append({"kernel": r["name"], "TFLOPS": r["published_tflops"], "source": "write-up, B300"})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.5 + 1.3 * len(rows)), 4.2))
    if long:
        sns.barplot(data=pd.DataFrame(long), x="kernel", y="TFLOPS", hue="source",
                    order=[r["name"] for r in rows], ax=ax)
        for container in ax.containers:
            ax.bar_label(container, fmt="%.0f", fontsize=8)
        ax.legend(title=None, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    ax.set_title(f"Attention forward, B={case['B']} H={case['H']} S={case['S']} D={case['D']}, fp16", fontsize=10)
    ax.set_xlabel("")
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def _none(x):
    return None if x is None or (isinstance(x, float) and pd.isna(x)) else x


def context(summary: pd.DataFrame, resources: pd.DataFrame, meta: dict, slug: str) -> dict:
    kernels = meta["kernels"]
    provs = [k["provenance"] for k in kernels if k.get("provenance")]
    gpu_name = provs[0]["gpu"] if provs else slug
    case = summary[summary.is_case]
    step = {s["kernel"]: s for s in conclusions.steps(case, kernels)}
    timed = ("tflops", "tflops_median", "tflops_min", "tflops_max", "ms_per_step", "gib_per_s")
    rows = []
    for k in kernels:
        r = case[case.kernel == k["name"]]
        r = r.iloc[0] if len(r) else {}
        rows.append({**k, **{f: _none(r.get(f)) for f in timed}, "step": step.get(k["name"])})
    archs = sorted(resources.arch.unique(), key=lambda a: (a != meta["gpu_arch"], a))
    l2 = provs[0]["l2_bytes"] if provs else None
    inputs = next((k["timing"]["input_bytes"] for k in kernels if k.get("timing")), None)
    return {
        "slug": slug,
        "gpu_name": gpu_name,
        "meta": meta,
        "common": {key: sorted({str(p[key]) for p in provs}) for key in
                   ("gpu", "arch", "sm_count", "driver", "cuda_driver", "cuda_runtime", "cupy", "git_commit")},
        "nvcc": sorted(resources.nvcc.unique()),
        "rows": rows,
        "timing": next((k["timing"] for k in kernels if k.get("timing")), None),
        "l2_bytes": l2,
        "input_bytes": inputs,
        "archs": archs,
        "resources": {(r.kernel, r.arch): r._asdict() for r in resources.itertuples()},
        "checks": [{k: _none(v) for k, v in row.items()} for row in summary.to_dict("records")],
        "extra_shapes": int((~summary.is_case).sum() // max(1, summary.kernel.nunique())),
        "findings": conclusions.findings(summary, resources, meta, gpu_name),
        "claims": claims.claims(summary, resources, meta, gpu_name),
        "conclusions": claims.conclusions(summary, resources, meta, gpu_name),
        "figure": FIGURE,
    }


def render(results_dir: Path | str, report_dir: Path | str, template: Path | str, slug: str) -> Path:
    summary, resources, meta = load(results_dir)
    ctx = context(summary, resources, meta, slug)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(template).parent)),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    text = env.get_template(Path(template).name).render(**ctx)
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    tflops_figure(ctx["rows"], ctx["gpu_name"], meta["case"], report_dir / FIGURE)
    write_text(report_dir / "report.md", text)
    return report_dir / "report.md"
