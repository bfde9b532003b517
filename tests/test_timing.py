"""timing.bench / timing.sweep on CPU: a fake CUDA that logs every event record, call and replay."""
import types

import numpy as np
import pytest

from flashbench import FlashbenchError, NoKernelForShape, timing
from flashbench.config import Shape

CASE = Shape(1, 64, 1024, 128)


class FakeCuda:
    """Events that log where they were recorded; elapsed time = the calls logged between two events."""

    def __init__(self):
        self.log = []
        cuda = self

        class Event:
            def record(self):
                self.at = len(cuda.log)
                cuda.log.append(("event", id(self)))

            def synchronize(self):
                pass

        self.cp = types.SimpleNamespace(
            random=np.random, float16=np.float16, float32=np.float32, uint16=np.uint16,
            full=np.full,
            cuda=types.SimpleNamespace(Event=Event, runtime=types.SimpleNamespace(deviceSynchronize=lambda: None),
                                       get_elapsed_time=lambda a, b: 0.01 * sum(1 for x in cuda.log[a.at:b.at]
                                                                                if x[0] in ("call", "replayed call"))))


class Kernel:
    causal = False

    def __init__(self, cuda, unsupported=None, no_kernel=False):
        self.name, self.cp, self.cuda, self.unsupported, self.no_kernel = "fake", cuda.cp, cuda, unsupported, no_kernel

    def supports(self, shape):
        return (self.unsupported or {}).get(shape.S)

    def inputs(self, shape, rng, kind="normal"):
        return (None,) * 4

    def __call__(self, q, k, v, o):
        if self.no_kernel:
            raise NoKernelForShape("no kernel for these inputs")
        self.cuda.log.append(("call",))

    def capture(self, q, k, v, o, calls):
        self.cuda.log.append(("capture", calls))

        def replay():
            self.cuda.log.extend([("replayed call",)] * calls)
        return replay


def test_a_causal_kernels_timing_counts_half_the_flops():
    dense, causal = Kernel(FakeCuda()), Kernel(FakeCuda())
    causal.causal = True
    d, c = (timing.bench(k, CASE, steps=10, repeats=3, warmup=1, seed=1, graph_replays=2) for k in (dense, causal))
    assert not d["causal"] and c["causal"] and c["ms_per_step"] == d["ms_per_step"]
    for figure in ("tflops", "tflops_median", "tflops_graph"):
        assert c[figure] == pytest.approx(d[figure] / 2)


def test_bench_places_its_events_around_exactly_the_timed_calls():
    cuda = FakeCuda()
    r = timing.bench(Kernel(cuda), CASE, steps=100, repeats=7, warmup=5, seed=1, graph_replays=3)
    log = cuda.log
    events = [i for i, x in enumerate(log) if x[0] == "event"]
    assert log[:5] == [("call",)] * 5  # warm-up first, untimed
    # the write-up's method: one pair of events around the 100 back-to-back calls
    assert log[events[0] + 1:events[1]] == [("call",)] * 100
    # the repeats: each call between its own pair
    for n in range(7):
        a, b = events[2 + 2 * n], events[3 + 2 * n]
        assert log[a + 1:b] == [("call",)]
    # the graph: captured once with the 100 calls, one untimed replay, then each replay between events
    capture = log.index(("capture", 100))
    assert capture > events[15] and log.count(("capture", 100)) == 1
    graph_events = [i for i in events if i > capture]
    assert len(graph_events) == 6
    for n in range(3):
        a, b = graph_events[2 * n], graph_events[2 * n + 1]
        assert log[a + 1:b] == [("replayed call",)] * 100
    assert r["ms_per_step"] == pytest.approx(0.01) and r["ms_median"] == pytest.approx(0.01)
    assert r["ms_graph"] == pytest.approx(0.01) and r["tflops_graph"] == pytest.approx(r["tflops"])
    assert r["clocks"] is None  # no sampler given


def test_bench_refuses_a_shape_the_kernel_cannot_run_before_any_call():
    cuda = FakeCuda()
    with pytest.raises(FlashbenchError, match="not timed at B=1 H=64 S=1024"):
        timing.bench(Kernel(cuda, unsupported={1024: "S=1024 is not a multiple of 768"}), CASE, 100, 1, 1, 1, 1)
    assert cuda.log == []


def test_sweep_skips_unsupported_lengths_and_shapes_with_no_kernel_and_times_the_rest():
    cuda = FakeCuda()
    shapes = [Shape(1, 64, S, 128) for S in (512, 1024, 2048)]
    points = timing.sweep(Kernel(cuda, unsupported={1024: "too long"}), shapes, 8, 1024, 2, 0, 1, 2,
                          progress=lambda m: None)
    assert [p["timed"] for p in points] == [True, False, True]
    assert [p.get("steps") for p in points] == [32, None, 2]  # the work of 8 calls at S=1024
    assert points[1]["reason"] == "too long" and "tflops" not in points[1]
    assert points[0]["tflops_graph"] > 0
    none = timing.sweep(Kernel(cuda, no_kernel=True), shapes[:1], 2, 1024, 2, 0, 1, 2, progress=lambda m: None)
    assert none == [{**shapes[0].as_dict(), "timed": False, "reason": "no kernel for these inputs"}]


def test_the_sweep_times_the_same_work_at_every_length_with_at_least_one_call():
    from flashbench.config import sweep_steps

    assert [sweep_steps(20, 1024, S) for S in (512, 1024, 2048, 4096, 8192, 16384)] == [80, 20, 5, 1, 1, 1]
    assert sweep_steps(100, 1024, 3000) == 12  # 100 x (1024/3000)^2 = 11.65, rounded
    assert [sweep_steps(n, 1024, 2048) for n in (2, 6, 10)] == [1, 2, 3]  # halves up, not to even


def test_the_clock_window_flags_throttling():
    from flashbench.clocks import summarize

    calm = [{"t": i, "sm_mhz": 1980, "mem_mhz": 3201, "power_w": 400.0, "temperature_c": 50, "reasons": 0}
            for i in range(4)]
    assert summarize(calm)["throttled"] is False and summarize(calm)["sm_clock_mhz"]["min"] == 1980
    capped = calm + [{**calm[0], "sm_mhz": 1600, "reasons": 0x4 | 0x1}]  # power cap (idle is not throttling)
    s = summarize(capped)
    assert s["throttled"] and s["throttle_reasons"] == ["sw_power_cap"] and s["sm_clock_mhz"]["min"] == 1600
    assert summarize([])["throttled"] is None


def test_without_nvml_the_clock_sampler_stops_with_one_clear_error():
    from flashbench import FlashbenchError, gpu
    from flashbench.clocks import ClockSampler

    if gpu.detect() is not None:
        pytest.skip("a GPU is here: NVML answers")
    with pytest.raises(FlashbenchError, match="the NVML clock sampler stopped: "):
        ClockSampler("0000:19:00.0", timeout_s=20)


FAKE_NVML = '''
NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
class _Pci:
    busId = b"00000000:19:00.0"
def nvmlInit(): pass
def nvmlDeviceGetCount(): return 1
def nvmlDeviceGetHandleByIndex(i): return "gpu0"
def nvmlDeviceGetPciInfo(h): return _Pci()
def nvmlDeviceGetClockInfo(h, which): return 1755 if which == NVML_CLOCK_SM else 3201
def nvmlDeviceGetPowerUsage(h): return 699000
def nvmlDeviceGetTemperature(h, sensor): return 61
def nvmlDeviceGetCurrentClocksEventReasons(h): return 0x4
'''


def test_the_sampler_reads_the_gpu_at_its_bus_id_and_flags_a_power_cap(tmp_path, monkeypatch):
    import time

    from flashbench.clocks import ClockSampler

    (tmp_path / "pynvml.py").write_text(FAKE_NVML)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{__import__('os').environ.get('PYTHONPATH', '')}")
    with ClockSampler("0000:19:00.0", interval_s=0.01) as sampler:  # CUDA's spelling of NVML's bus id
        t0 = time.time()
        time.sleep(0.1)
        window = sampler.window(t0, time.time())
    assert window["samples"] >= 3 and window["throttled"] and window["throttle_reasons"] == ["sw_power_cap"]
    assert window["sm_clock_mhz"] == {"min": 1755, "median": 1755, "max": 1755} and window["power_w"]["max"] == 699.0
