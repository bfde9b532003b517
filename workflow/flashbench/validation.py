"""Every record and table the pipeline reads back is checked as it is read, so that a damaged,
misplaced or edited one stops the stage with one line naming the file and the key, before anything
is written from it.

A record kind (KINDS) is its schema (`$defs.<kind>` in workflow/schemas/records.schema.yaml: the
required keys and their types, a number being a finite one) and the checks a schema cannot state:
`consistent` ones on the record alone, and `as_configured` ones against what the run was asked to
do (Expected). Adding a kind is one schema entry and one entry here.

    record = read_record(path, "bench", expected)   # or expected=None: schema and consistency only
"""
from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import FlashbenchError, attention
from .config import METHODS, Shape, methods, pair_timing, ragged_near, ragged_pairable, sweep_lengths, sweep_steps
from .files import read_json

Problem = tuple[str, str] | None  # (key, what is wrong with it), or None


class BadRecord(FlashbenchError):
    """A record or table that cannot be trusted: its message names the file and the key."""


@dataclass(frozen=True)
class Expected:
    """What the run was configured to do, which its records must show they did (from_settings: the run's
    settings file, which every command is given)."""

    case: dict  # B, H, S, D of the timed case
    check_shapes: list[dict]  # every configured check shape, the case first
    inputs: list[str]  # the kinds of input each of them runs on
    gate: dict  # factor, tolerance
    bench: dict  # steps, repeats, warmup, graph_replays
    sweep: dict | None  # S and the same counts, or None where no sweep is run
    peers: list[str] = field(default_factory=list)  # the peers' runs' names (their identity is their library's)
    causal: list[str] = field(default_factory=list)  # the runs, and the configurations, under the causal mask
    kernel_inputs: list[str] = field(default_factory=list)  # the kinds the kernels (not the peers) run on besides
    ragged_pairs: list[str] = field(default_factory=list)  # the runs whose sweep pairs its ragged lengths
    ragged_rounds: int | None = None  # in as many rounds (config.pair_timing's)
    # the runs, and the configurations, whose head dim is not the case's: each runs every shape at its own
    head_dims: dict = field(default_factory=dict)  # run -> D
    configuration_head_dims: dict = field(default_factory=dict)  # configuration -> D
    # what a head-to-head point times in each configuration (config.methods), by its name
    head_to_head_methods: dict = field(default_factory=dict)  # configuration -> [method]

    def case_of(self, run: str) -> dict:
        """The case as the run `run` runs it: at its head dim."""
        return {**self.case, "D": self.head_dims.get(run, self.case["D"])}

    def case_in(self, configuration: str | None) -> dict:
        """The case as the configuration `configuration` runs it (None: the first's)."""
        return {**self.case, "D": self.configuration_head_dims.get(configuration, self.case["D"])}

    def methods_in(self, configuration: str | None) -> list[str] | None:
        """What a head-to-head point times in the configuration `configuration` (None: the first; None
        where the run asked no head-to-head)."""
        return self.head_to_head_methods.get(configuration or next(iter(self.head_to_head_methods), None))

    def check_shapes_of(self, run: str) -> list[dict]:
        D = self.case_of(run)["D"]
        return [{**shape, "D": D} for shape in self.check_shapes]

    @classmethod
    def from_settings(cls, settings) -> Expected:
        """From config.Settings."""
        return cls(case=settings.case.as_dict(), check_shapes=[s.as_dict() for s in settings.check_shapes],
                   inputs=list(settings.check_inputs),
                   gate={"factor": settings.check_factor, "tolerance": settings.tolerance},
                   bench=dict(settings.bench), sweep=dict(settings.sweep) if settings.sweep else None,
                   peers=[run.name for run in settings.peer_runs()],
                   causal=[*(run.name for run in settings.runs() if run.configuration.causal),
                           *(c.name for c in settings.configurations if c.causal)],
                   kernel_inputs=list(settings.check_kernel_inputs),
                   ragged_pairs=[run.name for run in settings.runs() if settings.pairs_ragged(run.name)],
                   ragged_rounds=settings.ragged_pair_timing()["rounds"] if settings.head_to_head else None,
                   head_dims={run.name: run.configuration.D for run in settings.runs()
                              if run.configuration.D != settings.case.D},
                   configuration_head_dims={c.name: c.D for c in settings.configurations if c.D != settings.case.D},
                   head_to_head_methods={c.name: list(methods(settings.head_to_head_in(c)))
                                         for c in settings.configurations} if settings.head_to_head else {})


COUNTS = ("steps", "repeats", "warmup", "graph_replays")
# What every record of a run names what ran by: a kernel its cubin, a peer the torch build and backend
# beside whatever else its library names (cuDNN's version, FlashAttention's)
KERNEL_IDENTITY, PEER_IDENTITY = ("cubin_sha256",), ("torch", "backend")
# Each TFLOPS figure and the time it is worked out from (tflops_min is the slowest call's)
TFLOPS_OF = {"tflops": "ms_per_step", "tflops_median": "ms_median", "tflops_min": "ms_max",
             "tflops_max": "ms_min", "tflops_graph": "ms_graph"}
AGREEMENT = 1e-6  # relative: what a figure and its time may differ by (the records keep full precision)


def _dims(d: dict) -> dict:
    return {k: d.get(k) for k in "BHSD"}


def _shape_text(d: dict) -> str:
    return str(Shape(**{k: int(d[k]) for k in "BHSD"}))


def timing_disagrees(timing: dict, causal: bool | None = None) -> Problem:
    """A timing's TFLOPS and GiB/s must be what its shape and times come to, under its mask (`causal`,
    else the timing's own `causal`; absent: none): an edited figure fails (a summary row, which keeps
    fewer times than a record, is held to the ones it keeps)."""
    shape = Shape(**{k: int(timing[k]) for k in "BHSD"})
    causal = timing.get("causal", False) if causal is None else causal
    worked_out = {f: attention.tflops(shape, timing[ms] / 1e3, causal) for f, ms in TFLOPS_OF.items() if ms in timing}
    worked_out["gib_per_s"] = attention.gib_per_s(shape, timing["ms_per_step"] / 1e3)
    for figure, value in worked_out.items():
        if not math.isclose(timing[figure], value, rel_tol=AGREEMENT):
            source = TFLOPS_OF.get(figure, "ms_per_step")
            return figure, (f"{timing[figure]} is not what {source} {timing[source]} at {shape} comes to "
                            f"({value:.6g})")
    return None


def _at(key: str, problem: Problem) -> Problem:
    return (f"{key}.{problem[0]}", problem[1]) if problem else None


def _timed_as(timing: dict, dims: dict, counts: dict, what: str) -> Problem:
    """A timing at `dims` with `counts` (the configured ones), its figures agreeing with its times."""
    for key, value in {**dims, **{c: counts[c] for c in COUNTS}}.items():
        if timing[key] != value:
            return key, f"{timing[key]}, but {what} is {key}={value}"
    return timing_disagrees(timing)


# ---- the checks each kind of record gets beyond its schema -----------------------------------------

def _check_consistent(r: dict, expected) -> Problem:
    if r.get("skipped") and r["passed"]:
        return "passed", "true, but the check was skipped"
    if r["passed"]:
        for i, row in enumerate(r["shapes"]):
            if row["passed"] is False:
                return f"shapes[{i}].passed", (f"false ({_shape_text(row)} {row['inputs']}), but the record says the "
                                               f"check passed")
    return None


def _check_as_configured(r: dict, expected: Expected) -> Problem:
    if r["gate"] != expected.gate:
        return "gate", f"{r['gate']}, but the configured gate is {expected.gate}"
    if not r["passed"]:  # skipped, or failed (perhaps stopped at a fault): never timed, whatever it holds
        return None
    kinds = expected.inputs + ([] if r["kernel"] in expected.peers else expected.kernel_inputs)
    if r["inputs"] != kinds:
        return "inputs", f"{r['inputs']}, but the configured kinds of input are {kinds}"
    rows = {(*_dims(row).values(), row["inputs"]): row for row in r["shapes"]}
    for shape in expected.check_shapes_of(r["kernel"]):
        for kind in kinds:
            row = rows.get((*shape.values(), kind))
            if row is None:
                return "shapes", f"no row for the configured shape {_shape_text(shape)} on {kind} inputs"
            if shape == expected.case_of(r["kernel"]) and row["passed"] is not True:
                return "passed", f"true, but the case on {kind} inputs was not checked"
    return None


def _masked_as_configured(causal: bool, name: str, expected: Expected) -> Problem:
    """A timing's mask (its FLOPs) must be its run's, or its configuration's: one under the causal mask
    counts half a dense call's FLOPs."""
    if causal != (name in expected.causal):
        return "causal", f"{causal}, but {name} runs {'under' if name in expected.causal else 'without'} the causal mask"
    return None


def _bench_as_configured(r: dict, expected: Expected) -> Problem:
    if not r["timed"]:
        return None
    return (_at("timing", _masked_as_configured(r["timing"].get("causal", False), r["kernel"], expected))
            or _at("timing", _timed_as(r["timing"], expected.case_of(r["kernel"]), expected.bench, "the case")))


def _sweep_as_configured(r: dict, expected: Expected) -> Problem:
    if not r["timed"]:
        return None
    if expected.sweep is None:
        return "timed", "true, but no sweep is configured"
    lengths, configured = [p["S"] for p in r["points"]], sweep_lengths(expected.sweep)
    if lengths != configured:
        return "points", f"at S = {lengths}, but the configured sweep is S = {configured}"
    for i, p in enumerate(r["points"]):
        dims = {**expected.case_of(r["kernel"]), "S": p["S"]}
        if _dims(p) != dims:
            return f"points[{i}]", f"at {_shape_text(p)}, but the sweep runs at {_shape_text(dims)}"
        counts = {**expected.sweep, "steps": sweep_steps(expected.sweep["steps"], expected.case["S"], p["S"])}
        if p["timed"] and (problem := _masked_as_configured(p.get("causal", False), r["kernel"], expected)
                           or _timed_as(p, dims, counts, "the configured sweep")):
            return _at(f"points[{i}]", problem)
    timed = {p["S"] for p in r["points"] if p["timed"]}
    pairs, paired = r.get("ragged", []), r["kernel"] in expected.ragged_pairs
    if pairs and not paired:
        return "ragged", f"{len(pairs)} pair(s), but {r['kernel']}'s sweep pairs no ragged length"
    due = ragged_pairable(expected.sweep.get("ragged", []), timed) if paired else []
    if "ragged" in r and [p["S"] for p in pairs] != due:  # absent: a sweep from before the pairs
        return "ragged", (f"pairs at S = {[p['S'] for p in pairs]}, but the sweep timed S = {due} and the next "
                          "multiple of 128 of each")
    for i, pair in enumerate(pairs):
        if problem := _pair_problem(pair, expected.ragged_rounds) or _masked_as_configured(pair["causal"], r["kernel"],
                                                                                         expected):
            return _at(f"ragged[{i}]", problem)
    return None


def _pair_problem(pair: dict, rounds: int | None) -> Problem:
    """A ragged pair against itself: against the next multiple of 128, in the configured rounds, with the
    calls per timing of both lengths."""
    if pair["near"] != ragged_near(pair["S"]):
        return "near", f"{pair['near']}, but S={pair['S']} is paired with the next multiple of 128, {ragged_near(pair['S'])}"
    if rounds is not None and len(pair["rounds"]) != rounds:
        return "rounds", f"{len(pair['rounds'])}, but the pair is timed in {rounds}"
    if set(pair["calls_per_timing"]) != {str(pair["S"]), str(pair["near"])}:
        return "calls_per_timing", f"for S = {sorted(pair['calls_per_timing'])}, not {pair['S']} and {pair['near']}"
    return None


def _profile_as_configured(r: dict, expected: Expected) -> Problem:
    if r["profiled"] and _dims(r) != expected.case_of(r["kernel"]):
        return "S", f"profiled at {_shape_text(r)}, but the case is {_shape_text(expected.case_of(r['kernel']))}"
    return None


def _cycles_as_configured(r: dict, expected: Expected) -> Problem:
    case = expected.case_of(r["kernel"])
    if r["counted"] and not any(_dims(p) == case for p in r["points"]):
        return "points", f"no count at the case ({_shape_text(case)})"
    return None


def _head_to_head_consistent(r: dict, expected) -> Problem:
    if list(r["contestants"]) != r["order"]:
        return "order", f"{r['order']}, but the contestants are {list(r['contestants'])}"
    rounds = {name: len(c["rounds"]) for name, c in r["contestants"].items()}
    if len(set(rounds.values())) > 1:
        return "contestants", f"rounds differ between contestants ({rounds}): the ratios would not be paired"
    return None


def _head_to_head_as_configured(r: dict, expected: Expected) -> Problem:
    case = expected.case_in(r.get("configuration"))
    if r["is_case"] != (_dims(r) == case):
        return "is_case", f"{r['is_case']}, but {_shape_text(r)} is{'' if _dims(r) == case else ' not'} the case"
    asked = expected.methods_in(r.get("configuration"))
    timed = r.get("methods", list(METHODS))  # none named: a point before the choice, which timed both
    if asked is not None and timed != asked:
        where = f"the configuration {r['configuration']}" if "configuration" in r else "its first configuration"
        return "methods", f"{timed}, but config's head-to-head times {asked} in {where}: run its head-to-head again"
    if "configuration" in r:  # a point made before configurations ran without the mask
        return _masked_as_configured(r.get("causal", False), r["configuration"], expected)
    return None


def _kernels_consistent(meta: dict, expected) -> Problem:
    h2h = meta.get("head_to_head")
    rounds = pair_timing(meta.get("sweep"), h2h)["rounds"] if h2h else None
    for i, k in enumerate(meta["kernels"]):
        if k["timing"] and (problem := timing_disagrees(k["timing"])):
            return _at(f"kernels[{i}].timing", problem)
        lengths = [p["S"] for p in k.get("ragged") or []]
        if len(set(lengths)) != len(lengths):
            return f"kernels[{i}].ragged", f"pairs at S = {lengths}: one a length"
        for j, pair in enumerate(k.get("ragged") or []):
            if problem := _pair_problem(pair, rounds):
                return _at(f"kernels[{i}].ragged[{j}]", problem)
    return None


# What kernels.json states of the run beside the settings it embeds: each must be what those say
RUN_KEYS = {"case": lambda s: s.case.as_dict(), "baseline": lambda s: s.baseline, "sweep": lambda s: s.sweep,
            "headline": lambda s: s.headline, "head_to_head": lambda s: s.head_to_head, "cycles": lambda s: s.cycles,
            "configurations": lambda s: [c.as_dict() for c in s.configurations]}


def _kernels_settings(meta: dict, expected) -> Problem:
    """The settings kernels.json embeds read back through config.Settings, as the run read them, and
    agree with what it states of the run (absent in archives summarized before it embedded them)."""
    from .config import ConfigError, validate

    if "settings" not in meta:
        return None
    try:
        settings = validate(meta["settings"], check_sources=False)
    except ConfigError as e:
        return "settings", f"not settings a run could have read: {e}"
    for key, of in RUN_KEYS.items():
        if key in meta and meta[key] != of(settings):
            return key, f"{meta[key]!r}, but the settings it embeds say {of(settings)!r}"
    return None


@dataclass(frozen=True)
class RecordKind:
    """One kind of record: its schema is `$defs.<name>` of records.schema.yaml."""

    named_after_kernel: bool  # <name>.json holds the record of the kernel or peer <name>
    ran: Callable[[dict], bool] = lambda r: False  # whether it ran the kernel: then it names what it ran
    consistent: tuple = ()  # (record, expected or None) -> Problem
    as_configured: tuple = ()  # (record, Expected) -> Problem


KINDS = {
    "check": RecordKind(True, lambda r: "skipped" not in r, (_check_consistent,), (_check_as_configured,)),
    "bench": RecordKind(True, lambda r: r["timed"], as_configured=(_bench_as_configured,)),
    "sweep": RecordKind(True, lambda r: r["timed"], as_configured=(_sweep_as_configured,)),
    "profile": RecordKind(True, lambda r: r["profiled"], as_configured=(_profile_as_configured,)),
    "compile": RecordKind(True),
    "cycles": RecordKind(True, lambda r: r["counted"], as_configured=(_cycles_as_configured,)),
    "head_to_head": RecordKind(False, consistent=(_head_to_head_consistent,),
                               as_configured=(_head_to_head_as_configured,)),
    "kernels": RecordKind(False, consistent=(_kernels_consistent, _kernels_settings)),
}


@functools.cache
def _validator(kind: str):
    from . import schemas

    document = schemas.load("records")
    return schemas.Validator({**document, "$ref": f"#/$defs/{kind}"})


def _identity(r: dict, expected: Expected) -> Problem:
    """What ran is named: a kernel by its cubin's sha256, a peer by its torch build and backend (the
    records of one run are tied together by these)."""
    needed = PEER_IDENTITY if r["kernel"] in expected.peers else KERNEL_IDENTITY
    missing = [key for key in needed if key not in r]
    return (missing[0], "missing") if missing else None


def load_json(path: Path | str):
    """A JSON file, or BadRecord naming it where it cannot be read or parsed (cut short, say)."""
    try:
        return read_json(path)
    except FlashbenchError as e:
        raise BadRecord(f"{e}; run the stage that writes it again") from None


def problem_of(record, kind: str, name: str, expected: Expected | None = None) -> Problem:
    """What is wrong with `record` of `kind` (None: nothing); `name`: what its file is named after."""
    from . import schemas

    spec = KINDS[kind]
    if problem := schemas.first_error(_validator(kind), record):
        return problem
    if spec.named_after_kernel and record["kernel"] != name:
        return "kernel", f"{record['kernel']!r}, but the file is {name!r}'s"
    checks = spec.consistent
    if expected is not None:
        checks += spec.as_configured + ((_identity,) if spec.ran(record) else ())
    for check in checks:
        if problem := check(record, expected):
            return problem
    return None


def read_record(path: Path | str, kind: str, expected: Expected | None = None) -> dict:
    """The record at `path`, checked as a `kind` record (KINDS), against `expected` where given; else
    BadRecord: `<path>: key '<key>': <what is wrong>`."""
    record = load_json(path)
    if problem := problem_of(record, kind, Path(path).stem, expected):
        raise BadRecord(f"{path}: key '{problem[0]}': {problem[1]}")
    return record


# ---- the tables summarize writes, read back by the reports -------------------------------------------

def read_table(path: Path | str, columns: list[str]):
    """A CSV table with at least `columns`, or BadRecord naming the file (unreadable, cut short)."""
    import io

    import pandas as pd

    try:
        text = Path(path).read_text()
        table = pd.read_csv(io.StringIO(text))
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise BadRecord(f"{path}: cannot be read as a table ({e}); run the stage that writes it again") from None
    if not text.endswith("\n"):  # every table is written whole, its last line ended
        raise BadRecord(f"{path}: its last line stops short: cut short; run the stage that writes it again")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise BadRecord(f"{path} was written by an older pipeline or cut short (no {', '.join(missing[:3])}"
                        f"{' ...' if len(missing) > 3 else ''}): run the GPU stages on that GPU again")
    return table


ROW_KEYS = ("kernel", "kind", "series", "B", "H", "S", "D", "inputs", "is_case")  # never empty in a whole row
TIMED_FIGURES = (*TFLOPS_OF, *set(TFLOPS_OF.values()), "gib_per_s")


def _positive_finite(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def config_disagrees(row: dict, name: str, meta: dict) -> str | None:
    """A table row's `config` must be the configuration kernels.json says the run `name` ran in (an
    archive summarized before configurations has no such column, and runs named no configuration)."""
    said = row.get("config")
    said = None if said != said else said  # an empty cell: NaN
    entry = next((k for k in meta["kernels"] if k["name"] == name), None)
    if entry is not None and "configurations" in meta and said != entry.get("config"):
        return f"config {said!r}, but kernels.json says {name} runs in {entry.get('config')!r}"
    return None


def causal_of(meta: dict, name: str) -> bool:
    """Whether the run `name` of kernels.json (`meta`) ran under the causal mask (an archive summarized
    before configurations ran none)."""
    return next(k for k in meta["kernels"] if k["name"] == name).get("causal", False)


def summary_problem(summary, meta: dict) -> str | None:
    """What is wrong with summary.csv read back beside kernels.json (`meta`, already read through
    read_record), or None: a row cut short, a kernel missing or unknown, a timing that is not a
    positive finite number, not what its times come to, or not the one kernels.json holds."""
    names = [k["name"] for k in meta["kernels"]]
    for i, row in enumerate(summary.to_dict("records")):
        empty = [key for key in ROW_KEYS if row[key] != row[key]]  # NaN: the row stops short
        if empty:
            return f"line {i + 2} ({row['kernel']}): no {empty[0]}"
        where = f"line {i + 2} ({row['kernel']}, {row['series']} S={row['S']})"
        if row["kernel"] not in names:
            return f"{where}: {row['kernel']} is not among the kernels of kernels.json"
        if problem := config_disagrees(row, row["kernel"], meta):
            return f"{where}: {problem}"
        timed = {f: row[f] for f in TIMED_FIGURES if f in row and row[f] == row[f]}
        for figure, value in timed.items():
            if not _positive_finite(value):
                return f"{where}: {figure} {value} is not a positive finite number"
        if timed and (untimed := [f for f in TIMED_FIGURES if f in row and f not in timed]):
            return f"{where}: {untimed[0]} is empty though {next(iter(timed))} is not"
        if timed and (problem := timing_disagrees(row, causal_of(meta, row["kernel"]))):
            return f"{where}: {problem[0]} {problem[1]}"
    checked = summary[summary.series == "check"]
    case = checked[checked.is_case & (checked.inputs == "normal")]
    for k in meta["kernels"]:
        name = k["name"]
        if k["skipped"]:
            continue
        kinds = set(checked[checked.kernel == name].inputs)
        if not kinds:
            return f"{name} has no check rows: cut short"
        asked = set(meta["inputs"]) | (set() if k["kind"] == "peer" else set(meta.get("kernel_inputs", [])))
        if k["check_passed"] and not asked <= kinds:  # a failed check may have stopped short
            return f"{name} has no check rows on {', '.join(sorted(asked - kinds))} inputs: cut short"
        at_case = case[case.kernel == name].tflops
        if k["check_passed"] and len(at_case) != 1:
            return f"{name} has {len(at_case)} rows at the case on normal inputs, not one"
        if k["timed"] and not math.isclose(at_case.iloc[0], k["timing"]["tflops"], rel_tol=AGREEMENT):
            return f"{name}'s TFLOPS at the case is {at_case.iloc[0]}, but kernels.json says {k['timing']['tflops']}"
        if not k["timed"] and at_case.notna().any():
            return f"{name} has TFLOPS at the case, but kernels.json says it was not timed"
        if k["timed"] and meta.get("sweep"):
            swept = sorted(summary[(summary.series == "sweep") & (summary.kernel == name)].S)
            lengths = sweep_lengths(meta["sweep"])
            if swept != sorted(lengths):
                return f"{name} has sweep rows at S = {swept}, not at the sweep's S = {lengths}: cut short"
    return None
