"""Every archived GPU side by side: each kernel's and peer's TFLOPS at the case by the write-up's
method (the case rows of results/<gpu>/summary.csv, series "check"), one column per GPU, then the
write-up's own B300 figures (the kernels' and peers' published_tflops in kernels.json).

Renders the table (reports/README.md, beside each GPU's folder, whose report it links) and the
figure (reports/compare.png: grouped bars per kernel and peer, one hue per GPU and one for the
write-up) from the results folders alone.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import FlashbenchError, archives, templates
from .archive_tables import configurations, read_summary, view
from .figures import PUBLISHED, bars_figure
from .files import write_text
from .gpu import commits
from .summary import case_rows


def not_timed_because(kernel: dict) -> str:
    """Why a kernel or peer has no TFLOPS on a GPU that ran it, in the report's words."""
    if kernel.get("skipped"):
        return "skipped"
    return "not timed" if kernel["check_passed"] else "failed check"


def column(results_dir: Path | str) -> dict:
    """One GPU's column: its name, its case and method, and a cell per kernel and peer it ran
    (TFLOPS at the case, or why there is none)."""
    results_dir = Path(results_dir)
    archives.require_tables(results_dir, ("summary.csv", "kernels.json"))
    summary, meta = read_summary(results_dir)
    summary, meta, _ = view(summary, meta, {}, configurations(meta)[0])  # the case's configuration
    case = case_rows(summary).set_index("kernel").tflops.dropna()
    measured = [k for k in meta["kernels"] if k.get("timing")]
    return {
        "slug": results_dir.name,
        "name": measured[0]["provenance"]["gpu"] if measured else results_dir.name,
        "case": meta["case"],
        "steps": sorted({k["timing"]["steps"] for k in measured}),
        "commits": commits([k["provenance"] for k in measured]),
        "kernels": meta["kernels"],
        "cells": {k["name"]: float(case[k["name"]]) if k["name"] in case else not_timed_because(k)
                  for k in meta["kernels"]},
    }


def label_columns(columns: list[dict]) -> None:
    """Each column's label: its GPU's name, with the folder where two folders hold the same GPU."""
    names = [c["name"] for c in columns]
    for c in columns:
        c["label"] = c["name"] if names.count(c["name"]) == 1 else f"{c['name']} ({c['slug']})"


def rows(columns: list[dict]) -> list[dict]:
    """A row per kernel and peer any GPU ran, in table order: its cell on each GPU (None where that
    GPU did not run it) and the write-up's figure."""
    kernels = {}
    for c in columns:
        for k in c["kernels"]:
            kernels.setdefault(k["name"], k)
    return [{"name": name, "kind": k["kind"], "parent": k.get("parent"), "published": k.get("published_tflops"),
             "cells": [c["cells"].get(name) for c in columns]} for name, k in kernels.items()]


def render(results_dirs: list[Path | str], template: Path | str, table: Path | str, figure: Path | str) -> Path:
    """Write the table from `template` and the figure; return the table's path."""
    table, figure = Path(table), Path(figure)
    templates.check(template)
    if twice := archives.given_twice(results_dirs):
        raise FlashbenchError(f"{', '.join(twice)} given twice: each GPU's results once, one column each")
    columns = [column(d) for d in results_dirs]
    label_columns(columns)
    table_rows = rows(columns)
    bars = [{"kernel": r["name"], "TFLOPS": cell, "source": c["label"]}
            for r in table_rows for c, cell in zip(columns, r["cells"]) if isinstance(cell, float)]
    bars += [{"kernel": r["name"], "TFLOPS": r["published"], "source": PUBLISHED}
             for r in table_rows if r["published"] is not None]
    text = templates.fill(template, columns=columns, rows=table_rows, published=PUBLISHED,
                          figure=os.path.relpath(figure, table.parent))
    bars_figure(bars, [r["name"] for r in table_rows], {r["name"]: r["kind"] for r in table_rows},
                "Attention forward at the case, fp16: every archived GPU and the write-up's B300", figure)
    write_text(table, text)
    return table
