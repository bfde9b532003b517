"""The reports' figures (matplotlib, drawn headless): bars of TFLOPS per kernel and peer, TFLOPS
against S, the profiler's stall reasons. Our kernels and the PyTorch peers are told apart at a glance
in every figure, and each figure is sized to read at 100% on a laptop's screen."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .files import staged

PUBLISHED = "write-up, B300"
PEER = "peer"  # the kind of a PyTorch peer in kernels.json; every other kind is one of our kernels
# Our kernels: solid lines and filled bars in one categorical palette; the peers: dashed lines and
# hatched bars in another, so that the two are told apart at a glance and every line has its own
# colour (a palette runs out only past 10 of ours or 8 peers, where the markers still differ).
OURS_PALETTE, PEERS_PALETTE = "tab10", "Dark2"
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
PEER_DASHES = ((5, 2), (2, 1.5), (6, 2, 1.5, 2), (1, 1), (8, 2, 1.5, 2, 1.5, 2), (3, 3))
EMPHASIZED_WIDTH, LINE_WIDTH = 3.0, 1.6
FIRST_PANEL_HEIGHT, OTHER_PANEL_HEIGHT = 5.6, 3.0  # inches: the sweep's first configuration's panel, the others'
FONT = {"font.size": 11, "axes.titlesize": 12, "axes.labelsize": 11, "xtick.labelsize": 10, "ytick.labelsize": 10,
        "legend.fontsize": 10, "legend.title_fontsize": 10}


def _save(fig, path: Path) -> None:
    """`fig` as a PNG of 256 colours (a third of the bytes of full colour for these lines and bars): a
    report page embeds its figures, and a browser shows a page of at most 2 MB (Chromium's limit on a
    URL, which Snakemake's report makes of each page)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    fig.tight_layout()
    try:
        with staged(path) as tmp:
            fig.savefig(tmp, dpi=120, format="png")
            with Image.open(tmp) as full:
                palette = full.convert("RGB").quantize(colors=256)
            palette.save(tmp, format="PNG", optimize=True)
    finally:
        plt.close(fig)


def _axes(width: float, height: float):
    """A figure and its one axes."""
    return _stacked(width, [height])


def _stacked(width: float, heights: list[float]):
    """A figure of panels stacked, each as high as `heights` says (one: a single axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(len(heights), 1, figsize=(width, sum(heights)), gridspec_kw={"height_ratios": heights})


def _nothing_to_plot(ax, why: str) -> None:
    ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def line_styles(names: list[str], kinds: dict[str, str], emphasized: dict[str, str] | None = None) -> dict[str, dict]:
    """matplotlib keywords of each implementation's line, in `names` order: ours solid, each its own
    colour and marker; the peers dashed, each its own colour, dash and marker; the `emphasized` ones
    thicker."""
    import seaborn as sns

    emphasized = emphasized or {}
    ours = [n for n in names if kinds[n] != PEER]
    peers = [n for n in names if kinds[n] == PEER]
    styles = {}
    for group, palette in ((ours, OURS_PALETTE), (peers, PEERS_PALETTE)):
        colours = sns.color_palette(palette, max(len(group), 1))
        for i, name in enumerate(group):
            style = {"color": colours[i % len(colours)], "marker": MARKERS[i % len(MARKERS)],
                     "linewidth": EMPHASIZED_WIDTH if name in emphasized else LINE_WIDTH,
                     "markersize": 7 if name in emphasized else 5}
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
        extent = legend.get_window_extent(ax.figure.canvas.get_renderer())  # its height, to put the next under it
        top = ax.transAxes.inverted().transform(extent)[0][1] - 0.03


def _bars(ax, bars: list[dict], order: list[str], kinds: dict[str, str], title: str, y: str = "kernel",
          hue: str = "source", hue_title: str = "TFLOPS from") -> None:
    """Horizontal bars of TFLOPS on `ax`, a group per `y` value in `order` (top to bottom), a bar per `hue`
    value, one colour each: `bars` are {y, TFLOPS, hue, kernel}; our kernels' bars filled, the peers'
    (`kinds` of each bar's kernel) hatched."""
    import seaborn as sns
    from matplotlib.patches import Patch

    if bars:
        hues = list(dict.fromkeys(b[hue] for b in bars))
        colours = dict(zip(hues, sns.color_palette("colorblind" if len(hues) <= 10 else "tab20", len(hues))))
        frame = pd.DataFrame(bars)
        sns.barplot(data=frame, y=y, x="TFLOPS", hue=hue, order=order, hue_order=hues, palette=colours,
                    saturation=1, orient="h", ax=ax, legend=False)
        peer = {(b[y], b[hue]) for b in bars if kinds.get(b["kernel"]) == PEER}
        for value, container in zip(hues, ax.containers):
            for bar in container:  # a hue's bars skip the groups it has no figure for: placed by y
                if (order[round(bar.get_y() + bar.get_height() / 2)], value) in peer:
                    bar.set(hatch="///", facecolor=(*colours[value], 0.35), edgecolor=colours[value])
            ax.bar_label(container, fmt="%.0f", padding=3, fontsize=9)
        ax.margins(x=0.08)
        _legend_outside(ax, {
            hue_title: [Patch(facecolor=colours[v], label=v) for v in hues],
            "implementation": [Patch(facecolor="0.45", label="our kernel"),
                               Patch(facecolor=(0.45, 0.45, 0.45, 0.35), edgecolor="0.45", hatch="///",
                                     label="PyTorch peer")]})
        ax.set_xlabel("TFLOPS")
        ax.set_ylabel("")
        ax.grid(axis="x", alpha=0.3)
    ax.set_title(title)


def _bars_height(groups: int, hues: int) -> float:
    """The inches a panel of `groups` groups of `hues` bars each takes."""
    return 1.3 + 0.19 * groups * max(1, hues) + 0.2 * hues


def bars_figure(bars: list[dict], order: list[str], kinds: dict[str, str], title: str, path: Path) -> None:
    """Horizontal bars of TFLOPS, a group per kernel or peer in `order` (top to bottom), a bar per
    source: `bars` are {kernel, TFLOPS, source}, one colour per source; our kernels' bars filled, the
    peers' hatched."""
    import matplotlib

    with matplotlib.rc_context(FONT):
        fig, ax = _axes(10.0, _bars_height(len(order), len({b["source"] for b in bars})))
        _bars(ax, bars, order, kinds, title)
        _save(fig, path)


def tflops_figure(rows: list[dict], gpu_name: str, case: dict, path: Path,
                  other_configurations: tuple[tuple[str, list[dict]], ...] = (), first: str = "") -> None:
    """Bars of measured TFLOPS per kernel and peer, the write-up's B300 figures beside them; with
    `other_configurations` (each its label, and rows as `rows` of what runs in it), a second panel below:
    a group per configuration (`first`: the label of `rows`' own), a bar per kernel or peer that runs
    in more than the first, each in its own colour throughout."""
    import matplotlib

    bars = [{"kernel": r["name"], "TFLOPS": r["tflops"], "source": f"measured, {gpu_name}"}
            for r in rows if r["tflops"] is not None]
    bars += [{"kernel": r["name"], "TFLOPS": r["published_tflops"], "source": PUBLISHED}
             for r in rows if r["published_tflops"] is not None]
    order = [r["name"] for r in rows]
    kinds = {r["name"]: r["kind"] for _, measured in (("", rows), *other_configurations) for r in measured}
    title = f"Attention forward, B={case['B']} H={case['H']} S={case['S']} D={case['D']}, fp16"
    if not other_configurations:
        bars_figure(bars, order, kinds, title, path)
        return
    beyond = {r["name"] for _, measured in other_configurations for r in measured}
    by_configuration = [{"configuration": label, "kernel": r["name"], "TFLOPS": r["tflops"]}
                        for label, measured in ((first, rows), *other_configurations) for r in measured
                        if r["name"] in beyond and r["tflops"] is not None]
    labels = [first, *(label for label, _ in other_configurations)]
    heights = [_bars_height(len(order), len({b["source"] for b in bars})), _bars_height(len(labels), len(beyond))]
    with matplotlib.rc_context(FONT):
        fig, axes = _stacked(10.0, heights)
        _bars(axes[0], bars, order, kinds, title + (f", {first}" if first else ""))
        _bars(axes[1], by_configuration, labels, kinds, f"On {gpu_name}, in each configuration (its own D, mask, "
              "element type and K/V heads; B, H, S of the case)", y="configuration", hue="kernel",
              hue_title="kernel or peer")
        _save(fig, path)


def sweep_figure(sweep: pd.DataFrame, order: list[str], emphasized: dict[str, str], gpu_name: str, case: dict,
                 path: Path, other_configurations: tuple[tuple[str, pd.DataFrame, dict[str, str]], ...] = ()) -> None:
    """TFLOPS against S, one line per kernel or peer (ours solid, the peers dashed), the `emphasized`
    ones ({name: why}) thicker, their legend entries saying why; each of `other_configurations` (its
    label, its sweep rows and its emphasized) in a panel of its own below, each name in the same style,
    lower than the first's (twenty configurations' panels as high as the first made hopper.md's page
    2.4 MB, above what a browser shows: see _save)."""
    import matplotlib

    panels = [(label, rows.dropna(subset=["tflops"]), marked)
              for label, rows, marked in (("", sweep, emphasized), *other_configurations)]
    with matplotlib.rc_context(FONT):
        fig, axes = _stacked(11.0, [FIRST_PANEL_HEIGHT] + [OTHER_PANEL_HEIGHT] * (len(panels) - 1))
        timed_all = pd.concat([timed for _, timed, _ in panels])
        kinds = dict(zip(timed_all.kernel, timed_all.kind))
        names = [n for n in order if n in kinds] + [n for n in dict.fromkeys(timed_all.kernel) if n not in order]
        styles = line_styles(names, kinds, {n: why for _, _, e in panels for n, why in e.items()})
        title = f"TFLOPS against S on the {gpu_name}, B={case['B']} H={case['H']}"
        for ax, (label, timed, marked) in zip(np.atleast_1d(axes), panels):  # another configuration: its D its own
            _sweep_panel(ax, timed, names, kinds, styles, marked, title + (f", {label}" if label else f" D={case['D']}"))
        _save(fig, path)


def _sweep_panel(ax, timed: pd.DataFrame, names: list[str], kinds: dict, styles: dict, emphasized: dict[str, str],
                 title: str) -> None:
    """One panel of sweep_figure: the lines of `names` that `timed` (its timed rows) has."""
    from matplotlib.lines import Line2D

    if timed.empty:
        _nothing_to_plot(ax, "no sweep in this run")
        return
    names = [n for n in names if n in set(timed.kernel)]
    for name in names:
        points = timed[timed.kernel == name].sort_values("S")
        ax.plot(points.S, points.tflops, label=name, **styles[name])
    lengths = sorted(timed.S.unique())
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(s) if s & (s - 1) == 0 else "" for s in lengths])  # a ragged S (4000): a bare tick
    ax.set_xlim(lengths[0] / 1.15, lengths[-1] * 1.15)
    ax.set_xlabel("sequence length S")
    ax.set_ylabel("TFLOPS")
    ax.grid(alpha=0.3)

    def handle(name):
        why = f" ({emphasized[name]})" if name in emphasized else ""
        return Line2D([], [], label=name + why, **styles[name])

    _legend_outside(ax, {"our kernels (solid)": [handle(n) for n in names if kinds[n] != PEER],
                         "PyTorch peers (dashed)": [handle(n) for n in names if kinds[n] == PEER]})
    ax.set_title(title)


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
