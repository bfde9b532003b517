"""Correctness: each shape on fresh random inputs against the fp32 reference."""
from __future__ import annotations

import secrets

from . import FlashbenchError, attention
from .config import Shape


def check_shape(kernel, shape: Shape, tolerance: float, seed: int) -> dict:
    """`kernel`: an AttentionKernel or a TorchPeer (name, cp, supports, inputs, call -> output)."""
    cp = kernel.cp
    row = {**shape.as_dict(), "seed": seed}
    reason = kernel.supports(shape)
    if reason:  # e.g. above a peer's max_seq_len: not checked, and never timed there either
        return {**row, "passed": None, "reason": f"not checked: {reason}"}
    rng = cp.random.default_rng(seed)
    q, k, v, o = kernel.inputs(shape, rng)
    try:
        out = cp.asarray(kernel(q, k, v, o))
        cp.cuda.runtime.deviceSynchronize()
    except (cp.cuda.driver.CUDADriverError, cp.cuda.runtime.CUDARuntimeError) as e:
        # a kernel that faults poisons the CUDA context: record it and check no further shape
        return {**row, "passed": False, "reason": f"kernel launch failed: {e}", "fatal": True}
    except FlashbenchError as e:  # a peer whose library has no kernel for this shape
        return {**row, "passed": False, "reason": str(e)}
    result = attention.errors(out, attention.reference(q, k, v, cp), cp)
    if result["nonfinite"]:
        reason = f"{result['nonfinite']} NaN/Inf elements in the output (unwritten or overflowed)"
    elif result["rel_error"] >= tolerance:
        reason = f"relative error {result['rel_error']:.3e} is not below {tolerance:g}"
    else:
        reason = None
    return {**row, **result, "passed": reason is None, "reason": reason}


def check_kernel(kernel, shapes: list[Shape], tolerance: float, progress=print) -> dict:
    results = []
    for shape in shapes:
        seed = secrets.randbits(32)  # fresh inputs every run, the seed kept to replay a failure
        progress(f"check {kernel.name}: {shape} (seed {seed})")
        results.append(check_shape(kernel, shape, tolerance, seed))
        r = results[-1]
        verdict = {True: "pass", False: "FAIL", None: "skipped"}[r["passed"]]
        progress(f"  -> {verdict}" + (f", rel error {r['rel_error']:.2e}" if "rel_error" in r else "")
                 + (f": {r['reason']}" if r["reason"] else ""))
        if r.get("fatal"):
            break
    failed = [r for r in results if r["passed"] is False]
    checked = [r for r in results if r["passed"]]
    return {
        "kernel": kernel.name,
        "tolerance": tolerance,
        "passed": bool(checked) and not failed and len(results) == len(shapes),
        "reason": "; ".join(f"B={r['B']} H={r['H']} S={r['S']}: {r['reason']}" for r in failed) or None,
        "shapes": results,
    }
