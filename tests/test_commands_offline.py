"""Every GPU command the workflow runs (check, bench, sweep, head-to-head), in several configurations, through its
arguments and glue as far as the measurement, with the GPU's parts stood in for: what the GPU alone would
run (CuPy, NVML's sampler, the kernel, the timing) is faked, so that an attribute its parser does not
give or a call whose signature moved fails here rather than in a run on the GPU. (The profile's and the
cycles' commands and their drivers have tests of their own: test_records.py, test_cycles.py,
test_profile.py.)"""
import contextlib
import json
import sys
from types import SimpleNamespace

import pytest

import records
from flashbench import clocks, config, gpu, headtohead, timing
from flashbench.cli import main
from flashbench.check import Gate
from flashbench.config import Shape, load_settings
from flashbench.files import write_json

from conftest import FAKE_CUPY, ROOT

class Sampler:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def offline(monkeypatch, tmp_path, settings_file):
    """The GPU's parts stood in for; returns what the fakes saw (`seen`) and a maker of a run's files."""
    settings = load_settings(settings_file)
    seen = {"holds": [], "calls": []}

    def implementation(peer, cubin, record, run=None):
        name = run.name if run else "?"
        seen["calls"].append(("implementation", name, run.configuration.name if run else None))
        return SimpleNamespace(name=name, identity=identity(name), causal=run.configuration.causal if run else False)

    def identity(name):
        return ({"torch": "2.11.0", "backend": settings.peer(settings.run(name).of).backend}
                if settings.is_peer(settings.run(name).of) else {"cubin_sha256": "a" * 64})

    monkeypatch.chdir(ROOT)
    monkeypatch.setitem(sys.modules, "cupy", FAKE_CUPY)
    monkeypatch.setattr(gpu, "require", lambda: gpu.GPU("NVIDIA H200", "sm_90"))
    monkeypatch.setattr(gpu, "provenance", lambda: records.provenance("offline"))
    monkeypatch.setattr("flashbench.cli._gpu_held",
                        lambda what, exclusive=True: contextlib.nullcontext(seen["holds"].append(what)))
    monkeypatch.setattr("flashbench.cli._import_peer_libraries", lambda settings, names: None)
    monkeypatch.setattr("flashbench.cli._implementation", implementation)
    monkeypatch.setattr(clocks, "ClockSampler", lambda bus_id: Sampler())
    monkeypatch.setattr(clocks.EnergyCounter, "open", classmethod(lambda cls, bus_id: None))

    def files(name):
        """A run's passed check record, and for a kernel build its cubin and compile record: its options."""
        check = tmp_path / "check" / f"{name}.json"
        write_json(check, {"kernel": name, "gate": records.GATE, "inputs": records.INPUTS, "passed": True,
                           "reason": None, "shapes": [], **identity(name), "provenance": records.provenance(name)})
        if settings.is_peer(settings.run(name).of):
            return ["--peer", name], check
        cubin = tmp_path / "build" / f"{name}.cubin"
        cubin.parent.mkdir(exist_ok=True)
        cubin.write_bytes(b"")
        write_json(cubin.with_suffix(".json"), {**records.compile_record("v15", "sm_90a", "kernels/v25.cu"),
                                                "kernel": name})
        return ["--cubin", str(cubin), "--record", str(cubin.with_suffix(".json"))], check

    return SimpleNamespace(settings=settings, file=settings_file, seen=seen, files=files, out=tmp_path / "out.json")


def point_files(offline, configuration) -> tuple[list[str], list[str]]:
    """A head-to-head point's --checks (every contestant's passed check) and --cubins (the kernel builds')."""
    checks, cubins = [], []
    for name in offline.settings.contestants(configuration):
        options, check = offline.files(name)
        checks.append(str(check))
        if options[0] == "--cubin":
            cubins.append(options[1])
    return checks, cubins


RUNS = ["v25", "v25.causal", "v25.d64_bf16", "v25.gqa_causal_bf16", "sdpa_cudnn.d256", "flash_attn_cute.gqa", "v11"]


@pytest.mark.parametrize("name", RUNS)
def test_bench_runs_to_its_timing_at_the_runs_case(offline, monkeypatch, name):
    asked = []

    def fake_bench(kernel, shape, steps, repeats, warmup, seed, graph_replays, sampler=None):
        asked.append((kernel.name, shape))
        return {"tflops": 1.0, "tflops_median": 1.0, "tflops_graph": 1.0, "clocks": {"throttled": False}}

    monkeypatch.setattr(timing, "bench", fake_bench)
    options, check = offline.files(name)
    assert main(["bench", "--settings", offline.file, *options, "--check", str(check), "--out", str(offline.out)]) == 0
    run = offline.settings.run(name)
    assert asked == [(name, offline.settings.in_configuration(run.configuration).case)]
    assert offline.seen["holds"] == [f"bench {name}"] and json.loads(offline.out.read_text())["configuration"] == \
        run.configuration.name


@pytest.mark.parametrize("name", RUNS)
def test_sweep_runs_to_its_timings_and_pairs_where_its_configuration_pairs(offline, monkeypatch, name):
    asked, paired = [], []

    def fake_sweep(kernel, shapes, steps, case_s, repeats, warmup, seed, graph_replays, sampler=None, progress=print):
        asked.append([s.D for s in shapes])
        return [{"S": s.S, "timed": True} for s in shapes]

    def fake_pair(kernel, shape, timed_as, seed, progress=print):
        paired.append(shape.S)
        return {"S": shape.S, "near": 4096}

    monkeypatch.setattr(timing, "sweep", fake_sweep)
    monkeypatch.setattr(headtohead, "measure_ragged", fake_pair)
    monkeypatch.setattr(headtohead, "ragged_comparison",
                        lambda pair, case, confidence, resamples: {"ratio": 0.97, "ci_low": 0.96, "ci_high": 0.98})
    options, check = offline.files(name)
    assert main(["sweep", "--settings", offline.file, *options, "--check", str(check), "--out", str(offline.out)]) == 0
    run = offline.settings.run(name)
    assert asked and set(asked[0]) == {run.configuration.D}
    assert paired == ([4000] if name in ("v25", "v25.causal") else [])  # sweep.ragged_pair.configurations


@pytest.mark.parametrize("configuration", ["dense", "causal", "d64", "d256", "gqa"])
def test_a_head_to_head_point_runs_to_its_rounds_with_each_contestant_in_its_configuration(offline, monkeypatch,
                                                                                        configuration):
    settings = offline.settings
    c = settings.configuration(configuration)
    contestants = settings.contestants(c)
    checks, cubins = point_files(offline, c)
    measured = []

    def fake_measure(impls, shape, asked, seed, sampler, energy, progress=print):
        measured.append(([impl.name for impl in impls], shape, asked["rounds"], config.methods(asked)))
        return {**shape.as_dict(), "order": [], "contestants": {}, "excluded": {}}

    monkeypatch.setattr(headtohead, "measure", fake_measure)
    S = 4096
    assert main(["head-to-head", "--settings", offline.file, "--S", str(S), "--configuration", configuration,
                 "--checks", *checks, "--cubins", *cubins, "--out", str(offline.out)]) == 0
    (names, shape, rounds, methods), = measured
    assert names == contestants and shape.D == c.D and shape.S == S
    assert rounds == settings.head_to_head_in(c)["rounds"]
    assert methods == (("step", "graph") if configuration == "dense" else ("graph",))  # config's back_to_back
    assert json.loads(offline.out.read_text())["configuration"] == configuration


def test_a_timing_reads_its_provenance_once_it_has_let_the_gpu_go(offline, monkeypatch):
    """nvidia-smi's start (the provenance) runs nothing on the GPU: a bench and a head-to-head read it after
    their hold, so that the GPU does not stand idle in it."""
    from conftest import recording_hold

    steps = []
    monkeypatch.setattr("flashbench.cli._gpu_held", recording_hold(steps))
    monkeypatch.setattr(gpu, "provenance", lambda: steps.append(("provenance",)) or records.provenance("offline"))
    monkeypatch.setattr(timing, "bench", lambda *args, **kwargs: steps.append(("timed",)) or {
        "tflops": 1.0, "tflops_median": 1.0, "tflops_graph": 1.0, "clocks": {"throttled": False}})
    options, check = offline.files("v25")
    assert main(["bench", "--settings", offline.file, *options, "--check", str(check), "--out", str(offline.out)]) == 0
    assert [s[0] for s in steps] == ["hold", "timed", "release", "provenance"]

    steps.clear()
    monkeypatch.setattr(headtohead, "measure", lambda impls, shape, *args, **kwargs: steps.append(("timed",)) or {
        **shape.as_dict(), "order": [], "contestants": {}, "excluded": {}})
    checks, cubins = point_files(offline, offline.settings.configurations[0])
    assert main(["head-to-head", "--settings", offline.file, "--S", "4096", "--checks", *checks, "--cubins", *cubins,
                 "--out", str(offline.out)]) == 0
    assert [s[0] for s in steps] == ["hold", "timed", "release", "provenance"]
    assert json.loads(offline.out.read_text())["provenance"] == records.provenance("offline")


def test_a_gpu_job_makes_its_cuda_context_while_it_waits_for_the_lock(monkeypatch):
    """Making CUDA's context runs nothing on the GPU, and takes a good part of a short hold: a job makes it
    before it waits for the lock, and holds the lock of the GPU it made it on."""
    from flashbench import cli, gpulock

    steps = []
    device = SimpleNamespace(pci_bus_id="0000:19:00.0", synchronize=lambda: steps.append(("context",)))
    monkeypatch.setitem(sys.modules, "cupy", SimpleNamespace(cuda=SimpleNamespace(Device=lambda *a: device)))
    monkeypatch.setattr(gpu, "require", lambda: gpu.GPU("NVIDIA H200", "sm_90"))

    @contextlib.contextmanager
    def hold(bus_id, what, exclusive=True, progress=print):
        steps.append(("hold", bus_id, what, exclusive))
        yield

    monkeypatch.setattr(gpulock, "hold", hold)
    with cli._gpu_held("sweep v25"):
        steps.append(("timed",))
    assert steps == [("context",), ("hold", "0000:19:00.0", "sweep v25", True), ("timed",)]


def test_a_check_whose_call_hangs_writes_its_record_then_leaves_the_process_at_once(offline, monkeypatch):
    """The hung call still runs on the GPU: the record is written, then the process ends on the spot (no
    exit handler, no release of the lock, that would wait on the call)."""
    from flashbench import check as check_module
    from flashbench import cli

    hung = {**records.CASE, "inputs": "normal", "seed": 1, "passed": False, "fatal": True, "hung": True,
            "reason": "the call had not finished after 60 s: it hangs"}
    monkeypatch.setattr(check_module, "check_kernel", lambda kernel, *a, **k: {
        "kernel": kernel.name, "gate": records.GATE, "inputs": ["normal"], "passed": False,
        "reason": f"B=1 H=64 S=1024 normal: {hung['reason']}", "shapes": [hung]})

    class Left(Exception):
        pass

    def leave(status):
        raise Left(status)

    monkeypatch.setattr(cli.os, "_exit", leave)
    options, _ = offline.files("v25")
    with pytest.raises(Left) as left:
        main(["check", "--settings", offline.file, *options, "--out", str(offline.out)])
    assert left.value.args == (0,)  # the run goes on without v25
    record = json.loads(offline.out.read_text())
    assert record["passed"] is False and record["shapes"][0]["hung"] and "it hangs" in record["reason"]


@pytest.mark.parametrize("name", [run for run in RUNS if not run.startswith(("sdpa", "flash_attn"))])
def test_a_kernels_check_runs_to_the_gate_at_its_configurations_shapes_and_mask(offline, monkeypatch, name):
    from flashbench import check as check_module

    asked = []

    def fake_check(kernel, shapes, gate, kinds, smallest, progress, causal, ragged):
        asked.append((shapes, gate, kinds, smallest, causal, ragged))
        return {"kernel": kernel.name, "gate": records.GATE, "inputs": list(kinds), "passed": True, "reason": None,
                "shapes": []}

    monkeypatch.setattr(check_module, "check_kernel", fake_check)
    options, _ = offline.files(name)
    assert main(["check", "--settings", offline.file, *options, "--out", str(offline.out)]) == 0
    settings, c = offline.settings, offline.settings.run(name).configuration
    at_d = lambda shapes: [Shape(s.B, s.H, s.S, c.D) for s in shapes]  # noqa: E731  (B, H and S as configured)
    (shapes, gate, kinds, smallest, causal, ragged), = asked
    assert shapes == at_d(settings.check_shapes) and shapes[0] == Shape(**{**settings.case.as_dict(), "D": c.D})
    assert list(ragged) == at_d(settings.check_ragged) and smallest == settings.check_smallest
    assert gate == Gate(settings.check_factor, settings.tolerance) and causal == c.causal
    assert kinds == settings.check_kinds(name)
    assert offline.seen["holds"] == [f"check {name}"]


def test_an_nvml_or_cuda_error_in_a_command_is_one_line(monkeypatch, capsys, tmp_path):
    import pynvml

    from flashbench import cli

    journal = tmp_path / "flashbench-gpu-0000-19-00.0.journal"
    journal.write_text("")
    for error, said in ((pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION), "error: NVML failed in gpu-time: "),
                        (type("CUDARuntimeError", (RuntimeError,), {"__module__": "cupy_backends.cuda.api.runtime"})(
                            "cudaErrorIllegalAddress"), "error: CUDA failed in gpu-time: cudaErrorIllegalAddress")):
        monkeypatch.setattr(cli, "cmd_gpu_time", lambda a, error=error: (_ for _ in ()).throw(error))
        assert main(["gpu-time", str(journal)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(said) and len(err.splitlines()) == 1, err
    monkeypatch.setattr(cli, "cmd_gpu_time", lambda a: (_ for _ in ()).throw(KeyError("a bug")))
    with pytest.raises(KeyError):  # anything else is a bug, and shows its traceback
        main(["gpu-time", str(journal)])


def test_a_profile_refuses_a_source_changed_since_its_cubin_was_built(offline, capsys):
    from flashbench.files import read_json, sha256

    options, check = offline.files("v25")
    record_path = options[options.index("--record") + 1]
    record = read_json(record_path)
    run = ["profile", "--settings", offline.file, "--ncu", sys.executable, "--check", str(check), *options,
           "--out", str(offline.out)]
    write_json(record_path, {**record, "cubin_sha256": "a" * 64, "source_sha256": "0" * 64})  # the checked cubin,
    # built from another text of kernels/v25.cu
    assert main(run) == 1
    assert capsys.readouterr().err == (f"error: {record_path}: {record['source']} changed since this cubin was built "
                                       "from it: build it again\n")
    assert not offline.out.exists() and sha256(record["source"]) != "0" * 64
