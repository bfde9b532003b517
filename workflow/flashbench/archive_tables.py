"""A GPU's archive read back for its reports: the tables of results/<gpu>/ and kernels.json, each
checked (validation), so that a table cut short, from an older pipeline or edited is refused with one
line before anything is drawn."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import archives
from .summary import PROFILE_COLUMNS, RESOURCE_COLUMNS, SUMMARY_COLUMNS
from .validation import BadRecord, read_record, read_table, summary_problem


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


def read_tables(results_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """summary.csv, resources.csv, profile.csv and kernels.json, each checked."""
    results_dir = Path(results_dir)
    archives.require_tables(results_dir)
    summary, meta = read_summary(results_dir)
    resources = read_table(results_dir / "resources.csv", RESOURCE_COLUMNS)
    profile = read_table(results_dir / "profile.csv", PROFILE_COLUMNS)
    return summary, resources, profile, meta


def read_paired(results_dir: Path | str, meta: dict) -> dict:
    """head_to_head.csv and cycles.csv, where the run that wrote kernels.json made them (a table left
    by an earlier run is not this run's: its report says the run had no such stage)."""
    from .cycles import COLUMNS as CYCLES_COLUMNS
    from .headtohead import COLUMNS as HEAD_TO_HEAD_COLUMNS

    return {name: read_table(Path(results_dir) / f"{name}.csv", columns) if meta.get(name) else None
            for name, columns in (("head_to_head", HEAD_TO_HEAD_COLUMNS), ("cycles", CYCLES_COLUMNS))}

