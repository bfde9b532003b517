"""A GPU's archive read back for its reports: the tables of results/<gpu>/ and kernels.json, each
checked (validation), so that a table cut short, from an older pipeline or edited is refused with one
line before anything is drawn; and the ways the reports read a table, each written once: a figure as
kernel x S, and a cell without a value (NaN) as None."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import archives
from .summary import PROFILE_COLUMNS, RESOURCE_COLUMNS, SUMMARY_COLUMNS
from .validation import (BadRecord, cycles_problem, head_to_head_problem, profile_problem, read_record, read_table,
                         resources_problem, summary_problem)


def read_summary(results_dir: Path | str) -> tuple[pd.DataFrame, dict]:
    """summary.csv and kernels.json, each checked and checked against the other (validation): a table
    cut short, from an older pipeline or edited is refused with one line."""
    results_dir = Path(results_dir)
    summary = read_table(results_dir / "summary.csv", SUMMARY_COLUMNS)
    meta = read_record(results_dir / "kernels.json", "kernels")
    _refuse(results_dir / "summary.csv", summary_problem(summary, meta))
    for k in meta["kernels"]:  # an archive summarized before a file's choices were a list of paragraphs
        if isinstance(k.get("choices"), str):
            k["choices"] = [k["choices"]]
    return summary, meta


def _refuse(path: Path, problem: str | None) -> None:
    """BadRecord, one line naming the table and its problem (validation's), where it has one."""
    if problem:
        raise BadRecord(f"{path}: {problem}; run summarize on that GPU again")


def read_tables(results_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """summary.csv, resources.csv, profile.csv and kernels.json, each checked, and checked against
    kernels.json (validation)."""
    results_dir = Path(results_dir)
    archives.require_tables(results_dir)
    summary, meta = read_summary(results_dir)
    resources = read_table(results_dir / "resources.csv", RESOURCE_COLUMNS)
    _refuse(results_dir / "resources.csv", resources_problem(resources, meta))
    profile = read_table(results_dir / "profile.csv", PROFILE_COLUMNS)
    _refuse(results_dir / "profile.csv", profile_problem(profile, meta, resources))
    return summary, resources, profile, meta


def read_paired(results_dir: Path | str, meta: dict, summary: pd.DataFrame | None = None) -> dict:
    """head_to_head.csv and cycles.csv, where the run that wrote kernels.json made them (a table left
    by an earlier run is not this run's: its report says the run had no such stage), each checked
    against kernels.json and summary.csv (read here where not given: the lengths the sweep found no
    kernel at are those the head-to-head and the counts pass over)."""
    from .cycles import COLUMNS as CYCLES_COLUMNS
    from .headtohead import COLUMNS as HEAD_TO_HEAD_COLUMNS

    results_dir = Path(results_dir)
    if summary is None and (meta.get("head_to_head") or meta.get("cycles")):
        summary = read_table(results_dir / "summary.csv", SUMMARY_COLUMNS)
    tables = {}
    for name, columns, problem in (("head_to_head", HEAD_TO_HEAD_COLUMNS, head_to_head_problem),
                                   ("cycles", CYCLES_COLUMNS, cycles_problem)):
        tables[name] = read_table(results_dir / f"{name}.csv", columns) if meta.get(name) else None
        if tables[name] is not None:
            _refuse(results_dir / f"{name}.csv", problem(tables[name], meta, summary))
    return tables


def nan_as_none(value):
    """A cell as the templates read it: None where the table has no value (NaN), else the value."""
    return None if value is None or pd.isna(value) else value


def by_s(table: pd.DataFrame, column: str, kernels: list[str] | None = None,
         lengths: list[int] | None = None) -> pd.DataFrame:
    """`column` of a table of a row per kernel and S (summary.csv's sweep, cycles.csv) as kernel x S,
    NaN where a kernel has no value at an S. Its rows: those of `kernels` the table has, in that
    order (every kernel with a value where None); its columns: `lengths` (every S with a value where
    None)."""
    frame = table.pivot_table(index="kernel", columns="S", values=column) if not table.empty else pd.DataFrame()
    if kernels is not None:
        frame = frame.reindex([n for n in kernels if n in set(table.kernel)])
    return frame if lengths is None else frame.reindex(columns=lengths)


def sweep_rows(frame: pd.DataFrame) -> list[dict]:
    """A kernel x S frame of TFLOPS (by_s) as the templates' rows: each kernel's name and its figure
    at each S, None where it has none."""
    return [{"name": name, "tflops": [nan_as_none(v) for v in values]}
            for name, values in zip(frame.index, frame.itertuples(index=False))]
