"""A GPU's archive read back for its reports: the tables of results/<gpu>/ and kernels.json, each
checked against itself and kernels.json (summary.csv by validation, the others below), so that a
table cut short, from an older pipeline or edited is refused with one line before anything is drawn;
and the ways the reports read a table, each written once: a figure as kernel x S, and a cell without
a value (NaN) as None.

The checks of the tables beside summary.csv are here, not in validation: every command imports
validation, and these read headtohead, cycles, profile and occupancy, which only the reports need."""
from __future__ import annotations

import math
import numbers
from pathlib import Path

import pandas as pd

from . import archives
from .compile import runnable_build
from .config import Shape, head_to_head_in
from .occupancy import LIMITS, blocks_per_sm
from .profile import METRICS, STALLS, TOP_LINES
from .summary import PROFILE_COLUMNS, RESOURCE_COLUMNS, SUMMARY_COLUMNS
from .validation import AGREEMENT, BadRecord, config_disagrees, read_record, read_table, summary_problem


def _read(path: Path, columns: list[str], meta: dict) -> pd.DataFrame:
    """A table of the archive with `columns`; one summarized before configurations has no `config`
    column, and every row of it is in its only configuration (None)."""
    if "configurations" in meta:
        return read_table(path, columns)
    table = read_table(path, [c for c in columns if c != "config"])
    return table.assign(config=None) if "config" in columns else table


def read_summary(results_dir: Path | str) -> tuple[pd.DataFrame, dict]:
    """summary.csv and kernels.json, each checked and checked against the other (validation): a table
    cut short, from an older pipeline or edited is refused with one line."""
    results_dir = Path(results_dir)
    meta = read_record(results_dir / "kernels.json", "kernels")
    summary = _read(results_dir / "summary.csv", SUMMARY_COLUMNS, meta)
    _refuse(results_dir / "summary.csv", summary_problem(summary, meta))
    for k in meta["kernels"]:  # an archive summarized before a file's choices were a list of paragraphs
        if isinstance(k.get("choices"), str):
            k["choices"] = [k["choices"]]
    return summary, meta


class BadTable(BadRecord):
    """A table of an archive at odds with itself or with kernels.json: one line naming the table (`path`)
    and its `problem`."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}; run summarize on that GPU again")
        self.path, self.problem = Path(path), problem


def _refuse(path: Path, problem: str | None) -> None:
    """BadTable where the table has a problem (validation's)."""
    if problem:
        raise BadTable(path, problem)


def read_tables(results_dir: Path | str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame, dict]:
    """summary.csv, resources.csv, profile.csv and kernels.json, each checked, and checked against
    kernels.json (validation)."""
    results_dir = Path(results_dir)
    archives.require_tables(results_dir)
    summary, meta = read_summary(results_dir)
    resources = _read(results_dir / "resources.csv", RESOURCE_COLUMNS, meta)
    _refuse(results_dir / "resources.csv", configs_problem(resources, meta, ("kernel",))
            or resources_problem(resources, meta))
    profile = _read(results_dir / "profile.csv", PROFILE_COLUMNS, meta)
    _refuse(results_dir / "profile.csv", configs_problem(profile, meta, ("kernel",))
            or profile_problem(profile, meta, resources))
    return summary, resources, profile, meta


def read_paired(results_dir: Path | str, meta: dict, summary: pd.DataFrame) -> dict:
    """head_to_head.csv and cycles.csv, where the run that wrote kernels.json made them (a table left
    by an earlier run is not this run's: its report says the run had no such stage), each checked
    against kernels.json and summary.csv (the lengths the sweep found no kernel at are those the
    head-to-head and the counts pass over)."""
    from .cycles import COLUMNS as CYCLES_COLUMNS
    from .headtohead import COLUMNS as HEAD_TO_HEAD_COLUMNS

    results_dir = Path(results_dir)
    tables = {}
    for name, columns, problem in (("head_to_head", HEAD_TO_HEAD_COLUMNS, head_to_head_problem),
                                   ("cycles", CYCLES_COLUMNS, cycles_problem)):
        tables[name] = _read(results_dir / f"{name}.csv", columns, meta) if meta.get(name) else None
        if tables[name] is not None:
            _refuse(results_dir / f"{name}.csv", configs_problem(tables[name], meta, ("kernel", "version", "rival")))
            for i, configuration in enumerate(configurations(meta)):  # each one's rows, as a run of its own
                v_summary, v_meta, v_tables = view(summary, meta, {name: tables[name]}, configuration)
                said = problem(v_tables[name], v_meta, v_summary)
                _refuse(results_dir / f"{name}.csv", f"in the configuration {configuration['name']}, {said}"
                        if said and i > 0 else said)
    return tables


def configs_problem(table: pd.DataFrame, meta: dict, name_columns: tuple[str, ...]) -> str | None:
    """The first row whose `config` is not the configuration kernels.json says its runs (the cells of
    `name_columns` it has) ran in, or None."""
    columns = [c for c in name_columns if c in table.columns]
    for line, row in _rows(table):
        for column in columns:
            if problem := config_disagrees(row, row[column], meta):
                return f"line {line} ({row[column]}): {problem}"
    return None


def configurations(meta: dict) -> list[dict | None]:
    """The configurations of an archive's run, the case's first ([None]: an archive summarized before
    configurations, which ran one)."""
    return meta.get("configurations") or [None]


def view(summary: pd.DataFrame, meta: dict, tables: dict, configuration: dict | None
         ) -> tuple[pd.DataFrame, dict, dict]:
    """The archive in one configuration, as a run of that configuration alone would have written it:
    the rows of its runs, each named by the kernel or peer it is a run of (v25.causal as v25), and
    kernels.json with those runs and the headline versions that have one (`tables`: name -> a table
    with a `config` column, or None). An archive without configurations is its own view."""
    if configuration is None:
        return summary, meta, tables
    name = configuration["name"]
    runs = [k for k in meta["kernels"] if k.get("config") == name]
    of = {k["name"]: k.get("of", k["name"]) for k in runs}
    kernels = [{**k, "name": of[k["name"]]} for k in runs]
    h2h = meta.get("head_to_head") and head_to_head_in(meta["head_to_head"], name)  # the configuration's own
    meta = {**meta, "kernels": kernels, "configuration": configuration, "head_to_head": h2h,
            "headline": [h for h in meta.get("headline") or [] if h in set(of.values())],
            "case": {**meta["case"], "D": configuration.get("D", meta["case"]["D"])}}  # the case at its D

    def mine(table):
        if table is None:
            return None
        table = table[table.config == name]
        return table.assign(**{c: table[c].map(lambda n: of.get(n, n)) for c in ("kernel", "version", "rival")
                               if c in table.columns})

    return mine(summary), meta, {key: mine(table) for key, table in tables.items()}


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


# ---- resources.csv, profile.csv, head_to_head.csv and cycles.csv, each checked beside kernels.json ------
#
# Like summary.csv (validation.summary_problem), each is checked row by row (every figure a number in
# its range, agreeing with those it is worked out from) and as a whole against what kernels.json says
# was run: no row of something that was not run, none twice, none missing (a table cut to its header
# included). A problem is `line <n> (<the row>): <what is wrong>`, n the CSV line (the header is line
# 1); a missing row is named by the line it would be at.

REGISTERS = (1, 255)  # per thread: what ptxas may give a thread
THREADS_PER_BLOCK = 1024


class _Refused(Exception):
    """What is wrong with a row (raised by the readers of its cells, said with the row's line)."""


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
    if nan_as_none(raw) is None:
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
    raise _Refused(f"no {column}" if nan_as_none(raw) is None else f"{column} {raw!r} is neither True nor False")


def _text(row: dict, column: str) -> str:
    raw = row[column]
    if not isinstance(raw, str) or not raw:
        raise _Refused(f"no {column}" if nan_as_none(raw) is None else f"{column} {raw!r} is not a name")
    return raw


def _shape_of(row: dict) -> dict:
    return {d: _within(row, d, 1, whole=True) for d in "BHSD"}


def _is_case(row: dict, shape: dict, case: dict) -> None:
    if _flag(row, "is_case") != (shape == case):
        raise _Refused(f"is_case {row['is_case']}, but {str(Shape(**shape))} is{'' if shape == case else ' not'} "
                       "the case")


def _where(shape: dict, case: dict) -> str:
    return "the case" if shape == case else f"S={shape['S']}"


def _rows(table):
    """Each row of a table, with its CSV line (the header is line 1; a configuration's view keeps the
    lines of its rows)."""
    return ((i + 2, row) for i, row in zip(table.index, table.to_dict("records")))


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
            before = [line for k, line in present.items() if rank.get(k, len(order)) < rank[key]]
            line = max(before) + 1 if before else min(present.values(), default=2)
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


def _counted(entry: dict | None) -> bool:
    """Whether ncu counted a kernel or peer's cycles: what its count record said, in kernels.json
    (archives summarized before it said so hold no count: counted wherever it passed its check)."""
    return ((entry or {}).get("count") or {}).get("counted", True)


def _passed(entry: dict, what: str) -> None:
    if not entry.get("check_passed"):
        raise _Refused(f"kernels.json says {entry['name']} did not pass its check: it is never {what}")


def head_to_head_points(meta: dict) -> list[dict]:
    """The head-to-head's points, in table order: the case, then the sweep's other lengths by S (in a
    configuration's view, those its head_to_head settings name, where they do)."""
    case, asked = meta["case"], (meta.get("head_to_head") or {}).get("S")
    lengths = sorted(S for S in (meta.get("sweep") or {}).get("S", []) if S != case["S"] and (asked is None or S in asked))
    return [case, *({**case, "S": S} for S in lengths)]


def contestants(meta: dict) -> list[str]:
    """The headline versions, then the head-to-head's rivals (in a run that had one): what is counted
    at every point of the head-to-head (config.Settings.contestants)."""
    return [*(meta.get("headline") or []), *((meta.get("head_to_head") or {}).get("rivals") or [])]


def head_to_head_problem(table, meta: dict, summary) -> str | None:
    """What is wrong with head_to_head.csv read back beside kernels.json (`meta`, of a run with a
    head-to-head) and summary.csv, or None. A row: a headline version against one of its rivals (the
    later headline versions, then config's rivals) at a point of the head-to-head, both having passed
    their checks; its ratio and interval positive and finite, the ratio inside the interval, its
    verdict the one the interval and the band (level_within) give, its rounds the configured ones,
    the graph fair to both sides (only back-to-back calls can time the CPU's dispatch). And one row,
    no more, for each version, rival and method the configuration times (config.methods) at every
    point where both were run."""
    from .config import methods
    from .headtohead import design_rounds, verdict

    settings, headline, case = meta["head_to_head"], meta.get("headline") or [], meta["case"]
    timed = methods(settings)
    rivals_of = {v: [*headline[i + 1:], *settings["rivals"]] for i, v in enumerate(headline)}
    points, band = head_to_head_points(meta), settings["level_within"]
    seen, timed_at = {}, {}  # each point's contestants, as its rows name them: its rounds are their designs'
    for row in table.to_dict("records"):
        named = {row.get("version"), row.get("rival")} & {*headline, *settings["rivals"]}
        timed_at.setdefault(tuple(row.get(d) for d in "BHSD"), set()).update(named)
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
            if method not in timed:
                raise _Refused(f"method {method!r} is not one the head-to-head timed here ({', '.join(timed)})")
            for name in (version, rival):
                _passed(_known(meta, name), "in the head-to-head")
            if shape not in points:
                raise _Refused(f"{str(Shape(**shape))} is not a point of the head-to-head (the case, then the sweep's "
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
            contestants = len(timed_at[tuple(shape[d] for d in "BHSD")])
            if _within(row, "rounds", 1, whole=True) != (ran := design_rounds(settings["rounds"], contestants)):
                raise _Refused(f"rounds {row['rounds']}, but the head-to-head ran {ran} (at least {settings['rounds']}, "
                               f"in whole balanced designs of its {contestants} contestants)")
            if not _flag(row, "fair") and method == "graph":
                raise _Refused("fair False by graph: only back-to-back calls can time the CPU's dispatch")
            for side in ("version", "rival"):
                _positive(row, f"{side}_tflops")
                for figure in ("sm_clock_mhz", "joules_per_call", "tflops_per_watt", "sustained_tflops"):
                    _positive(row, f"{side}_{figure}", may_be_empty=True)  # no clock samples, no energy counter
        except _Refused as e:
            return f"{where}: {e}"
    entries, refusals = _entries(meta), _sweep_refusals(summary)
    order = [(i, v, r, m) for i, p in enumerate(points) for v in headline for r in rivals_of[v] for m in timed
             if _runs_at(entries.get(v), p, refusals) and _runs_at(entries.get(r), p, refusals)]
    return _missing(order, seen, lambda k: f"{k[1]} against {k[2]} by {k[3]} at {_where(points[k[0]], case)}, "
                                           "where kernels.json says both were run")


def cycles_problem(table, meta: dict, summary) -> str | None:
    """What is wrong with cycles.csv read back beside kernels.json (`meta`, of a run that counted
    cycles) and summary.csv, or None. A row: a kernel or peer that passed its check, at the case or
    (a contestant of the head-to-head) at one of its points; its cycles (median, least, most)
    positive and finite and in that order, over the configured launches; its efficiency per cycle in
    (0, 1] and what its cycles come to on the GPU's SMs; a headline version's also at the sweep's ragged
    lengths where the run asked (cycles.ragged). And one row, no more, for each kernel and peer counted
    at each of its shapes (none where the run counted none: cycles_note)."""
    from .cycles import efficiency_per_cycle

    case, points = meta["case"], head_to_head_points(meta)
    paired, note, launches = contestants(meta), meta.get("cycles_note"), meta["cycles"]["launches"]
    ragged = [{**case, "S": S} for S in (meta.get("sweep") or {}).get("ragged", [])
              if meta["cycles"].get("ragged")]  # the headline's, where the run asked
    shapes_of = {k["name"]: [*points, *(ragged if k["name"] in (meta.get("headline") or []) else [])]
                 if k["name"] in paired else [case] for k in meta["kernels"]}
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
            if not _counted(entry):
                raise _Refused(f"kernels.json says {name} was not counted ({entry['count']['reason']})")
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
                worked_out = efficiency_per_cycle(Shape(**shape), cycles, next(iter(sm_counts)), entry.get("causal", False))
                if not math.isclose(efficiency, worked_out, rel_tol=AGREEMENT):
                    raise _Refused(f"efficiency_per_cycle {row['efficiency_per_cycle']} is not what {cycles:g} cycles "
                                   f"on {next(iter(sm_counts))} SMs come to ({worked_out:.6g})")
        except _Refused as e:
            return f"{where}: {e}"
    entries, refusals = _entries(meta), _sweep_refusals(summary)
    order = [(i, j) for i, name in enumerate(names) if not note and _counted(entries[name])
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
            limits = LIMITS.get(arch.removesuffix("a"))
            if limits is None:
                raise _Refused(f"{arch} is an architecture without known limits ({', '.join(LIMITS)})")
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
            allowed = blocks_per_sm(arch, threads, registers, smem)
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
