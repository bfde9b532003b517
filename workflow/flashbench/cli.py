"""Command line of the pipeline's stages; each Snakemake rule calls one subcommand.

    python -m flashbench compile | check | bench | sweep | profile | summarize | render | compare | pages ...
    python -m flashbench agreement FIRST_RUN SECOND_RUN   (results/<gpu> of two runs on GPUs of one kind)
    python -m flashbench wheelhouse --python 3.12 --platform manylinux_2_28_x86_64 DIR

Errors the user can act on print one line, `error: ...`, and exit 1. Every path an argument names is
checked as the command line is read, before anything runs or is written (input_file, output_folder, ...).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, replace
from pathlib import Path

from . import FlashbenchError, archives, attention
from .config import RUN_SEPARATOR, ConfigError, Shape, conform, load_settings, ragged_pairable, supported_archs
from .files import digests, read_json, sha256, staged_folder, write_json, write_text
from .validation import BadRecord, Expected, read_record


_STARTED = time.monotonic()


def _asked_for(value, what: str, keys: str):
    """A stage's part of the settings (`value`), or the error that the run did not ask for the stage."""
    if not value:
        raise FlashbenchError(f"no {what} in the settings (config {keys})")
    return value


def _write_record(a, record: dict) -> None:
    """A stage's record at --out, naming what it was made from (--depends-on: the job's inputs) with
    their sha256, by which the workflow knows it up to date whatever the files' times."""
    write_json(a.out, {**record, "inputs_sha256": digests(a.depends_on)})


def _progress(message: str) -> None:
    """A long step's progress line, with the seconds since the command started (where a GPU job's
    time goes: imports, a library's compile, the measurement itself)."""
    print(f"[{time.monotonic() - _STARTED:6.1f} s] {message}", flush=True)


def cmd_compile(a) -> None:
    """On stdout the outcome, with nvcc's whole output where it failed; its error's first lines on
    stderr (the rule sends stdout to the log alone, stderr to the log and the console)."""
    from . import gpu, gpulock
    from .compile import CommandFailed, check_paths, compile_kernel

    run = a.settings.run(a.kernel)  # the kernel, or the kernel in another configuration (v25.causal)
    kernel = a.settings.kernel(run.of)
    archs = kernel.archs or supported_archs()  # its own, or any the workflow builds kernels for
    if a.arch not in archs:
        raise FlashbenchError(f"--arch {a.arch}: {a.kernel} is built for {', '.join(archs)}")
    check_paths(kernel.source, a.cubin, a.record)  # before nvidia-smi, or a wait for the GPUs' locks
    # Builds run beside each other but never beside a GPU job: every GPU's lock, shared.
    with gpulock.hold_shared(gpu.all_bus_ids(), f"compile {a.kernel} {a.arch}", progress=_progress):
        try:
            record = compile_kernel(a.kernel, kernel.source, a.arch, a.settings.nvcc_flags, a.settings.defines(a.kernel),
                                    a.cubin)
        except CommandFailed as e:
            print(e.transcript, end="", flush=True)
            raise
    stated = {"causal": record["launch"].get("causal", False), "dtype": record["launch"].get("dtype", "fp16"),
              "head_dim": record["launch"]["head_dim"], "grouped_kv": record["launch"].get("grouped_kv", False)}
    asked = {"causal": run.configuration.causal, "dtype": run.configuration.dtype, "head_dim": run.configuration.D,
             "grouped_kv": run.configuration.kv_group > 1}
    if stated != asked:
        differ = ", ".join(f"{key} {stated[key]} (asked {asked[key]})" for key in stated if stated[key] != asked[key])
        raise FlashbenchError(f"{a.kernel}: built for the configuration {run.configuration.name}, its launch contract "
                              f"says {differ}: the source does not take the configuration's parameters")
    write_json(a.record, record)
    print(f"{a.kernel} {a.arch}: {record['registers']} registers, {record['spill_bytes']} spill bytes, "
          f"{record['smem_bytes']} B smem, {record['blocks_per_sm']} blocks/SM")


class NotRunnableHere(FlashbenchError):
    """A kernel built only for another GPU (e.g. sm_90a on an SM103): recorded as skipped, with why."""


def _runnable_here(record_path) -> None:
    """Raise NotRunnableHere where the GPU here cannot run this build (asked before the GPU is taken)."""
    from . import gpu
    from .compile import not_runnable_reason, runs_on

    here = gpu.require().arch
    record = read_record(record_path, "compile")
    if not runs_on(record["arch"], here):
        raise NotRunnableHere(not_runnable_reason([record["arch"]], here))


@contextmanager
def _gpu_held(what: str, exclusive: bool = True):
    """This stage's hold on its GPU (the one CUDA gives it): one timing at a time across processes, and
    nothing beside it; `exclusive=False` (a check, which times nothing): beside builds and other checks."""
    from . import gpu, gpulock

    gpu.require()
    import cupy as cp

    device = cp.cuda.Device()
    device.synchronize()  # CUDA's context made while waiting, not in the hold: making it runs nothing on the GPU
    with gpulock.hold(device.pci_bus_id, what, exclusive=exclusive, progress=_progress):
        yield


@contextmanager
def _held_by_driver(what: str, out: str | None):
    """The hold of a driver ncu runs (launch-once, launch-marked), taken once its imports are done, so that
    neither ncu's start nor Python's holds the GPU: `what` names the stage it runs for. At `out` it says
    what it ran (the dict it yields) and on what (provenance, read once the GPU is let go), or, where the
    GPU could not be held, why (`not_held`: its parent's stage then fails, where ncu's own failure is
    recorded)."""
    from . import gpu

    with ExitStack() as held:
        try:
            held.enter_context(_gpu_held(what))
        except Exception as e:  # no lock, no GPU, or CUDA failing to name the GPU: said, and the stage fails
            if out:
                write_json(out, {"not_held": f"{e}" if isinstance(e, FlashbenchError) else f"{type(e).__name__}: {e}"})
            raise
        ran = {}
        yield ran
    if out:
        write_json(out, {**ran, "provenance": gpu.provenance()})


def _driver_said(path: Path) -> dict | None:
    """What a driver wrote at its --identity-out (None: nothing, as where ncu or the driver failed before
    it could say); where it could not hold the GPU, the stage fails."""
    said = read_json(path) if path.is_file() else None
    if said and "not_held" in said:
        raise FlashbenchError(said["not_held"])
    return said


def _ran(path: Path, name: str) -> dict:
    """What the driver ncu ran for `name` wrote once ncu succeeded: there must be something."""
    said = _driver_said(path)
    if said is None:
        raise FlashbenchError(f"{name}: ncu ran, but its driver said nothing of what it ran")
    return said


def _import_peer_libraries(settings, names: list[str]) -> None:
    """Before a stage waits for the GPU: the libraries of the peer runs among `names` (a kernel build
    has none; peers.import_libraries)."""
    from .peers import import_libraries

    peer_runs = {run.name: run for run in settings.peer_runs()}
    for name in names:
        if name in peer_runs:
            import_libraries(settings.peer(peer_runs[name].of))


def _kernel(a):
    """The implementation a check / bench / sweep / cycles runs: a compiled kernel or a configured peer
    (in the configuration `--peer` names, as sdpa_cudnn.causal does)."""
    return _implementation(_peer_of(a), a.cubin, a.record, _run(a))


def _peer_of(a):
    """The config.Peer `--peer` names (or a run of it in a configuration: sdpa_cudnn.causal), or None for
    a kernel."""
    if not a.peer:
        return None
    peer = a.settings.peer(a.peer.partition(RUN_SEPARATOR)[0])  # a peer the settings lack, named as such
    a.settings.run(a.peer)  # and a configuration they lack
    return peer


def _run(a):
    """The kernel build or peer run the command is for, with its configuration (config.Run)."""
    return a.settings.run(_name(a))


def _run_settings(a):
    """The settings as the run the command is for reads its shapes: at its configuration's D."""
    return a.settings.in_configuration(_run(a).configuration)


def _implementation(peer, cubin: str | None, record_path: str | None, run=None):
    """A peer (a config.Peer, in `run`'s configuration and named by it where given), or the kernel
    `cubin` its compile record describes (its inputs in `run`'s configuration where given)."""
    from .compile import runs_on
    from .launch import AttentionKernel

    if peer:
        from . import peers

        return peers.make(peer, run.configuration, run.name) if run else peers.make(peer)
    import cupy as cp

    record = read_record(record_path, "compile")
    here = "sm_" + cp.cuda.Device().compute_capability
    if not runs_on(record["arch"], here):
        raise FlashbenchError(f"{cubin} is built for {record['arch']} but the GPU it would run on is {here}")
    if sha256(cubin) != record["cubin_sha256"]:
        raise FlashbenchError(f"{cubin} is not the cubin its compile record describes: recompile it")
    return AttentionKernel(cubin, record, run.configuration if run else None)


def _name(a) -> str:
    return a.peer if a.peer else read_record(a.record, "compile")["kernel"]


def cmd_check(a) -> None:
    from . import gpu
    from .check import Gate, check_kernel
    from .peers import PeerUnavailable, require

    gpu.require()  # a missing GPU fails the stage; only what stays true on a GPU is recorded as skipped
    run = _run(a)  # the build or peer run, and its configuration
    settings = a.settings.in_configuration(run.configuration)  # its shapes at the configuration's D
    gate = Gate(factor=settings.check_factor, tolerance=settings.tolerance)

    def skipped(reason) -> None:  # no torch, another GPU's kernel, no library kernel here: the run goes on
        _write_record(a, {"kernel": run.name, "configuration": run.configuration.name, "gate": asdict(gate),
                           "passed": False, "skipped": str(reason), "reason": f"skipped: {reason}", "shapes": []})
        print(f"{run.name}: skipped, {reason}")

    try:
        if a.peer:
            require(_peer_of(a))
        else:
            _runnable_here(a.record)
    except (PeerUnavailable, NotRunnableHere) as e:
        return skipped(e)
    _import_peer_libraries(settings, [run.name])
    with _gpu_held(f"check {_name(a)}", exclusive=False):  # its results do not depend on what runs beside it
        try:
            kernel = _kernel(a)
        except PeerUnavailable as e:  # the library imports, but has no kernel for this GPU
            return skipped(e)
        result = check_kernel(kernel, settings.check_shapes, gate, kinds=settings.check_kinds(run.name),
                              smallest=settings.check_smallest, progress=_progress, causal=run.configuration.causal,
                              ragged=settings.check_ragged)
        _write_record(a, {**result, "configuration": run.configuration.name, **kernel.identity,
                          "provenance": gpu.provenance()})
        print(f"{kernel.name}: {'all shapes pass' if result['passed'] else 'FAILED: ' + result['reason']}")
        if any(r.get("hung") for r in result["shapes"]):
            _leave_now()


def _leave_now() -> None:
    """End the process at once, its record written: a call that hangs still runs on the GPU and ends with
    the process (the driver tears its context down), while anything else, CuPy freeing its memory at
    exit or the lock's release, would wait on it for ever (the lock is let go with the process; the
    journal has no line for that hold)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _refused(check: dict, a, done: str = "timed") -> bool:
    """A kernel or peer that failed (or skipped) its check is never timed nor profiled: say so in its
    record (`done`: timed | profiled)."""
    if check["passed"]:
        return False
    reason = check["reason"] if check.get("skipped") else f"failed its check: {check['reason']}"
    _write_record(a, {"kernel": check["kernel"], "configuration": a.settings.run(check["kernel"]).configuration.name,
                       done: False, "reason": reason})
    print(f"{check['kernel']}: not {done}, {reason}")
    return True


def _same_as_checked(name: str, identity: dict, check: dict) -> None:
    """What is timed or profiled must be what passed the check: the same cubin (or torch build)."""
    differs = {key: (check.get(key), value) for key, value in identity.items() if check.get(key) != value}
    if differs:
        detail = ", ".join(f"{key} {now} (checked: {then})" for key, (then, now) in differs.items())
        raise FlashbenchError(f"{name} is not what passed its check: {detail}; run its check again")


def _timed(a, what: str, run) -> None:
    """Hold the GPU, refuse what did not pass or is not what passed, sample the clocks, run `run`."""
    import secrets

    from . import gpu
    from .clocks import ClockSampler

    check = read_record(a.check, "check")
    if _refused(check, a):
        return
    _import_peer_libraries(a.settings, [check["kernel"]])
    with _gpu_held(f"{what} {check['kernel']}"):
        kernel = _kernel(a)
        _same_as_checked(kernel.name, kernel.identity, check)
        import cupy as cp

        with ClockSampler(cp.cuda.Device().pci_bus_id) as sampler:
            result = run(kernel, secrets.randbits(32), sampler)
    # provenance read once the GPU is let go: nothing in it moves with the work, and nvidia-smi's start would
    # keep the GPU idle in the hold
    _write_record(a, {"kernel": kernel.name, "configuration": _run(a).configuration.name, "timed": True,
                      "reason": None, **kernel.identity, **result, "provenance": gpu.provenance()})


def cmd_bench(a) -> None:
    from .timing import bench

    shape, counts = _run_settings(a).case, a.settings.bench

    def run(kernel, seed, sampler):
        _progress(f"bench {kernel.name}: {shape}, {counts['steps']}-step method + {counts['repeats']} timed calls + graph")
        timing = bench(kernel, shape, counts["steps"], counts["repeats"], counts["warmup"], seed, counts["graph_replays"],
                       sampler)
        print(f"{kernel.name}: {timing['tflops']:.1f} TFLOPS ({counts['steps']}-step), median {timing['tflops_median']:.1f}, "
              f"graph {timing['tflops_graph']:.1f}" + (" THROTTLED" if timing["clocks"]["throttled"] else ""))
        return {"timing": timing}

    _timed(a, "bench", run)


def cmd_sweep(a) -> None:
    """The sweep's lengths; and for a headline version, where a head-to-head is configured, each ragged S
    it was timed at against the next multiple of 128, paired (headtohead.measure_ragged)."""
    from .headtohead import measure_ragged, ragged_comparison
    from .timing import sweep

    settings = _run_settings(a)
    counts = _asked_for(settings.sweep, "sweep", "key 'sweep'")
    paired = settings.ragged_pair_timing() if settings.pairs_ragged(_name(a)) else None
    interval = settings.head_to_head

    def run(kernel, seed, sampler):
        points = sweep(kernel, settings.sweep_shapes(), counts["steps"], settings.case.S, counts["repeats"],
                       counts["warmup"], seed, counts["graph_replays"], sampler, progress=_progress)
        print(f"{kernel.name}: timed at {sum(p['timed'] for p in points)} of {len(points)} lengths")
        timed = {p["S"] for p in points if p["timed"]}
        pairs = []
        for S in ragged_pairable(settings.sweep.get("ragged", []), timed) if paired else []:
            pairs.append(measure_ragged(kernel, replace(settings.case, S=S), paired, seed, _progress))
            said = ragged_comparison(pairs[-1], settings.case, interval["confidence"], interval["resamples"])
            print(f"{kernel.name}: at S={S}, {said['ratio']:.3f} [{said['ci_low']:.3f}, {said['ci_high']:.3f}] of "
                  f"its TFLOPS at S={pairs[-1]['near']}, paired")
        return {"points": points, **({"ragged": pairs} if paired else {})}

    _timed(a, "sweep", run)


def cmd_launch_once(a) -> None:
    """What ncu profiles: one launch of a kernel on random inputs (a shape it cannot run is refused)."""
    import cupy as cp

    with _held_by_driver(a.hold_for or f"launch-once {_name(a)}", a.identity_out) as ran:
        kernel = _implementation(None, a.cubin, a.record)  # no settings: its build says its configuration
        kernel(*kernel.inputs(a.shape, cp.random.default_rng(0), a.inputs))
        cp.cuda.runtime.deviceSynchronize()
        ran["identity"] = kernel.identity


def cmd_profile(a) -> None:
    import tempfile

    from .profile import profile

    check = read_record(a.check, "check")
    if _refused(check, a, "profiled"):
        return
    record = read_record(a.record, "compile")
    _same_as_checked(record["kernel"], {"cubin_sha256": record["cubin_sha256"]}, check)
    if not Path(record["source"]).is_file():  # where the stalls are read against
        raise FlashbenchError(f"{a.record}: its source {record['source']} is not there: run from the repository root")
    built_from = record.get("source_sha256")  # the source's lines the stalls are read against must be the cubin's
    if built_from and built_from != sha256(record["source"]):
        raise FlashbenchError(f"{a.record}: {record['source']} changed since this cubin was built from it: build it "
                              "again")
    shape = _run_settings(a).case
    with tempfile.TemporaryDirectory() as tmp:  # the driver holds the GPU while ncu profiles its launch
        said = Path(tmp) / "ran.json"
        try:
            readings = profile(a.ncu, Path(a.cubin), Path(a.record), Path(record["source"]), shape, progress=_progress,
                               driver=["--hold-for", f"profile {record['kernel']}", "--identity-out", str(said)])
        except FlashbenchError as e:  # e.g. no permission for the GPU's counters: say so, the run goes on
            _driver_said(said)
            _write_record(a, {"kernel": check["kernel"], "profiled": False, "reason": str(e)})
            print(f"{check['kernel']}: not profiled, {e}")
            return
        ran = _ran(said, record["kernel"])
    _same_as_checked(record["kernel"], ran["identity"], check)
    _write_record(a, {"kernel": record["kernel"], "profiled": True, "reason": None, **shape.as_dict(),
                       "cubin_sha256": record["cubin_sha256"], **readings, "provenance": ran["provenance"]})
    m = readings["metrics"]
    print(f"{record['kernel']}: " + ", ".join(f"{key} {m[key]}" for key in ("duration_us", "lsu_pipe_pct", "registers",
                                                                          "achieved_occupancy_pct")))


def cmd_head_to_head(a) -> None:
    """The headline versions and the rivals at one shape, paired in this process (headtohead.py).
    A contestant that did not pass its check is left out, and the record says why."""
    import secrets

    from . import gpu
    from .clocks import ClockSampler, EnergyCounter
    from .headtohead import measure

    settings = a.settings
    _asked_for(settings.head_to_head, "head-to-head", "keys 'headline' and 'head_to_head'")
    try:
        configuration = settings.configuration(a.configuration) if a.configuration else settings.configurations[0]
    except ConfigError:
        raise FlashbenchError(f"--configuration {a.configuration!r}: not a configuration of the settings "
                              f"({', '.join(c.name for c in settings.configurations)})") from None
    shape = settings.in_configuration(configuration).head_to_head_shape(a.S, configuration)
    contestants = settings.contestants(configuration)
    if not settings.headline_in(configuration):
        raise FlashbenchError(f"no headline version runs in the configuration {configuration.name!r}: "
                              f"its head-to-head has nothing to compare")
    checks, cubins = _by_name(a.checks, "--checks"), _by_name(a.cubins, "--cubins")
    for cubin in cubins.values():
        if not cubin.with_suffix(".json").is_file():
            raise FlashbenchError(f"--cubins {cubin}: its compile record {cubin.with_suffix('.json')} is not beside it")
    excluded, admitted = {}, []
    for name in contestants:
        if name not in checks:
            raise FlashbenchError(f"--checks has no check record of the contestant {name} (a file {name}.json)")
        if name not in {run.name for run in settings.peer_runs()} and name not in cubins:
            raise FlashbenchError(f"--cubins has no build of the contestant {name} (a file {name}.cubin)")
        check = read_record(checks[name], "check")
        if check["passed"]:
            admitted.append((name, check))
        else:
            excluded[name] = check["reason"] if check.get("skipped") else f"failed its check: {check['reason']}"
    _import_peer_libraries(settings, [name for name, _ in admitted])
    with _gpu_held(f"head-to-head {shape}"):
        import cupy as cp

        impls = []
        for name, check in admitted:
            run = settings.run(name)
            if name in cubins:
                impl = _implementation(None, cubins[name], cubins[name].with_suffix(".json"), run)
            else:
                impl = _implementation(settings.peer(run.of), None, None, run)
            _same_as_checked(impl.name, impl.identity, check)
            impls.append(impl)
        bus_id = cp.cuda.Device().pci_bus_id
        with ClockSampler(bus_id) as sampler:
            record = measure(impls, shape, settings.head_to_head_in(configuration), secrets.randbits(32), sampler,
                             EnergyCounter.open(bus_id), progress=_progress) if impls else None
    record = record or {**shape.as_dict(), "order": [], "contestants": {}, "excluded": {}}
    # provenance read once the GPU is let go, as in _timed
    _write_record(a, {**record, "is_case": shape == settings.in_configuration(configuration).case,
                      "configuration": configuration.name,
                      "excluded": {**excluded, **record["excluded"]}, "provenance": gpu.provenance()})
    print(f"head-to-head at {shape}, {configuration.name}: {len(impls)} contestants"
          + (f", {len(excluded)} left out" if excluded else ""))


def _by_name(paths: list[str], option: str) -> dict[str, Path]:
    """Files named after what they are of (results/<gpu>/check/v24.json, build/sm_90a/v24.cubin), by that name."""
    by_name = {}
    for path in map(Path, paths):
        if path.stem in by_name:
            raise FlashbenchError(f"{option}: two files for {path.stem} ({by_name[path.stem]}, {path})")
        by_name[path.stem] = path
    return by_name


def cmd_cycles(a) -> None:
    """Nsight Compute's cycle count of a kernel or peer that passed its check (cycles.py). Only the
    driver ncu runs touches the GPU: it says what it ran, which must be what passed the check."""
    import tempfile

    from .cycles import count, points

    launches = _asked_for(a.settings.cycles, "cycle counts", "key 'cycles'")["launches"]
    check = read_record(a.check, "check")
    if _refused(check, a, "counted"):
        return
    run = a.settings.run(check["kernel"])  # the check's: the record of a build need not be read for it
    settings = a.settings.in_configuration(run.configuration)
    configuration = run.configuration.name
    with tempfile.TemporaryDirectory() as tmp:  # the driver holds the GPU while ncu counts its calls
        identity_file = Path(tmp) / "identity.json"
        target = ["--settings", a.settings_file] + (["--peer", a.peer] if a.peer else ["--cubin", a.cubin, "--record", a.record]) \
            + ["--hold-for", f"cycles {check['kernel']}", "--identity-out", str(identity_file)]
        try:
            kernels, ncu_version = count(a.ncu, target, settings.cycle_shapes(check["kernel"]), launches,
                                         progress=_progress)
        except FlashbenchError as e:  # e.g. no permission for the GPU's counters: say so, the run goes on
            _driver_said(identity_file)
            _write_record(a, {"kernel": check["kernel"], "configuration": configuration, "counted": False,
                               "reason": str(e)})
            print(f"{check['kernel']}: not counted, {e}")
            return
        ran = _ran(identity_file, check["kernel"])
        _same_as_checked(check["kernel"], ran["identity"], check)
        readings = {"points": points(kernels, [Shape(**s) for s in ran["shapes"]], launches), "ncu": ncu_version}
        provenance = ran["provenance"]
    _write_record(a, {"kernel": check["kernel"], "configuration": configuration, "counted": True, "reason": None,
                       **ran["identity"], "sm_count": provenance["sm_count"], **readings, "provenance": provenance})
    print(f"{check['kernel']}: " + ", ".join(f"S={p['S']} {p['cycles'] / 1e3:.1f}k cycles" for p in readings["points"]))


def cmd_launch_marked(a) -> None:
    """What ncu counts cycles of (cycles.launch_marked); --identity-out: where to say what ran."""
    from .cycles import launch_marked

    settings = _run_settings(a)
    launches = _asked_for(settings.cycles, "cycle counts", "key 'cycles'")["launches"]
    _import_peer_libraries(a.settings, [_name(a)])
    with _held_by_driver(a.hold_for or f"launch-marked {_name(a)}", a.identity_out) as ran:
        impl = _kernel(a)
        shapes = launch_marked(impl, settings.cycle_shapes(impl.name), launches)
        ran.update(identity=impl.identity, shapes=[s.as_dict() for s in shapes])


def cmd_summarize(a) -> None:
    from . import cycles, headtohead
    from .archive_tables import BadTable, read_paired, read_tables
    from .summary import tidy_tables

    settings = a.settings
    expected = Expected.from_settings(settings)
    points = [read_record(p, "head_to_head", expected) for p in a.head_to_heads]
    counts = [read_record(p, "cycles", expected) for p in a.cycles]
    # each point's contestants and each count held to one GPU and the cubins built now, as the rest
    more = {"cycles": {r["kernel"]: r for r in counts},
            **{f"head_to_head/{Path(path).stem}": headtohead.as_records(p) for path, p in zip(a.head_to_heads, points)}}
    profile_note, cycles_note = settings.profiling_notes(ncu_found=bool(a.profiles))
    run = {"baseline": settings.baseline, "sweep": settings.sweep, "profile_note": profile_note,
           "headline": settings.headline, "head_to_head": settings.head_to_head, "cycles": settings.cycles,
           "cycles_note": cycles_note, "configurations": [c.as_dict() for c in settings.configurations]}
    entries, case = settings.entries(), settings.case.as_dict()
    summary, resources, profiles, meta = tidy_tables(entries, a.checks, a.benches, a.compiled, a.gpu_arch, case,
                                                     a.sweeps, a.profiles, run, expected=expected, more_records=more)
    meta["settings"] = settings.mapping
    tables = {"summary": summary, "resources": resources, "profile": profiles}
    if settings.head_to_head:  # asked for in config: written, if only with its header
        def contestants_of(name):  # a point's configuration: its headline runs, and its rivals' runs
            configuration = settings.configuration(name) if name else settings.configurations[0]
            return settings.headline_in(configuration), settings.rivals_in(configuration)

        tables["head_to_head"] = headtohead.table(points, run, contestants_of)
    if settings.cycles:
        tables["cycles"] = cycles.table(counts, entries, expected.case_of)
    out = Path(a.out_dir)
    with staged_folder(out, [f"{name}.csv" for name in tables] + ["kernels.json"]) as staging:  # all, or none
        for name, table in tables.items():
            write_text(staging / f"{name}.csv", table.to_csv(index=False))
        write_json(staging / "kernels.json", {**meta, "inputs_sha256": digests(a.depends_on)})
        try:  # read back as the reports read them: records that leave a point, a count or a build out are refused
            summary_read, _, _, meta_read = read_tables(staging)
            read_paired(staging, meta_read, summary_read)
        except BadTable as e:
            raise FlashbenchError(f"{out / e.path.name}: {e.problem}: the records given make no whole archive, so "
                                  f"{out} is left as it was") from None
        except BadRecord as e:  # a table or kernels.json that does not read back at all: named as in `out`
            raise FlashbenchError(f"{str(e).replace(str(staging), str(out))} (the tables just made, so {out} is left "
                                  "as it was)") from None
    print(f"summary of {len(meta['kernels'])} kernels written to {out}")


def cmd_render(a) -> None:
    from .gpu_reports import WRITTEN, render

    render(a.results, a.reports, a.template, a.slug, a.settings.goal)
    for name in WRITTEN:
        print(f"wrote {Path(a.reports) / name}")


def cmd_compare(a) -> None:
    from .gpu_comparison import render

    print(f"wrote {render(a.results, a.template, a.table, a.figure)} and {a.figure}")


def cmd_agreement(a) -> None:
    from . import agreement

    result = agreement.disagreements(a.first, a.second, a.ratio_within, a.cycles_within)
    for line in agreement.report_lines(result):
        print(line)
    if result["problems"]:
        raise FlashbenchError(f"the two runs do not agree: {len(result['problems'])} disagreements above")
    print("the two runs agree")


def cmd_pages(a) -> None:
    """Every page made before any is written: a source that cannot be made a page leaves the folder as it was."""
    from .pages import absent_page, render

    names = [f"{Path(source).stem}.html" for source in a.sources] + [f"{table}.html" for table in a.absent]
    if twice := sorted({name for name in names if names.count(name) > 1}):
        raise FlashbenchError(f"--sources and --absent make {', '.join(twice)} twice: one page would replace the other")
    texts = [render(source) for source in a.sources] + [absent_page(table) for table in a.absent]
    whys = [f"from {source}" for source in a.sources] + [f"the run made no {table}.csv" for table in a.absent]
    for name, text, why in zip(names, texts, whys):
        out = Path(a.out_dir) / name
        write_text(out, text)
        print(f"wrote {out} ({why})")


def cmd_gpu_time(a) -> None:
    from datetime import datetime, timezone

    from . import gpulock

    since = a.since.timestamp() if a.since else 0.0
    journals = sorted(gpulock.lock_dir().glob("flashbench-gpu-*.journal")) if a.journal is None else [a.journal]
    if not journals:
        raise FlashbenchError(f"no GPU lock journal in {gpulock.lock_dir()} (FLASHBENCH_LOCK_DIR moves it)")
    for journal in journals:
        entries = gpulock.parse_journal(journal)
        used = gpulock.time_by_stage(entries, since)
        if not used["stages"]:
            print(f"{journal}: no hold" + (f" since {a.since.isoformat()}" if a.since else ""))
            continue
        start = min(e["acquired"] for e in entries if e["acquired"] >= since)
        print(f"{journal}: {used['span_s']:.0f} s from the first hold at "
              f"{datetime.fromtimestamp(start, timezone.utc):%Y-%m-%d %H:%M:%S} UTC to the last release")
        for stage, held in sorted(used["stages"].items(), key=lambda kv: -kv[1]["seconds"]):
            print(f"  {stage:14} {held['seconds']:7.1f} s held, {held['holds']} holds")
        print(f"  {'(no holder)':14} {used['idle_s']:7.1f} s: between holds, the GPU waited on the jobs' Python")


def cmd_wheelhouse(a) -> None:
    import shlex

    from . import wheelhouse

    wheels = wheelhouse.build(a.folder, a.python, a.platform, a.extra, a.project)
    requirement = f".[{','.join(a.extra)}]" if a.extra else "."
    print(f"{a.folder}: {len(wheels)} wheels for CPython {a.python} on {a.platform}. On the host, in the checkout:\n"
          f"  {shlex.join(wheelhouse.install_command(a.folder, '-e', requirement))}")


# ---- what each argument must be, checked as the command line is read (before anything runs) ----------
# Each is an argparse type: a path given that is not of its kind is one line, `error: ...`, exit 1.

def _unwritable(folder: Path) -> str | None:
    """Why files cannot be written in `folder`, made where need be (its nearest existing folder is a
    file, or not writable), or None."""
    nearest = next(p for p in (folder, *folder.parents) if os.path.lexists(p))
    if not nearest.is_dir():
        return f"{nearest} is not a folder"
    if not os.access(nearest, os.W_OK | os.X_OK):
        return f"{nearest} is not writable"
    return None


def _suffixes(text: str, suffixes: tuple[str, ...]) -> None:
    if suffixes and Path(text).suffix not in suffixes:
        raise argparse.ArgumentTypeError(f"{text}: not a {' or '.join(suffixes)} file")


def iso_time(text: str):
    """A moment as ISO 8601 (a time without a zone is UTC)."""
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: not an ISO 8601 time such as 2026-12-04T15:47:00+00:00") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def input_file(*suffixes: str):
    """A file the command reads: one that is there and readable, ending in one of `suffixes` (any, if none)."""
    def existing_file(text: str) -> str:
        path = Path(text)
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: is a folder, not a file")
        if path.exists() and not path.is_file():
            raise argparse.ArgumentTypeError(f"{text}: not a regular file")
        try:
            with path.open("rb"):
                pass
        except OSError as e:
            raise argparse.ArgumentTypeError(f"{text}: cannot be read ({e.strerror})") from None
        _suffixes(text, suffixes)
        return text

    return existing_file


def input_folder(text: str) -> str:
    """A folder the command reads (results/<gpu>, a project's root): one that is there."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: cannot be read (Permission denied)")
    return text


def output_file(*suffixes: str):
    """A file the command writes (whole, beside it first): ending in one of `suffixes`, no folder, in a
    folder that exists or can be made."""
    def file_to_write(text: str) -> str:
        _suffixes(text, suffixes)
        if Path(text).is_dir():
            raise argparse.ArgumentTypeError(f"{text}: is a folder, not a file")
        if why := _unwritable(Path(text).parent):
            raise argparse.ArgumentTypeError(f"{text}: its folder cannot be made or written ({why})")
        return text

    return file_to_write


def output_folder(text: str) -> str:
    """A folder the command writes into: one that exists or can be made, in a folder where a staging
    folder beside it can be made too (files.staged_folder)."""
    folder = Path(text)
    if why := _unwritable(folder) or _unwritable(folder.parent):
        raise argparse.ArgumentTypeError(f"{text}: cannot be made or written ({why})")
    return text


def executable(text: str) -> str:
    """A program the command runs (ncu): an executable file, or one on PATH."""
    if shutil.which(text) is None:
        raise argparse.ArgumentTypeError(f"{text}: not an executable (no such program on PATH, or a file that is "
                                         "not executable)")
    return text


def gpu_arch(text: str) -> str:
    """A GPU architecture the kernels are built for (config's schema)."""
    if text not in supported_archs():
        raise argparse.ArgumentTypeError(f"{text!r}: not a GPU architecture the kernels are built for "
                                         f"({', '.join(supported_archs())})")
    return text


class BadArgument(FlashbenchError):
    """An argument the command line refuses (argparse's message, naming the command and the argument)."""


class Parser(argparse.ArgumentParser):
    """A bad argument is one line, `error: ...`, and exit status 1, as every other error here: main says it."""

    def error(self, message):
        raise BadArgument(f"{self.prog}: {message}")


def _shape(text: str) -> Shape:
    """An argument type: a shape {B, H, S, D} as JSON, one the kernels take (the config schema's shape)."""
    try:
        return Shape(**conform(json.loads(text), "$defs/shape", ""))
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


SETTINGS_HELP = ("the run's settings file (the workflow writes it from config.yaml: .snakemake/flashbench/settings/"
                 "<digest>.json), or a config file itself (config.yaml)")


def _settings_option(p) -> None:
    p.add_argument("--settings", dest="settings_file", required=True, help=SETTINGS_HELP)


def _driver_options(p, said: str) -> None:
    """A driver's options (launch-once, launch-marked): what its hold of the GPU is for, where to say what ran."""
    p.add_argument("--hold-for", help="what the GPU is held for, as the lock's journal names it (the stage that runs "
                                      "this under ncu: profile v25, cycles v25)")
    p.add_argument("--identity-out", type=output_file(".json"), help=f"write {said} here")


def _depends_on_option(p) -> None:
    p.add_argument("--depends-on", nargs="*", default=[], type=input_file(),
                   help="the job's inputs: the record names each with its sha256 (the workflow's rule passes them)")


def _implementation_options(p, peer_help: str = "a peer instead: its name in config's peers") -> None:
    p.add_argument("--cubin", type=input_file(".cubin"), help="a kernel: its cubin")
    p.add_argument("--record", type=input_file(".json"), help="a kernel: its compile record")
    p.add_argument("--peer", help=peer_help)


def parser() -> argparse.ArgumentParser:
    """The command line's shape: which options each command takes. What they mean comes from the settings
    file (the validated config), which every stage of a run reads whole."""
    p = Parser(prog="flashbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="nvcc one kernel for one arch and record ptxas's report")
    _settings_option(c)
    c.add_argument("--kernel", required=True, help="its build: a kernel of config's kernels, or <kernel>.<configuration> (source, defines, nvcc flags)")
    c.add_argument("--arch", required=True)
    c.add_argument("--cubin", required=True)
    c.add_argument("--record", required=True)
    c.set_defaults(run=cmd_compile)

    for name, fn, helptext in (
            ("check", cmd_check, "run a kernel or peer on random inputs against the fp32 reference"),
            ("bench", cmd_bench, "time a kernel or peer that passed its check, at the case"),
            ("sweep", cmd_sweep, "time a kernel or peer that passed its check, at the sweep's lengths"),
            ("cycles", cmd_cycles, "Nsight Compute's cycle counts of a kernel or peer that passed its check"),
            ("launch-marked", cmd_launch_marked, "calls between marker kernels (what cycles profiles)")):
        s = sub.add_parser(name, help=helptext)
        _settings_option(s)
        _implementation_options(s)
        s.set_defaults(run=fn)
        if name == "launch-marked":
            _driver_options(s, "what ran (cubin hash, library versions), at which shapes, and the provenance")
            continue
        if name != "check":
            s.add_argument("--check", type=input_file(".json"), required=True, help="its check record")
        if name == "cycles":
            s.add_argument("--ncu", type=executable, required=True, help="the ncu executable")
        s.add_argument("--out", type=output_file(".json"), required=True)
        _depends_on_option(s)

    s = sub.add_parser("launch-once", help="launch a kernel once on random inputs (what the profiler runs)")
    s.add_argument("--cubin", type=input_file(".cubin"), required=True)
    s.add_argument("--record", type=input_file(".json"), required=True)
    s.add_argument("--shape", type=_shape, required=True, help="JSON {B, H, S, D}")
    s.add_argument("--inputs", choices=attention.INPUT_KINDS, default="normal",
                   help="the kind of random input (compute-sanitizer runs the rare paths on the others)")
    _driver_options(s, "what ran (the cubin's hash) and the provenance")
    s.set_defaults(run=cmd_launch_once, peer=None)

    s = sub.add_parser("profile", help="Nsight Compute readings of a kernel that passed its check, at the case")
    _settings_option(s)
    s.add_argument("--ncu", type=executable, required=True, help="the ncu executable")
    s.add_argument("--cubin", type=input_file(".cubin"), required=True)
    s.add_argument("--record", type=input_file(".json"), required=True)
    s.add_argument("--check", type=input_file(".json"), required=True)
    s.add_argument("--out", type=output_file(".json"), required=True)
    _depends_on_option(s)
    s.set_defaults(run=cmd_profile, peer=None)  # a kernel build: the profile takes no peer

    s = sub.add_parser("head-to-head", help="the headline versions against the rivals at one length, paired")
    _settings_option(s)
    s.add_argument("--S", type=int, required=True, help="the point's length: the case's or one of the sweep's")
    s.add_argument("--configuration", help="the configuration its contestants run in (default: the first)")
    s.add_argument("--checks", nargs="+", type=input_file(".json"), required=True,
                   help="every contestant's check record (<name>.json)")
    s.add_argument("--cubins", nargs="*", type=input_file(".cubin"), default=[],
                   help="every contestant kernel's build (<name>.cubin, its compile record beside it)")
    s.add_argument("--out", type=output_file(".json"), required=True)
    _depends_on_option(s)
    s.set_defaults(run=cmd_head_to_head)

    s = sub.add_parser("summarize", help="gather one GPU's records into its tables and kernels.json")
    _settings_option(s)
    s.add_argument("--checks", nargs="+", type=input_file(".json"), required=True)
    s.add_argument("--benches", nargs="+", type=input_file(".json"), required=True)
    s.add_argument("--compiled", nargs="+", type=input_file(".json"), required=True)
    s.add_argument("--sweeps", nargs="*", type=input_file(".json"), default=[])
    s.add_argument("--profiles", nargs="*", type=input_file(".json"), default=[],
                   help="none: the run was not profiled (settings say why)")
    s.add_argument("--head-to-heads", nargs="*", type=input_file(".json"), default=[])
    s.add_argument("--cycles", nargs="*", type=input_file(".json"), default=[])
    s.add_argument("--gpu-arch", type=gpu_arch, required=True)
    s.add_argument("--out-dir", type=output_folder, required=True)
    _depends_on_option(s)
    s.set_defaults(run=cmd_summarize)

    r = sub.add_parser("render", help="render one GPU's report from its results folder")
    r.add_argument("--results", type=input_folder, required=True)
    r.add_argument("--reports", type=output_folder, required=True)
    r.add_argument("--template", type=input_file(".j2"), required=True,
                   help="report.md's jinja2 template (hopper.md's beside it)")
    r.add_argument("--slug", required=True, help="the GPU's folder name, such as nvidia-h200")
    _settings_option(r)  # the goal the Hopper line is judged against
    r.set_defaults(run=cmd_render)

    r = sub.add_parser("compare", help="every GPU's TFLOPS side by side, from their results folders")
    r.add_argument("--results", nargs="*", type=input_folder, default=[],
                   help="the GPUs' results folders, in column order")
    r.add_argument("--template", type=input_file(".j2"), required=True)
    r.add_argument("--table", type=output_file(".md"), required=True,
                   help="the markdown table, beside each GPU's report folder")
    r.add_argument("--figure", type=output_file(".png"), required=True)
    r.set_defaults(run=cmd_compare)

    r = sub.add_parser("agreement", help="do two runs on one GPU, or two of a kind, agree: verdicts, ratios and cycles")
    r.add_argument("first", type=input_folder, help="the first run's results folder (results/<gpu>)")
    r.add_argument("second", type=input_folder, help="the second run's")
    r.add_argument("--ratio-within", type=float, help="how far a fair paired ratio may move (default: as flashbench."
                                                      "agreement has it for one GPU or two of a kind)")
    r.add_argument("--cycles-within", type=float, help="how far a cycle count may move (default: likewise)")
    r.set_defaults(run=cmd_agreement)

    r = sub.add_parser("pages", help="the HTML pages of Snakemake's report: each markdown report and table as a page")
    r.add_argument("--sources", nargs="+", type=input_file(".md", ".csv"), required=True,
                   help="markdown reports (their figures beside them) and CSV tables")
    r.add_argument("--absent", nargs="+", choices=archives.OPTIONAL_TABLES, default=[],
                   help="tables the run did not make: a page saying so for each")
    r.add_argument("--out-dir", type=output_folder, required=True,
                   help="where <name>.html goes for each <name>.md or <name>.csv")
    r.set_defaults(run=cmd_pages)

    r = sub.add_parser("gpu-time", help="where a run's GPU time went: each stage's holds of the GPU lock, and the idle time")
    r.add_argument("journal", nargs="?", type=input_file(".journal"),
                   help="a lock journal (default: every GPU's beside the lock, FLASHBENCH_LOCK_DIR or the temp folder)")
    r.add_argument("--since", type=iso_time, help="only holds from this time on (ISO 8601, e.g. 2026-12-04T15:47:00+00:00): one run's")
    r.set_defaults(run=cmd_gpu_time)

    w = sub.add_parser("wheelhouse", help="download every wheel the pipeline needs, for a host without internet")
    w.add_argument("folder", type=output_folder, help="where the wheels go (created if need be)")
    w.add_argument("--python", required=True, help="the host's CPython version, e.g. 3.12")
    w.add_argument("--platform", required=True, help="the host's wheel platform tag, e.g. manylinux_2_28_x86_64")
    w.add_argument("--extra", action="append", default=[], help="an optional extra of pyproject.toml too (one it lacks is refused, naming those it has); repeatable")
    w.add_argument("--project", type=input_folder, default=".", help="the repository root (default: here)")
    w.set_defaults(run=cmd_wheelhouse)

    return p


def main(argv=None) -> int:
    p = parser()
    try:
        args = p.parse_args(argv)  # every argument checked as it is read (input_file, output_folder, ...)
        if args.command in ("check", "bench", "sweep", "cycles", "launch-marked") and not (args.peer or (args.cubin and args.record)):
            p.error(f"{args.command} needs --cubin and --record (a kernel) or --peer (a PyTorch peer)")
        if hasattr(args, "settings_file"):
            args.settings = load_settings(args.settings_file)
            if getattr(args, "peer", None):
                _peer_of(args)  # a peer, or a run of one, the settings do not have: said before anything runs
        args.run(args)
    except FlashbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # in a GPU stage, CUDA's error (out of memory, a fault, a trap) or NVML's: one line too
        library = type(e).__module__.split(".")[0]
        if library in ("cupy", "cupy_backends", "pynvml"):
            print(f"error: {'NVML' if library == 'pynvml' else 'CUDA'} failed in {args.command}: {e}", file=sys.stderr)
            return 1
        raise
    return 0
