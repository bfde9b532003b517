"""Command line of the pipeline's stages; each Snakemake rule calls one subcommand.

    python -m flashbench compile | check | bench | sweep | profile | summarize | render | compare | pages ...
    python -m flashbench wheelhouse --python 3.12 --platform manylinux_2_28_x86_64 DIR

Errors the user can act on print one line, `error: ...`, and exit 1.
"""
from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from . import FlashbenchError
from .config import Shape
from .files import read_json, sha256, write_json, write_text


def _progress(message: str) -> None:
    print(message, flush=True)


def cmd_compile(a) -> None:
    """On stdout the outcome, with nvcc's whole output where it failed; its error's first lines on
    stderr (the rule sends stdout to the log alone, stderr to the log and the console)."""
    from . import gpu, gpulock
    from .compile import CommandFailed, compile_kernel

    # Builds run beside each other but never beside a GPU job: every GPU's lock, shared.
    with gpulock.hold_shared(gpu.all_bus_ids(), f"compile {a.kernel} {a.arch}", progress=_progress):
        try:
            record = compile_kernel(a.kernel, a.source, a.arch, json.loads(a.flags), json.loads(a.defines), a.cubin)
        except CommandFailed as e:
            print(e.transcript, end="", flush=True)
            raise
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
    record = read_json(record_path)
    if not runs_on(record["arch"], here):
        raise NotRunnableHere(not_runnable_reason([record["arch"]], here))


@contextmanager
def _gpu_held(what: str):
    """This stage's hold on its GPU (the one CUDA gives it): one GPU job at a time across processes."""
    from . import gpu, gpulock

    gpu.require()
    import cupy as cp

    with gpulock.hold(cp.cuda.Device().pci_bus_id, what, progress=_progress):
        yield


def _kernel(a):
    """The implementation a check / bench / sweep / profile runs: a compiled kernel or a PyTorch peer."""
    from .compile import runs_on
    from .launch import AttentionKernel

    if a.peer:
        from .config import Peer
        from .peers import TorchPeer

        return TorchPeer(Peer(**json.loads(a.peer)))
    import cupy as cp

    record = read_json(a.record)
    here = "sm_" + cp.cuda.Device().compute_capability
    if not runs_on(record["arch"], here):
        raise FlashbenchError(f"{a.cubin} is built for {record['arch']} but the GPU it would run on is {here}")
    if sha256(a.cubin) != record["cubin_sha256"]:
        raise FlashbenchError(f"{a.cubin} is not the cubin its compile record describes: recompile it")
    return AttentionKernel(a.cubin, record)


def _name(a) -> str:
    return json.loads(a.peer)["name"] if a.peer else read_json(a.record)["kernel"]


def cmd_check(a) -> None:
    from . import gpu
    from .check import Gate, check_kernel
    from .peers import PeerUnavailable, require_torch

    gate = Gate(factor=a.factor, tolerance=a.tolerance)
    try:
        if a.peer:
            require_torch()
        else:
            _runnable_here(a.record)
    except (PeerUnavailable, NotRunnableHere) as e:  # no torch, or another GPU's kernel: skipped, the run goes on
        name = _name(a)
        write_json(a.out, {"kernel": name, "gate": asdict(gate), "passed": False, "skipped": str(e),
                           "reason": f"skipped: {e}", "shapes": []})
        print(f"{name}: skipped, {e}")
        return
    with _gpu_held(f"check {_name(a)}"):
        kernel = _kernel(a)
        shapes = [Shape(**s) for s in json.loads(a.shapes)]
        result = check_kernel(kernel, shapes, gate, kinds=a.inputs.split(","),
                              smallest=tuple(json.loads(a.smallest)) if a.smallest else None, progress=_progress)
        write_json(a.out, {**result, **kernel.identity, "provenance": gpu.provenance()})
    print(f"{kernel.name}: {'all shapes pass' if result['passed'] else 'FAILED: ' + result['reason']}")


def _refused(check: dict, out, done: str = "timed") -> bool:
    """A kernel or peer that failed (or skipped) its check is never timed nor profiled: say so in its
    record (`done`: timed | profiled)."""
    if check["passed"]:
        return False
    reason = check["reason"] if check.get("skipped") else f"failed its check: {check['reason']}"
    write_json(out, {"kernel": check["kernel"], done: False, "reason": reason})
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

    check = read_json(a.check)
    if _refused(check, a.out):
        return
    with _gpu_held(f"{what} {check['kernel']}"):
        kernel = _kernel(a)
        _same_as_checked(kernel.name, kernel.identity, check)
        import cupy as cp

        with ClockSampler(cp.cuda.Device().pci_bus_id) as sampler:
            result = run(kernel, secrets.randbits(32), sampler)
        write_json(a.out, {"kernel": kernel.name, "timed": True, "reason": None, **kernel.identity, **result,
                           "provenance": gpu.provenance()})


def cmd_bench(a) -> None:
    from .timing import bench

    def run(kernel, seed, sampler):
        shape = Shape(**json.loads(a.shape))
        _progress(f"bench {kernel.name}: {shape}, {a.steps}-step method + {a.repeats} timed calls + graph")
        timing = bench(kernel, shape, a.steps, a.repeats, a.warmup, seed, a.graph_replays, sampler)
        print(f"{kernel.name}: {timing['tflops']:.1f} TFLOPS ({a.steps}-step), median {timing['tflops_median']:.1f}, "
              f"graph {timing['tflops_graph']:.1f}" + (" THROTTLED" if timing["clocks"]["throttled"] else ""))
        return {"timing": timing}

    _timed(a, "bench", run)


def cmd_sweep(a) -> None:
    from .timing import sweep

    def run(kernel, seed, sampler):
        shapes = [Shape(**s) for s in json.loads(a.shapes)]
        points = sweep(kernel, shapes, a.steps, a.repeats, a.warmup, seed, a.graph_replays, sampler,
                       progress=_progress)
        print(f"{kernel.name}: timed at {sum(p['timed'] for p in points)} of {len(points)} lengths")
        return {"points": points}

    _timed(a, "sweep", run)


def cmd_launch_once(a) -> None:
    """What ncu profiles: one launch of a kernel on random inputs (a shape it cannot run is refused)."""
    import cupy as cp

    with _gpu_held(f"launch-once {_name(a)}"):  # under `profile`, its parent holds the GPU already
        kernel = _kernel(a)
        shape = Shape(**json.loads(a.shape))
        kernel(*kernel.inputs(shape, cp.random.default_rng(0)))
        cp.cuda.runtime.deviceSynchronize()


def cmd_profile(a) -> None:
    from . import gpu
    from .profile import profile

    check = read_json(a.check)
    if _refused(check, a.out, "profiled"):
        return
    record = read_json(a.record)
    _same_as_checked(record["kernel"], {"cubin_sha256": record["cubin_sha256"]}, check)
    shape = Shape(**json.loads(a.shape))
    with _gpu_held(f"profile {record['kernel']}"):
        try:
            readings = profile(a.ncu, Path(a.cubin), Path(a.record), Path(a.source), shape, progress=_progress)
        except FlashbenchError as e:  # e.g. no permission for the GPU's counters: say so, the run goes on
            write_json(a.out, {"kernel": check["kernel"], "profiled": False, "reason": str(e)})
            print(f"{check['kernel']}: not profiled, {e}")
            return
        provenance = gpu.provenance()
    write_json(a.out, {"kernel": record["kernel"], "profiled": True, "reason": None, **shape.as_dict(),
                       "cubin_sha256": record["cubin_sha256"], **readings, "provenance": provenance})
    m = readings["metrics"]
    print(f"{record['kernel']}: " + ", ".join(f"{key} {m[key]}" for key in ("duration_us", "lsu_pipe_pct", "registers",
                                                                          "achieved_occupancy_pct")))


def cmd_summarize(a) -> None:
    from .summary import summarize

    summary, resources, profiles, meta = summarize(json.loads(a.kernels), a.checks, a.benches, a.compiled, a.gpu_arch,
                                                   json.loads(a.case), a.sweeps, a.profiles, json.loads(a.settings))
    out = Path(a.out_dir)
    write_text(out / "summary.csv", summary.to_csv(index=False))
    write_text(out / "resources.csv", resources.to_csv(index=False))
    write_text(out / "profile.csv", profiles.to_csv(index=False))
    write_json(out / "kernels.json", meta)
    print(f"summary of {len(meta['kernels'])} kernels written to {out}")


def cmd_render(a) -> None:
    from .report import WRITTEN, render

    render(a.results, a.reports, a.template, a.slug)
    for name in WRITTEN:
        print(f"wrote {Path(a.reports) / name}")


def cmd_compare(a) -> None:
    from .compare import render

    print(f"wrote {render(a.results, a.template, a.table, a.figure)} and {a.figure}")


def cmd_pages(a) -> None:
    from .pages import render

    for source in map(Path, a.sources):
        out = Path(a.out_dir) / f"{source.stem}.html"
        write_text(out, render(source))
        print(f"wrote {out} (from {source})")


def cmd_wheelhouse(a) -> None:
    import shlex

    from . import wheelhouse

    wheels = wheelhouse.build(a.folder, a.python, a.platform, a.extra, a.project)
    requirement = f".[{','.join(a.extra)}]" if a.extra else "."
    print(f"{a.folder}: {len(wheels)} wheels for CPython {a.python} on {a.platform}. On the host, in the checkout:\n"
          f"  {shlex.join(wheelhouse.install_command(a.folder, '-e', requirement))}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashbench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compile", help="nvcc one kernel for one arch and record ptxas's report")
    c.add_argument("--kernel", required=True)
    c.add_argument("--source", required=True)
    c.add_argument("--arch", required=True)
    c.add_argument("--flags", default="[]", help="JSON list of nvcc flags")
    c.add_argument("--defines", default="{}", help="JSON object of -D parameters")
    c.add_argument("--cubin", required=True)
    c.add_argument("--record", required=True)
    c.set_defaults(run=cmd_compile)

    for name, fn, helptext in (("check", cmd_check, "run a kernel or peer on random inputs against the fp32 reference"),
                               ("bench", cmd_bench, "time a kernel or peer that passed its check, at one shape"),
                               ("sweep", cmd_sweep, "time a kernel or peer that passed its check, at several shapes")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--cubin", help="a kernel: its cubin")
        s.add_argument("--record", help="a kernel: its compile record")
        s.add_argument("--peer", help="a PyTorch peer instead: its config entry as JSON")
        s.add_argument("--out", required=True)
        s.set_defaults(run=fn)
        if name == "check":
            s.add_argument("--shapes", required=True, help="JSON list of {B, H, S, D}")
            s.add_argument("--inputs", default="normal", help="comma-separated kinds of input (attention.INPUT_KINDS)")
            s.add_argument("--smallest", help="JSON [B, H]: also check a kernel at its smallest S with these")
            s.add_argument("--factor", type=float, required=True, help="times plain fp16's error")
            s.add_argument("--tolerance", type=float, required=True, help="cap on the whole-tensor relative error")
        else:
            s.add_argument("--check", required=True, help="its check record")
            s.add_argument(*(("--shape",) if name == "bench" else ("--shapes",)), required=True,
                           help="JSON {B, H, S, D}" if name == "bench" else "JSON list of {B, H, S, D}")
            s.add_argument("--steps", type=int, required=True)
            s.add_argument("--repeats", type=int, required=True)
            s.add_argument("--warmup", type=int, required=True)
            s.add_argument("--graph-replays", type=int, required=True)

    s = sub.add_parser("launch-once", help="launch a kernel once on random inputs (what the profiler runs)")
    s.add_argument("--cubin", required=True)
    s.add_argument("--record", required=True)
    s.add_argument("--shape", required=True)
    s.set_defaults(run=cmd_launch_once, peer=None)

    s = sub.add_parser("profile", help="Nsight Compute readings of a kernel that passed its check")
    s.add_argument("--ncu", required=True, help="the ncu executable")
    s.add_argument("--cubin", required=True)
    s.add_argument("--record", required=True)
    s.add_argument("--check", required=True)
    s.add_argument("--source", required=True, help="the kernel file, to attribute stalls to its lines")
    s.add_argument("--shape", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(run=cmd_profile)

    s = sub.add_parser("summarize", help="gather one GPU's records into summary.csv, resources.csv, kernels.json")
    s.add_argument("--kernels", required=True, help="JSON list of the kernels' config entries, in table order")
    s.add_argument("--checks", nargs="+", required=True)
    s.add_argument("--benches", nargs="+", required=True)
    s.add_argument("--compiled", nargs="+", required=True)
    s.add_argument("--sweeps", nargs="*", default=[])
    s.add_argument("--profiles", nargs="*", default=[])
    s.add_argument("--gpu-arch", required=True)
    s.add_argument("--case", required=True)
    s.add_argument("--settings", default="{}", help="JSON: baseline, sweep settings, profile note")
    s.add_argument("--out-dir", required=True)
    s.set_defaults(run=cmd_summarize)

    r = sub.add_parser("render", help="render one GPU's report from its results folder")
    r.add_argument("--results", required=True)
    r.add_argument("--reports", required=True)
    r.add_argument("--template", required=True)
    r.add_argument("--slug", required=True)
    r.set_defaults(run=cmd_render)

    r = sub.add_parser("compare", help="every GPU's TFLOPS side by side, from their results folders")
    r.add_argument("--results", nargs="*", default=[], help="the GPUs' results folders, in column order")
    r.add_argument("--template", required=True)
    r.add_argument("--table", required=True, help="the markdown table, beside each GPU's report folder")
    r.add_argument("--figure", required=True)
    r.set_defaults(run=cmd_compare)

    r = sub.add_parser("pages", help="the HTML pages of Snakemake's report: each markdown report and table as a page")
    r.add_argument("--sources", nargs="+", required=True, help="markdown reports (their figures beside them) and CSV tables")
    r.add_argument("--out-dir", required=True, help="where <name>.html goes for each <name>.md or <name>.csv")
    r.set_defaults(run=cmd_pages)

    w = sub.add_parser("wheelhouse", help="download every wheel the pipeline needs, for a host without internet")
    w.add_argument("folder", help="where the wheels go (created if need be)")
    w.add_argument("--python", required=True, help="the host's CPython version, e.g. 3.12")
    w.add_argument("--platform", required=True, help="the host's wheel platform tag, e.g. manylinux_2_28_x86_64")
    w.add_argument("--extra", action="append", default=[], help="an optional extra too (test, slurm); repeatable")
    w.add_argument("--project", default=".", help="the repository root (default: here)")
    w.set_defaults(run=cmd_wheelhouse)

    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.command in ("check", "bench", "sweep") and not (args.peer or (args.cubin and args.record)):
        p.error(f"{args.command} needs --cubin and --record (a kernel) or --peer (a PyTorch peer)")
    try:
        args.run(args)
    except FlashbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a CUDA error (out of memory, a fault, a trap) in a GPU stage: one line too
        if type(e).__module__.startswith("cupy"):
            print(f"error: CUDA failed in {args.command}: {e}", file=sys.stderr)
            return 1
        raise
    return 0
