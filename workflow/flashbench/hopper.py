"""The Hopper line (the sm_90a versions after V13): its own report beside the chapter's, from the same
results. Each step's change and gain, its place against the peers at the case and over S, the
profiler's readings, and the line's goal judged from the head-to-head (head_to_head.csv): its best
version at or above torch SDPA held to cuDNN and SDPA's automatic dispatch at the case and at every
S from GOAL_MIN_S up, each verdict from the interval of the paired ratios; beside them its verdicts
against every other rival (FlashAttention's own kernel) and the cycle counts (cycles.csv)."""
from __future__ import annotations

import pandas as pd

from .summary import case_rows

LINE = "hopper"
GOAL_MIN_S = 4096
STRETCH = 1.1
RIVALS = ("cudnn", "auto")  # the peers' backends the goal names
SHOWN_STALLS = 3


def tflops_of(frame: pd.DataFrame, name: str, column: str = "tflops") -> float | None:
    """`name`'s figure (`column`) in `frame` (case rows, or one length of the sweep), or None."""
    row = frame[frame.kernel == name]
    return float(row.iloc[0][column]) if len(row) and pd.notna(row.iloc[0][column]) else None


def _where(row) -> str:
    return "case" if row.is_case else f"S={int(row.S)}"


def _comparison(row) -> dict:
    return {"ratio": float(row.ratio), "ci_low": float(row.ci_low), "ci_high": float(row.ci_high),
            "verdict": row.verdict, "fair": bool(row.fair), "version_tflops": float(row.version_tflops),
            "rival_tflops": float(row.rival_tflops), "version_tflops_per_watt": _float(row.version_tflops_per_watt),
            "rival_tflops_per_watt": _float(row.rival_tflops_per_watt),
            "version_joules_per_call": _float(row.version_joules_per_call),
            "rival_joules_per_call": _float(row.rival_joules_per_call)}


def _float(x) -> float | None:
    return None if pd.isna(x) else float(x)


def paired_goal(table: pd.DataFrame | None, meta: dict) -> dict | None:
    """The goal from the head-to-head: per rival and point, the best headline version's paired ratio,
    interval and verdict by CUDA graph and back to back. The goal is reached where no fair verdict
    against the goal's rivals is "behind" at the case and at every S >= GOAL_MIN_S."""
    headline = meta.get("headline") or []
    if table is None or table.empty or not headline:
        return None
    best = headline[0]
    peers = {k["name"]: k for k in meta["kernels"] if k["kind"] == "peer"}
    goal_rivals = [n for n, k in peers.items() if k.get("backend") in RIVALS]
    mine = table[(table.version == best) & ~table.rival.isin(headline)]  # its predecessors: a table of their own
    rivals = list(dict.fromkeys(mine.rival))
    points = []
    for (is_case, S), at in mine.groupby(["is_case", "S"], sort=False):
        for rival in rivals:
            pair = {m: _comparison(r) for r in at[at.rival == rival].itertuples() for m in [r.method]}
            if pair:
                row = next(iter(at.itertuples()))
                points.append({"where": _where(row), "S": int(S), "is_case": bool(is_case), "rival": rival,
                               "in_goal": rival in goal_rivals and (is_case or S >= GOAL_MIN_S), **pair})
    judged = [(p, m) for p in points if p["in_goal"] for m in ("graph", "step") if m in p and p[m]["fair"]]
    behind = [f"{p['rival']} at {p['where']} ({m})" for p, m in judged if p[m]["verdict"] == "behind"]
    goal_points = {(p["where"], p["rival"]) for p in points if p["in_goal"]}
    complete = len(goal_points) == len(goal_rivals) * len({p["where"] for p in points
                                                          if p["is_case"] or p["S"] >= GOAL_MIN_S})
    by_rival = {}
    for rival in rivals:
        verdicts = {}
        for p in points:
            if p["rival"] == rival and "graph" in p:
                verdicts.setdefault(p["graph"]["verdict"], []).append(p["where"])
        by_rival[rival] = verdicts
    lows = [p["graph"]["ci_low"] for p in points if p["in_goal"] and "graph" in p]
    return {"best": best, "rivals": rivals, "goal_rivals": goal_rivals, "points": points, "by_rival": by_rival,
            "behind": behind, "complete": complete and bool(judged),
            "reached": complete and bool(judged) and not behind,
            "stretch": bool(lows) and complete and min(lows) >= STRETCH,
            "level_within": (meta.get("head_to_head") or {}).get("level_within"),
            "rounds": (meta.get("head_to_head") or {}).get("rounds"),
            "confidence": (meta.get("head_to_head") or {}).get("confidence"),
            "predecessors": [{"where": _where(r), "rival": r.rival, "method": r.method, **_comparison(r)}
                             for r in table[(table.version == best) & table.rival.isin(headline[1:])].itertuples()]}


def cycle_counts(table: pd.DataFrame | None, meta: dict) -> dict | None:
    """The cycles of everything at the case, and of the head-to-head's contestants at every length."""
    if table is None or table.empty:
        return None
    headline = meta.get("headline") or []
    contestants = headline + list((meta.get("head_to_head") or {}).get("rivals", []))
    order = [k["name"] for k in meta["kernels"]]
    case = table[table.is_case].set_index("kernel").reindex([n for n in order if n in set(table.kernel)])
    at_case = [{"kernel": n, "cycles": float(r.cycles), "spread": float((r.cycles_max - r.cycles_min) / r.cycles),
                "efficiency": float(r.efficiency_per_cycle), "tensor_pipe_pct": float(r.tensor_pipe_pct),
                "kernels_per_call": int(r.kernels_per_call)}
               for n, r in case.dropna(subset=["cycles"]).iterrows()]
    lengths = sorted(int(s) for s in table[table.kernel.isin(contestants)].S.unique())
    by_s = []
    for name in [c for c in contestants if c in set(table.kernel)]:
        mine = table[table.kernel == name]
        cells = {int(r.S): r for r in mine.itertuples()}
        by_s.append({"kernel": name, "cycles": [float(cells[s].cycles) if s in cells else None for s in lengths],
                     "efficiency": [float(cells[s].efficiency_per_cycle) if s in cells else None for s in lengths]})
    best = headline[0] if headline else None
    ratios = []
    if best in set(table.kernel):
        mine = {int(r.S): float(r.cycles) for r in table[table.kernel == best].itertuples()}
        for rival in contestants[1:]:
            theirs = {int(r.S): float(r.cycles) for r in table[table.kernel == rival].itertuples()}
            ratios.append({"rival": rival, "ratios": [theirs[s] / mine[s] if s in mine and s in theirs else None
                                                      for s in lengths]})
    return {"at_case": at_case, "lengths": lengths, "by_s": by_s, "best": best, "ratios": ratios}


def context(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict,
            head_to_head: pd.DataFrame | None = None, cycles: pd.DataFrame | None = None) -> dict:
    kernels = meta["kernels"]
    line = [k for k in kernels if k.get("line") == LINE]
    chapter_versions = [k["name"] for k in kernels if k.get("line", "g3") == "g3" and k["kind"] == "version"]
    rivals = {k["backend"]: k["name"] for k in kernels if k["kind"] == "peer" and k.get("backend") in RIVALS}
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
    by_s = {}
    for column in ("tflops", "tflops_graph"):
        pivot = table.pivot_table(index="kernel", columns="S", values=column) if not table.empty else pd.DataFrame()
        pivot = pivot.reindex([n for n in order if n in pivot.index])
        by_s[column] = [{"name": n, "tflops": [None if pd.isna(v) else float(v) for v in row]}
                        for n, row in zip(pivot.index, pivot.itertuples(index=False))]

    head_to_head_goal = paired_goal(head_to_head, meta)
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
            readings.append({"kernel": name, **{m: (None if pd.isna(r[m]) else float(r[m])) for m in
                                                ("duration_us", "tensor_pipe_pct", "issue_active_pct", "eligible_warps",
                                                 "registers", "achieved_occupancy_pct")},
                             "stalls": [(c.removeprefix("stall_"), float(r[c])) for c in top]})
    return {
        "line": line, "steps": steps, "rivals": rivals, "lengths": lengths, "sweep": by_s, "readings": readings,
        "min_s": GOAL_MIN_S,
        "not_run": [k for k in line if not k.get("check_passed")],
        "order": order,
        "paired": head_to_head_goal,
        "cycles": cycle_counts(cycles, meta),
        "dispatch_bound": dispatch_bound,
    }
