"""One GPU job at a time, whatever Snakemake's flags: an inter-process lock per GPU (keyed on its PCI
bus id) in a folder every run on the machine shares.

Every stage that times or profiles on a GPU (bench, sweep, head-to-head, profile, cycles, the GPU
tests) holds its lock exclusively; a check holds it shared, and a compile every GPU's lock shared, so
that checks and builds run beside each other (a check's verdict does not depend on what runs beside
it) but never beside a timing. Two runs from two checkouts, or a run and the GPU tests, queue on the same file.
Under Nsight Compute the driver ncu starts takes the lock itself, once its imports are done, for the
stage that runs it (profile, cycles): neither ncu's start nor Python's holds the GPU. A process
started by a holder (a GPU test's command) is marked by FLASHBENCH_GPU_LOCK_HELD and does not take
the lock again. Each hold is appended to a journal beside the lock, so that overlaps
can be looked for afterwards (`overlapping`).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from . import FlashbenchError

HELD = "FLASHBENCH_GPU_LOCK_HELD"


def lock_dir() -> Path:
    return Path(os.environ.get("FLASHBENCH_LOCK_DIR") or tempfile.gettempdir())


def normalize_bus_id(bus_id: str) -> str:
    """'0000:19:00.0' (CUDA) and '00000000:19:00.0' (NVML, nvidia-smi) -> '0000:19:00.0'."""
    m = re.fullmatch(r"(?:([0-9a-fA-F]+):)?([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-7])", bus_id.strip())
    if m is None:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, device, function = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def lock_path(bus_id: str) -> Path:
    return lock_dir() / f"flashbench-gpu-{normalize_bus_id(bus_id).replace(':', '-')}.lock"


def journal_path(bus_id: str) -> Path:
    return lock_path(bus_id).with_suffix(".journal")


def _open_shared(path: Path, flags: int) -> int:
    """Open (creating) a file every user of the machine can use: the lock is shared between users."""
    fd = os.open(path, flags | os.O_CREAT, 0o666)
    try:
        os.fchmod(fd, 0o666)  # the umask took bits off; only the file's owner may put them back
    except PermissionError:
        pass
    return fd


@contextmanager
def hold(bus_id: str, what: str, exclusive: bool = True, progress=print):
    """Hold the lock of the GPU at `bus_id` for `what` (a stage's description); waits, saying so."""
    key = normalize_bus_id(bus_id)
    held = os.environ.get(HELD, "").split(",")
    if f"{key}:x" in held or (not exclusive and f"{key}:s" in held):  # our parent holds it for us
        yield
        return
    path = lock_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _open_shared(path, os.O_RDONLY)
    except OSError as e:
        raise FlashbenchError(f"cannot open the GPU lock {path}: {e.strerror} (FLASHBENCH_LOCK_DIR moves it)") from None
    holder = path.with_suffix(".holder")
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            busy = _holder(holder)
            progress(f"waiting for the GPU at {key}: held by {busy}")
            fcntl.flock(fd, mode)
        acquired = time.time()
        _note(holder, f"pid {os.getpid()}: {what}\n", os.O_WRONLY | os.O_TRUNC)
        previous = os.environ.get(HELD)
        os.environ[HELD] = ",".join(filter(None, [previous, f"{key}:{'x' if exclusive else 's'}"]))
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(HELD, None)
            else:
                os.environ[HELD] = previous
            entry = {"pid": os.getpid(), "what": what, "exclusive": exclusive, "acquired": acquired,
                     "released": time.time()}
            _note(journal_path(key), json.dumps(entry) + "\n", os.O_WRONLY | os.O_APPEND)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _holder(path: Path) -> str:
    """Who holds the lock, as its holder wrote; a diagnostic, so a file that cannot be read says so."""
    try:
        return path.read_text().strip() or "another job"
    except FileNotFoundError:
        return "another job"
    except OSError as e:
        return f"another job (its {path.name} cannot be read: {e.strerror})"


def _note(path: Path, text: str, flags: int) -> None:
    """Write the holder's name or a journal line; a diagnostic, so a file another user owns and keeps
    private is passed over rather than failing the job."""
    try:
        fd = _open_shared(path, flags)
    except OSError:
        return
    with os.fdopen(fd, "w") as f:
        f.write(text)


@contextmanager
def hold_shared(bus_ids: list[str], what: str, progress=print):
    """Hold every GPU's lock shared (a compile: beside other compiles, never beside a GPU job)."""
    with ExitStack() as stack:
        for bus_id in sorted(normalize_bus_id(b) for b in bus_ids):
            stack.enter_context(hold(bus_id, what, exclusive=False, progress=progress))
        yield


def read_journal(bus_id: str) -> list[dict]:
    path = journal_path(bus_id)
    return parse_journal(path) if path.exists() else []


def parse_journal(path: Path | str) -> list[dict]:
    """A journal's holds, a JSON object a line, each with what held the lock (a stage's name first), whether
    exclusively, and when it was acquired and released (epoch seconds)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise FlashbenchError(f"{path}: cannot be read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise FlashbenchError(f"{path}: not text, so no journal (a JSON object a line)") from None
    from . import schemas

    entry_schema = schemas.Validator({**schemas.load("records"), "$ref": "#/$defs/journal_entry"})
    entries = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as e:
            raise FlashbenchError(f"{path}: line {number} is not a journal entry (JSON): {e.msg}") from None
        if error := schemas.first_error(entry_schema, entry):
            raise FlashbenchError(f"{path}: line {number} is not a journal entry: key '{error[0]}': {error[1]}")
        entries.append(entry)
    return entries


def overlapping(entries: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of holds that overlapped in time where one of them was exclusive (which the lock forbids)."""
    pairs = []
    ordered = sorted(entries, key=lambda e: e["acquired"])
    for i, a in enumerate(ordered):
        for b in ordered[i + 1:]:
            if b["acquired"] >= a["released"]:
                break
            if a["exclusive"] or b["exclusive"]:
                pairs.append((a, b))
    return pairs


def time_by_stage(entries: list[dict], since: float = 0.0) -> dict:
    """Where a GPU's time went from `since` (epoch seconds) to the last release in the journal: per
    stage (the first word of each hold's `what`: compile, check, bench, sweep, profile, head-to-head,
    cycles) its holds and seconds held, and the seconds no job held the lock. Shared holds (builds,
    checks) overlap one another: a stretch of time is counted once, for the stage that took it first
    (so a check beside a build or another check counts only what no earlier hold covered)."""
    holds = sorted((e for e in entries if e["acquired"] >= since), key=lambda e: e["acquired"])
    if not holds:
        return {"stages": {}, "idle_s": 0.0, "span_s": 0.0}
    stages, covered_until, idle = {}, holds[0]["acquired"], 0.0
    for e in holds:
        stage = stages.setdefault(e["what"].split()[0], {"holds": 0, "seconds": 0.0})
        stage["holds"] += 1
        idle += max(0.0, e["acquired"] - covered_until)
        stage["seconds"] += max(0.0, e["released"] - max(e["acquired"], covered_until))
        covered_until = max(covered_until, e["released"])
    return {"stages": stages, "idle_s": idle, "span_s": covered_until - holds[0]["acquired"]}
