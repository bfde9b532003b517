"""Do two runs agree? Their head-to-head and cycle counts side by side.

A verdict that a rerun can flip is not a verdict. Two runs on one GPU agree when every verdict of
the head-to-head is the same in both, every paired ratio moved by at most `ratio_within` (1.5% by
default) and every cycle count by at most `cycles_within` (1%):

    python -m flashbench agreement results/nvidia-h200 /tmp/first/results/nvidia-h200

A back-to-back ratio that is not fair in a run (it timed a side's Python dispatch, not its kernel)
has "not fair" for its verdict, as the report shows it, and is not held to `ratio_within`: it moves
with the CPU, which is not what is compared. A ratio fair in one run and not in the other is a
verdict that differs. Each verdict that differs is named with both runs' ratios and intervals;
opposite verdicts (ahead in one run, behind in the other) are counted apart from the rest: a
verdict that moved to the next one (ahead or behind to level), where an interval's end sits at the
band's edge, and a ratio fair in one run only.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .validation import read_table

SHAPE = ["B", "H", "S", "D"]
PAIRED_KEYS = [*SHAPE, "version", "rival", "method"]
CYCLE_KEYS = ["kernel", *SHAPE]
OPPOSITE = {"ahead", "behind"}


def _side_by_side(first: pd.DataFrame, second: pd.DataFrame, keys: list[str], value: str,
                  extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """Rows of both tables matched on `keys`, `value`, `extra` and `shown` of each, and how far `value`
    moved."""
    columns = [*keys, value, *extra, "shown"]
    both = first[columns].merge(second[columns], on=keys, how="outer", suffixes=("_first", "_second"),
                                indicator="found")
    both["moved"] = (both[f"{value}_second"] / both[f"{value}_first"] - 1).abs()
    return both


def _read(folder: Path, name: str, keys: list[str], values: list[str]) -> pd.DataFrame:
    return read_table(Path(folder) / f"{name}.csv", [*keys, *values])


def compare(first_dir: Path, second_dir: Path, ratio_within: float, cycles_within: float) -> dict:
    """The two runs' head-to-head and cycles side by side, and each way in which they disagree."""
    paired, counted = [], []
    for folder in (first_dir, second_dir):
        table = _read(folder, "head_to_head", PAIRED_KEYS, ["ratio", "ci_low", "ci_high", "verdict", "fair"])
        paired.append(table.assign(shown=table.verdict.where(table.fair.astype(bool), "not fair")))
        counted.append(_read(folder, "cycles", CYCLE_KEYS, ["cycles"]).assign(shown=""))
    paired = _side_by_side(*paired, PAIRED_KEYS, "ratio", ("ci_low", "ci_high"))
    counted = _side_by_side(*counted, CYCLE_KEYS, "cycles")
    problems = []
    for what, table, keys in (("paired ratio", paired, PAIRED_KEYS), ("cycle count", counted, CYCLE_KEYS)):
        for row in table[table.found != "both"].itertuples():
            run = "first" if row.found == "left_only" else "second"
            problems.append(f"{what} of {_name(row, keys)}: only in the {run} run")
    paired = paired[paired.found == "both"].copy()
    counted = counted[counted.found == "both"].copy()
    for what, table in (("paired ratios", paired), ("cycle counts", counted)):
        if table.empty:
            problems.append(f"no {what} in both runs: nothing to compare")
    paired["judged"] = paired.shown_first.ne("not fair") & paired.shown_second.ne("not fair")
    paired["opposite"] = [{a, b} == OPPOSITE for a, b in zip(paired.shown_first, paired.shown_second)]
    for row in paired.itertuples():
        name = _name(row, PAIRED_KEYS)
        if row.shown_first != row.shown_second:
            problems.append(f"{name}: {row.shown_first} {_estimate(row, 'first')} in the first run, "
                            f"{row.shown_second} {_estimate(row, 'second')} in the second"
                            + (" (opposite verdicts)" if row.opposite else ""))
        if row.judged and pd.isna(row.moved):
            problems.append(f"{name}: no ratio in {_which(row.ratio_first, row.ratio_second)}")
        elif row.judged and row.moved > ratio_within:
            problems.append(f"{name}: ratio {row.ratio_first:.3f} -> {row.ratio_second:.3f}, "
                            f"moved {row.moved:.1%} (more than {ratio_within:.1%})")
    for row in counted.itertuples():
        name = f"cycles of {_name(row, CYCLE_KEYS)}"
        if pd.isna(row.moved):
            problems.append(f"{name}: not counted in {_which(row.cycles_first, row.cycles_second)}")
        elif row.moved > cycles_within:
            problems.append(f"{name}: {row.cycles_first:.0f} -> {row.cycles_second:.0f}, "
                            f"moved {row.moved:.1%} (more than {cycles_within:.1%})")
    return {"paired": paired, "cycles": counted, "problems": problems,
            "ratio_within": ratio_within, "cycles_within": cycles_within}


def _estimate(row, run: str) -> str:
    """A run's ratio and interval, as `1.037 [1.015, 1.044]`."""
    ratio, low, high = (getattr(row, f"{c}_{run}") for c in ("ratio", "ci_low", "ci_high"))
    return f"{ratio:.3f} [{low:.3f}, {high:.3f}]"


def _which(first, second) -> str:
    return "either run" if pd.isna(first) and pd.isna(second) else "the first run" if pd.isna(first) else "the second run"


def _name(row, keys: list[str]) -> str:
    values = {k: getattr(row, k) for k in keys}
    if "version" in values:
        return f"{values['version']} vs {values['rival']} at S={values['S']} by {values['method']}"
    return f"{values['kernel']} at S={values['S']}"


def summary(result: dict) -> list[str]:
    """What the comparison found, a line each: the largest moves, the verdicts, then every disagreement."""
    paired, counted = result["paired"], result["cycles"]
    judged = paired[paired.judged].dropna(subset=["moved"])
    lines = []
    if len(judged):
        worst = judged.loc[judged.moved.idxmax()]
        lines.append(f"{len(judged)} paired ratios held to {result['ratio_within']:.1%}: the largest move "
                     f"{worst.moved:.2%} ({_name(worst, PAIRED_KEYS)}); median move {judged.moved.median():.2%}")
    unfair = paired[~paired.judged]
    if len(unfair):
        lines.append(f"{len(unfair)} back-to-back ratios not fair in a run (Python's dispatch), not held to it: "
                     f"largest move {unfair.moved.max():.1%}")
    same = (paired.shown_first == paired.shown_second).sum()
    lines.append(f"verdicts: {same} of {len(paired)} the same, {paired.opposite.sum()} opposite (ahead in one run, behind in "
                 "the other)")
    counts = counted.dropna(subset=["moved"])
    if len(counts):
        worst = counts.loc[counts.moved.idxmax()]
        lines.append(f"{len(counts)} cycle counts held to {result['cycles_within']:.1%}: the largest move "
                     f"{worst.moved:.2%} ({_name(worst, CYCLE_KEYS)}); median move {counts.moved.median():.2%}")
    return lines + [f"disagrees: {p}" for p in result["problems"]]
