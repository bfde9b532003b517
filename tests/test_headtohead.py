"""The head-to-head's statistics on planted series: paired ratios, their bootstrap interval and the
verdict, and the table summarize writes; on a GPU, a kernel against itself is level."""
import time
import types

import numpy as np
import pytest

from flashbench import FlashbenchError, NoKernelForShape, config, headtohead
from flashbench.config import Shape
from flashbench.headtohead import comparisons, median_interval, paired_ratios, ratio_and_verdict, verdict

SETTINGS = {"confidence": 0.95, "resamples": 4000, "level_within": 0.01}
ROUNDS = 9


def noisy(base: float, rng, spread: float = 0.005, rounds: int = ROUNDS) -> list[float]:
    return list(base * (1 + spread * rng.standard_normal(rounds)))


def test_two_equal_contestants_are_level_with_an_interval_around_one():
    rng = np.random.default_rng(1)
    result = ratio_and_verdict(noisy(1.0, rng), noisy(1.0, rng), **SETTINGS)
    assert result["verdict"] == "level"
    assert result["ci_low"] < 1 < result["ci_high"] and result["rounds"] == ROUNDS


def test_three_percent_apart_with_noise_is_ahead_one_way_and_behind_the_other():
    rng = np.random.default_rng(2)
    fast, slow = noisy(1.0, rng), noisy(1.03, rng)
    ahead = ratio_and_verdict(fast, slow, **SETTINGS)
    assert ahead["verdict"] == "ahead" and ahead["ci_low"] > 1.01 and ahead["ratio"] == pytest.approx(1.03, abs=0.01)
    behind = ratio_and_verdict(slow, fast, **SETTINGS)
    assert behind["verdict"] == "behind" and behind["ci_high"] < 0.99


def test_a_drifting_clock_misleads_an_unpaired_comparison_but_not_the_paired_one():
    # The GPU's clock falls from 1980 to 1500 MHz over the run (the power cap); the version does 2% fewer
    # cycles than the rival. Paired rounds see both at nearly the same clock; two separate timings, the
    # version's late in the run and the rival's early (two jobs minutes apart), see different clocks.
    rounds = 2 * ROUNDS
    clock = np.linspace(1980e6, 1500e6, rounds)
    version_cycles, rival_cycles = 0.98e8, 1.0e8
    version = list(version_cycles / clock)
    rival = list(rival_cycles / (clock * 0.999))  # timed just after the version in each round
    paired = ratio_and_verdict(version, rival, **SETTINGS)
    assert paired["verdict"] == "ahead" and paired["ratio"] == pytest.approx(1.02, abs=0.003)
    unpaired = np.median(rival[:ROUNDS]) / np.median(version[ROUNDS:])  # rival early, version late
    assert unpaired < 1 - SETTINGS["level_within"]  # would call the faster version behind


def test_the_verdict_comes_from_the_interval_and_the_margin():
    assert verdict(1.02, 1.05, 0.01) == "ahead"
    assert verdict(1.005, 1.03, 0.01) == "level"  # not shown to be more than 1% ahead
    assert verdict(0.97, 0.985, 0.01) == "behind"
    assert verdict(0.985, 1.02, 0.01) == "level"
    assert verdict(1.0001, 1.002, 0.0) == "ahead"


def test_the_interval_is_a_percentile_bootstrap_of_the_median_and_repeats():
    # A resample's median of n distinct values is at most the j-th smallest where more than half its draws are,
    # with probability sum_{i > n/2} C(n, i) (j/n)^i (1 - j/n)^(n - i): for n = 7 that is 1.0% at the smallest,
    # 10.8% at the second, 89.2% at the fifth and 99.0% at the sixth, so the 95% interval is [2nd, 6th]; for
    # n = 11, 0.7% and 5.1% at the second and third, 94.9% and 99.3% at the eighth and ninth: [3rd, 9th].
    for n, (low, high) in ((7, (2, 6)), (11, (3, 9))):
        values = np.random.default_rng(n).permutation(1 + np.arange(n) / 100)
        ranked = np.sort(values)
        assert median_interval(values, 0.95, 4000) == (ranked[low - 1], ranked[high - 1])
    values = np.array([1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07, 1.08])
    assert median_interval(values, 0.95, 4000) == median_interval(values, 0.95, 4000)  # the same archive, the same CSV
    with pytest.raises(FlashbenchError, match="one time of each per round"):
        paired_ratios([1.0, 1.0], [1.0])


def point_record(times: dict, is_case: bool = True, dispatch_bound: tuple = ()) -> dict:
    """A head-to-head record with per-round `times` {name: (step_s, graph_s)} (the same each round)."""
    rng = np.random.default_rng(3)
    contestants = {}
    for name, (step, graph) in times.items():
        rounds = [{"step_s": s, "graph_s": g, "issue_s": s if name in dispatch_bound else s / 10,
                   "dispatch_bound": name in dispatch_bound,
                   "clocks": {"step": {"sm_clock_mhz": {"median": 1900}}, "graph": {"sm_clock_mhz": {"median": 1890}}}}
                  for s, g in zip(noisy(step, rng), noisy(graph, rng))]
        contestants[name] = {"identity": {}, "calls_per_timing": 900, "rounds": rounds,
                             "energy": [{"calls": 20000, "seconds": 1.2, "joules": 20000 * graph * 650, "watts": 650}]}
    return {"B": 1, "H": 64, "S": 1024, "D": 128, "is_case": is_case, "order": list(times), "contestants": contestants}


def test_each_headline_version_meets_its_predecessor_and_every_rival_by_both_methods():
    record = point_record({"v22": (60e-6, 58e-6), "v21": (63e-6, 61e-6), "sdpa_cudnn": (62e-6, 62e-6),
                           "flash_attn_cute": (90e-6, 62e-6)}, dispatch_bound=("flash_attn_cute",))
    rows = comparisons(record, ["v22", "v21"], ["sdpa_cudnn", "flash_attn_cute"], **SETTINGS)
    pairs = [(r["version"], r["rival"], r["method"]) for r in rows]
    assert pairs == [(v, r, m) for v, r in [("v22", "v21"), ("v22", "sdpa_cudnn"), ("v22", "flash_attn_cute"),
                                             ("v21", "sdpa_cudnn"), ("v21", "flash_attn_cute")]
                     for m in ("step", "graph")]
    by = {(r["version"], r["rival"], r["method"]): r for r in rows}
    assert by["v22", "sdpa_cudnn", "graph"]["verdict"] == "ahead"
    assert by["v22", "flash_attn_cute", "step"]["fair"] is False  # its dispatch outlasts its kernel
    assert by["v22", "flash_attn_cute", "graph"]["fair"] is True
    row = by["v22", "sdpa_cudnn", "graph"]
    assert row["version_tflops"] == pytest.approx(34.36e9 / 58e-6 / 1e12, rel=0.02)
    assert row["version_joules_per_call"] == pytest.approx(58e-6 * 650)
    assert row["version_tflops_per_watt"] == pytest.approx(34.36e9 / (58e-6 * 650) / 1e12, rel=1e-3)
    assert row["version_sm_clock_mhz"] == 1890
    assert row["version_sustained_tflops"] == pytest.approx(34.36e9 / (1.2 / 20000) / 1e12, rel=0.02)


def test_a_contestant_left_out_has_no_rows_and_the_table_has_its_columns():
    record = point_record({"v22": (60e-6, 58e-6), "sdpa_auto": (62e-6, 62e-6)}, is_case=False)
    table = headtohead.table([record], {"headline": ["v22", "v21"],
                                        "head_to_head": {"rivals": ["sdpa_cudnn", "sdpa_auto"], **SETTINGS}})
    assert list(table.columns) == headtohead.COLUMNS
    assert set(table.rival) == {"sdpa_auto"} and len(table) == 2


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_each_contestant_takes_each_place_and_follows_each_other_equally_often(n):
    names = [f"c{i}" for i in range(n)]
    orders = headtohead.balanced_orders(names)
    assert len(orders) == (n if n % 2 == 0 else 2 * n) and all(sorted(o) == names for o in orders)
    places = {(name, order.index(name)) for order in orders for name in order}
    assert all(sum(o.index(name) == place for o in orders) == len(orders) // n for name, place in places)
    follows = [(o[i], o[i + 1]) for o in orders for i in range(n - 1)]
    # each ordered pair as often, and so every one of the n(n-1) there (the follows number n(n-1) of that count)
    assert {follows.count(pair) for pair in follows} == {len(orders) // n}
    assert headtohead.round_order(names, len(orders)) == orders[0]  # then the design again


@pytest.mark.gpu
def test_a_kernel_against_itself_is_level_with_an_interval_around_one(settings, tmp_path, needs_nvcc):
    from flashbench import gpu
    from flashbench.clocks import ClockSampler, EnergyCounter
    from flashbench.compile import compile_kernel, runnable_build
    from flashbench.launch import AttentionKernel

    from conftest import ROOT

    here = gpu.require().arch
    best = settings.kernel(settings.headline[0])
    arch = runnable_build(best.archs, here) if best.archs else here
    if arch is None:
        pytest.skip(f"{best.name} has no build for this GPU")
    import cupy as cp

    record = compile_kernel(best.name, ROOT / best.source, arch, settings.nvcc_flags, best.defines, tmp_path / "k.cubin")
    twins = [AttentionKernel(tmp_path / "k.cubin", {**record, "kernel": name}) for name in ("v22", "v22_again")]
    h2h = {**settings.head_to_head, "rounds": 8, "energy_rounds": 1}  # even: each twin first as often
    bus = cp.cuda.Device().pci_bus_id
    with ClockSampler(bus) as sampler:
        point = headtohead.measure(twins, settings.case, h2h, 7, sampler, EnergyCounter.open(bus),
                                   progress=lambda m: None)
    point["is_case"] = True
    rows = comparisons(point, ["v22", "v22_again"], [], h2h["confidence"], h2h["resamples"], h2h["level_within"])
    for row in rows:
        assert row["verdict"] == "level" and row["ci_low"] <= 1 <= row["ci_high"], row
    first = point["contestants"]["v22"]
    assert first["calls_per_timing"] * first["rounds"][0]["graph_s"] >= 0.02  # each timing >= min_timing_ms
    assert Shape(**{d: point[d] for d in "BHSD"}) == settings.case


class _Event:
    def record(self):
        self.t = time.perf_counter()

    def synchronize(self):
        pass


# CuPy as measure() uses it, on the host: events read the host clock, calls return at once
FAKE_CP = types.SimpleNamespace(
    cuda=types.SimpleNamespace(Event=_Event, get_elapsed_time=lambda a, b: (b.t - a.t) * 1e3,
                               runtime=types.SimpleNamespace(deviceSynchronize=lambda: None)),
    random=types.SimpleNamespace(default_rng=np.random.default_rng))


class SwitchedPeer:
    """A peer that, like torch's SDPA, runs whatever the process-wide switch says: it notes each call
    made while the switch is another peer's."""

    switch = None  # the process's, as torch.backends.cuda's
    causal = False  # no mask, as every contestant of one point

    def __init__(self, name, no_kernel=False):
        self.name, self.cp, self.identity, self.no_kernel, self.wrong_calls = name, FAKE_CP, {}, no_kernel, 0

    def activate(self):
        SwitchedPeer.switch = self.name

    def supports(self, shape):
        return None

    def inputs(self, shape, rng, kind="normal"):
        if self.no_kernel:
            raise NoKernelForShape(f"{self.name} has no kernel for {shape}")
        return (None, None, None, None)

    def __call__(self, *args):
        self.wrong_calls += SwitchedPeer.switch != self.name
        time.sleep(1e-4)

    def capture(self, *args):
        calls = args[-1]
        return lambda: [self(*args[:-1]) for _ in range(calls)]


class _Sampler:
    def windows(self, spans):
        return [{"samples": 0} for _ in spans]


class _SpanSampler:
    """Each window's reading says which span it was asked for."""

    def windows(self, spans):
        return [{"samples": 0, "start": t0, "end": t1} for t0, t1 in spans]


class _LoggedEnergy:
    joule = 0.0

    def joules(self):
        LoggedPeer.log.append("energy")
        self.joule += 1.0
        return self.joule


def test_every_peer_runs_as_it_is_configured_though_the_switches_are_the_processs():
    # each one made in turn (the last one's switches would hold for all), then timed in rounds
    peers = [SwitchedPeer(name) for name in ("sdpa_cudnn", "sdpa_auto", "sdpa_flash")]
    for peer in peers:
        peer.activate()
    settings = {"rounds": 3, "min_timing_ms": 10, "lead_in_ms": 5, "warmup": 1, "energy_rounds": 1, "energy_window_s": 0.01}
    record = headtohead.measure(peers, Shape(1, 64, 1024, 128), settings, 0, _Sampler(), None, progress=lambda m: None)
    assert [p.wrong_calls for p in peers] == [0, 0, 0]
    assert record["order"] == ["sdpa_cudnn", "sdpa_auto", "sdpa_flash"] and record["excluded"] == {}


def test_a_contestant_without_a_kernel_at_a_point_is_left_out_saying_why():
    peers = [SwitchedPeer("v22"), SwitchedPeer("flash_attn_cute", no_kernel=True)]
    settings = {"rounds": 2, "min_timing_ms": 5, "lead_in_ms": 5, "warmup": 1, "energy_rounds": 1, "energy_window_s": 0.01}
    record = headtohead.measure(peers, Shape(1, 64, 1024, 128), settings, 0, _Sampler(), None, progress=lambda m: None)
    assert record["order"] == ["v22"] and list(record["contestants"]) == ["v22"]
    assert record["excluded"] == {"flash_attn_cute": "flash_attn_cute has no kernel for B=1 H=64 S=1024 D=128"}
    with pytest.raises(FlashbenchError, match="no contestant runs at B=1 H=64 S=1024 D=128: flash_attn_cute: "):
        headtohead.measure(peers[1:], Shape(1, 64, 1024, 128), settings, 0, _Sampler(), None, progress=lambda m: None)


def test_causal_and_dense_contestants_are_never_paired():
    """A point's contestants compute the same thing: a causal one beside a dense one would pair half
    the work with the whole."""
    causal = SwitchedPeer("v25.causal")
    causal.causal = True
    settings = {"rounds": 2, "min_timing_ms": 5, "lead_in_ms": 5, "warmup": 1, "energy_rounds": 1, "energy_window_s": 0.01}
    with pytest.raises(FlashbenchError, match="pits causal against non-causal contestants"):
        headtohead.measure([SwitchedPeer("v22"), causal], Shape(1, 64, 1024, 128), settings, 0, _Sampler(), None,
                           progress=lambda m: None)


class _LoggedEvent:
    def record(self):
        self.at = len(LoggedPeer.log)
        LoggedPeer.log.append("event")
        LoggedPeer.seconds.append(0.0)

    def synchronize(self):
        pass


def _logged_elapsed_ms(before, after) -> float:
    """What the calls and replays logged between two events take: 0.1 ms a call, whatever the host does."""
    return sum(LoggedPeer.seconds[before.at:after.at]) * 1e3


class LoggedPeer(SwitchedPeer):
    """A peer whose calls, graph replays and the events around them go to one log, in order, each
    with the GPU time it takes (0.1 ms a call)."""

    log, seconds = [], []
    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Event=_LoggedEvent, get_elapsed_time=_logged_elapsed_ms,
                                                          runtime=FAKE_CP.cuda.runtime),
                               random=FAKE_CP.random)

    def __init__(self, name):
        super().__init__(name)
        self.cp = LoggedPeer.cp

    def _logged(self, what: str, calls: int) -> None:
        LoggedPeer.log.append(f"{what} {self.name}")
        LoggedPeer.seconds.append(calls * 1e-4)

    def __call__(self, *args):
        self._logged("call", 1)

    def capture(self, *args):
        calls = args[-1]
        return lambda: self._logged("replay", calls)


def _logged_point(lead_in_ms: float, energy_rounds: int, back_to_back: bool = True) -> dict:
    """A point of two logged contestants in two rounds, with NVML's energy counter: its record, the
    contestants' calls in LoggedPeer.log."""
    peers = [LoggedPeer("v22"), LoggedPeer("flash_attn_cute")]
    settings = {"rounds": 2, "min_timing_ms": 5, "lead_in_ms": lead_in_ms, "warmup": 1,
                "energy_rounds": energy_rounds, "energy_window_s": 0.01, "back_to_back": back_to_back}
    LoggedPeer.log.clear()
    LoggedPeer.seconds.clear()
    return headtohead.measure(peers, Shape(1, 64, 1024, 128), settings, 0, _SpanSampler(), _LoggedEnergy(),
                              progress=lambda m: None)


def test_each_timing_starts_after_a_lead_in_of_its_own_graph_and_back_to_back_comes_last():
    # The power cap's clock lags the load: a timing right after a contestant that left the GPU idle
    # (its Python dispatch) runs on a clock that contestant raised. So each turn: the contestant's own
    # graph for lead_in_ms untimed, its graph timed, then its calls back to back timed.
    record = _logged_point(lead_in_ms=12, energy_rounds=1)
    lead_in = {name: c["lead_in_replays"] for name, c in record["contestants"].items()}
    calls = {name: c["calls_per_timing"] for name, c in record["contestants"].items()}
    for name in lead_in:
        # as many replays as fill lead_in_ms, each at least its calls' sleeps (and a little more)
        assert lead_in[name] * calls[name] * 1e-4 * 1.1 >= 0.012 > (lead_in[name] - 1) * calls[name] * 1e-4
    log = " | ".join(LoggedPeer.log)
    turns = [(f"replay {name} | " * lead_in[name] + f"event | replay {name} | event | event | "
              + f"call {name} | " * calls[name] + "event") for name in ("v22", "flash_attn_cute")]
    rounds = f"{turns[0]} | {turns[1]} | {turns[1]} | {turns[0]}"  # the second round in the other order
    assert record["round_orders"] == [["v22", "flash_attn_cute"], ["flash_attn_cute", "v22"]]
    assert rounds in log
    for name, c in record["contestants"].items():  # each clock window is its own timing's: the graph's first
        assert all(r["clocks"]["graph"]["end"] <= r["clocks"]["step"]["start"] for r in c["rounds"])
    # then the energy windows, each after its lead-in: NVML's counter read once the lead-in is done
    windows = [f"replay {name} | " * lead_in[name] + "energy | "
               + f"replay {name} | " * (record["contestants"][name]["energy"][0]["calls"] // calls[name]) + "energy"
               for name in ("v22", "flash_attn_cute")]
    assert log.endswith(f"{turns[0]} | {windows[0]} | {windows[1]}")


def test_a_configuration_without_back_to_back_times_each_turns_graph_alone_and_compares_by_graph():
    """back_to_back false: each turn is the lead-in and the graph's timing, no call made after them; the
    record says which method it timed, and the point's rows are by graph alone."""
    record = _logged_point(lead_in_ms=12, energy_rounds=0, back_to_back=False)
    lead_in = {name: c["lead_in_replays"] for name, c in record["contestants"].items()}
    turns = [f"replay {name} | " * lead_in[name] + f"event | replay {name} | event" for name in ("v22", "flash_attn_cute")]
    assert " | ".join(LoggedPeer.log).endswith(f"{turns[0]} | {turns[1]} | {turns[1]} | {turns[0]}")
    assert record["methods"] == ["graph"]
    for c in record["contestants"].values():
        assert "step_calls_per_timing" not in c
        assert all(set(r) == {"graph_s", "clocks"} and set(r["clocks"]) == {"graph"} for r in c["rounds"])
    rows = comparisons({**record, "is_case": True}, ["v22"], ["flash_attn_cute"], **SETTINGS)
    assert [(r["version"], r["rival"], r["method"]) for r in rows] == [("v22", "flash_attn_cute", "graph")]
    assert config.methods({}) == config.methods({"back_to_back": True}) == ("step", "graph")


def test_a_configuration_that_asks_no_energy_windows_gets_none_and_says_why():
    record = _logged_point(lead_in_ms=1, energy_rounds=0)
    assert "energy" not in " | ".join(LoggedPeer.log)
    assert all(c["energy"] == [] and len(c["rounds"]) == 2 for c in record["contestants"].values())
    assert record["energy_reason"] == "no energy windows asked in this configuration"


class _DispatchBoundPeer(LoggedPeer):
    """A logged peer whose calls back to back take 8 times as long as in its graph (0.8 ms against 0.1):
    Python's dispatch, not its kernel, paces them."""

    def __call__(self, *args):
        LoggedPeer.log.append(f"call {self.name}")
        LoggedPeer.seconds.append(8e-4)


def test_calls_back_to_back_fill_the_graph_timings_time_where_dispatch_slows_them():
    """A contestant whose dispatch makes each call 8 times slower makes an eighth of the graph's calls
    back to back (its turn as long as the others', not 8 times), and the record says how many; one
    whose calls run as fast as in its graph makes the graph's calls."""
    LoggedPeer.log.clear()
    LoggedPeer.seconds.clear()
    peers = [LoggedPeer("v25"), _DispatchBoundPeer("flash_attn_cute")]
    settings = {"rounds": 2, "min_timing_ms": 20, "lead_in_ms": 20, "warmup": 1, "energy_rounds": 1,
                "energy_window_s": 0.01}
    record = headtohead.measure(peers, Shape(1, 64, 1024, 128), settings, 0, _Sampler(), None, progress=lambda m: None)
    mine, theirs = record["contestants"]["v25"], record["contestants"]["flash_attn_cute"]
    assert mine["step_calls_per_timing"] == mine["calls_per_timing"] == 200  # 20 ms of 0.1 ms calls
    assert theirs["calls_per_timing"] >= 200  # its graph sized by the replay (5% more: a dispatch-bound one)
    assert theirs["step_calls_per_timing"] == -(-theirs["calls_per_timing"] // 8)
    for c, per_call in ((mine, 1e-4), (theirs, 8e-4)):
        assert all(r["step_s"] == pytest.approx(per_call) and r["graph_s"] == pytest.approx(1e-4) for r in c["rounds"])
    log = " | ".join(LoggedPeer.log)
    turn = "event | event | " + "call flash_attn_cute | " * theirs["step_calls_per_timing"] + "event"
    assert turn in log and turn + " | call" not in log


@pytest.mark.parametrize("asked, contestants, rounds", [(10, 5, 10), (10, 4, 12), (20, 5, 20), (20, 4, 20),
                                                         (3, 3, 6), (2, 1, 2)])
def test_a_point_runs_whole_balanced_designs_as_few_as_give_the_rounds_asked(asked, contestants, rounds):
    assert headtohead.design_rounds(asked, contestants) == rounds
    peers = [SwitchedPeer(f"c{i}") for i in range(contestants)]
    settings = {"rounds": asked, "min_timing_ms": 1, "lead_in_ms": 0, "warmup": 1, "energy_rounds": 1,
                "energy_window_s": 0.001}
    record = headtohead.measure(peers, Shape(1, 64, 1024, 128), settings, 0, _Sampler(), None, progress=lambda m: None)
    assert len(record["round_orders"]) == rounds
    assert all(len(c["rounds"]) == rounds for c in record["contestants"].values())


class _LengthPeer(LoggedPeer):
    """A logged peer whose call takes S^2 / 1024^2 * 0.1 ms: one speed per FLOP at every length; its
    inputs carry their S, so the log says which length each replay ran at."""

    def inputs(self, shape, rng, kind="normal"):
        return (shape.S, None, None, None)

    def __call__(self, S, *args):
        LoggedPeer.log.append(f"call {S}")
        LoggedPeer.seconds.append(1e-4 * (S / 1024) ** 2)

    def capture(self, S, *args):
        calls = args[-1]

        def replay():
            LoggedPeer.log.append(f"replay {S}")
            LoggedPeer.seconds.append(calls * 1e-4 * (S / 1024) ** 2)
        return replay


def test_a_ragged_length_is_paired_with_the_next_multiple_of_128_each_after_its_own_lead_in():
    """The sweep's pair (measure_ragged): the two lengths' graphs timed in turns, the first of them
    alternating, each after a lead-in of its own graph; a kernel as fast per FLOP at both is at 1."""
    LoggedPeer.log.clear()
    LoggedPeer.seconds.clear()
    settings = {"rounds": 4, "min_timing_ms": 2, "lead_in_ms": 4, "warmup": 1}
    pair = headtohead.measure_ragged(_LengthPeer("v25"), Shape(1, 64, 4000, 128), settings, 0, progress=lambda m: None)
    assert (pair["S"], pair["near"], len(pair["rounds"])) == (4000, 4096, 4)
    events = [i for i, x in enumerate(LoggedPeer.log) if x == "event"]  # each timing between a pair of them
    timed = [LoggedPeer.log[a + 1:b] for a, b in zip(events[::2], events[1::2])]
    assert timed[-8:] == [["replay 4000"], ["replay 4096"], ["replay 4096"], ["replay 4000"]] * 2
    log = " | ".join(LoggedPeer.log)
    lead_in = -(-4e-3 // (pair["calls_per_timing"]["4096"] * 1e-4 * (4096 / 1024) ** 2))
    assert ("replay 4096 | " * int(lead_in) + "event | replay 4096 | event") in log
    said = headtohead.ragged_comparison(pair, Shape(1, 64, 1024, 128), 0.95, 1000)
    assert said["ratio"] == pytest.approx(1.0) and said["ci_low"] == pytest.approx(1.0)
    assert said["tflops"] == pytest.approx(said["near_tflops"])


def test_a_timing_longer_than_its_lead_in_replays_a_graph_as_long_as_the_lead_in():
    """1 s timings after 100 ms lead-ins (a ragged pair's): the graph fills the lead-in, and a timing
    replays it as often as fill the timing; a whole timing's graph as the lead-in would make each lead-in
    as long as a timing and the pair twice as long."""
    LoggedPeer.log.clear()
    LoggedPeer.seconds.clear()
    settings = {"rounds": 2, "min_timing_ms": 40, "lead_in_ms": 10, "warmup": 1}
    pair = headtohead.measure_ragged(_LengthPeer("v25"), Shape(1, 64, 4000, 128), settings, 0, progress=lambda m: None)
    call_s = 1e-4 * (4096 / 1024) ** 2  # 1.6 ms a call at 4096: 7 calls fill the 10 ms lead-in
    assert pair["calls_per_timing"]["4096"] == 7 * 4  # 4 replays of 11.2 ms fill the 40 ms timing
    log = " | ".join(LoggedPeer.log)
    # after the other length's timing, one replay of lead-in, then 4 timed
    assert "event | replay 4096 | event | " + "replay 4096 | " * 4 + "event" in log
    assert pair["rounds"][0]["near_graph_s"] == pytest.approx(call_s)
    assert pair["rounds"][0]["near_graph_s"] * pair["calls_per_timing"]["4096"] >= 0.040  # a timing's whole length
