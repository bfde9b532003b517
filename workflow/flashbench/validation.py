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
import json
import math
import numbers
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from . import FlashbenchError, attention
from .config import Shape, sweep_steps
from .files import read_json

Problem = tuple[str, str] | None  # (key, what is wrong with it), or None


class BadRecord(FlashbenchError):
    """A record or table that cannot be trusted: its message names the file and the key."""


@dataclass(frozen=True)
class Expected:
    """What the run was configured to do, which its records must show they did. JSON both ways
    (the summarize stage gets it on its command line)."""

    case: dict  # B, H, S, D of the timed case
    check_shapes: list[dict]  # every configured check shape, the case first
    inputs: list[str]  # the kinds of input each of them runs on
    gate: dict  # factor, tolerance
    bench: dict  # steps, repeats, warmup, graph_replays
    sweep: dict | None  # S and the same counts, or None where no sweep is run
    peers: list[str] = field(default_factory=list)  # the PyTorch peers' names (their identity is torch's)

    @classmethod
    def from_settings(cls, settings) -> Expected:
        """From config.Settings."""
        return cls(case=settings.case.as_dict(), check_shapes=[s.as_dict() for s in settings.check_shapes],
                   inputs=list(settings.check_inputs),
                   gate={"factor": settings.check_factor, "tolerance": settings.tolerance},
                   bench=dict(settings.bench), sweep=dict(settings.sweep) if settings.sweep else None,
                   peers=[p.name for p in settings.peers])

    def as_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Expected:
        return cls(**json.loads(text))


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


def timing_disagrees(timing: dict) -> Problem:
    """A timing's TFLOPS and GiB/s must be what its shape and times come to: an edited figure fails
    (a summary row, which keeps fewer times than a record, is held to the ones it keeps)."""
    shape = Shape(**{k: int(timing[k]) for k in "BHSD"})
    worked_out = {f: attention.tflops(shape, timing[ms] / 1e3) for f, ms in TFLOPS_OF.items() if ms in timing}
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
    if r["inputs"] != expected.inputs:
        return "inputs", f"{r['inputs']}, but the configured kinds of input are {expected.inputs}"
    rows = {(*_dims(row).values(), row["inputs"]): row for row in r["shapes"]}
    for shape in expected.check_shapes:
        for kind in expected.inputs:
            row = rows.get((*shape.values(), kind))
            if row is None:
                return "shapes", f"no row for the configured shape {_shape_text(shape)} on {kind} inputs"
            if shape == expected.case and row["passed"] is not True:
                return "passed", f"true, but the case on {kind} inputs was not checked"
    return None


def _bench_as_configured(r: dict, expected: Expected) -> Problem:
    return _at("timing", _timed_as(r["timing"], expected.case, expected.bench, "the case")) if r["timed"] else None


def _sweep_as_configured(r: dict, expected: Expected) -> Problem:
    if not r["timed"]:
        return None
    if expected.sweep is None:
        return "timed", "true, but no sweep is configured"
    lengths = [p["S"] for p in r["points"]]
    if lengths != expected.sweep["S"]:
        return "points", f"at S = {lengths}, but the configured sweep is S = {expected.sweep['S']}"
    for i, p in enumerate(r["points"]):
        dims = {**expected.case, "S": p["S"]}
        if _dims(p) != dims:
            return f"points[{i}]", f"at {_shape_text(p)}, but the sweep runs at {_shape_text(dims)}"
        counts = {**expected.sweep, "steps": sweep_steps(expected.sweep["steps"], expected.case["S"], p["S"])}
        if p["timed"] and (problem := _timed_as(p, dims, counts, "the configured sweep")):
            return _at(f"points[{i}]", problem)
    return None


def _profile_as_configured(r: dict, expected: Expected) -> Problem:
    if r["profiled"] and _dims(r) != expected.case:
        return "S", f"profiled at {_shape_text(r)}, but the case is {_shape_text(expected.case)}"
    return None


def _cycles_as_configured(r: dict, expected: Expected) -> Problem:
    if r["counted"] and not any(_dims(p) == expected.case for p in r["points"]):
        return "points", f"no count at the case ({_shape_text(expected.case)})"
    return None


def _head_to_head_consistent(r: dict, expected) -> Problem:
    if list(r["contestants"]) != r["order"]:
        return "order", f"{r['order']}, but the contestants are {list(r['contestants'])}"
    rounds = {name: len(c["rounds"]) for name, c in r["contestants"].items()}
    if len(set(rounds.values())) > 1:
        return "contestants", f"rounds differ between contestants ({rounds}): the ratios would not be paired"
    return None


def _head_to_head_as_configured(r: dict, expected: Expected) -> Problem:
    if r["is_case"] != (_dims(r) == expected.case):
        return "is_case", f"{r['is_case']}, but {_shape_text(r)} is{'' if _dims(r) == expected.case else ' not'} the case"
    return None


def _kernels_consistent(meta: dict, expected) -> Problem:
    for i, k in enumerate(meta["kernels"]):
        if k["timing"] and (problem := timing_disagrees(k["timing"])):
            return _at(f"kernels[{i}].timing", problem)
    return None


# What kernels.json states of the run beside the settings it embeds: each must be what those say
RUN_KEYS = {"case": lambda s: s.case.as_dict(), "baseline": lambda s: s.baseline, "sweep": lambda s: s.sweep,
            "headline": lambda s: s.headline, "head_to_head": lambda s: s.head_to_head, "cycles": lambda s: s.cycles}


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
        timed = {f: row[f] for f in TIMED_FIGURES if f in row and row[f] == row[f]}
        for figure, value in timed.items():
            if not _positive_finite(value):
                return f"{where}: {figure} {value} is not a positive finite number"
        if timed and (untimed := [f for f in TIMED_FIGURES if f in row and f not in timed]):
            return f"{where}: {untimed[0]} is empty though {next(iter(timed))} is not"
        if timed and (problem := timing_disagrees(row)):
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
        if k["check_passed"] and not set(meta["inputs"]) <= kinds:  # a failed check may have stopped short
            return f"{name} has no check rows on {', '.join(sorted(set(meta['inputs']) - kinds))} inputs: cut short"
        at_case = case[case.kernel == name].tflops
        if k["check_passed"] and len(at_case) != 1:
            return f"{name} has {len(at_case)} rows at the case on normal inputs, not one"
        if k["timed"] and not math.isclose(at_case.iloc[0], k["timing"]["tflops"], rel_tol=AGREEMENT):
            return f"{name}'s TFLOPS at the case is {at_case.iloc[0]}, but kernels.json says {k['timing']['tflops']}"
        if not k["timed"] and at_case.notna().any():
            return f"{name} has TFLOPS at the case, but kernels.json says it was not timed"
        if k["timed"] and meta.get("sweep"):
            swept = sorted(summary[(summary.series == "sweep") & (summary.kernel == name)].S)
            if swept != sorted(meta["sweep"]["S"]):
                return f"{name} has sweep rows at S = {swept}, not at the sweep's S = {meta['sweep']['S']}: cut short"
    return None


# ---- resources.csv, profile.csv, head_to_head.csv and cycles.csv, each read back beside kernels.json ----
#
# Like summary.csv, each is checked row by row (every figure a number in its range, agreeing with those
# it is worked out from) and as a whole against what kernels.json says was run: no row of something
# that was not run, none twice, none missing (a table cut to its header included). A problem is
# `line <n> (<the row>): <what is wrong>`, n the CSV line (the header is line 1); a missing row is named
# by the line it would be at.

REGISTERS = (1, 255)  # per thread: what ptxas may give a thread
THREADS_PER_BLOCK = 1024


class _Refused(Exception):
    """What is wrong with a row (raised by the readers of its cells, said with the row's line)."""


def _empty(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _as_float(value) -> float | None:
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _cell(row: dict, column: str, may_be_empty: bool) -> float | None:
    raw = row[column]
    if _empty(raw):
        if may_be_empty:
            return None
        raise _Refused(f"no {column}")
    value = _as_float(raw)
    if value is None:
        raise _Refused(f"{column} {raw!r} is not a number")
    return value


def _positive(row: dict, column: str, may_be_empty: bool = False) -> float | None:
    """The cell `column` of `row`: a positive finite number (None where it is empty and may be)."""
    value = _cell(row, column, may_be_empty)
    if value is not None and not (math.isfinite(value) and value > 0):
        raise _Refused(f"{column} {row[column]} is not a positive finite number")
    return value


def _within(row: dict, column: str, low: float, high: float | None = None, *, low_open: bool = False,
            whole: bool = False, may_be_empty: bool = False) -> float | int | None:
    """The cell `column` of `row`: a finite number (a whole one where `whole`) from `low` (above it
    where `low_open`) to `high` (None: no bound); None where it is empty and may be."""
    value = _cell(row, column, may_be_empty)
    if value is None:
        return None
    if (not math.isfinite(value) or (whole and not value.is_integer()) or (value <= low if low_open else value < low)
            or (high is not None and value > high)):
        span = f"{'(' if low_open else '['}{low:g}, {'inf)' if high is None else f'{high:g}]'}"
        raise _Refused(f"{column} {row[column]} is not {'a whole number' if whole else 'a number'} in {span}")
    return int(value) if whole else value


def _flag(row: dict, column: str) -> bool:
    raw = row[column]
    if (isinstance(raw, str) or type(raw).__name__ in ("bool", "bool_")) and str(raw) in ("True", "False"):
        return str(raw) == "True"
    raise _Refused(f"no {column}" if _empty(raw) else f"{column} {raw!r} is neither True nor False")


def _text(row: dict, column: str) -> str:
    raw = row[column]
    if not isinstance(raw, str) or not raw:
        raise _Refused(f"no {column}" if _empty(raw) else f"{column} {raw!r} is not a name")
    return raw


def _shape_of(row: dict) -> dict:
    return {d: _within(row, d, 1, whole=True) for d in "BHSD"}


def _is_case(row: dict, shape: dict, case: dict) -> None:
    if _flag(row, "is_case") != (shape == case):
        raise _Refused(f"is_case {row['is_case']}, but {_shape_text(shape)} is{'' if shape == case else ' not'} "
                       "the case")


def _where(shape: dict, case: dict) -> str:
    return "the case" if shape == case else f"S={shape['S']}"


def _rows(table):
    """Each row of a table, with its CSV line (the header is line 1)."""
    return ((i + 2, row) for i, row in enumerate(table.to_dict("records")))


def _once(seen: dict, key, line: int) -> None:
    if key in seen:
        raise _Refused(f"a second row for it (the first is line {seen[key]})")
    seen[key] = line


def _missing(order: list, present: dict, what) -> str | None:
    """The first of `order` (the keys of the rows kernels.json says the table has, in table order) that
    `present` (key -> line) lacks, named by the line it would be at; None where it lacks none."""
    rank = {key: i for i, key in enumerate(order)}
    for key in order:
        if key not in present:
            line = 2 + sum(1 for k in present if rank.get(k, len(order)) < rank[key])
            return f"line {line}: no row for {what(key)}: cut short or edited"
    return None


def _entries(meta: dict) -> dict:
    return {k["name"]: k for k in meta["kernels"]}


def _known(meta: dict, name: str) -> dict:
    entry = _entries(meta).get(name)
    if entry is None:
        raise _Refused(f"{name} is not among the kernels of kernels.json")
    return entry


def _sweep_refusals(summary) -> set[tuple[str, int]]:
    """(name, S) where the sweep found no kernel of `name` at length S (summary.csv has its row there
    untimed, with the reason): the head-to-head and the cycle counts pass over that length too."""
    if summary is None:
        return set()
    sweep = summary[(summary.series == "sweep") & summary.tflops.isna() & summary.reason.notna()]
    return {(name, int(S)) for name, S in zip(sweep.kernel, sweep.S)}


def _runs_at(entry: dict | None, shape: dict, refusals: set) -> bool:
    """Whether a kernel or peer was run at `shape` where asked to: it passed its check (one that failed
    or was skipped is left out), and it has a kernel for the shape (a peer's max_seq_len; a length the
    sweep found none at: _sweep_refusals)."""
    if entry is None or not entry.get("check_passed"):
        return False
    if entry.get("max_seq_len") and shape["S"] > entry["max_seq_len"]:
        return False
    return (entry["name"], shape["S"]) not in refusals


def _passed(entry: dict, what: str) -> None:
    if not entry.get("check_passed"):
        raise _Refused(f"kernels.json says {entry['name']} did not pass its check: it is never {what}")


def head_to_head_points(meta: dict) -> list[dict]:
    """The head-to-head's points, in table order: the case, then the sweep's other lengths by S."""
    case = meta["case"]
    lengths = sorted(S for S in (meta.get("sweep") or {}).get("S", []) if S != case["S"])
    return [case, *({**case, "S": S} for S in lengths)]


def contestants(meta: dict) -> list[str]:
    """The headline versions, then the head-to-head's rivals (in a run that had one): what is counted
    at every point of the head-to-head (config.Settings.contestants)."""
    return [*(meta.get("headline") or []), *((meta.get("head_to_head") or {}).get("rivals") or [])]


def head_to_head_problem(table, meta: dict, summary=None) -> str | None:
    """What is wrong with head_to_head.csv read back beside kernels.json (`meta`, of a run with a
    head-to-head) and summary.csv, or None. A row: a headline version against one of its rivals (the
    later headline versions, then config's rivals) at a point of the head-to-head, both having passed
    their checks; its ratio and interval positive and finite, the ratio inside the interval, its
    verdict the one the interval and the band (level_within) give, its rounds the configured ones,
    the graph fair to both sides (only back-to-back calls can time the CPU's dispatch). And one row,
    no more, for each version, rival and method at every point where both were run."""
    from .headtohead import METHODS, verdict

    settings, headline, case = meta["head_to_head"], meta.get("headline") or [], meta["case"]
    rivals_of = {v: [*headline[i + 1:], *settings["rivals"]] for i, v in enumerate(headline)}
    points, band = head_to_head_points(meta), settings["level_within"]
    seen = {}
    for line, row in _rows(table):
        where = f"line {line}"
        try:
            version, rival, method = (_text(row, c) for c in ("version", "rival", "method"))
            shape = _shape_of(row)
            where += f" ({version} against {rival} by {method} at {_where(shape, case)})"
            if version not in rivals_of:
                raise _Refused(f"{version} is not one of kernels.json's headline versions ({', '.join(headline)})")
            if rival not in rivals_of[version]:
                raise _Refused(f"{rival} is not one of {version}'s rivals in kernels.json "
                               f"({', '.join(rivals_of[version]) or 'none'})")
            if method not in METHODS:
                raise _Refused(f"method {method!r} is not one of {', '.join(METHODS)}")
            for name in (version, rival):
                _passed(_known(meta, name), "in the head-to-head")
            if shape not in points:
                raise _Refused(f"{_shape_text(shape)} is not a point of the head-to-head (the case, then the sweep's "
                               f"lengths: S = {[p['S'] for p in points]})")
            _is_case(row, shape, case)
            _once(seen, (points.index(shape), version, rival, method), line)
            ratio, low, high = (_positive(row, c) for c in ("ratio", "ci_low", "ci_high"))
            if not low <= ratio <= high:
                raise _Refused(f"ratio {row['ratio']} is outside its interval [{row['ci_low']}, {row['ci_high']}]")
            said, given = _text(row, "verdict"), verdict(low, high, band)
            if said != given:
                raise _Refused(f"verdict {said!r}, but its interval [{row['ci_low']}, {row['ci_high']}] and the band "
                               f"(level_within {band}) give {given!r}")
            if _within(row, "rounds", 1, whole=True) != settings["rounds"]:
                raise _Refused(f"rounds {row['rounds']}, but the head-to-head ran {settings['rounds']}")
            if not _flag(row, "fair") and method == "graph":
                raise _Refused("fair False by graph: only back-to-back calls can time the CPU's dispatch")
            for side in ("version", "rival"):
                _positive(row, f"{side}_tflops")
                for figure in ("sm_clock_mhz", "joules_per_call", "tflops_per_watt", "sustained_tflops"):
                    _positive(row, f"{side}_{figure}", may_be_empty=True)  # no clock samples, no energy counter
        except _Refused as e:
            return f"{where}: {e}"
    entries, refusals = _entries(meta), _sweep_refusals(summary)
    order = [(i, v, r, m) for i, p in enumerate(points) for v in headline for r in rivals_of[v] for m in METHODS
             if _runs_at(entries.get(v), p, refusals) and _runs_at(entries.get(r), p, refusals)]
    return _missing(order, seen, lambda k: f"{k[1]} against {k[2]} by {k[3]} at {_where(points[k[0]], case)}, "
                                           "where kernels.json says both were run")


def cycles_problem(table, meta: dict, summary=None) -> str | None:
    """What is wrong with cycles.csv read back beside kernels.json (`meta`, of a run that counted
    cycles) and summary.csv, or None. A row: a kernel or peer that passed its check, at the case or
    (a contestant of the head-to-head) at one of its points; its cycles (median, least, most)
    positive and finite and in that order, over the configured launches; its efficiency per cycle in
    (0, 1] and what its cycles come to on the GPU's SMs. And one row, no more, for each kernel and
    peer counted at each of its shapes (none where the run counted none: cycles_note)."""
    from .cycles import efficiency_per_cycle

    case, points = meta["case"], head_to_head_points(meta)
    paired, note, launches = contestants(meta), meta.get("cycles_note"), meta["cycles"]["launches"]
    shapes_of = {k["name"]: points if k["name"] in paired else [case] for k in meta["kernels"]}
    sm_counts = {k["provenance"]["sm_count"] for k in meta["kernels"] if (k.get("provenance") or {}).get("sm_count")}
    seen, names = {}, list(shapes_of)
    for line, row in _rows(table):
        where = f"line {line}"
        try:
            name, shape = _text(row, "kernel"), _shape_of(row)
            where += f" ({name} at {_where(shape, case)})"
            entry = _known(meta, name)
            if _text(row, "kind") != entry["kind"]:
                raise _Refused(f"kind {row['kind']!r}, but kernels.json says {name} is a {entry['kind']}")
            if note:
                raise _Refused(f"kernels.json says the run counted no cycles ({note})")
            _passed(entry, "counted")
            if shape not in shapes_of[name]:
                raise _Refused(f"{name} is counted at {', '.join(_where(s, case) for s in shapes_of[name])} only")
            _is_case(row, shape, case)
            _once(seen, (names.index(name), shapes_of[name].index(shape)), line)
            cycles, least, most = (_positive(row, c) for c in ("cycles", "cycles_min", "cycles_max"))
            if not least <= cycles <= most:
                raise _Refused(f"cycles {row['cycles']} is not between cycles_min {row['cycles_min']} and cycles_max "
                               f"{row['cycles_max']}")
            if _within(row, "launches", 1, whole=True) != launches:
                raise _Refused(f"launches {row['launches']}, but the run counted {launches} at each shape")
            _positive(row, "duration_us")
            _within(row, "tensor_pipe_pct", 0, 100)
            _positive(row, "sm_clock_mhz")
            _within(row, "kernels_per_call", 1, whole=True)
            efficiency = _within(row, "efficiency_per_cycle", 0, 1, low_open=True)
            if len(sm_counts) == 1:
                worked_out = efficiency_per_cycle(Shape(**shape), cycles, next(iter(sm_counts)))
                if not math.isclose(efficiency, worked_out, rel_tol=AGREEMENT):
                    raise _Refused(f"efficiency_per_cycle {row['efficiency_per_cycle']} is not what {cycles:g} cycles "
                                   f"on {next(iter(sm_counts))} SMs come to ({worked_out:.6g})")
        except _Refused as e:
            return f"{where}: {e}"
    entries, refusals = _entries(meta), _sweep_refusals(summary)
    order = [(i, j) for i, name in enumerate(names) if not note
             for j, shape in enumerate(shapes_of[name]) if _runs_at(entries[name], shape, refusals)]
    return _missing(order, seen, lambda k: f"{names[k[0]]} at {_where(shapes_of[names[k[0]]][k[1]], case)}, "
                                           "where kernels.json says it was counted (it passed its check)")


def _built_for(meta: dict, table) -> dict[str, list[str]]:
    """Each kernel's build archs: its own (config's `archs`), else the run's, the GPU's own among them
    (common.smk's ARCHS): the settings' archs where kernels.json embeds them, else those the kernels
    without archs of their own were built for."""
    kernels = [k for k in meta["kernels"] if k["kind"] != "peer"]
    own = {k["name"]: list(k["archs"]) for k in kernels if k.get("archs")}
    if "settings" in meta:
        run = list(meta["settings"]["archs"])
    else:
        names = {k["name"] for k in kernels} - set(own)
        run = list(dict.fromkeys(a for k, a in zip(table.kernel, table.arch) if k in names and isinstance(a, str)))
    run += [meta["gpu_arch"]] if meta["gpu_arch"] not in run else []
    return {k["name"]: own.get(k["name"], run) for k in kernels}


def resources_problem(table, meta: dict) -> str | None:
    """What is wrong with resources.csv read back beside kernels.json (`meta`), or None. A row: a
    kernel of kernels.json at an arch it is built for; registers 1..255 a thread, spills, stack and
    shared memory whole and not below 0, the shared memory its static and dynamic parts together
    and within what a block may have on that arch, threads 1..1024 a block, and the blocks per SM
    and what limits them what the registers, shared memory and threads allow (occupancy): none
    only in a build that never ran (one that cannot launch fails its check). And one row, no more,
    for each kernel and arch it is built for."""
    from . import occupancy
    from .compile import runnable_build

    built_for = _built_for(meta, table)
    names, seen = list(built_for), {}
    for line, row in _rows(table):
        where = f"line {line}"
        try:
            name, arch = _text(row, "kernel"), _text(row, "arch")
            where += f" ({name} for {arch})"
            entry = _known(meta, name)
            if entry["kind"] == "peer":
                raise _Refused(f"{name} is a peer: nothing of it is compiled")
            if arch not in built_for[name]:
                raise _Refused(f"{name} is built for {', '.join(built_for[name])}")
            limits = occupancy.LIMITS.get(arch.removesuffix("a"))
            if limits is None:
                raise _Refused(f"{arch} is an architecture without known limits ({', '.join(occupancy.LIMITS)})")
            _once(seen, (names.index(name), built_for[name].index(arch)), line)
            registers = _within(row, "registers", *REGISTERS, whole=True)
            for column in ("spill_store_bytes", "spill_load_bytes", "stack_frame_bytes"):
                _within(row, column, 0, whole=True)
            static, dynamic, smem = (_within(row, c, 0, limits.smem_per_block_max, whole=True)
                                     for c in ("static_smem_bytes", "dynamic_smem_bytes", "smem_bytes"))
            if smem != static + dynamic:
                raise _Refused(f"smem_bytes {smem} is not static_smem_bytes {static} + dynamic_smem_bytes {dynamic}")
            threads = _within(row, "threads", 1, min(THREADS_PER_BLOCK, limits.max_threads), whole=True)
            _within(row, "block_rows", 1, whole=True)
            blocks = _within(row, "blocks_per_sm", 0, limits.max_blocks, whole=True)
            allowed = occupancy.blocks_per_sm(arch, threads, registers, smem)
            limited_by = " + ".join(allowed["limited_by"])
            if (blocks, row["limited_by"]) != (allowed["blocks_per_sm"], limited_by):
                raise _Refused(f"{blocks} blocks per SM limited by {row['limited_by']}, but {threads} threads, "
                               f"{registers} registers and {smem} bytes of shared memory allow "
                               f"{allowed['blocks_per_sm']} on {arch}, limited by {limited_by}")
            if blocks == 0 and entry.get("check_passed") and arch == runnable_build(built_for[name], meta["gpu_arch"]):
                raise _Refused(f"no block fits an SM (limited by {limited_by}), but kernels.json says {name} passed "
                               f"its check on {meta['gpu_arch']}")  # a build that cannot launch may fail its check
            sha = _text(row, "cubin_sha256")
            if len(sha) != 64 or set(sha) - set("0123456789abcdef"):
                raise _Refused(f"cubin_sha256 {sha!r} is not a sha256")
        except _Refused as e:
            return f"{where}: {e}"
    order = [(i, j) for i, name in enumerate(names) for j in range(len(built_for[name]))]
    return _missing(order, seen, lambda k: f"{names[k[0]]} for {built_for[names[k[0]]][k[1]]}, which kernels.json's "
                                           "run builds it for")


def profile_problem(table, meta: dict, resources) -> str | None:
    """What is wrong with profile.csv read back beside kernels.json (`meta`) and resources.csv, or
    None. A row: a kernel kernels.json says was profiled; its duration positive, its registers
    1..255 and those of the build it ran (resources.csv), percentages 0..100, counts and stall
    cycles not below 0, and the softmax's share and place among the top stall lines what kernels.json
    says (an empty cell: a metric ncu did not give). And one row, no more, for each profiled kernel."""
    from .compile import runnable_build
    from .profile import METRICS, STALLS, TOP_LINES

    profiled = [k["name"] for k in meta["kernels"] if (k.get("profile") or {}).get("profiled")]
    seen = {}
    for line, row in _rows(table):
        where = f"line {line}"
        try:
            name = _text(row, "kernel")
            where += f" ({name})"
            profile = _known(meta, name).get("profile") or {}
            if not profile.get("profiled"):
                raise _Refused(f"kernels.json says {name} was not profiled"
                               + (f" ({profile['reason']})" if profile.get("reason") else ""))
            _once(seen, profiled.index(name), line)
            for metric in METRICS:
                if metric == "duration_us":
                    _positive(row, metric, may_be_empty=True)
                elif metric == "registers":
                    registers = _within(row, metric, *REGISTERS, whole=True, may_be_empty=True)
                    mine = resources[resources.kernel == name]
                    arch = runnable_build(list(mine.arch), meta["gpu_arch"])
                    built = [int(r) for r in mine[mine.arch == arch].registers]
                    if registers is not None and built and registers != built[0]:
                        raise _Refused(f"registers {registers}, but its build for {arch} has {built[0]} "
                                       "(resources.csv)")
                else:
                    _within(row, metric, 0, 100 if metric.endswith("_pct") else None, may_be_empty=True)
            for stall in STALLS:
                _within(row, f"stall_{stall}", 0, may_be_empty=True)
            share = _within(row, "softmax_share", 0, 1, may_be_empty=True)
            if (share is None) != (profile.get("softmax_share") is None) or (
                    share is not None and not math.isclose(share, profile["softmax_share"], rel_tol=AGREEMENT)):
                raise _Refused(f"softmax_share {row['softmax_share']}, but kernels.json says "
                               f"{profile.get('softmax_share')}")
            in_top = _within(row, "softmax_in_top_lines", 0, TOP_LINES, whole=True, may_be_empty=True)
            top = profile.get("top_lines")
            said = None if top is None else sum(t["softmax"] for t in top)
            if "top_lines" in profile and in_top != said:
                raise _Refused(f"softmax_in_top_lines {row['softmax_in_top_lines']}, but kernels.json's top stall "
                               f"lines have {said}")
        except _Refused as e:
            return f"{where}: {e}"
    return _missing(list(range(len(profiled))), seen,
                    lambda k: f"{profiled[k]}, which kernels.json says was profiled")
