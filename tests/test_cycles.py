"""Cycle counts from ncu's raw page: kernels split into calls at the markers, a call's kernels summed,
the median of the launches, each on inputs of its own, and the efficiency per cycle (V22's figure at
S=8192 as first measured)."""
import csv
import io
from types import SimpleNamespace

import pytest

from flashbench import FlashbenchError, cycles
from flashbench.config import Shape

from conftest import recording_hold, the_parent_never_holds, with_stub

CASE = Shape(1, 64, 1024, 128)
LONG = Shape(1, 64, 8192, 128)


def raw_page(kernels: list[tuple[str, float, float]], duration_unit: str = "nsecond") -> str:
    """ncu --page raw --csv --print-units base: a header, a units row, one row per (name, cycles, ns)."""
    metrics = list(cycles.METRICS.values())
    out = io.StringIO()
    w = csv.writer(out, quoting=csv.QUOTE_ALL)
    w.writerow(["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", *metrics])
    units = {"gpc__cycles_elapsed.max": "cycle", "gpu__time_duration.sum": duration_unit,
             "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": "%",
             "gpc__cycles_elapsed.avg.per_second": "cycle/second"}
    w.writerow(["", "", "", "", "", "", "", *(units[m] for m in metrics)])
    for i, (name, n, ns) in enumerate(kernels):
        values = {"gpc__cycles_elapsed.max": f"{n:,.0f}", "gpu__time_duration.sum": f"{ns:,.0f}",
                  "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed": "70.5",
                  "gpc__cycles_elapsed.avg.per_second": "1,800,000,000"}
        w.writerow([str(i), "42", "python3", "host", name, "1", "7", *(values[m] for m in metrics)])
    return out.getvalue()


M = cycles.MARKER


def test_calls_are_split_at_the_markers_and_a_call_of_two_kernels_is_summed():
    page = raw_page([(M, 10, 5), ("prepare", 1000, 500), ("attention", 98000, 54000), (M, 10, 5),
                     ("prepare", 1000, 500), ("attention", 99000, 55000), (M, 10, 5),
                     ("prepare", 1000, 500), ("attention", 98500, 54500), (M, 10, 5)])
    [point] = cycles.points(cycles.parse_kernels(page), [CASE], 3)
    assert point["cycles"] == 99500  # the median call: 1000 + 98500
    assert [c["kernels"] for c in point["launches"]] == [["prepare", "attention"]] * 3
    assert point["duration_us"] == pytest.approx(55.0)
    assert point["sm_clock_mhz"] == pytest.approx(1800)


def test_shapes_follow_in_order_and_a_wrong_count_is_refused():
    per_shape = lambda n: [(M, 1, 1), ("k", n, 1), (M, 1, 1), ("k", n, 1), (M, 1, 1), ("k", n, 1), (M, 1, 1)]
    kernels = cycles.parse_kernels(raw_page(per_shape(98600) + per_shape(5165900)))
    case, long = cycles.points(kernels, [CASE, LONG], 3)
    assert (case["S"], case["cycles"], long["S"], long["cycles"]) == (1024, 98600, 8192, 5165900)
    with pytest.raises(FlashbenchError, match="6 calls, not 1 shapes x 3 launches"):
        cycles.points(kernels, [CASE], 3)
    with pytest.raises(FlashbenchError, match="before the first marker"):
        cycles.calls(cycles.parse_kernels(raw_page([("k", 1, 1), (M, 1, 1)])))


def test_a_launch_that_runs_other_kernels_than_the_first_is_refused():
    """FlashAttention's inputs were once copied to its layout inside the profiled range on five of
    seven launches: three copy kernels counted with its attention kernel, twice its cycles."""
    page = raw_page([(M, 1, 1), ("attention", 109600, 64000), (M, 1, 1), ("copy", 44000, 22000), ("copy", 44000, 22000),
                     ("copy", 44000, 22000), ("attention", 109700, 64000), (M, 1, 1), ("attention", 109800, 64000),
                     (M, 1, 1)])
    with pytest.raises(FlashbenchError, match=r"launch 2 of 3 ran 4 kernels \(copy, copy, copy, attention\), "
                                              r"launch 1 1 kernels \(attention\)"):
        cycles.points(cycles.parse_kernels(page), [CASE], 3)


def test_a_page_without_the_metrics_or_in_an_unknown_unit_is_refused():
    with pytest.raises(FlashbenchError, match="no kernel table"):
        cycles.parse_kernels("==PROF== nothing profiled\n")
    with pytest.raises(FlashbenchError, match="unit this parser does not know"):
        cycles.parse_kernels(raw_page([(M, 1, 1)], duration_unit="fortnight"))


def test_efficiency_per_cycle_is_the_share_of_the_dense_fp16_peak():
    # V22 at S=8192 took 5165.9k cycles: 4*64*8192^2*128 FLOP / (5165.9e3 * 132 SMs * 4096) = 78.7%
    assert cycles.efficiency_per_cycle(LONG, 5165.9e3, 132) == pytest.approx(0.787, abs=5e-4)
    assert cycles.efficiency_per_cycle(CASE, 98.6e3, 132) == pytest.approx(0.645, abs=5e-4)


def test_the_table_has_a_row_per_counted_shape_in_table_order():
    record = {"kernel": "v22", "counted": True, "sm_count": 132, "points": [
        {**CASE.as_dict(), "cycles": 98600, "duration_us": 55.0, "tensor_pipe_pct": 70.5, "sm_clock_mhz": 1800,
         "launches": [{"cycles": c, "kernels": ["flash_attention_forward"]} for c in (98500, 98600, 98900)]}]}
    not_counted = {"kernel": "v11", "counted": False, "reason": "failed its check: ..."}
    table = cycles.table([not_counted, record], [{"name": "v11", "kind": "version"}, {"name": "v22", "kind": "version"}],
                         lambda name: CASE.as_dict())
    assert list(table.columns) == cycles.COLUMNS
    assert table.kernel.tolist() == ["v22"] and bool(table.is_case.iloc[0])
    assert (table.cycles_min.iloc[0], table.cycles_max.iloc[0], table.launches.iloc[0]) == (98500, 98900, 3)


def test_ncu_is_told_to_leave_the_clocks_and_count_only_the_marked_range():
    cmd = cycles.command("ncu", "/tmp/r", ["python3", "-m", "flashbench", "launch-marked"])
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert "gpc__cycles_elapsed.max" in cmd[cmd.index("--metrics") + 1]


def test_the_cycles_command_records_what_the_driver_says_it_ran_and_refuses_another(tmp_path, monkeypatch,
                                                                                     records_settings):
    """The parent never touches the GPU: the driver ncu runs holds it, for the parent's stage, and names
    what ran, at which lengths and on what GPU; where it could not hold the GPU the stage fails."""
    import json

    import records
    from flashbench import cli
    from flashbench.files import write_json

    check = tmp_path / "check" / "v14.json"
    write_json(check, {"kernel": "v14", "gate": records.GATE, "inputs": records.INPUTS, "passed": True, "reason": None,
                       "shapes": [], "cubin_sha256": "a" * 64, "provenance": records.provenance("v14")})
    said = {"identity": {"cubin_sha256": "a" * 64}, "shapes": [CASE.as_dict()], "provenance": records.provenance("v14")}
    drivers = []

    def fake_count(ncu, target, shapes, launches, progress):
        drivers.append(target[target.index("--hold-for") + 1])
        write_json(target[target.index("--identity-out") + 1], said)
        if "not_held" in said:
            raise FlashbenchError("ncu failed: ==ERROR== The application returned an error code (1).")
        page = [(M, 1, 1)] + [k for _ in range(launches) for k in (("flash_attention_forward", 98600, 55000), (M, 1, 1))]
        return cycles.parse_kernels(raw_page(page)), "Version 2025.3"

    monkeypatch.setattr(cli, "_gpu_held", the_parent_never_holds)
    monkeypatch.setattr(cycles, "count", fake_count)
    out = tmp_path / "cycles" / "v14.json"
    cubin, record = tmp_path / "v14.cubin", tmp_path / "v14.json"  # handed on to the driver, never read here
    cubin.write_bytes(b"")
    record.write_text("{}")
    with_stub(tmp_path, "ncu", "exit 1")  # never run: count is faked
    args = ["cycles", *records_settings, "--cubin", str(cubin), "--record", str(record), "--ncu",
            str(tmp_path / "ncu-stub" / "ncu"), "--check", str(check), "--out", str(out)]
    assert cli.main(args) == 0
    record = json.loads(out.read_text())
    assert [p["S"] for p in record["points"]] == [1024] and record["points"][0]["cycles"] == 98600
    assert record["cubin_sha256"] == "a" * 64 and record["sm_count"] == 132 and record["counted"]
    assert record["provenance"] == said["provenance"] and drivers == ["cycles v14"]  # its hold named for the stage
    said["identity"] = {"cubin_sha256": "b" * 64}  # not the cubin that passed its check
    assert cli.main(args) == 1
    out.unlink()
    said.clear()
    said["not_held"] = "cannot open the GPU lock /nowhere/flashbench-gpu.lock"  # the stage fails, nothing recorded
    assert cli.main(args) == 1 and not out.exists()


def test_the_driver_holds_the_gpu_from_its_first_launch_to_its_last_and_says_on_what(tmp_path, monkeypatch,
                                                                                    records_settings):
    """launch-marked takes the GPU's lock itself once its imports are done (ncu's start and Python's hold
    nothing), names the hold for the stage that runs it, and writes what ran with the provenance read
    once it let the GPU go (nvidia-smi's start holds nothing either); where the lock cannot be held it
    says why and fails."""
    import records
    from flashbench import cli, gpu
    from flashbench.files import read_json

    steps = []

    class Impl:
        name, identity = "sdpa_auto", {"torch": "2.11", "backend": "auto"}

    monkeypatch.setattr(cli, "_gpu_held", recording_hold(steps))
    monkeypatch.setattr(cli, "_import_peer_libraries", lambda settings, names: steps.append(("import", names[0])))
    monkeypatch.setattr(cli, "_kernel", lambda a: steps.append(("load", a.peer)) or Impl())
    monkeypatch.setattr(cycles, "launch_marked", lambda impl, shapes, launches: steps.append(("launch", launches))
                        or shapes[:1])
    monkeypatch.setattr(gpu, "provenance", lambda: steps.append(("provenance", None)) or records.provenance("x"))
    out = tmp_path / "ran.json"
    argv = ["launch-marked", *records_settings, "--peer", "sdpa_auto", "--hold-for", "cycles sdpa_auto",
            "--identity-out", str(out)]
    assert cli.main(argv) == 0
    assert [s[0] for s in steps] == ["import", "hold", "load", "launch", "release", "provenance"]
    assert steps[1] == ("hold", "cycles sdpa_auto")
    ran = read_json(out)
    assert ran["identity"] == Impl.identity and ran["shapes"] == [records.CASE] and ran["provenance"]["gpu"]

    def no_lock(what, exclusive=True):
        raise FlashbenchError("cannot open the GPU lock /nowhere/flashbench-gpu.lock")

    monkeypatch.setattr(cli, "_gpu_held", no_lock)
    assert cli.main(argv) == 1
    assert read_json(out) == {"not_held": "cannot open the GPU lock /nowhere/flashbench-gpu.lock"}


def test_each_profiled_launch_has_inputs_of_its_own_made_before_the_profiled_range():
    log = []

    class Implementation:  # what launch_marked needs of a kernel or peer, and of its cupy
        cp = SimpleNamespace(
            RawKernel=lambda source, name: lambda *args: log.append("marker"),
            random=SimpleNamespace(default_rng=lambda seed: seed),
            cuda=SimpleNamespace(runtime=SimpleNamespace(deviceSynchronize=lambda: None),
                                 profiler=SimpleNamespace(start=lambda: log.append("start"),
                                                          stop=lambda: log.append("stop"))))

        def supports(self, shape):
            return "longer than it takes" if shape.S > 4096 else None

        def inputs(self, shape, seed):
            log.append(f"inputs {seed}")
            return (f"q{seed}", f"k{seed}", f"v{seed}", f"o{seed}")

        def __call__(self, q, k, v, o):
            log.append(f"call on {q}")

    assert cycles.launch_marked(Implementation(), [CASE, LONG], 3) == [CASE]
    warm = ["call on q0"] * cycles.WARMUP
    assert log == ["inputs 0", "inputs 1", "inputs 2", *warm, "start", "marker", "call on q0", "marker", "call on q1",
                   "marker", "call on q2", "marker", "stop"]
