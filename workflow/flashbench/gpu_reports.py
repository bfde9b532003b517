"""The render stage: one GPU's two reports, the chapter's (report.md) and the Hopper line's after it
(hopper.md), with their figures, from results/<gpu>/ alone but for the goal the line is held to
(config's). All of them are written beside the folder first and land together: a render that fails
leaves the reports as they were."""
from __future__ import annotations

import os
from pathlib import Path

from . import FlashbenchError, chapter_report, hopper_report, templates
from .archive_tables import configurations, read_paired, read_tables, view
from .config import Goal
from .files import staged_folder
from .gpu import slugify

WRITTEN = (*chapter_report.WRITTEN, *hopper_report.WRITTEN)  # what render writes


def render(results_dir: Path | str, report_dir: Path | str, template: Path | str, slug: str, goal: Goal) -> Path:
    """report.md from `template`, hopper.md from the Hopper line's template beside it (the line judged
    against `goal`), and their figures, into `report_dir`; returns report.md's path."""
    hopper_template = Path(template).with_name(hopper_report.TEMPLATE)
    for path in (template, hopper_template):
        templates.check(path)
    if slugify(slug) != slug:
        raise FlashbenchError(f"slug {slug!r}: not a GPU's folder name (such as nvidia-h200)")
    summary, resources, profile, meta = read_tables(results_dir)
    folder = Path(os.path.abspath(results_dir)).name  # the folder as named (a link to storage named otherwise too)
    if folder != slug:  # the reports would name another GPU's archive as their source
        raise FlashbenchError(f"slug {slug!r}: the results given ({results_dir}) are {folder}'s; a GPU's reports are "
                              "named after its results' folder")
    paired = read_paired(results_dir, meta, summary)
    # the archive in each configuration: the chapter's report is the first's, the Hopper line's all of them
    views = [view(summary, meta, {"resources": resources, "profile": profile, **paired}, configuration)
             for configuration in configurations(meta)]
    report_dir = Path(report_dir)
    with staged_folder(report_dir, list(WRITTEN)) as staging:
        first_summary, first_meta, first = views[0]
        gpu_name = chapter_report.render(first_summary, first["resources"], first["profile"], first_meta, template,
                                         staging, slug)
        hopper_report.render(views, goal, hopper_template, staging, slug, gpu_name)
    return report_dir / "report.md"
