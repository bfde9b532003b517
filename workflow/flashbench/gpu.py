"""Which GPU is here (via nvidia-smi, no CUDA context), its archive slug, and run provenance (the
clocks, power and throttling during each timing are sampled separately, through NVML: clocks.py)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from . import FlashbenchError


class NoGPUError(FlashbenchError):
    pass


@dataclass(frozen=True)
class GPU:
    name: str  # as the driver names it, e.g. "NVIDIA H200"
    arch: str  # e.g. "sm_90"

    @property
    def slug(self) -> str:
        return slugify(self.name)


def slugify(name: str) -> str:
    """'NVIDIA H200' -> 'nvidia-h200': the folder name of a GPU's results and report."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def arch_of(compute_cap: str) -> str:
    """'9.0' -> 'sm_90', '10.3' -> 'sm_103'."""
    major, minor = compute_cap.strip().split(".")
    return f"sm_{int(major)}{int(minor)}"


def _smi(*query: str, device: str | None = None) -> list[str] | None:
    """One GPU's values of an nvidia-smi query, or None where there is no usable GPU. The GPU is
    `device` (index, UUID or PCI bus id), else the first of CUDA_VISIBLE_DEVICES, else the first."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    device = device or os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip() or None
    try:
        proc = subprocess.run([smi, f"--query-gpu={','.join(query)}", "--format=csv,noheader,nounits",
                               *(["-i", device] if device else [])],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return [v.strip() for v in proc.stdout.strip().splitlines()[0].split(",")]


def detect() -> GPU | None:
    values = _smi("name", "compute_cap")
    return GPU(name=values[0], arch=arch_of(values[1])) if values else None


def all_bus_ids() -> list[str]:
    """The PCI bus id of every GPU on this machine (a compile holds all their locks), [] without one."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        proc = subprocess.run([smi, "--query-gpu=pci.bus_id", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in proc.stdout.splitlines() if line.strip()] if proc.returncode == 0 else []


def require() -> GPU:
    gpu = detect()
    if gpu is None:
        raise NoGPUError("no NVIDIA GPU found (nvidia-smi lists none): this stage runs kernels and needs one")
    return gpu


def _git_head(root: Path | str) -> str | None:
    """HEAD of the checkout at `root`, '+dirty' if tracked files other than the archive (results/,
    reports/: what a run remakes, and may have been cleared to run afresh) changed; None where git does
    not work."""
    git = ["git", "-c", "safe.directory=*"]  # a copied checkout may belong to another user
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", ".",
                                ":(exclude)results", ":(exclude)reports"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def git_commit(root: Path | str = ".") -> dict:
    """What git and the run say of the commit a run is made from: `git_commit`, git's own answer (or the
    given commit where git does not work), and `given_commit`, FLASHBENCH_GIT_COMMIT, where the two
    differ (a copied checkout whose .git knows another HEAD). The given commit is the run's
    (measured_commit)."""
    given = os.environ.get("FLASHBENCH_GIT_COMMIT", "").strip() or None
    head = _git_head(root)
    if head is None:
        return {"git_commit": f"{given} (given: no git here)" if given else "unknown (no git here: set FLASHBENCH_GIT_COMMIT)"}
    if given and not head.removesuffix("+dirty").startswith(given):
        return {"git_commit": head, "given_commit": given}
    return {"git_commit": head}


def uuid(bus_id: str) -> str:
    """The UUID of the GPU at `bus_id` (GPU-...), through NVML: what tells two GPUs of one kind apart,
    where a PCI bus id is the same on every machine of a kind (two runs agree more closely on one GPU)."""
    import pynvml

    from .clocks import nvml_device

    pynvml.nvmlInit()
    value = pynvml.nvmlDeviceGetUUID(nvml_device(pynvml, bus_id))
    return value.decode() if isinstance(value, bytes) else value


def provenance() -> dict:
    """Which GPU, driver, CUDA and commit a measurement was taken on, and when."""
    import cupy as cp

    device = cp.cuda.Device()  # the one the kernels ran on: nvidia-smi is asked about it by PCI bus id
    values = _smi("name", "compute_cap", "driver_version", "clocks.max.sm", "power.limit", device=device.pci_bus_id)
    if values is None:
        raise NoGPUError(f"nvidia-smi cannot read the GPU at {device.pci_bus_id}")
    name, cc, driver, sm_clock_max, power_limit = values
    attrs = device.attributes

    def version(v: int) -> str:
        return f"{v // 1000}.{(v % 1000) // 10}"

    return {
        "gpu": name,
        "gpu_uuid": uuid(device.pci_bus_id),
        "pci_bus_id": device.pci_bus_id,
        "arch": arch_of(cc),
        "sm_count": attrs["MultiProcessorCount"],
        "l2_bytes": attrs["L2CacheSize"],
        "driver": driver,
        "cuda_driver": version(cp.cuda.runtime.driverGetVersion()),
        "cuda_runtime": version(cp.cuda.runtime.runtimeGetVersion()),
        "cupy": cp.__version__,
        "sm_clock_max_mhz": sm_clock_max,
        "power_limit_w": power_limit,
        **git_commit(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def measured_commit(provenance: dict) -> str:
    """The one commit a record's numbers were measured at: the one given to the run where there is one
    (whoever gives it knows what the checkout was made from), else git's own answer."""
    return provenance.get("given_commit") or provenance["git_commit"]


def commits(provenances: list[dict]) -> dict:
    """The commits records were measured at, and git's own answers where they differ from those."""
    return {"measured": sorted({measured_commit(p) for p in provenances}),
            "git_said": sorted({p["git_commit"] for p in provenances if p.get("given_commit")})}
