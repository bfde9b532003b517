"""Timing with CUDA events: the write-up's 100-step method plus a per-call median over repeats."""
from __future__ import annotations

import statistics

from . import FlashbenchError, attention
from .config import Shape


def bench(kernel, shape: Shape, steps: int, repeats: int, warmup: int, seed: int) -> dict:
    """Time `kernel` (an AttentionKernel or a TorchPeer) at `shape`. Same inputs for every call, as
    the write-up did (the report says whether they fit in L2)."""
    cp = kernel.cp
    q, k, v, o = kernel.inputs(shape, cp.random.default_rng(seed))
    for _ in range(warmup):
        kernel(q, k, v, o)
    cp.cuda.runtime.deviceSynchronize()

    # The write-up's method: `steps` back-to-back calls between two events, total / steps.
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(steps):
        kernel(q, k, v, o)
    end.record()
    end.synchronize()
    total_ms = cp.cuda.get_elapsed_time(start, end)

    # Each call between its own pair of events, for the median and the spread.
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeats)]
    for before, after in events:
        before.record()
        kernel(q, k, v, o)
        after.record()
    events[-1][1].synchronize()
    per_call_ms = sorted(cp.cuda.get_elapsed_time(b, a) for b, a in events)

    step_s = total_ms / steps / 1e3
    median_s = statistics.median(per_call_ms) / 1e3
    return {
        **shape.as_dict(),
        "steps": steps,
        "repeats": repeats,
        "warmup": warmup,
        "total_s": total_ms / 1e3,
        "ms_per_step": total_ms / steps,
        "ms_median": median_s * 1e3,
        "ms_min": per_call_ms[0],
        "ms_max": per_call_ms[-1],
        "tflops": attention.tflops(shape, step_s),
        "tflops_median": attention.tflops(shape, median_s),
        "tflops_min": attention.tflops(shape, per_call_ms[-1] / 1e3),
        "tflops_max": attention.tflops(shape, per_call_ms[0] / 1e3),
        "gib_per_s": attention.gib_per_s(shape, step_s),
        "input_bytes": attention.input_bytes(shape),
    }


def sweep(kernel, shapes: list[Shape], steps: int, repeats: int, warmup: int, seed: int, progress=print) -> list[dict]:
    """`bench` at each shape `kernel` supports; a shape it does not support gets its reason instead."""
    points = []
    for shape in shapes:
        reason = kernel.supports(shape)
        if reason:
            progress(f"sweep {kernel.name}: {shape} skipped, {reason}")
            points.append({**shape.as_dict(), "timed": False, "reason": reason})
            continue
        progress(f"sweep {kernel.name}: {shape}, {steps}-step method + {repeats} timed calls")
        try:
            points.append({**bench(kernel, shape, steps, repeats, warmup, seed), "timed": True, "reason": None})
        except FlashbenchError as e:  # a peer's library without a kernel for this length
            progress(f"  -> not timed: {e}")
            points.append({**shape.as_dict(), "timed": False, "reason": str(e)})
            continue
        progress(f"  -> {points[-1]['tflops']:.1f} TFLOPS")
    return points
