"""Command line of the pipeline's stages; each Snakemake rule calls one subcommand.

    python -m flashbench compile | check | bench | summarize | render | rerender-archive ...

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
    from .compile import compile_kernel

    record = compile_kernel(a.kernel, a.source, a.arch, json.loads(a.flags), json.loads(a.defines), a.cubin)
    write_json(a.record, record)
    print(f"{a.kernel} {a.arch}: {record['registers']} registers, {record['spill_bytes']} spill bytes, "
          f"{record['smem_bytes']} B smem, {record['blocks_per_sm']} blocks/SM")


def _kernel(a):
    from . import gpu
    from .launch import AttentionKernel

    gpu.require()
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

    kernel = _kernel(a)
    shapes = [Shape(**s) for s in json.loads(a.shapes)]
    result = check_kernel(kernel, shapes, a.tolerance, progress=_progress)
    write_json(a.out, {**result, "cubin_sha256": kernel.record["cubin_sha256"]})
    print(f"{kernel.name}: {'all shapes pass' if result['passed'] else 'FAILED: ' + result['reason']}")


def cmd_bench(a) -> None:
    import secrets

    from . import gpu
    from .timing import bench

    check = read_json(a.check)
    if not check["passed"]:  # a kernel that fails its check is never timed
        write_json(a.out, {"kernel": check["kernel"], "timed": False, "reason": f"failed its check: {check['reason']}"})
        print(f"{check['kernel']}: not timed, it failed its check")
        return
    kernel = _kernel(a)
    shape = Shape(**json.loads(a.shape))
    _progress(f"bench {kernel.name}: {shape}, {a.steps}-step method + {a.repeats} timed calls")
    timing = bench(kernel, shape, a.steps, a.repeats, a.warmup, seed=secrets.randbits(32))
    record = {"kernel": kernel.name, "timed": True, "reason": None, "cubin_sha256": kernel.record["cubin_sha256"],
              "timing": timing, "provenance": gpu.provenance()}
    write_json(a.out, record)
    print(f"{kernel.name}: {timing['tflops']:.1f} TFLOPS ({a.steps}-step), median {timing['tflops_median']:.1f}")


def cmd_summarize(a) -> None:
    from .summary import summarize

    summary, resources, meta = summarize(json.loads(a.kernels), a.checks, a.benches, a.compiled, a.gpu_arch,
                                         json.loads(a.case))
    out = Path(a.out_dir)
    write_text(out / "summary.csv", summary.to_csv(index=False))
    write_text(out / "resources.csv", resources.to_csv(index=False))
    write_json(out / "kernels.json", meta)
    print(f"summary of {len(meta['kernels'])} kernels written to {out}")


def cmd_render(a) -> None:
    from .report import render

    print(f"wrote {render(a.results, a.reports, a.template, a.slug)}")


def cmd_rerender_archive(a) -> None:
    from .report import render

    archived = sorted(p.parent for p in Path(a.results_root).glob("*/summary.csv"))
    print("no GPU found: GPU stages (check, bench) skipped; re-rendering the archived reports "
          f"from {a.results_root}/ ({len(archived)} GPU{'s' if len(archived) != 1 else ''})")
    for results in archived:
        print(f"  {render(results, Path(a.reports_root) / results.name, a.template, results.name)}")


def cmd_require_gpu(a) -> None:
    from . import gpu

    gpu.require()


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

    for name, fn, helptext in (("check", cmd_check, "run a kernel on random inputs against the fp32 reference"),
                               ("bench", cmd_bench, "time a kernel that passed its check")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--cubin", required=True)
        s.add_argument("--record", required=True, help="the kernel's compile record")
        s.add_argument("--out", required=True)
        s.set_defaults(run=fn)
        if name == "check":
            s.add_argument("--shapes", required=True, help="JSON list of {B, H, S, D}")
            s.add_argument("--tolerance", type=float, required=True)
        else:
            s.add_argument("--check", required=True, help="the kernel's check record")
            s.add_argument("--shape", required=True, help="JSON {B, H, S, D}")
            s.add_argument("--steps", type=int, required=True)
            s.add_argument("--repeats", type=int, required=True)
            s.add_argument("--warmup", type=int, required=True)

    s = sub.add_parser("summarize", help="gather one GPU's records into summary.csv, resources.csv, kernels.json")
    s.add_argument("--kernels", required=True, help="JSON list of the kernels' config entries, in table order")
    s.add_argument("--checks", nargs="+", required=True)
    s.add_argument("--benches", nargs="+", required=True)
    s.add_argument("--compiled", nargs="+", required=True)
    s.add_argument("--gpu-arch", required=True)
    s.add_argument("--case", required=True)
    s.add_argument("--out-dir", required=True)
    s.set_defaults(run=cmd_summarize)

    r = sub.add_parser("render", help="render one GPU's report from its results folder")
    r.add_argument("--results", required=True)
    r.add_argument("--reports", required=True)
    r.add_argument("--template", required=True)
    r.add_argument("--slug", required=True)
    r.set_defaults(run=cmd_render)

    r = sub.add_parser("rerender-archive", help="re-render every archived GPU's report (no GPU needed)")
    r.add_argument("--results-root", default="results")
    r.add_argument("--reports-root", default="reports")
    r.add_argument("--template", required=True)
    r.set_defaults(run=cmd_rerender_archive)

    g = sub.add_parser("require-gpu", help="fail with a clear message where no GPU is found")
    g.set_defaults(run=cmd_require_gpu)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except FlashbenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
