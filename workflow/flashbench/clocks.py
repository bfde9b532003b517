"""The GPU's clocks, power, temperature and throttle reasons, sampled through NVML while timings run.

A child process samples (so no sampling thread competes with the timed Python loop for the GIL)
and appends one JSON line per reading to a file; each timing asks for the readings inside its own
wall-clock window. A timing during which the GPU throttled (power cap, thermal, hardware slowdown)
is flagged, and the report says so.

    python -m flashbench.clocks BUS_ID INTERVAL_S OUT_FILE   (the sampler; stops when stdin closes)
"""
from __future__ import annotations

import json
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import FlashbenchError

# NVML's clock event (throttle) reasons that lower the clock under load; idle, application clocks
# and sync boost are not throttling.
THROTTLE_REASONS = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal",
                    0x80: "hw_power_brake"}


def nvml_device(pynvml, bus_id: str):
    """NVML's handle of the GPU at `bus_id` (NVML initialised), found by its PCI bus id as CUDA gives it."""
    from .gpulock import normalize_bus_id

    want = normalize_bus_id(bus_id)
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        found = pynvml.nvmlDeviceGetPciInfo(handle).busId
        if normalize_bus_id(found.decode() if isinstance(found, bytes) else found) == want:
            return handle
    raise FlashbenchError(f"NVML lists no GPU at {bus_id}")


def sample_forever(bus_id: str, interval_s: float, out: Path) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = nvml_device(pynvml, bus_id)
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    with open(out, "a", buffering=1) as f:
        while True:
            f.write(json.dumps({
                "t": time.time(),
                "sm_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                "mem_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
                "power_w": pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                "temperature_c": pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
                "reasons": int(reasons(handle)),
            }) + "\n")
            if select.select([sys.stdin], [], [], interval_s)[0]:  # stdin closed: stop
                return


def summarize(samples: list[dict]) -> dict:
    """Min / median / max of each reading and the throttle reasons seen in `samples`."""
    if not samples:
        return {"samples": 0, "throttled": None, "throttle_reasons": []}
    seen = 0
    for s in samples:
        seen |= s["reasons"]
    reasons = [name for bit, name in THROTTLE_REASONS.items() if seen & bit]

    def spread(key):
        values = [s[key] for s in samples]
        return {"min": min(values), "median": statistics.median(values), "max": max(values)}

    return {"samples": len(samples), "sm_clock_mhz": spread("sm_mhz"), "mem_clock_mhz": spread("mem_mhz"),
            "power_w": spread("power_w"), "temperature_c": spread("temperature_c"),
            "throttled": bool(reasons), "throttle_reasons": reasons}


class EnergyCounter:
    """NVML's total energy counter of the GPU at `bus_id` (millijoules since the driver loaded), read
    in this process: it moves in steps, so it is read over windows of a second or more."""

    def __init__(self, bus_id: str):
        import pynvml

        self._pynvml = pynvml
        pynvml.nvmlInit()
        self._handle = nvml_device(pynvml, bus_id)
        self.joules()  # raises where the GPU has no energy counter

    @classmethod
    def open(cls, bus_id: str) -> "EnergyCounter | None":
        """The counter, or None where NVML has none for this GPU."""
        import pynvml

        try:
            return cls(bus_id)
        except pynvml.NVMLError_NotSupported:
            return None

    def joules(self) -> float:
        return self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0


class ClockSampler:
    """Samples the GPU at `bus_id` from construction to close(); window(t0, t1) summarises a timing."""

    def __init__(self, bus_id: str, interval_s: float = 0.01, timeout_s: float = 20.0):
        self.interval_s = interval_s
        self._dir = tempfile.TemporaryDirectory(prefix="flashbench-clocks-")
        self.path = Path(self._dir.name) / "samples.jsonl"
        self._errors = Path(self._dir.name) / "sampler.err"
        with open(self._errors, "w") as err:
            self._proc = subprocess.Popen([sys.executable, "-m", "flashbench.clocks", bus_id, str(interval_s),
                                           str(self.path)], stdin=subprocess.PIPE, stderr=err)
        deadline = time.time() + timeout_s
        while not (self.path.exists() and self.path.stat().st_size):  # the first reading: NVML is up
            if self._proc.poll() is not None:
                message = self._last_error()
                self.close()
                raise FlashbenchError(f"the NVML clock sampler stopped: {message}")
            if time.time() > deadline:
                self.close()
                raise FlashbenchError(f"the NVML clock sampler gave no reading in {timeout_s:.0f} s")
            time.sleep(0.01)

    def _last_error(self) -> str:
        lines = self._errors.read_text().strip().splitlines()
        return lines[-1] if lines else "no message"

    def samples(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.endswith("}")]

    def window(self, t0: float, t1: float) -> dict:
        """Readings between t0 and t1 (time.time()); a window shorter than the interval gets the
        reading just before it and the one just after."""
        return self.windows([(t0, t1)])[0]

    def windows(self, spans: list[tuple[float, float]]) -> list[dict]:
        """`window` of each (t0, t1) in `spans`, all read once, after the last has closed."""
        time.sleep(self.interval_s * 1.5)  # let the reading that closes the last window land
        if self._proc.poll() is not None:  # its last readings would pass for this timing's
            raise FlashbenchError(f"the NVML clock sampler stopped during the timing: {self._last_error()}")
        every = self.samples()
        out = []
        for t0, t1 in spans:
            inside = [s for s in every if t0 <= s["t"] <= t1]
            if not inside:
                before = [s for s in every if s["t"] < t0][-1:]
                after = [s for s in every if s["t"] > t1][:1]
                inside = before + after
            out.append(summarize(inside))
        return out

    def close(self) -> None:
        self._proc.stdin.close()  # the sampler's signal to stop
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._dir.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


if __name__ == "__main__":
    sample_forever(sys.argv[1], float(sys.argv[2]), Path(sys.argv[3]))
