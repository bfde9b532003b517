"""Timing with CUDA events: the write-up's 100-step method, a per-call median over repeats, and a
CUDA-graph figure (the steps captured once and replayed, so no CPU launch cost sits between calls),
with the GPU's clocks sampled through NVML over each timing."""
from __future__ import annotations

import statistics
import time

from . import FlashbenchError, NoKernelForShape, attention
from .config import Shape, sweep_steps


def elapsed_ms(cp, run) -> float:
    """GPU time of what `run` enqueues, between two CUDA events."""
    return elapsed_and_issued(cp, run)[0]


def elapsed_and_issued(cp, run) -> tuple[float, float]:
    """GPU time (ms) of what `run` enqueues, between two CUDA events, and the host time (s) `run`
    took to return: a library whose Python dispatch outlasts its kernel leaves the GPU waiting."""
    before, after = cp.cuda.Event(), cp.cuda.Event()
    before.record()
    start = time.perf_counter()
    run()
    issued_s = time.perf_counter() - start
    after.record()
    after.synchronize()
    return cp.cuda.get_elapsed_time(before, after), issued_s


# Back-to-back calls this much slower than their CUDA graph, while the CPU took as long to issue each
# call as the GPU takes to run it, time the CPU's dispatch (a full launch queue makes a fast CPU wait
# too, but then back-to-back runs as fast as the graph).
DISPATCH_SLOWDOWN = 1.02


def dispatch_bound(issue_s_per_call: float, step_s_per_call: float, graph_s_per_call: float) -> bool:
    """Whether back-to-back calls time the CPU rather than the GPU (the graph has no CPU launch cost)."""
    return issue_s_per_call >= graph_s_per_call and step_s_per_call > DISPATCH_SLOWDOWN * graph_s_per_call


def bench(kernel, shape: Shape, steps: int, repeats: int, warmup: int, seed: int, graph_replays: int,
          sampler=None) -> dict:
    """Time `kernel` (an AttentionKernel or a TorchPeer) at `shape`. Same inputs for every call, as
    the write-up did (the report says whether they fit in L2). `sampler`: a ClockSampler, whose
    readings over this timing are kept. Under a causal mask (kernel.causal) the FLOPs are half."""
    reason = kernel.supports(shape)
    if reason:
        raise FlashbenchError(f"{kernel.name} is not timed at {shape}: {reason}")
    cp = kernel.cp
    q, k, v, o = kernel.inputs(shape, cp.random.default_rng(seed))
    for _ in range(warmup):
        kernel(q, k, v, o)
    cp.cuda.runtime.deviceSynchronize()
    t0 = time.time()  # the clocks' window: the timed calls, not the warm-up

    def back_to_back():
        for _ in range(steps):
            kernel(q, k, v, o)

    # The write-up's method: `steps` back-to-back calls between two events, total / steps; and how
    # long the CPU took to issue them (where that is longer, the figure times the dispatch).
    total_ms, issue_s = elapsed_and_issued(cp, back_to_back)

    # Each call between its own pair of events (recorded ahead, read after), for the median and spread.
    events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(repeats)]
    for before, after in events:
        before.record()
        kernel(q, k, v, o)
        after.record()
    events[-1][1].synchronize()
    per_call_ms = sorted(cp.cuda.get_elapsed_time(b, a) for b, a in events)

    # CUDA graph: the same `steps` calls captured once, replayed `graph_replays` times (one replay
    # first, untimed); each replay between its own events, the median / steps is the figure.
    replay = kernel.capture(q, k, v, o, steps)
    replay()
    graph_ms = sorted(elapsed_ms(cp, replay) / steps for _ in range(graph_replays))
    t1 = time.time()

    step_s = total_ms / steps / 1e3
    causal = kernel.causal
    median_s = statistics.median(per_call_ms) / 1e3
    graph_s = statistics.median(graph_ms) / 1e3
    return {
        **shape.as_dict(),
        "steps": steps,
        "repeats": repeats,
        "warmup": warmup,
        "graph_replays": graph_replays,
        "causal": causal,
        "total_s": total_ms / 1e3,
        "ms_per_step": total_ms / steps,
        "ms_median": median_s * 1e3,
        "ms_min": per_call_ms[0],
        "ms_max": per_call_ms[-1],
        "ms_graph": graph_s * 1e3,
        "issue_ms_per_call": issue_s / steps * 1e3,
        "dispatch_bound": dispatch_bound(issue_s / steps, total_ms / steps / 1e3, graph_s),
        "tflops": attention.tflops(shape, step_s, causal),
        "tflops_median": attention.tflops(shape, median_s, causal),
        "tflops_min": attention.tflops(shape, per_call_ms[-1] / 1e3, causal),
        "tflops_max": attention.tflops(shape, per_call_ms[0] / 1e3, causal),
        "tflops_graph": attention.tflops(shape, graph_s, causal),
        "gib_per_s": attention.gib_per_s(shape, step_s),
        "input_bytes": attention.input_bytes(shape),
        "clocks": sampler.window(t0, t1) if sampler is not None else None,
    }


def sweep(kernel, shapes: list[Shape], steps_at_case: int, case_s: int, repeats: int, warmup: int, seed: int,
          graph_replays: int, sampler=None, progress=print) -> list[dict]:
    """`bench` at each shape `kernel` supports, with as many steps as do the work of `steps_at_case` at
    the case's length (config.sweep_steps); a shape it does not support gets its reason instead (a
    peer's library without a kernel for a length is such a shape too)."""
    points = []
    for shape in shapes:
        steps = sweep_steps(steps_at_case, case_s, shape.S)
        reason = kernel.supports(shape)
        if reason:
            progress(f"sweep {kernel.name}: {shape} skipped, {reason}")
            points.append({**shape.as_dict(), "timed": False, "reason": reason})
            continue
        progress(f"sweep {kernel.name}: {shape}, {steps}-step method + {repeats} timed calls + graph")
        try:
            points.append({**bench(kernel, shape, steps, repeats, warmup, seed, graph_replays, sampler),
                           "timed": True, "reason": None})
        except NoKernelForShape as e:
            progress(f"  -> not timed: {e}")
            points.append({**shape.as_dict(), "timed": False, "reason": str(e)})
            continue
        p = points[-1]
        progress(f"  -> {p['tflops']:.1f} TFLOPS ({steps}-step), {p['tflops_graph']:.1f} (graph)"
                 + (" THROTTLED" if (p["clocks"] or {}).get("throttled") else ""))
    return points
