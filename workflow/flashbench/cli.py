"""Command line of the pipeline's stages; each Snakemake rule calls one subcommand.

    python -m flashbench compile | check | bench | sweep | profile | summarize | render | compare ...

Errors the user can act on print one line, `error: ...`, and exit 1.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import FlashbenchError
from .config import Shape
from .files import read_json, sha256, write_json, write_text


def _progress(message: str) -> None:
    print(message, flush=True)


def cmd_compile(a) -> None:
    """On stdout the outcome, with nvcc's whole output where it failed; its error's first lines on
    stderr (the rule sends stdout to the log alone, stderr to the log and the console)."""
    from .compile import CommandFailed, compile_kernel

    try:
        record = compile_kernel(a.kernel, a.source, a.arch, json.loads(a.flags), json.loads(a.defines), a.cubin)
    except CommandFailed as e:
        print(e.transcript, end="", flush=True)
        raise
    write_json(a.record, record)
    print(f"{a.kernel} {a.arch}: {record['registers']} registers, {record['spill_bytes']} spill bytes, "
          f"{record['smem_bytes']} B smem, {record['blocks_per_sm']} blocks/SM")


def _kernel(a):
    """The implementation a check / bench / sweep runs: a compiled kernel or a PyTorch peer."""
    from . import gpu
    from .launch import AttentionKernel

    gpu.require()
    if a.peer:
        from .config import Peer
        from .peers import TorchPeer

        return TorchPeer(Peer(**json.loads(a.peer)))
    import cupy as cp

    record = read_json(a.record)
    here = "sm_" + cp.cuda.Device().compute_capability
    if record["arch"] != here:
        raise FlashbenchError(f"{a.cubin} is built for {record['arch']} but the GPU it would run on is {here}")
    if sha256(a.cubin) != record["cubin_sha256"]:
        raise FlashbenchError(f"{a.cubin} is not the cubin its compile record describes: recompile it")
    return AttentionKernel(a.cubin, record)


def cmd_check(a) -> None:
    from .check import check_kernel
    from .peers import PeerUnavailable

    try:
        kernel = _kernel(a)
    except PeerUnavailable as e:  # no torch: the peer is skipped, the run goes on
        name = json.loads(a.peer)["name"]
        write_json(a.out, {"kernel": name, "tolerance": a.tolerance, "passed": False, "skipped": str(e),
                           "reason": f"skipped: {e}", "shapes": []})
        print(f"{name}: skipped, {e}")
        return
    shapes = [Shape(**s) for s in json.loads(a.shapes)]
    result = check_kernel(kernel, shapes, a.tolerance, progress=_progress)
    write_json(a.out, {**result, **kernel.identity})
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


def cmd_bench(a) -> None:
    import secrets

    from . import gpu
    from .timing import bench

    if _refused(read_json(a.check), a.out):
        return
    kernel = _kernel(a)
    shape = Shape(**json.loads(a.shape))
    _progress(f"bench {kernel.name}: {shape}, {a.steps}-step method + {a.repeats} timed calls")
    timing = bench(kernel, shape, a.steps, a.repeats, a.warmup, seed=secrets.randbits(32))
    record = {"kernel": kernel.name, "timed": True, "reason": None, **kernel.identity,
              "timing": timing, "provenance": gpu.provenance()}
    write_json(a.out, record)
    print(f"{kernel.name}: {timing['tflops']:.1f} TFLOPS ({a.steps}-step), median {timing['tflops_median']:.1f}")


def cmd_sweep(a) -> None:
    import secrets

    from . import gpu
    from .timing import sweep

    if _refused(read_json(a.check), a.out):
        return
    kernel = _kernel(a)
    shapes = [Shape(**s) for s in json.loads(a.shapes)]
    points = sweep(kernel, shapes, a.steps, a.repeats, a.warmup, seed=secrets.randbits(32), progress=_progress)
    write_json(a.out, {"kernel": kernel.name, "timed": True, "reason": None, **kernel.identity, "points": points,
                       "provenance": gpu.provenance()})
    print(f"{kernel.name}: timed at {sum(p['timed'] for p in points)} of {len(points)} lengths")


def cmd_launch_once(a) -> None:
    """What ncu profiles: one launch of a kernel on random inputs."""
    import cupy as cp

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
    gpu.require()
    shape = Shape(**json.loads(a.shape))
    try:
        readings = profile(a.ncu, Path(a.cubin), Path(a.record), Path(a.source), shape, progress=_progress)
    except FlashbenchError as e:  # e.g. no permission for the GPU's counters: say so, the run goes on
        write_json(a.out, {"kernel": check["kernel"], "profiled": False, "reason": str(e)})
        print(f"{check['kernel']}: not profiled, {e}")
        return
    record = read_json(a.record)
    write_json(a.out, {"kernel": record["kernel"], "profiled": True, "reason": None, **shape.as_dict(),
                       "cubin_sha256": record["cubin_sha256"], **readings, "provenance": gpu.provenance()})
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
    from .report import render

    print(f"wrote {render(a.results, a.reports, a.template, a.slug)}")


def cmd_compare(a) -> None:
    from .compare import render

    print(f"wrote {render(a.results, a.template, a.table, a.figure)} and {a.figure}")


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
            s.add_argument("--tolerance", type=float, required=True)
        else:
            s.add_argument("--check", required=True, help="its check record")
            s.add_argument(*(("--shape",) if name == "bench" else ("--shapes",)), required=True,
                           help="JSON {B, H, S, D}" if name == "bench" else "JSON list of {B, H, S, D}")
            s.add_argument("--steps", type=int, required=True)
            s.add_argument("--repeats", type=int, required=True)
            s.add_argument("--warmup", type=int, required=True)

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
    return 0
