"""The Hopper line (the sm_90a versions after V13): its own report beside the chapter's, from the same
results. Each step's change and gain, its place against the peers at the case and over S, the
profiler's readings, and the line's goal (config's `goal`) judged from the head-to-head
(head_to_head.csv): its best version at or above torch SDPA held to the goal's rivals (cuDNN and
SDPA's automatic dispatch) at the case and at every S from the goal's min_s up, each verdict from the
interval of the paired ratios; beside them its verdicts against every other rival (FlashAttention's
own kernel) and the cycle counts (cycles.csv); and the next goal, past FlashAttention-3: given
factors over rivals (cuDNN and FlashAttention's kernel) by both the head-to-head and the cycles, and
given efficiencies per cycle."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from .archive_tables import by_s, nan_as_none, sweep_rows
from .archive_tables import contestants as archive_contestants
from .chapter_report import correctness
from .config import Goal, Shape, pair_timing, pairs_in, ragged_near
from .figures import sweep_figure, tflops_figure
from .files import write_text
from .gpu import commits
from .headtohead import ragged_comparison
from .summary import case_rows
from .templates import fill

FIGURES = {"tflops": "hopper_tflops.png", "sweep": "hopper_sweep.png"}
WRITTEN = ("hopper.md", *FIGURES.values())  # what render writes
TEMPLATE = "hopper.md.j2"  # beside the chapter's template
LINE = "hopper"
SHOWN_STALLS = 3


def line_best(meta: dict) -> str | None:
    """The line's best version: the first of config's `headline`, None in a run without one."""
    return (meta.get("headline") or [None])[0]


def tflops_of(frame: pd.DataFrame, name: str, column: str = "tflops") -> float | None:
    """`name`'s figure (`column`) in `frame` (case rows, or one length of the sweep), or None."""
    row = frame[frame.kernel == name]
    return nan_as_none(row.iloc[0][column]) if len(row) else None


def _where(is_case: bool, S: int) -> str:
    return "case" if is_case else f"S={int(S)}"


COMPARED = ("ratio", "ci_low", "ci_high", "verdict", "fair", "version_tflops", "rival_tflops",
            "version_tflops_per_watt", "rival_tflops_per_watt", "version_joules_per_call", "rival_joules_per_call",
            "version_sustained_tflops", "rival_sustained_tflops")


def _comparison(row) -> dict:
    """One row of head_to_head.csv as the template reads it (NaN, as where no energy was read: None)."""
    return {key: nan_as_none(value) for key, value in row._asdict().items() if key in COMPARED}


def cycles_over(cycles: pd.DataFrame, version: str) -> pd.DataFrame | None:
    """Each kernel's cycle count over `version`'s, at each S (kernel x S; NaN where either was not
    counted there), or None where `version` was not counted at all."""
    counts = by_s(cycles, "cycles")
    return counts.div(counts.loc[version], axis=1) if version in counts.index else None


def _cell(frame: pd.DataFrame | None, row, column) -> float | None:
    if frame is None or row not in frame.index or column not in frame.columns:
        return None
    return nan_as_none(frame.at[row, column])


def goal_verdicts(table: pd.DataFrame | None, meta: dict, goal: Goal, cycles: pd.DataFrame | None = None
                  ) -> dict | None:
    """The goal judged from the head-to-head: per rival and point, the best headline version's paired
    ratio, interval and verdict by CUDA graph and, where the point timed it, back to back, and beside
    them the rival's cycles
    over the version's where both were counted there. The goal is reached where no fair verdict
    against the goal's rivals is "behind" at the case and at every S >= goal.min_s."""
    best = line_best(meta)
    if table is None or table.empty or best is None:
        return None
    headline, settings = meta["headline"], meta.get("head_to_head") or {}
    goal_rivals = [k["name"] for k in meta["kernels"]
                   if k["kind"] == "peer" and k.get("backend") in goal.rivals]
    mine = table[table.version == best]
    against = mine[~mine.rival.isin(headline)]  # its predecessors: a table of their own
    over = cycles_over(cycles, best) if cycles is not None else None
    points = []  # in the table's order: the case first, then by S
    for (is_case, S, rival), pair in against.groupby(["is_case", "S", "rival"], sort=False):
        points.append({"where": _where(is_case, S), "S": int(S), "is_case": bool(is_case), "rival": rival,
                       "in_goal": rival in goal_rivals and (is_case or S >= goal.min_s),
                       "cycles_ratio": _cell(over, rival, S), **{r.method: _comparison(r) for r in pair.itertuples()}})
    in_goal = [p for p in points if p["in_goal"]]
    goal_wheres = {p["where"] for p in points if p["is_case"] or p["S"] >= goal.min_s}
    complete = bool(in_goal) and {(p["where"], p["rival"]) for p in in_goal} == {
        (w, r) for w in goal_wheres for r in goal_rivals}
    behind = [f"{p['rival']} at {p['where']} ({m})" for p in in_goal for m in ("graph", "step")
              if m in p and p[m]["fair"] and p[m]["verdict"] == "behind"]
    by_rival = {}  # each rival, as the points first name it: its points by verdict
    for p in points:
        by_rival.setdefault(p["rival"], {}).setdefault(p["graph"]["verdict"], []).append(p["where"])
    return {"best": best, "goal_rivals": goal_rivals, "points": points, "by_rival": by_rival,
            "back_to_back": any("step" in p for p in points),
            "behind": behind, "complete": complete, "reached": complete and not behind,
            "stretch": complete and min(p["graph"]["ci_low"] for p in in_goal) >= goal.stretch,
            **{key: settings.get(key) for key in ("level_within", "confidence")},
            "rounds": sorted({int(r) for r in mine["rounds"]}),  # whole designs: per point, by its contestants
            "predecessors": [{"where": _where(r.is_case, r.S), "rival": r.rival, "method": r.method, **_comparison(r)}
                             for r in mine[mine.rival.isin(headline[1:])].itertuples()]}


def next_goal(verdicts: dict | None, cycles: pd.DataFrame | None, meta: dict, goal: Goal,
              reference: pd.DataFrame | None = None) -> dict | None:
    """The next goal (goal.next): for each of its rivals at the case and at each S from its min_s, the
    best version's interval's lower end by graph and the rival's cycles over its, against the factor;
    the best version's efficiency per cycle at the case (where asked: efficiency_case not None) and
    from its long_s up (where asked); and where goal.next.cycles_of asks, its cycles over those of the
    other configuration's best version (`reference`: that one's rows of its cycles table) at the case and
    at each S from min_s. Judged where every such point and count is there. Without a head-to-head (a
    configuration whose rivals are none) at the lengths the best version was counted at, but its ragged
    ones; None without its cycle counts."""
    best = verdicts["best"] if verdicts else line_best(meta)
    mine = cycles[cycles.kernel == best] if cycles is not None and best else None
    if mine is None or mine.empty:
        return None
    peers = {k["name"]: k.get("backend") for k in meta["kernels"] if k["kind"] == "peer"}
    factor = {name: goal.next.factors[backend] for name, backend in peers.items() if backend in goal.next.factors}
    no_peer = [backend for backend in goal.next.factors if backend not in peers.values()]
    ragged = set((meta.get("sweep") or {}).get("ragged", []))
    points = verdicts["points"] if verdicts else [{"where": _where(r.is_case, r.S), "S": int(r.S), "is_case": bool(r.is_case)}
                                                  for r in mine.itertuples() if r.is_case or int(r.S) not in ragged]
    ratios = [{"where": p["where"], "rival": p["rival"], "factor": factor[p["rival"]], "graph_low": p["graph"]["ci_low"],
               "cycles": p["cycles_ratio"]}
              for p in points if p.get("rival") in factor and (p["is_case"] or p["S"] >= goal.next.min_s)]
    for r in ratios:
        r["met"] = r["cycles"] is not None and min(r["graph_low"], r["cycles"]) >= r["factor"]
    efficiency = [{"where": _where(r.is_case, r.S), "efficiency": float(r.efficiency_per_cycle),
                   "floor": goal.next.efficiency_case if r.is_case else goal.next.efficiency_long}
                  for r in mine.itertuples() if (r.is_case and goal.next.efficiency_case is not None)
                  or (not r.is_case and r.S >= goal.next.long_s and goal.next.efficiency_long is not None)]
    for e in efficiency:
        e["met"] = e["efficiency"] >= e["floor"]
    wheres = list(dict.fromkeys(p["where"] for p in points if p["is_case"] or p["S"] >= goal.next.min_s))
    against = _cycles_against(mine, reference, wheres, goal.next.cycles_of)
    missing = _next_goal_missing(wheres, factor, ratios, efficiency, goal.next)
    missing += [f"{a['lacks']}'s cycles at {a['where']}" for a in against if a["ratio"] is None]
    missing += [f"a peer of the {backend} backend (none runs in this configuration)" for backend in no_peer]
    complete = not missing
    misses = [f"{r['rival']} at {r['where']}" for r in ratios if not r["met"]]
    misses += [f"{100 * e['efficiency']:.1f}% per cycle at {e['where']}" for e in efficiency if not e["met"]]
    misses += [f"{a['ratio']:.3f}x {goal.next.cycles_of['configuration']}'s cycles at {a['where']}" for a in against
               if a["ratio"] is not None and not a["met"]]
    return {"best": best, "ratios": ratios, "efficiency": efficiency, "cycles_of": against,
            "complete": complete, "reached": complete and not misses, "misses": misses, "missing": missing,
            "factors": factor}


def _cycles_against(mine: pd.DataFrame, reference: pd.DataFrame | None, wheres: list[str], asked: dict | None
                    ) -> list[dict]:
    """Where goal.next.cycles_of asks: at each of `wheres` (the head-to-head's points it judges), the best
    version's cycles over the reference configuration's best version's, and whether at most 1 + within;
    the ratio None, and what lacks a count there named (`lacks`), where either was not counted."""
    if not asked:
        return []
    counts = {"best version": {_where(r.is_case, r.S): float(r.cycles) for r in mine.itertuples()},
              asked["configuration"]: {} if reference is None else
              {_where(r.is_case, r.S): float(r.cycles) for r in reference.itertuples()}}
    out = []
    for where in wheres:
        lacks = [who for who, count in counts.items() if where not in count]
        ratio = None if lacks else counts["best version"][where] / counts[asked["configuration"]][where]
        out.append({"where": where, "ratio": ratio, "within": asked["within"], "lacks": " and ".join(lacks) or None,
                    "met": ratio is not None and ratio <= 1 + asked["within"]})
    return out


def _next_goal_missing(wheres: list[str], factor: dict, ratios: list[dict], efficiency: list[dict], asked
                       ) -> list[str]:
    """What the next goal needs and the run lacks, in words: a rival with no head-to-head point at all
    (not installed, say), or the points, cycle counts and efficiencies that are missing."""
    have = {(r["where"], r["rival"]) for r in ratios}
    missing = []
    for rival in factor:
        absent = [w for w in wheres if (w, rival) not in have]
        if absent and len(absent) == len(wheres):
            missing.append(f"{rival} (not in this run's head-to-head)")
        else:
            missing += [f"{rival} at {w}" for w in absent]
    missing += [f"{r['rival']}'s cycles at {r['where']}" for r in ratios if r["cycles"] is None]
    if asked.efficiency_case is not None and not any(e["where"] == "case" for e in efficiency):
        missing.append("the best version's cycles at the case")
    if asked.efficiency_long is not None and all(e["where"] == "case" for e in efficiency):
        missing.append(f"the best version's cycles at S >= {asked.long_s}")
    return missing


def ragged_point(sweep: pd.DataFrame, meta: dict, best: str, S: int, goal: Goal,
                 cycles: pd.DataFrame | None = None) -> dict:
    """The line's best at a ragged S against the next multiple of 128: its TFLOPS there over its TFLOPS
    at that multiple (each counts its own FLOPs), paired where the sweep paired them (the best's
    `ragged` in kernels.json: headtohead.ragged_comparison), and the sweep's own two figures by CUDA
    graph, taken minutes apart; by cycles, its efficiency per cycle there over that at the multiple,
    where both were counted (cycles.ragged). Judged against goal.ragged_within by the paired
    interval's lower end alone, in a configuration that pairs (`asked`: config.pairs_in): the unpaired
    figures are no basis for a few percent."""
    near = ragged_near(S)
    mine = sweep[sweep.kernel == best]
    at, there = (tflops_of(mine[mine.S == length], best, "tflops_graph") for length in (S, near))
    entry = next((k for k in meta["kernels"] if k["name"] == best), {})
    pair = next((p for p in entry.get("ragged") or [] if p["S"] == S), None)
    h2h = meta.get("head_to_head") or {}
    paired = (ragged_comparison(pair, Shape(**meta["case"]), h2h["confidence"], h2h["resamples"])
              if pair and h2h else None)
    counted = {} if cycles is None else {int(r.S): float(r.efficiency_per_cycle)
                                         for r in cycles[cycles.kernel == best].itertuples() if r.S in (S, near)}
    within = goal.ragged_within
    configuration = (meta.get("configuration") or {}).get("name")
    asked = configuration is None or pairs_in(meta.get("sweep"), configuration)
    return {"kernel": best, "S": S, "near": near, "tflops": at, "near_tflops": there, "asked": asked,
            "unpaired_ratio": float(at / there) if at and there else None, "paired": paired,
            "timing": pair_timing(meta.get("sweep"), h2h) if paired else None,
            "cycles_ratio": counted[S] / counted[near] if len(counted) == 2 else None,
            "within": within,
            "met": None if paired is None or within is None or not asked else bool(paired["ci_low"] >= 1 - within)}


def cycle_counts(table: pd.DataFrame | None, meta: dict) -> dict | None:
    """The cycles of everything at the case, and of the head-to-head's contestants at every length."""
    if table is None or table.empty:
        return None
    contestants = [n for n in archive_contestants(meta) if n in set(table.kernel)]
    at_case = [{"kernel": r.kernel, "cycles": float(r.cycles), "spread": float((r.cycles_max - r.cycles_min) / r.cycles),
                "efficiency": float(r.efficiency_per_cycle), "tensor_pipe_pct": float(r.tensor_pipe_pct),
                "kernels_per_call": int(r.kernels_per_call)}
               for r in table[table.is_case].itertuples()]  # the table is in table order
    over_s = table[table.kernel.isin(contestants)]
    lengths = sorted(int(s) for s in over_s.S.unique())
    cycles, efficiency = (by_s(over_s, column, contestants, lengths) for column in ("cycles", "efficiency_per_cycle"))
    best = contestants[0] if contestants and contestants[0] == line_best(meta) else None
    over = cycles_over(over_s, best).reindex(index=contestants, columns=lengths) if best else None
    return {"at_case": at_case, "lengths": lengths, "best": best,
            "by_s": [{"kernel": n, "cycles": _cells(cycles.loc[n]), "efficiency": _cells(efficiency.loc[n])}
                     for n in contestants],
            "ratios": [{"rival": n, "ratios": _cells(over.loc[n])} for n in contestants[1:]] if best else []}


def _cells(row: pd.Series) -> list:
    return [nan_as_none(x) for x in row]


def context(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict, goal: Goal,
            head_to_head: pd.DataFrame | None = None, cycles: pd.DataFrame | None = None,
            reference: pd.DataFrame | None = None) -> dict:
    """What hopper.md's part of one configuration shows; `reference`: the cycle counts of the best version
    of the configuration goal.next.cycles_of names (next_goal)."""
    kernels = meta["kernels"]
    line = [k for k in kernels if k.get("line") == LINE]
    chapter_versions = [k["name"] for k in kernels if k.get("line", "g3") == "g3" and k["kind"] == "version"]
    rivals = {k["backend"]: k["name"] for k in kernels if k["kind"] == "peer" and k.get("backend") in goal.rivals}
    peers = [k["name"] for k in kernels if k["kind"] == "peer"]
    case = case_rows(summary)
    sweep = summary[summary.series == "sweep"]

    steps, previous = [], chapter_versions[-1] if chapter_versions else None
    for k in line:
        name = k["name"]
        now, before = tflops_of(case, name), tflops_of(case, previous) if previous else None
        res = resources[(resources.kernel == name)]
        res = res.iloc[0].to_dict() if len(res) else {}
        vs = {backend: (now / t if now and (t := tflops_of(case, peer)) else None) for backend, peer in rivals.items()}
        steps.append({**k, "tflops": now, "tflops_median": tflops_of(case, name, "tflops_median"),
                      "tflops_graph": tflops_of(case, name, "tflops_graph"), "previous": previous,
                      "throttled": bool((case[case.kernel == name].throttled == True).any()),  # noqa: E712
                      "gain": now / before if now and before else None, "vs": vs, "resources": res})
        if now:
            previous = name

    lengths = sorted(int(s) for s in sweep.S.unique()) if not sweep.empty else []
    order = [k["name"] for k in line] + [n for n in chapter_versions[-1:]] + peers
    table = sweep[sweep.kernel.isin(order)]
    by_length = {column: sweep_rows(by_s(table.dropna(subset=[column]), column, order))  # the kernels with a figure
                 for column in ("tflops", "tflops_graph")}

    verdicts = goal_verdicts(head_to_head, meta, goal, cycles)
    best = line_best(meta)
    ragged = [ragged_point(sweep, meta, best, S, goal, cycles) for S in (meta.get("sweep") or {}).get("ragged", [])] if best else []
    # the step method's figures that timed the CPU's dispatch rather than the kernel: (name, S)
    flagged = sweep[sweep.kernel.isin(order) & (sweep.dispatch_bound == True)]  # noqa: E712  (NaN: not timed)
    dispatch_bound = sorted({(n, int(s)) for n, s in zip(flagged.kernel, flagged.S)})

    stall_columns = [c for c in profile.columns if c.startswith("stall_") and c != "stall_selected"]
    readings = []
    for name in [k["name"] for k in line] + chapter_versions[-1:]:
        p = profile[profile.kernel == name]
        if len(p):
            r = p.iloc[0]
            top = sorted(stall_columns, key=lambda c: -(r[c] if pd.notna(r[c]) else 0))[:SHOWN_STALLS]
            readings.append({"kernel": name, **{m: nan_as_none(r[m]) for m in
                                                ("duration_us", "tensor_pipe_pct", "issue_active_pct", "eligible_warps",
                                                 "registers", "achieved_occupancy_pct")},
                             "stalls": [(c.removeprefix("stall_"), float(r[c])) for c in top]})
    h2h = meta.get("head_to_head") or {}
    peer_names = {k["name"] for k in kernels if k["kind"] == "peer"}
    return {
        # a head-to-head is configured, but none of its rivals runs here: the line's best counted alone
        "unraced": bool(h2h) and not peer_names & set(h2h.get("rivals", [])),
        "line": line, "steps": steps, "rivals": rivals, "lengths": lengths, "sweep": by_length, "readings": readings,
        "goal": goal,
        "not_run": [k for k in line if not k.get("check_passed")],
        "order": order,
        "goal_verdicts": verdicts,
        "next_goal": next_goal(verdicts, cycles, meta, goal, reference),
        "cycles": cycle_counts(cycles, meta),
        "dispatch_bound": dispatch_bound,
        "ragged": ragged,
    }


def render(views: list[tuple[pd.DataFrame, dict, dict]], goal: Goal, template: Path, report_dir: Path, slug: str,
           gpu_name: str) -> None:
    """hopper.md and its figures into `report_dir`, a part per configuration from the archive's view of
    it (archive_tables.view: its summary, kernels.json and the tables resources, profile, head_to_head
    and cycles), each judged against `goal`, and the goals of every configuration in one table at
    the end; the figures, in the first part, hold every configuration (a group of bars in the second
    panel of the bars, a panel against S each).
    `gpu_name` as the chapter's report gives it."""
    parts, goals, figures = [], [], []
    first_runs = [k["name"] for k in views[0][1]["kernels"] if k.get("line") == LINE or k["kind"] == "peer"]
    best_counts = {}  # each configuration's best version's cycle counts: what another's may be held to
    for _, meta, tables in views:
        if meta.get("configuration") and tables["cycles"] is not None and (best := line_best(meta)):
            best_counts[meta["configuration"]["name"]] = tables["cycles"][tables["cycles"].kernel == best]
    for i, (summary, meta, tables) in enumerate(views):
        configuration = meta.get("configuration")
        asked = goal.in_configuration(configuration["name"] if configuration else None)
        ctx = context(summary, tables["resources"], tables["profile"], meta, asked,
                      head_to_head=tables["head_to_head"], cycles=tables["cycles"],
                      reference=best_counts.get((asked.next.cycles_of or {}).get("configuration")))
        figures.append(_figure_data(ctx, summary, meta, configuration))
        line = [k["name"] for k in ctx["line"]]
        checked = summary[(summary.series == "check") & summary.kernel.isin(line)]
        here = {k["name"] for k in meta["kernels"]}
        goals.append({"configuration": configuration, "verdicts": ctx["goal_verdicts"], "next_goal": ctx["next_goal"],
                      "ragged": ctx["ragged"], "unraced": ctx["unraced"]})
        parts.append({**ctx, "meta": meta, "configuration": configuration, "first": i == 0,
                      "figures": FIGURES if i == 0 else None, "correctness": correctness(checked, line),
                      "commits": commits([k["provenance"] for k in meta["kernels"] if k.get("provenance")]),
                      # the line's kernels and the peers of the first configuration that do not run in this one
                      "absent": [name for name in first_runs if name not in here]})
    (rows, sweep, emphasized, _), *others = figures
    first = views[0][1].get("configuration")
    tflops_figure(rows, gpu_name, views[0][1]["case"], report_dir / FIGURES["tflops"],
                  tuple((label, r) for r, _, _, label in others), first=first["name"] if first else "")
    sweep_figure(sweep, parts[0]["order"], emphasized, gpu_name, views[0][1]["case"], report_dir / FIGURES["sweep"],
                 tuple((label, w, e) for _, w, e, label in others))
    last = len(parts) - 1
    text = "".join(fill(template, **part, slug=slug, gpu_name=gpu_name, goals=goals if i == last and last else None)
                   for i, part in enumerate(parts))
    write_text(report_dir / "hopper.md", text)


def _figure_data(ctx: dict, summary: pd.DataFrame, meta: dict, configuration: dict | None) -> tuple:
    """What the figures show of one configuration's view (context's `ctx`): its bars' rows, its sweep's
    rows, the lines it emphasizes, and its label (the configuration's name; None for an archive without
    configurations). The sweep's figure labels every configuration's panel but the first's."""
    names = set(ctx["order"])
    kinds = {k["name"]: k["kind"] for k in meta["kernels"]}
    rows = [{"name": n, "kind": kinds[n], "tflops": tflops_of(case_rows(summary), n), "published_tflops": None}
            for n in ctx["order"]]
    sweep = summary[(summary.series == "sweep") & summary.kernel.isin(names)]
    timed = [s["name"] for s in ctx["steps"] if s["tflops"]]
    best = line_best(meta) or (timed[-1] if timed else None)  # a config without `headline`: the last timed
    emphasized = {**({best: "the line's best"} if best else {}),
                  **{n: "the goal's rival" for n in ctx["rivals"].values()}}
    label = None
    if configuration:
        label = configuration["name"] + (" (FLOPs counted as half)" if configuration["mask"] == "causal" else "")
    return rows, sweep, emphasized, label
