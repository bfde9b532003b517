"""The head-to-head: the Hopper line's headline versions against their rivals, paired in one process.

A verdict at the few-percent level cannot come from two timings taken minutes apart on a
power-capped GPU: its clock swings by a fifth within minutes, and each job of the pipeline times at
its own moment of that swing. Here every contestant is timed at one point (a shape) in the same
process, in rounds:

    prepare  each contestant: the same input values, `warmup` untimed calls (a JIT compile happens
             here), as many calls per timing as fill min_timing_ms, their CUDA graph captured once
    rounds   whole balanced designs (balanced_orders), as few as give at least `rounds` rounds: in
             each, every contestant in turn: a lead-in (its graph replayed, untimed, for at least
             lead_in_ms), then its graph replayed between two events, then, where `back_to_back`
             asks, its calls back to back between two events (the write-up's method)
    energy   `energy_rounds` rounds, in the same orders: a lead-in, then the graph replayed for at
             least energy_window_s between two readings of NVML's energy counter

The lead-in is there because the power cap's clock remembers what ran just before. A contestant
whose back-to-back calls time Python's dispatch leaves the GPU half idle; its power falls and the
clock rises, and whatever is timed next starts on that clock. Timed right after its own
back-to-back calls, FlashAttention's graph at S=1024 ran 11% faster than over a sustained second
(the others 0-3%), and came out level with a kernel that takes 9% fewer cycles. So each timing
starts on the contestant's own sustained load, and the back-to-back calls, the one timing that
can idle the GPU, come last in a turn. Back to back, a contestant whose calls time Python's dispatch
makes as many calls as fill the same time, not as many as its graph holds (at S=512 that would be a
turn eight times as long for nothing: such a timing is not a fair figure anyway).

How many rounds, how long each timing: config's head_to_head says, and why (10 rounds of 100 ms
gave intervals as wide as 20 of 50 ms, in less time). Whole designs always: a point runs as few of
them as give the rounds asked (design_rounds).

Each round gives, per headline version, rival and method, one paired ratio: the rival's time over the
version's (above 1: the version is faster), from timings a fraction of a second apart, so a clock that
drifts over the point moves both. The ratio is the median over the rounds, with a bootstrap interval
of that median, and the verdict comes from the interval: ahead when its lower end is above
1 + level_within, behind when its upper end is below 1 - level_within, level otherwise.
"""
from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from . import FlashbenchError, NoKernelForShape, attention
from .config import METHODS, Shape, methods, ragged_near
from .timing import dispatch_bound, elapsed_and_issued, elapsed_ms

MIN_CALLS = 3
BOOTSTRAP_SEED = 0  # the interval is a function of the archived timings: summarize gives the same CSV twice
COLUMNS = [
    "config", "B", "H", "S", "D", "is_case", "version", "rival", "method", "ratio", "ci_low", "ci_high", "verdict", "rounds",
    "fair", "version_tflops", "rival_tflops", "version_sm_clock_mhz", "rival_sm_clock_mhz",
    "version_joules_per_call", "rival_joules_per_call", "version_tflops_per_watt", "rival_tflops_per_watt",
    "version_sustained_tflops", "rival_sustained_tflops",
]


# ---- statistics (no GPU) --------------------------------------------------------------------------

def paired_ratios(version_s: list[float], rival_s: list[float]) -> np.ndarray:
    """Per round, the rival's time over the version's: above 1, the version is faster."""
    if len(version_s) != len(rival_s) or not version_s:
        raise FlashbenchError(f"paired ratios need one time of each per round: {len(version_s)} and {len(rival_s)}")
    return np.asarray(rival_s, dtype=float) / np.asarray(version_s, dtype=float)


def median_interval(values: np.ndarray, confidence: float, resamples: int, seed: int = BOOTSTRAP_SEED
                    ) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of `values` (resampled with replacement)."""
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, size=(resamples, len(values)), replace=True), axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


def verdict(ci_low: float, ci_high: float, level_within: float) -> str:
    if ci_low > 1 + level_within:
        return "ahead"
    if ci_high < 1 - level_within:
        return "behind"
    return "level"


def ratio_and_verdict(version_s: list[float], rival_s: list[float], confidence: float, resamples: int,
                      level_within: float) -> dict:
    """The paired comparison of two contestants' per-round times by one method."""
    ratios = paired_ratios(version_s, rival_s)
    low, high = median_interval(ratios, confidence, resamples)
    return {"ratio": float(np.median(ratios)), "ci_low": low, "ci_high": high, "verdict": verdict(low, high, level_within),
            "rounds": len(ratios)}


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def comparisons(record: dict, headline: list[str], rivals: list[str], confidence: float, resamples: int,
                level_within: float) -> list[dict]:
    """The rows of head_to_head.csv for one point's record: each headline version against the later
    headline versions (its predecessors) and every rival, by each method the point timed (the record's
    `methods`; absent: a run before the choice, which timed both). A contestant missing from the record
    (it failed its check, or was skipped) has no rows. Under a causal mask (the record's `causal`) the
    FLOPs are half."""
    shape = Shape(**{d: record[d] for d in "BHSD"})
    timed, causal = record["contestants"], record.get("causal", False)
    rows = []
    for i, version in enumerate(headline):
        if version not in timed:
            continue
        for rival in [*headline[i + 1:], *rivals]:
            if rival not in timed:
                continue
            mine, theirs = timed[version], timed[rival]
            for method in record.get("methods", METHODS):
                key = f"{method}_s"
                row = {"config": record.get("configuration"), **shape.as_dict(), "is_case": record["is_case"],
                       "version": version, "rival": rival,
                       "method": method,
                       **ratio_and_verdict([r[key] for r in mine["rounds"]], [r[key] for r in theirs["rounds"]],
                                           confidence, resamples, level_within),
                       # the step method is not fair to a side whose Python dispatch outlasts its kernel
                       "fair": method == "graph" or not (_mostly_dispatch_bound(mine) or _mostly_dispatch_bound(theirs))}
                for side, c in (("version", mine), ("rival", theirs)):
                    row[f"{side}_tflops"] = attention.tflops(shape, _median(r[key] for r in c["rounds"]), causal)
                    row[f"{side}_sm_clock_mhz"] = _median(r["clocks"][method].get("sm_clock_mhz", {}).get("median")
                                                          for r in c["rounds"])
                    energy = energy_per_call(c)
                    row[f"{side}_joules_per_call"] = energy
                    row[f"{side}_tflops_per_watt"] = attention.flops(shape, causal) / energy / 1e12 if energy else None
                    sustained = sustained_s_per_call(c)
                    row[f"{side}_sustained_tflops"] = attention.tflops(shape, sustained, causal) if sustained else None
                rows.append(row)
    return rows


def table(records: list[dict], settings: dict, contestants_of=None):
    """head_to_head.csv: every point's comparisons, the case first, then by S, in each configuration in
    the order of `records`' first points there. `contestants_of`: a configuration's name -> its headline
    runs and rivals' runs (absent: settings' headline and rivals, one configuration)."""
    import pandas as pd

    h2h = settings.get("head_to_head")
    contestants_of = contestants_of or (lambda configuration: (settings["headline"], h2h["rivals"]))
    configurations = list(dict.fromkeys(r.get("configuration") for r in records))
    rows = []
    for record in sorted(records, key=lambda r: (configurations.index(r.get("configuration")), not r["is_case"], r["S"])):
        rows += comparisons(record, *contestants_of(record.get("configuration")), h2h["confidence"], h2h["resamples"],
                            h2h["level_within"])
    return pd.DataFrame(rows, columns=COLUMNS)


def as_records(record: dict) -> dict:
    """A point's contestants as records of their own (name -> identity and the point's provenance), for
    the check that they are what passed their checks on this GPU."""
    return {name: {**c["identity"], "provenance": record["provenance"]} for name, c in record["contestants"].items()}


def _mostly_dispatch_bound(contestant: dict) -> bool:
    rounds = contestant["rounds"]
    return sum(r["dispatch_bound"] for r in rounds) * 2 > len(rounds)


def sustained_s_per_call(contestant: dict) -> float | None:
    """Seconds per call over the energy windows (graph replays for a second or more, after a lead-in):
    what the short timings should agree with, once each starts on its own load's clock."""
    return _median(w["seconds"] / w["calls"] for w in contestant.get("energy", []))


def energy_per_call(contestant: dict) -> float | None:
    """Joules per call: the median over the energy windows (None where NVML has no energy counter)."""
    return _median(w["joules"] / w["calls"] if w["joules"] else None for w in contestant.get("energy", []))


# ---- measurement (GPU) ----------------------------------------------------------------------------

class _Contestant:
    """One implementation at one point: its inputs, its CUDA graph, and its calls per timing.

    The graph holds as many calls as fill the shorter of a timing and a lead-in; a timing replays it as
    often as fill min_timing_s, a lead-in as often as fill lead_in_s. With the head-to-head's timings
    as long as its lead-ins, a timing is one replay; with 1 s timings (a ragged pair's) a lead-in stays
    near its 100 ms instead of a whole 1 s replay. Back to back (where `back_to_back`) it makes the
    graph timing's calls, or as many as fill the same time where its dispatch makes each call slower
    (`step_calls`; None where it times no calls back to back)."""

    def __init__(self, impl, shape: Shape, seed: int, warmup: int, min_timing_s: float, lead_in_s: float,
                 back_to_back: bool = True):
        self.impl, self.name, self.cp = impl, impl.name, impl.cp
        impl.activate()  # torch's backend switches are the process's: each peer sets its own before its calls
        self.args = impl.inputs(shape, impl.cp.random.default_rng(seed))  # the same values for every contestant
        for _ in range(warmup):
            impl(*self.args)
        graph_s = min(min_timing_s, lead_in_s) if lead_in_s > 0 else min_timing_s
        per_call_s = elapsed_ms(self.cp, lambda: self._back_to_back(MIN_CALLS)) / 1e3 / MIN_CALLS
        self.graph_calls = max(MIN_CALLS, math.ceil(graph_s / per_call_s))
        self.replay = impl.capture(*self.args, self.graph_calls)
        self.replay()
        replay_s = elapsed_ms(self.cp, self.replay) / 1e3
        if replay_s < graph_s:  # its graph runs faster than its calls back to back (dispatch-bound)
            self.graph_calls = math.ceil(self.graph_calls * graph_s / replay_s * 1.05)
            self.replay = impl.capture(*self.args, self.graph_calls)
            self.replay()
            replay_s = elapsed_ms(self.cp, self.replay) / 1e3
        self.timing_replays = math.ceil(min_timing_s / replay_s)
        self.calls = self.graph_calls * self.timing_replays  # a graph timing's
        self.lead_in_replays = math.ceil(lead_in_s / replay_s)
        self.step_calls = None
        if back_to_back:
            step_s = elapsed_ms(self.cp, lambda: self._back_to_back(self.graph_calls)) / 1e3
            self.step_calls = max(MIN_CALLS, min(self.calls, math.ceil(self.calls * replay_s / step_s)))

    def _lead_in(self) -> None:
        """The graph replayed untimed until the GPU is on this contestant's load; what is timed next
        starts a few microseconds after it ends (the wait lets the clock windows start there)."""
        self._replays(self.lead_in_replays)
        self.cp.cuda.runtime.deviceSynchronize()

    def _replays(self, replays: int) -> None:
        for _ in range(replays):
            self.replay()

    def _back_to_back(self, calls: int) -> None:
        for _ in range(calls):
            self.impl(*self.args)

    def time_graph(self) -> float:
        """The lead-in, then the graph timed: seconds per call."""
        self.impl.activate()
        self._lead_in()
        return elapsed_ms(self.cp, lambda: self._replays(self.timing_replays)) / 1e3 / self.calls

    def time_round(self) -> dict:
        """One turn: the lead-in, the graph, then back to back where asked; wall-clock windows kept for
        the clock readings."""
        t0 = time.time()
        graph_s = self.time_graph()
        t1 = time.time()
        if self.step_calls is None:
            return {"graph_s": graph_s, "windows": {"graph": (t0, t1)}}
        step_ms, issue_s = elapsed_and_issued(self.cp, lambda: self._back_to_back(self.step_calls))
        t2 = time.time()
        step_s, issue_s = step_ms / 1e3 / self.step_calls, issue_s / self.step_calls
        return {"step_s": step_s, "graph_s": graph_s, "issue_s": issue_s,
                "dispatch_bound": dispatch_bound(issue_s, step_s, graph_s),
                "windows": {"graph": (t0, t1), "step": (t1, t2)}}

    def energy_window(self, energy, window_s: float, graph_s: float) -> dict:
        """The graph replayed for at least `window_s`, NVML's energy counter read on either side."""
        replays = max(1, math.ceil(window_s / (graph_s * self.graph_calls)))
        self.impl.activate()
        self._lead_in()
        start_j, t0 = energy.joules(), time.perf_counter()
        self._replays(replays)
        self.cp.cuda.runtime.deviceSynchronize()
        seconds, joules = time.perf_counter() - t0, energy.joules() - start_j
        return {"calls": replays * self.graph_calls, "seconds": seconds, "joules": joules or None,
                "watts": joules / seconds if joules else None}


def balanced_orders(names: list[str]) -> list[list[str]]:
    """A Williams design: orders in which each contestant takes each place, and comes right after each
    other contestant, equally often; n orders for an even n, 2n for an odd one (the n and their
    mirror images). Rotating one order moves each contestant's place but keeps who comes before it,
    so whatever the one before leaves behind (the clock it left) would fall on the same one each round."""
    n = len(names)
    first, low, high = [0], 1, n - 1
    for place in range(1, n):
        if place % 2:
            first.append(low)
            low += 1
        else:
            first.append(high)
            high -= 1
    orders = [[(i + shift) % n for i in first] for shift in range(n)]
    if n % 2:
        orders += [order[::-1] for order in orders]
    return [[names[i] for i in order] for order in orders]


def design_rounds(rounds: int, contestants: int) -> int:
    """The rounds a point runs: as few whole balanced designs of its contestants as give at least
    `rounds` (ten for five contestants, twelve for four, where at least ten are asked)."""
    design = len(balanced_orders(list(range(contestants))))
    return -(-rounds // design) * design


def round_order(names: list[str], round_index: int) -> list[str]:
    orders = balanced_orders(names)
    return orders[round_index % len(orders)]


def measure(impls: list, shape: Shape, settings: dict, seed: int, sampler, energy, progress=print) -> dict:
    """Time `impls` (kernels and peers that passed their check) at `shape` as the module says.
    `settings`: config's head_to_head; `sampler`: a ClockSampler; `energy`: an EnergyCounter (or None
    where NVML has none: the record says so)."""
    names = [impl.name for impl in impls]
    if len(set(names)) != len(names):
        raise FlashbenchError(f"the head-to-head names a contestant twice: {names}")
    if len({impl.causal for impl in impls}) > 1:
        raise FlashbenchError(f"the head-to-head pits causal against non-causal contestants: {names}")
    causal, timed = bool(impls) and impls[0].causal, methods(settings)
    contestants, excluded = {}, {}
    for impl in impls:  # one without a kernel for this shape (a peer above its max_seq_len) is left out
        if reason := impl.supports(shape):
            excluded[impl.name] = reason
            continue
        progress(f"head-to-head {shape}: preparing {impl.name}")
        try:
            contestants[impl.name] = _Contestant(impl, shape, seed, settings["warmup"], settings["min_timing_ms"] / 1e3,
                                                 settings["lead_in_ms"] / 1e3, back_to_back="step" in timed)
        except NoKernelForShape as e:
            excluded[impl.name] = str(e)
    names = [name for name in names if name in contestants]
    if not names:
        raise FlashbenchError(f"no contestant runs at {shape}: "
                              + "; ".join(f"{name}: {reason}" for name, reason in excluded.items()))
    rounds = {name: [] for name in names}
    orders = [round_order(names, r) for r in range(design_rounds(settings["rounds"], len(names)))]
    progress(f"head-to-head {shape}: {len(orders)} rounds of {len(names)} contestants")
    for order in orders:
        for name in order:
            rounds[name].append(contestants[name].time_round())
    windows = sampler.windows([w for name in names for r in rounds[name] for w in r["windows"].values()])
    it = iter(windows)
    for name in names:
        for r in rounds[name]:
            r["clocks"] = {method: next(it) for method in r.pop("windows")}
    energies = {name: [] for name in names}
    if energy is not None and settings["energy_rounds"]:  # 0: head_to_head.configurations asks none here
        progress(f"head-to-head {shape}: energy, {settings['energy_rounds']} round(s) of "
                 f"{settings['energy_window_s']} s windows")
        for r in range(settings["energy_rounds"]):
            for name in round_order(names, r):
                graph_s = float(np.median([x["graph_s"] for x in rounds[name]]))
                energies[name].append(contestants[name].energy_window(energy, settings["energy_window_s"], graph_s))
    for name in names:
        tflops = {m: attention.tflops(shape, np.median([x[f"{m}_s"] for x in rounds[name]]), causal) for m in timed}
        back_to_back = f"{tflops['step']:.1f} TFLOPS back to back, " if "step" in tflops else ""
        progress(f"  {name}: {back_to_back}{tflops['graph']:.1f} by graph ({contestants[name].calls} calls a timing)")
    return {
        **shape.as_dict(),
        "causal": causal,
        "methods": list(timed),
        "order": names,
        "round_orders": orders,
        "contestants": {name: {"identity": contestants[name].impl.identity, "calls_per_timing": contestants[name].calls,
                               **({"step_calls_per_timing": contestants[name].step_calls} if "step" in timed else {}),
                               "lead_in_replays": contestants[name].lead_in_replays,
                               "rounds": rounds[name], "energy": energies[name]} for name in names},
        "energy_reason": ("NVML has no energy counter for this GPU" if energy is None else
                          None if settings["energy_rounds"] else "no energy windows asked in this configuration"),
        "excluded": excluded,
    }


# ---- a ragged S against the next multiple of the tile (GPU), paired ---------------------------------
# A kernel's TFLOPS at S=4000 over its TFLOPS at 4096 is a ratio of a few percent, so it is measured as
# the head-to-head measures: one process, the two lengths' graphs timed in turns, each after its own
# lead-in, the one that goes first alternating, and each round's ratio kept (the sweep's two figures,
# taken minutes apart, ran 1500 MHz against 1980 in one archive). Its timings are its own, longer than
# the head-to-head's (config's sweep.ragged_pair says why).

def measure_ragged(impl, ragged: Shape, settings: dict, seed: int, progress=print) -> dict:
    """`impl` at `ragged` and at the next multiple of 128 by CUDA graph, in settings["rounds"] rounds
    (config.pair_timing: its warm-up, calls per timing and lead-in), the ragged one first in even
    rounds."""
    near = replace(ragged, S=ragged_near(ragged.S))
    sides = {shape.S: _Contestant(impl, shape, seed, settings["warmup"], settings["min_timing_ms"] / 1e3,
                                  settings["lead_in_ms"] / 1e3, back_to_back=False) for shape in (ragged, near)}
    progress(f"sweep {impl.name}: S={ragged.S} against S={near.S}, paired, {settings['rounds']} rounds")
    rounds = []
    for r in range(settings["rounds"]):
        graph_s = {S: sides[S].time_graph() for S in ((ragged.S, near.S) if r % 2 == 0 else (near.S, ragged.S))}
        rounds.append({"graph_s": graph_s[ragged.S], "near_graph_s": graph_s[near.S]})
    return {"S": ragged.S, "near": near.S, "causal": impl.causal,
            "calls_per_timing": {str(S): side.calls for S, side in sides.items()}, "rounds": rounds}


def ragged_comparison(pair: dict, shape: Shape, confidence: float, resamples: int) -> dict:
    """A paired ragged record (measure_ragged's, at B, H, D of `shape`) as TFLOPS at its S over TFLOPS at
    its near S, each with its own FLOPs: the median of the rounds' ratios and its bootstrap interval."""
    ragged, near = (replace(shape, S=S) for S in (pair["S"], pair["near"]))
    causal = pair.get("causal", False)
    scale = attention.flops(ragged, causal) / attention.flops(near, causal)
    ratios = scale * paired_ratios([r["graph_s"] for r in pair["rounds"]], [r["near_graph_s"] for r in pair["rounds"]])
    low, high = median_interval(ratios, confidence, resamples)
    return {"ratio": float(np.median(ratios)), "ci_low": low, "ci_high": high, "rounds": len(ratios),
            "tflops": attention.tflops(ragged, _median(r["graph_s"] for r in pair["rounds"]), causal),
            "near_tflops": attention.tflops(near, _median(r["near_graph_s"] for r in pair["rounds"]), causal)}
