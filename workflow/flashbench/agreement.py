"""Do two runs agree? Their head-to-head and cycle counts side by side.

A verdict that a rerun can flip is not a verdict. Two fresh runs agree when, row by row of
head_to_head.csv (version, rival, method, shape):

- no verdict is opposite: ahead in one run, behind in the other;
- a verdict differs only where it may: where one run's interval ends within 1% (EDGE_WITHIN) of the
  band's edge that the verdict turned on (ahead iff ci_low > 1 + level_within, behind iff
  ci_high < 1 - level_within, level otherwise: headtohead.verdict), or where a back-to-back ratio is
  fair in one run only (it timed a side's Python dispatch in the other, which moves with the CPU);
- every ratio fair in both runs moved by at most the ratio tolerance;

and every cycle count of cycles.csv moved by at most the cycle tolerance. On one GPU (the same UUID
in both runs' provenance) these are 1.5% and 1%; across two GPUs of one kind, 2.5% each, as a GPU's
own power and clock behaviour differ from another's. A run that names no UUID (recorded before it was)
is taken as on another GPU of the same kind, and the output says so; two kinds are not compared.

    python -m flashbench agreement results/nvidia-h200 /tmp/first/results/nvidia-h200

A row in one run only, and a ratio or count missing in one, are disagreements too; but where a version
was timed in both runs and by a method in one alone (config's `back_to_back`, set otherwise between
them), those rows are not compared, and the output says which.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from . import FlashbenchError, archives
from .validation import read_record, read_table

SHAPE = ["B", "H", "S", "D"]
PAIRED_KEYS = [*SHAPE, "version", "rival", "method"]
CYCLE_KEYS = ["kernel", *SHAPE]
OPPOSITE = {"ahead", "behind"}
EDGE_WITHIN = 0.01  # an interval end this near the band's edge (relative) can fall on either side in a rerun


@dataclass(frozen=True)
class Tolerances:
    """How far a fair paired ratio and a cycle count may move between the runs."""

    ratio: float
    cycles: float


ONE_GPU = Tolerances(ratio=0.015, cycles=0.01)
ONE_KIND = Tolerances(ratio=0.025, cycles=0.025)

# How a row's verdict moved between the runs
SAME, NEITHER_FAIR, FAIR_IN_ONE, NEAR_EDGE, FAR_FROM_EDGE, OPPOSITE_VERDICTS = (
    "same", "not fair in either run", "fair in one run only", "near the band's edge", "far from the band's edge",
    "opposite")


def _checked(tolerance: float | None, what: str) -> float | None:
    """A tolerance asked for: a positive finite fraction (nan would hold nothing, a negative one all)."""
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance > 0):
        raise FlashbenchError(f"{what} must be a positive finite fraction (0.015 for 1.5%), not {tolerance}")
    return tolerance


@dataclass(frozen=True)
class Run:
    """What kernels.json says of a run: its GPU's name and UUID (None where its records predate it) and
    the head-to-head's band."""

    folder: Path
    gpu: str
    uuid: str | None
    band: float


def _run(folder: Path | str) -> Run:
    folder = Path(folder)
    meta = read_record(folder / "kernels.json", "kernels")
    provenances = [k["provenance"] for k in meta["kernels"] if k["provenance"]]
    names = {p["gpu"] for p in provenances}
    uuids = {p["gpu_uuid"] for p in provenances if "gpu_uuid" in p}  # at most one: summarize holds them to it
    if len(names) != 1 or len(uuids) > 1:
        raise FlashbenchError(f"{folder / 'kernels.json'}: its records name {len(names)} GPUs and {len(uuids)} UUIDs, "
                              "not one: summarize it again")
    if not meta.get("head_to_head"):
        raise FlashbenchError(f"{folder / 'kernels.json'}: the run has no head-to-head to compare")
    return Run(folder, names.pop(), next(iter(uuids), None), meta["head_to_head"]["level_within"])


def _gpus(first: Run, second: Run) -> tuple[Tolerances, str]:
    """The tolerances two runs are held to, by the GPUs they ran on, and a line saying which those are."""
    if first.gpu != second.gpu:
        raise FlashbenchError(f"the first run is on {first.gpu}, the second on {second.gpu}: only runs on GPUs of one "
                              "kind are compared")
    if first.band != second.band:
        raise FlashbenchError(f"the runs' verdicts are judged with different bands (level_within {first.band} and "
                              f"{second.band}): they cannot agree")
    if first.uuid and first.uuid == second.uuid:
        return ONE_GPU, f"both runs on one {first.gpu}, {first.uuid}"
    if first.uuid and second.uuid:
        return ONE_KIND, f"two {first.gpu}s, {first.uuid} and {second.uuid}"
    unnamed = [which for which, run in (("the first run", first), ("the second run", second)) if not run.uuid]
    who = "neither run names a" if len(unnamed) == 2 else f"{unnamed[0]} names no"
    return ONE_KIND, f"{who} GPU UUID (records made before UUIDs were recorded): taken as two {first.gpu}s"


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
    return read_table(folder / f"{name}.csv", [*keys, *values])


def _verdict_change(row, band: float) -> str:
    """How the row's verdict (or "not fair") moved between the runs. Between level and ahead the
    verdict turned on the interval's lower end against 1 + band; between level and behind, on its
    upper end against 1 - band: near that edge, in either run, a rerun may land on the other side."""
    first, second = row.shown_first, row.shown_second
    if first == second:
        return NEITHER_FAIR if first == "not fair" else SAME
    if "not fair" in (first, second):
        return FAIR_IN_ONE
    if {first, second} == OPPOSITE:
        return OPPOSITE_VERDICTS
    end, edge = ("ci_low", 1 + band) if _deciding_end(row) == "lower" else ("ci_high", 1 - band)
    near = any(abs(getattr(row, f"{end}_{run}") / edge - 1) <= EDGE_WITHIN for run in ("first", "second"))
    return NEAR_EDGE if near else FAR_FROM_EDGE


def _deciding_end(row) -> str:
    """The interval's end that a change between level and ahead (lower) or behind (upper) turned on."""
    return "lower" if "ahead" in (row.shown_first, row.shown_second) else "upper"


def disagreements(first_dir: Path | str, second_dir: Path | str, ratio_within: float | None = None,
                  cycles_within: float | None = None) -> dict:
    """The two runs' head-to-head and cycles side by side, and each way in which they disagree.
    `ratio_within` and `cycles_within`, where given, replace the tolerances of the GPUs they ran on."""
    asked = Tolerances(_checked(ratio_within, "the ratio tolerance"), _checked(cycles_within, "the cycle tolerance"))
    if archives.given_twice([first_dir, second_dir]):
        raise FlashbenchError(f"{first_dir} is given twice: agreement compares two runs' folders")
    runs = [_run(folder) for folder in (first_dir, second_dir)]
    tolerances, gpus = _gpus(*runs)
    ratio_within = asked.ratio or tolerances.ratio
    cycles_within = asked.cycles or tolerances.cycles
    paired, counted = [], []
    for run in runs:
        table = _read(run.folder, "head_to_head", PAIRED_KEYS, ["ratio", "ci_low", "ci_high", "verdict", "fair"])
        paired.append(table.assign(shown=table.verdict.where(table.fair.astype(bool), "not fair")))
        counted.append(_read(run.folder, "cycles", CYCLE_KEYS, ["cycles"]).assign(shown=""))
    paired, by_one_method = _methods_in_both(*paired)
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
    band = runs[0].band
    paired["change"] = [_verdict_change(row, band) for row in paired.itertuples()]
    paired["judged"] = ~paired.change.isin([NEITHER_FAIR, FAIR_IN_ONE])  # fair in both runs
    for row in paired.itertuples():
        name = _name(row, PAIRED_KEYS)
        if row.change in (OPPOSITE_VERDICTS, FAR_FROM_EDGE):
            why = "opposite verdicts" if row.change == OPPOSITE_VERDICTS else \
                f"neither interval's {_deciding_end(row)} end within {EDGE_WITHIN:.0%} of the band's edge"
            problems.append(f"{name}: {row.shown_first} {_estimate(row, 'first')} in the first run, "
                            f"{row.shown_second} {_estimate(row, 'second')} in the second ({why})")
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
    return {"paired": paired, "cycles": counted, "problems": problems, "gpus": gpus, "by_one_method": by_one_method,
            "ratio_within": ratio_within, "cycles_within": cycles_within}


def _methods_in_both(first: pd.DataFrame, second: pd.DataFrame) -> tuple[list[pd.DataFrame], list[str]]:
    """The two runs' rows but those of a version both timed, by a method one of them did not time it by;
    and those, as `<method> of <version>` (a version one run lacks keeps its rows: that is a disagreement)."""
    timed = [set(zip(t.version, t.method)) for t in (first, second)]
    in_both = set(first.version) & set(second.version)
    alone = {(v, m) for v, m in timed[0] ^ timed[1] if v in in_both}
    kept = [t[[(v, m) not in alone for v, m in zip(t.version, t.method)]] for t in (first, second)]
    return kept, [f"{m} of {v}" for v, m in sorted(alone)]


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


def _spread(table: pd.DataFrame, keys: list[str]) -> str:
    """The median and the largest move of `table`'s rows, and whose the largest is."""
    worst = table.loc[table.moved.idxmax()]
    return f"median move {table.moved.median():.2%}, largest {worst.moved:.2%} ({_name(worst, keys)})"


def report_lines(result: dict) -> list[str]:
    """What the comparison found, a line each: the GPUs, the spread of the ratios and of the cycle
    counts, the verdicts, then every disagreement."""
    paired, counted = result["paired"], result["cycles"]
    lines = [f"{result['gpus']}: fair ratios held to {result['ratio_within']:.1%}, "
             f"cycle counts to {result['cycles_within']:.1%}"]
    judged = paired[paired.judged].dropna(subset=["moved"])
    if len(judged):
        lines.append(f"{len(judged)} paired ratios fair in both runs: {_spread(judged, PAIRED_KEYS)}")
    unfair = paired[paired.change == NEITHER_FAIR].dropna(subset=["moved"])
    if len(unfair):
        lines.append(f"{len(unfair)} back-to-back ratios not fair in either run (Python's dispatch), not held: "
                     f"{_spread(unfair, PAIRED_KEYS)}")
    changes = paired.change.value_counts()
    lines.append(f"verdicts: {changes.get(SAME, 0) + changes.get(NEITHER_FAIR, 0)} of {len(paired)} the same, "
                 f"{changes.get(OPPOSITE_VERDICTS, 0)} opposite (ahead in one run, behind in the other), "
                 f"{changes.get(NEAR_EDGE, 0)} changed where an interval ends within {EDGE_WITHIN:.0%} of the band's "
                 f"edge, {changes.get(FAR_FROM_EDGE, 0)} changed far from it, {changes.get(FAIR_IN_ONE, 0)} of a "
                 "back-to-back ratio fair in one run only")
    if result["by_one_method"]:
        lines.append(f"timed so in one run alone, not compared: {', '.join(result['by_one_method'])}")
    counts = counted.dropna(subset=["moved"])
    if len(counts):
        lines.append(f"{len(counts)} cycle counts: {_spread(counts, CYCLE_KEYS)}")
    return lines + [f"disagrees: {p}" for p in result["problems"]]
