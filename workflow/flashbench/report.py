"""Render reports/<gpu>/report.md and its figures from results/<gpu>/ alone."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2
import pandas as pd

from . import archives, attention, claims, conclusions, hopper, markdown
from .config import sweep_steps
from .files import staged, staged_folder, write_text
from .gpu import commits
from .profile import TOP_LINES
from .check import METRICS
from .summary import PROFILE_COLUMNS, RESOURCE_COLUMNS, SUMMARY_COLUMNS, TIMED, case_rows
from .validation import BadRecord, read_record, read_table, summary_problem

FIGURES = {"tflops": "tflops.png", "sweep": "sweep.png", "stalls": "stalls.png"}
HOPPER_FIGURES = {"tflops": "hopper_tflops.png", "sweep": "hopper_sweep.png"}
LIBRARY_NAMES = {"torch": "torch", "cudnn": "cuDNN", "flash_attn": "flash-attn-4", "cutlass_dsl": "CUTLASS DSL"}
HOPPER_TEMPLATE = "hopper.md.j2"  # beside the chapter's template
WRITTEN = ("report.md", *FIGURES.values(), "hopper.md", *HOPPER_FIGURES.values())  # what render writes


def read_summary(results_dir: Path | str) -> tuple[pd.DataFrame, dict]:
    """summary.csv and kernels.json, each checked and checked against the other (validation): a table
    cut short, from an older pipeline or edited is refused with one line."""
    results_dir = Path(results_dir)
    summary = read_table(results_dir / "summary.csv", SUMMARY_COLUMNS)
    meta = read_record(results_dir / "kernels.json", "kernels")
    if problem := summary_problem(summary, meta):
        raise BadRecord(f"{results_dir / 'summary.csv'}: {problem}; run summarize on that GPU again")
    for k in meta["kernels"]:  # an archive summarized before a file's choices were a list of paragraphs
        if isinstance(k.get("choices"), str):
            k["choices"] = [k["choices"]]
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
PEER = "peer"  # the kind of a PyTorch peer in kernels.json; every other kind is one of our kernels
# Our kernels: solid lines and filled bars in one categorical palette; the peers: dashed lines and
# hatched bars in another, so that the two are told apart at a glance and every line has its own
# colour (a palette runs out only past 10 of ours or 8 peers, where the markers still differ).
OURS_PALETTE, PEERS_PALETTE = "tab10", "Dark2"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
PEER_DASHES = ((5, 2), (2, 1.5), (6, 2, 1.5, 2), (1, 1), (8, 2, 1.5, 2, 1.5, 2), (3, 3))
HEADLINE_WIDTH, LINE_WIDTH = 3.0, 1.6
FONT = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "xtick.labelsize": 10, "ytick.labelsize": 10,
        "legend.fontsize": 10, "legend.title_fontsize": 10}


def line_styles(names: list[str], kinds: dict[str, str], headline: dict[str, str] | None = None) -> dict[str, dict]:
    """matplotlib keywords of each implementation's line, in `names` order: ours solid, each its own
    colour and marker; the peers dashed, each its own colour, dash and marker; the `headline` ones
    thicker."""
    import seaborn as sns

    headline = headline or {}
    ours = [n for n in names if kinds[n] != PEER]
    peers = [n for n in names if kinds[n] == PEER]
    styles = {}
    for group, palette in ((ours, OURS_PALETTE), (peers, PEERS_PALETTE)):
        colours = sns.color_palette(palette, max(len(group), 1))
        for i, name in enumerate(group):
            style = {"color": colours[i % len(colours)], "marker": MARKERS[i % len(MARKERS)],
                     "linewidth": HEADLINE_WIDTH if name in headline else LINE_WIDTH,
                     "markersize": 7 if name in headline else 5}
            if group is peers:
                style |= {"dashes": PEER_DASHES[i % len(PEER_DASHES)], "markerfacecolor": "white"}
            styles[name] = style
    return {n: styles[n] for n in names}


def _legend_outside(ax, handles_by_title: dict[str, list]) -> None:
    """One legend per group (our kernels, the peers), stacked right of the axes, titled in words."""
    top = 1.0
    for title, handles in handles_by_title.items():
        if not handles:
            continue
        legend = ax.legend(handles=handles, title=title, loc="upper left", bbox_to_anchor=(1.01, top),
                           frameon=False, alignment="left")
        ax.add_artist(legend)
        legend.set_clip_on(False)  # counted in the layout, which leaves it room
        ax.figure.canvas.draw()  # the legend's height, to put the next one under it
        top = ax.transAxes.inverted().transform(legend.get_window_extent())[0][1] - 0.03


def bars_figure(bars: list[dict], order: list[str], kinds: dict[str, str], title: str, path: Path) -> None:
    """Horizontal bars of TFLOPS, a group per kernel or peer in `order` (top to bottom), a bar per
    source: `bars` are {kernel, TFLOPS, source}, one colour per source; our kernels' bars filled, the
    peers' hatched."""
    import matplotlib
    import seaborn as sns
    from matplotlib.patches import Patch

    sources = list(dict.fromkeys(b["source"] for b in bars))
    with matplotlib.rc_context(FONT):
        fig, ax = _axes(10.0, 1.3 + 0.19 * len(order) * max(1, len(sources)) + 0.2 * len(sources))
        if bars:
            colours = dict(zip(sources, sns.color_palette("colorblind", len(sources))))
            sns.barplot(data=pd.DataFrame(bars), y="kernel", x="TFLOPS", hue="source", order=order,
                        hue_order=sources, palette=colours, saturation=1, orient="h", ax=ax, legend=False)
            for source, container in zip(sources, ax.containers):
                for bar in container:  # a source's bars skip the kernels it has no figure for: placed by y
                    if kinds.get(order[round(bar.get_y() + bar.get_height() / 2)]) == PEER:
                        bar.set(hatch="///", facecolor=(*colours[source], 0.35), edgecolor=colours[source])
                ax.bar_label(container, fmt="%.0f", padding=3, fontsize=9)
            ax.margins(x=0.08)
            _legend_outside(ax, {
                "TFLOPS from": [Patch(facecolor=colours[s], label=s) for s in sources],
                "implementation": [Patch(facecolor="0.45", label="our kernel"),
                                   Patch(facecolor=(0.45, 0.45, 0.45, 0.35), edgecolor="0.45", hatch="///",
                                         label="PyTorch peer")]})
            ax.set_xlabel("TFLOPS")
            ax.set_ylabel("")
            ax.grid(axis="x", alpha=0.3)
        ax.set_title(title)
        _save(fig, path)


def tflops_figure(rows: list[dict], gpu_name: str, case: dict, path: Path) -> None:
    """Bars of measured TFLOPS per kernel and peer, the write-up's B300 figures beside them."""
    bars = []
    for r in rows:
        if r["tflops"] is not None:
            bars.append({"kernel": r["name"], "TFLOPS": r["tflops"], "source": f"measured, {gpu_name}"})
        if r["published_tflops"] is not None:
            bars.append({"kernel": r["name"], "TFLOPS": r["published_tflops"], "source": PUBLISHED})
    bars_figure(bars, [r["name"] for r in rows], {r["name"]: r["kind"] for r in rows},
                f"Attention forward, B={case['B']} H={case['H']} S={case['S']} D={case['D']}, fp16", path)


def sweep_figure(sweep: pd.DataFrame, order: list[str], headline: dict[str, str], gpu_name: str, case: dict,
                 path: Path) -> None:
    """TFLOPS against S, one line per kernel or peer (ours solid, the peers dashed), the `headline`
    ones ({name: why}) thicker, their legend entries saying why."""
    import matplotlib
    from matplotlib.lines import Line2D

    with matplotlib.rc_context(FONT):
        fig, ax = _axes(11.0, 5.6)
        timed = sweep.dropna(subset=["tflops"])
        if timed.empty:
            _nothing_to_plot(ax, "no sweep in this run")
        else:
            kinds = dict(zip(timed.kernel, timed.kind))
            names = [n for n in order if n in kinds]
            styles = line_styles(names, kinds, headline)
            for name in names:
                points = timed[timed.kernel == name].sort_values("S")
                ax.plot(points.S, points.tflops, label=name, **styles[name])
            lengths = sorted(timed.S.unique())
            ax.set_xscale("log", base=2)
            ax.set_xticks(lengths, [str(s) for s in lengths])
            ax.set_xlim(lengths[0] / 1.15, lengths[-1] * 1.15)
            ax.set_xlabel("sequence length S")
            ax.set_ylabel("TFLOPS")
            ax.grid(alpha=0.3)

            def handle(name):
                return Line2D([], [], label=name + (f" ({headline[name]})" if name in headline else ""), **styles[name])

            _legend_outside(ax, {"our kernels (solid)": [handle(n) for n in names if kinds[n] != PEER],
                                 "PyTorch peers (dashed)": [handle(n) for n in names if kinds[n] == PEER]})
            ax.set_title(f"TFLOPS against S on the {gpu_name}, B={case['B']} H={case['H']} D={case['D']}")
        _save(fig, path)


def stalls_figure(profile: pd.DataFrame, order: list[str], path: Path, shown: int = 7) -> None:
    """Stacked horizontal bars: cycles each kernel's warps spend per issued instruction in each stall
    reason, the `shown` largest reasons and the rest summed."""
    import matplotlib

    with matplotlib.rc_context(FONT):
        profiled = [n for n in order if n in set(profile.kernel)]
        fig, ax = _axes(10.0, 1.6 + 0.45 * max(len(profiled), 3))
        columns = [c for c in profile.columns if c.startswith("stall_") and c != "stall_selected"]
        if profile.empty:
            _nothing_to_plot(ax, "not profiled in this run")
        else:
            data = profile.set_index("kernel").reindex(profiled)[columns]
            data.columns = [c.removeprefix("stall_").replace("_", " ") for c in columns]
            top = data.sum().sort_values(ascending=False).index[:shown]
            data = data[list(top)].assign(other=data.drop(columns=list(top)).sum(axis=1))
            data.iloc[::-1].plot(kind="barh", stacked=True, ax=ax, colormap="tab10", width=0.7)
            ax.set_xlabel("stall cycles per issued instruction")
            ax.set_ylabel("")
            ax.grid(axis="x", alpha=0.3)
            ax.legend(title="stall reason", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                      alignment="left")
            ax.set_title("Warp stall reasons at the case (Nsight Compute)")
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
        "torch": sorted({", ".join(f"{LIBRARY_NAMES[key]} {k['identity'][key]}" for key in LIBRARY_NAMES
                                   if key in k["identity"])
                         for k in kernels if k.get("identity", {}).get("torch")}),
        "skipped_peers": [k for k in kernels if k["kind"] == "peer" and k.get("skipped")],
        "nvcc": sorted(resources.nvcc.unique()),
        "rows": rows,
        "baseline": baseline if baseline in timed_case else None,
        "baseline_published": published.get(baseline),
        "longest_checked": int(checked.S.max()) if len(checked) else None,
        "sweep_steps": ({S: sweep_steps(meta["sweep"]["steps"], meta["case"]["S"], S) for S in meta["sweep"]["S"]}
                        if meta.get("sweep") else {}),
        "timing": next((k["timing"] for k in kernels if k.get("timing")), None),
        "l2_bytes": l2,
        "input_bytes": inputs,
        "archs": archs,
        "resources": {(r.kernel, r.arch): r._asdict() for r in resources.itertuples()},
        "correctness": correctness(checked, order=[k["name"] for k in kernels]),
        "failures": [{k: _none(v) for k, v in row.items()} for row in checked[checked.passed != True].to_dict("records")],  # noqa: E712
        **checked_shapes(checked),
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
    paired = read_paired(results_dir, meta)
    last_version = [k["name"] for k in meta["kernels"] if k["kind"] == "version"][-1:]
    headline = {**{n: "the chapter's last" for n in last_version},
                **({ctx["baseline"]: "the baseline"} if ctx["baseline"] else {})}
    with staged_folder(report_dir, list(WRITTEN)) as staging:
        tflops_figure(ctx["rows"], ctx["gpu_name"], meta["case"], staging / FIGURES["tflops"])
        sweep_figure(summary[summary.series == "sweep"], order, headline, ctx["gpu_name"], meta["case"],
                     staging / FIGURES["sweep"])
        stalls_figure(profile, order, staging / FIGURES["stalls"])
        write_text(staging / "report.md", text)
        render_hopper(*everything, Path(template).with_name(HOPPER_TEMPLATE), staging, slug, ctx["gpu_name"], paired)
    return report_dir / "report.md"


def read_paired(results_dir: Path | str, meta: dict) -> dict:
    """head_to_head.csv and cycles.csv, where the run that wrote kernels.json made them (a table left
    by an earlier run is not this run's: its report says the run had no such stage)."""
    from .cycles import COLUMNS as CYCLES_COLUMNS
    from .headtohead import COLUMNS as HEAD_TO_HEAD_COLUMNS

    return {name: read_table(Path(results_dir) / f"{name}.csv", columns) if meta.get(name) else None
            for name, columns in (("head_to_head", HEAD_TO_HEAD_COLUMNS), ("cycles", CYCLES_COLUMNS))}


def render_hopper(summary, resources, profile, meta, template: Path, report_dir: Path, slug: str, gpu_name: str,
                  paired: dict) -> None:
    ctx = hopper.context(summary, resources, profile, meta, **paired)
    names = set(ctx["order"])
    checked = summary[(summary.series == "check") & summary.kernel.isin([k["name"] for k in ctx["line"]])]
    kinds = {k["name"]: k["kind"] for k in meta["kernels"]}
    rows = [{"name": n, "kind": kinds[n], "tflops": hopper.tflops_of(case_rows(summary), n), "published_tflops": None}
            for n in ctx["order"]]
    tflops_figure(rows, gpu_name, meta["case"], report_dir / HOPPER_FIGURES["tflops"])
    sweep = summary[(summary.series == "sweep") & summary.kernel.isin(names)]
    timed = [s["name"] for s in ctx["steps"] if s["tflops"]]
    best = (meta.get("headline") or timed[-1:] or [None])[0]  # a config without `headline`: the last timed
    headline = {**({best: "the line's best"} if best else {}), **{n: "the goal's rival" for n in ctx["rivals"].values()}}
    sweep_figure(sweep, ctx["order"], headline, gpu_name, meta["case"], report_dir / HOPPER_FIGURES["sweep"])
    measured = commits([k["provenance"] for k in meta["kernels"] if k.get("provenance")])
    text = fill(template, **ctx, meta=meta, slug=slug, gpu_name=gpu_name, figures=HOPPER_FIGURES, commits=measured,
        correctness=correctness(checked, [k["name"] for k in ctx["line"]]))
    write_text(report_dir / "hopper.md", text)
