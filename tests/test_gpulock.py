"""One GPU job at a time: the per-GPU lock across processes, shared holds for builds, the journal."""
import os
import subprocess
import sys
import time

import pytest

from flashbench import gpulock

BUS = "00000000:19:00.0"
HOLD = """
import sys, time
from flashbench import gpulock
with gpulock.hold(sys.argv[1], sys.argv[2], exclusive=sys.argv[3] == "x", progress=lambda m: print(m, flush=True)):
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
"""


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_LOCK_DIR", str(tmp_path))
    monkeypatch.delenv(gpulock.HELD, raising=False)


def holder(what, mode, seconds):
    """Another process holding the lock; returns once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, BUS, what, mode, str(seconds)], stdout=subprocess.PIPE,
                            text=True, env=os.environ)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_bus_ids_of_cuda_and_nvml_name_one_lock():
    assert gpulock.normalize_bus_id("0000:19:00.0") == gpulock.normalize_bus_id(BUS) == "0000:19:00.0"
    assert gpulock.lock_path("0000:19:00.0") == gpulock.lock_path(BUS)
    with pytest.raises(ValueError):
        gpulock.normalize_bus_id("GPU-1234")


def test_a_second_gpu_job_waits_for_the_first_and_says_for_whom():
    first = holder("bench v13", "x", 1.0)
    said = []
    start = time.time()
    with gpulock.hold(BUS, "check v12", progress=said.append):
        waited = time.time() - start
    first.wait()
    assert waited > 0.3
    assert said and "held by pid" in said[0] and "bench v13" in said[0]
    assert gpulock.overlapping(gpulock.read_journal(BUS)) == []
    assert [e["what"] for e in gpulock.read_journal(BUS)] == ["bench v13", "check v12"]


def test_builds_share_the_lock_with_each_other_but_not_with_a_gpu_job():
    build = holder("compile v11 sm_90", "s", 1.0)
    start = time.time()
    with gpulock.hold_shared([BUS], "compile v12 sm_90", progress=lambda m: None):
        assert time.time() - start < 0.3  # beside the other build at once
    with gpulock.hold(BUS, "bench v11", progress=lambda m: None):
        assert time.time() - start > 0.3  # the timing waited for the build
    build.wait()
    journal = gpulock.read_journal(BUS)
    assert len(journal) == 3 and gpulock.overlapping(journal) == []


def test_a_process_started_by_the_holder_does_not_take_the_lock_again():
    with gpulock.hold(BUS, "profile v13", progress=lambda m: None):
        child = subprocess.run([sys.executable, "-c", HOLD, BUS, "launch-once v13", "x", "0"], capture_output=True,
                               text=True, timeout=20, env=os.environ)
    assert child.returncode == 0 and child.stdout.strip() == "held"


def test_overlapping_finds_exclusive_holds_that_overlapped():
    a = {"what": "a", "exclusive": True, "acquired": 0.0, "released": 2.0}
    b = {"what": "b", "exclusive": True, "acquired": 1.0, "released": 3.0}
    c = {"what": "c", "exclusive": False, "acquired": 3.5, "released": 4.0}
    d = {"what": "d", "exclusive": False, "acquired": 3.6, "released": 4.5}
    assert gpulock.overlapping([a, b, c, d]) == [(a, b)]


def test_the_gpu_time_goes_to_the_stage_that_held_it_and_the_gaps_are_idle():
    def hold(what, acquired, released, exclusive=True):
        return {"pid": 1, "what": what, "exclusive": exclusive, "acquired": acquired, "released": released}

    journal = [hold("compile v24", 100, 104, False), hold("compile v25", 101, 106, False),  # shared, overlapping
               hold("check v24", 107, 110), hold("check v25", 110, 112), hold("sweep v25", 115, 125),
               hold("head-to-head B=1 H=64 S=1024 D=128", 125.5, 155), hold("bench v11", 50, 60)]
    used = gpulock.time_by_stage(journal, since=100)
    assert used["stages"] == {"compile": {"holds": 2, "seconds": 6.0}, "check": {"holds": 2, "seconds": 5.0},
                              "sweep": {"holds": 1, "seconds": 10.0}, "head-to-head": {"holds": 1, "seconds": 29.5}}
    assert used["idle_s"] == pytest.approx(1 + 3 + 0.5) and used["span_s"] == 55
    assert gpulock.time_by_stage(journal, since=200) == {"stages": {}, "idle_s": 0.0, "span_s": 0.0}


def test_gpu_time_reads_a_journal_and_refuses_a_bad_line_or_time_in_one_line(tmp_path):
    journal = tmp_path / "flashbench-gpu-0000-19-00.0.journal"
    good = '{"pid": 1, "what": "sweep v25", "exclusive": true, "acquired": 1e9, "released": 1000000010}\n'
    journal.write_text(good)
    run = [sys.executable, "-m", "flashbench", "gpu-time"]
    out = subprocess.run([*run, str(journal)], capture_output=True, text=True)
    assert out.returncode == 0 and "sweep" in out.stdout and "10.0 s held, 1 holds" in out.stdout
    out = subprocess.run([*run, str(journal), "--since", "yesterday"], capture_output=True, text=True)
    assert out.returncode != 0 and "not an ISO 8601 time" in out.stderr and "Traceback" not in out.stderr
    for bad in ("not json", "[1]", '{"start": "x"}', '{"pid": 1, "what": "", "exclusive": true, "acquired": 1, "released": 2}',
                '{"pid": 1, "what": "bench v1", "exclusive": true, "acquired": "1", "released": 2}',
                '{"pid": 1, "what": "bench v1", "exclusive": 1, "acquired": 1, "released": 2}'):
        journal.write_text(good + bad + "\n")
        out = subprocess.run([*run, str(journal)], capture_output=True, text=True)
        assert out.returncode != 0 and "line 2 is not a journal entry" in out.stderr, bad
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, bad
    journal.write_bytes(b"\xff\xfe")
    out = subprocess.run([*run, str(journal)], capture_output=True, text=True)
    assert out.returncode != 0 and "not text" in out.stderr and "Traceback" not in out.stderr


def test_a_check_holds_its_gpu_shared_a_timing_exclusively(tmp_path, monkeypatch, records_settings):
    """A check times nothing: it runs beside builds and other checks, never beside a timing."""
    import contextlib

    import records
    from flashbench import check, cli, gpu
    from flashbench.files import write_json

    holds = []
    monkeypatch.setattr(gpu, "require", lambda: None)
    monkeypatch.setattr(gpu, "provenance", lambda: records.provenance("v14"))
    monkeypatch.setattr(cli, "_runnable_here", lambda record: None)
    monkeypatch.setattr(cli, "_gpu_held",
                        lambda what, exclusive=True: contextlib.nullcontext(holds.append((what, exclusive))))
    monkeypatch.setattr(cli, "_kernel", lambda a: type("Kernel", (), {"name": "v14", "identity": {}})())
    monkeypatch.setattr(check, "check_kernel", lambda kernel, *args, **kwargs: {
        "kernel": "v14", "gate": records.GATE, "inputs": records.INPUTS, "passed": False, "reason": "planted",
        "shapes": []})
    cubin, record = tmp_path / "v14.cubin", tmp_path / "v14.json"
    cubin.write_bytes(b"")
    write_json(record, records.compile_record("v14", "sm_90a", "kernels/v14.cu"))
    cli.main(["check", *records_settings, "--cubin", str(cubin), "--record", str(record),
              "--out", str(tmp_path / "check" / "v14.json")])
    assert holds == [("check v14", False)]
    with gpulock.hold(BUS, "check v12", exclusive=False, progress=lambda m: None):
        another_job = {k: v for k, v in os.environ.items() if k != gpulock.HELD}  # not one this hold started
        subprocess.run([sys.executable, "-c", HOLD, BUS, "check v13", "s", "0.2"], env=another_job, timeout=20,
                       check=True, capture_output=True)  # beside it at once (it would time out waiting)
    beside = {e["what"]: e for e in gpulock.read_journal(BUS)}
    assert beside["check v13"]["acquired"] < beside["check v12"]["released"]  # the two held it at once
    a_check = holder("check v15", "s", 1.0)
    start = time.time()
    with gpulock.hold(BUS, "bench v11", progress=lambda m: None):
        assert time.time() - start > 0.3  # the timing waited for the check
    a_check.wait()
    assert gpulock.overlapping(gpulock.read_journal(BUS)) == []
