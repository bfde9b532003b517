"""The Hopper line (the sm_90a versions after V13): its own report beside the chapter's, from the same
results. Each step's change and gain, its place against the peers at the case and over S, the
profiler's readings, and the line's goal judged from the data: its best version at or above torch
SDPA held to cuDNN and SDPA's automatic dispatch, measured in the same run, at the case and at every
S from GOAL_MIN_S up."""
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


def context(summary: pd.DataFrame, resources: pd.DataFrame, profile: pd.DataFrame, meta: dict) -> dict:
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
    goal_points = [("case", case)] + [(f"S={s}", sweep[sweep.S == s]) for s in lengths if s >= GOAL_MIN_S]

    def ratios(name: str, column: str) -> list[dict]:
        out = []
        for label, frame in goal_points:
            mine = tflops_of(frame, name, column)
            best_rival = max((t for p in rivals.values() if (t := tflops_of(frame, p, column))), default=None)
            out.append({"where": label, "tflops": mine, "rival": best_rival,
                        "ratio": mine / best_rival if mine and best_rival else None})
        return out

    measured = [s["name"] for s in steps if s["tflops"]]
    verdicts = {n: ratios(n, "tflops") for n in measured}
    # judged where every point has both figures: a missing rival or timing leaves the goal unjudged
    complete = [n for n in measured if all(r["ratio"] is not None for r in verdicts[n])]
    best = max(complete, key=lambda n: min(r["ratio"] for r in verdicts[n]), default=None)
    worst_ratio = min(r["ratio"] for r in verdicts[best]) if best else None
    graph = ratios(best, "tflops_graph") if best else []
    graph_ratios = [r["ratio"] for r in graph]
    graph_worst = min(graph_ratios) if graph_ratios and None not in graph_ratios else None

    order = [k["name"] for k in line] + [n for n in chapter_versions[-1:]] + peers
    table = sweep[sweep.kernel.isin(order)]
    by_s = {}
    for column in ("tflops", "tflops_graph"):
        pivot = table.pivot_table(index="kernel", columns="S", values=column) if not table.empty else pd.DataFrame()
        pivot = pivot.reindex([n for n in order if n in pivot.index])
        by_s[column] = [{"name": n, "tflops": [None if pd.isna(v) else float(v) for v in row]}
                        for n, row in zip(pivot.index, pivot.itertuples(index=False))]

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
        "goal": {"best": best, "points": verdicts.get(best, []), "graph": graph, "worst_ratio": worst_ratio,
                 "graph_worst_ratio": graph_worst, "reached_by_graph": graph_worst is not None and graph_worst >= 1.0,
                 "reached": worst_ratio is not None and worst_ratio >= 1.0,
                 "stretch": worst_ratio is not None and worst_ratio >= STRETCH, "min_s": GOAL_MIN_S},
        "not_run": [k for k in line if not k.get("check_passed")],
        "order": order,
    }
