"""Do two runs agree? Their head-to-head and cycle counts side by side.

A verdict that a rerun can flip is not a verdict. Two runs on one GPU agree when every verdict of
the head-to-head is the same in both, every paired ratio moved by at most `ratio_within` (1.5% by
default) and every cycle count by at most `cycles_within` (1%):

    python -m flashbench agreement results/nvidia-h200 /tmp/first/results/nvidia-h200

A back-to-back ratio that is not fair in either run (it timed a side's Python dispatch, not its
kernel) is listed but not held to `ratio_within`: it moves with the CPU, which is not what is
compared.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from . import cycles, headtohead
from .validation import read_table

PAIRED_KEYS = ["S", "version", "rival", "method"]
CYCLE_KEYS = ["kernel", "S"]


def _side_by_side(first: pd.DataFrame, second: pd.DataFrame, keys: list[str], value: str,
                  also: list[str] = ()) -> pd.DataFrame:
    """Rows of both tables matched on `keys`, `value` (and `also`) of each, and how far `value` moved."""
    columns = [*keys, value, *also]
    both = first[columns].merge(second[columns], on=keys, how="outer", suffixes=("_first", "_second"),
                                indicator="found")
    both["moved"] = (both[f"{value}_second"] / both[f"{value}_first"] - 1).abs()
    return both


def compare(first_dir: Path, second_dir: Path, ratio_within: float, cycles_within: float) -> dict:
    """The two runs' head-to-head and cycles side by side, and each way in which they disagree."""
    tables = {}
    for name, columns in (("head_to_head", headtohead.COLUMNS), ("cycles", cycles.COLUMNS)):
        tables[name] = [read_table(Path(d) / f"{name}.csv", columns) for d in (first_dir, second_dir)]
    paired = _side_by_side(*tables["head_to_head"], PAIRED_KEYS, "ratio", ["verdict", "fair"])
    counted = _side_by_side(*tables["cycles"], CYCLE_KEYS, "cycles")
    problems = []
    for what, table, keys in (("paired ratio", paired, PAIRED_KEYS), ("cycle count", counted, CYCLE_KEYS)):
        for row in table[table.found != "both"].itertuples():
            run = "first" if row.found == "left_only" else "second"
            problems.append(f"{what} of {_name(row, keys)}: only in the {run} run")
    paired = paired[paired.found == "both"].copy()
    counted = counted[counted.found == "both"].copy()
    paired["judged"] = paired.fair_first.astype(bool) | paired.fair_second.astype(bool)
    for row in paired.itertuples():
        name = _name(row, PAIRED_KEYS)
        if row.verdict_first != row.verdict_second:
            problems.append(f"{name}: {row.verdict_first} in the first run, {row.verdict_second} in the second")
        if row.judged and row.moved > ratio_within:
            problems.append(f"{name}: ratio {row.ratio_first:.3f} -> {row.ratio_second:.3f}, "
                            f"moved {row.moved:.1%} (more than {ratio_within:.1%})")
    for row in counted.itertuples():
        if row.moved > cycles_within:
            problems.append(f"cycles of {_name(row, CYCLE_KEYS)}: {row.cycles_first:.0f} -> {row.cycles_second:.0f}, "
                            f"moved {row.moved:.1%} (more than {cycles_within:.1%})")
    return {"paired": paired, "cycles": counted, "problems": problems,
            "ratio_within": ratio_within, "cycles_within": cycles_within}


def _name(row, keys: list[str]) -> str:
    values = {k: getattr(row, k) for k in keys}
    if "version" in values:
        return f"{values['version']} vs {values['rival']} at S={values['S']} by {values['method']}"
    return f"{values['kernel']} at S={values['S']}"


def summary(result: dict) -> list[str]:
    """What the comparison found, a line each: the largest moves, the verdicts, then every disagreement."""
    paired, counted = result["paired"], result["cycles"]
    judged = paired[paired.judged]
    lines = []
    if len(judged):
        worst = judged.loc[judged.moved.idxmax()]
        lines.append(f"{len(judged)} paired ratios held to {result['ratio_within']:.1%}: the largest move "
                     f"{worst.moved:.2%} ({_name(worst, PAIRED_KEYS)}); median move {judged.moved.median():.2%}")
    if len(paired) > len(judged):
        lines.append(f"{len(paired) - len(judged)} back-to-back ratios not fair in either run (Python's dispatch), "
                     f"not held to it: largest move {paired[~paired.judged].moved.max():.1%}")
    same = (paired.verdict_first == paired.verdict_second).sum()
    lines.append(f"verdicts: {same} of {len(paired)} the same")
    if len(counted):
        worst = counted.loc[counted.moved.idxmax()]
        lines.append(f"{len(counted)} cycle counts held to {result['cycles_within']:.1%}: the largest move "
                     f"{worst.moved:.2%} ({_name(worst, CYCLE_KEYS)}); median move {counted.moved.median():.2%}")
    return lines + [f"disagrees: {p}" for p in result["problems"]]
