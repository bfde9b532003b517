"""Correctness: each shape and input kind on fresh random inputs, element by element against the
fp32 reference, with what plain code in the inputs' element type (fp16 or bf16) achieves on the same
inputs as the yardstick.

The gate, per shape and input kind (in the manner of FlashAttention's own tests), u the element type's
rounding (half an ulp: 2^-11 for fp16, 2^-8 for bf16):
  max abs error         <= factor * plain code's + u of the largest output
  worst row's rel error <= factor * plain code's + u
  whole-tensor rel error <= the smaller of the same bound and `tolerance`, given for fp16 and scaled by u
and no NaN/Inf anywhere (the output is NaN-poisoned before each run). The reference and the yardstick
come from a copy of the inputs taken before the kernel runs, and a kernel that changes its inputs
fails: judged on what it was given, not on what it left behind. A correct kernel rounds at
no more places than plain code (its logits stay fp32; P and O are rounded once each), so it lands
well under plain code's error; `factor` (2) leaves room for another accumulation order and the
approximate exp2, while one wrong row, a block that missed a key tile or a 1% scale error land one
to three orders of magnitude above. The rounding floor keeps an output that is exact but for its
own rounding (all-equal logits) from failing on a yardstick that happens to round closer.

A call that faults, or that has not finished after HANG_AFTER_S (a barrier nothing arrives at, a loop
without end: a new version's bug), fails its check there and ends it: the record says so, and the run
goes on without that kernel (cli's check leaves the process at once after a hang, as its call still
runs on the GPU).
"""
from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass

from . import FlashbenchError, NoKernelForShape, attention, elements
from .config import Shape


HANG_AFTER_S = 60.0  # the check's largest call takes about a millisecond on an H200, ten under compute-sanitizer
METRICS = ("max_abs_error", "worst_row_rel_error", "rel_error")
METRIC_NAMES = {"max_abs_error": "max abs error", "worst_row_rel_error": "worst row's relative error",
                "rel_error": "whole-tensor relative error"}


@dataclass(frozen=True)
class Gate:
    factor: float  # times plain code's error on the same inputs
    tolerance: float  # cap on the whole-tensor relative error of fp16 outputs (scaled by the rounding for bf16)

    def __post_init__(self):
        for name in ("factor", "tolerance"):  # a NaN bound would fail every output, an infinite one none
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise FlashbenchError(f"the check's {name} must be a positive finite number, not {value}")

    def thresholds(self, yardstick: dict, ref_max_abs: float, dtype: str = "fp16") -> dict:
        floor = elements.HALF_ULP[dtype]
        tolerance = self.tolerance * floor / elements.HALF_ULP["fp16"]
        return {
            "max_abs_error": self.factor * yardstick["max_abs_error"] + floor * ref_max_abs,
            "worst_row_rel_error": self.factor * yardstick["worst_row_rel_error"] + floor,
            "rel_error": min(tolerance, self.factor * yardstick["rel_error"] + floor),
        }

    def judge(self, measured: dict, yardstick: dict, ref_max_abs: float, dtype: str = "fp16") -> dict:
        """The verdict on one output of `dtype`: passed, why not, each threshold and the margin (the
        largest error / threshold; at most 1 passes)."""
        thresholds = self.thresholds(yardstick, ref_max_abs, dtype)
        verdict = {**{f"yardstick_{m}": yardstick[m] for m in METRICS},
                   **{f"threshold_{m}": thresholds[m] for m in METRICS}}
        if measured["nonfinite"]:
            return {**verdict, "passed": False, "margin": float("nan"),
                    "reason": f"{measured['nonfinite']} NaN/Inf elements in the output (unwritten or overflowed)"}
        over = [m for m in METRICS if not measured[m] <= thresholds[m]]
        reason = "; ".join(f"{METRIC_NAMES[m]} {measured[m]:.2e} above {thresholds[m]:.2e} "
                           f"(plain {dtype} {yardstick[m]:.2e})" for m in over) or None
        margin = max(_share(measured[m], thresholds[m]) for m in METRICS)
        return {**verdict, "passed": not over, "margin": margin, "reason": reason}


def _share(error: float, threshold: float) -> float:
    """error / threshold; a threshold of 0 (an all-zero reference and an exact yardstick) is met by no
    error at all (0) and missed by any (inf)."""
    if threshold > 0:
        return error / threshold
    return 0.0 if error == 0 else math.inf


def finished_within(cp, seconds: float) -> bool:
    """Whether the work given to the GPU so far on the current stream (a call just made) finishes within
    `seconds`: its completion polled, never waited on, so that a call that does not end cannot hang the
    caller. A call that faulted raises CuPy's error here."""
    done = cp.cuda.Event(disable_timing=True)
    done.record()
    deadline, pause = time.monotonic() + seconds, 1e-4
    while not done.done:
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.01)
    return True


def check_shape(kernel, shape: Shape, gate: Gate, seed: int, kind: str = "normal", causal: bool = False) -> dict:
    """`kernel`: an AttentionKernel or a TorchPeer (name, cp, supports, skips_unsupported, inputs, call,
    causal), judged against the reference under the causal mask where `causal`. A call that faults, or
    has not finished after HANG_AFTER_S, is `fatal` (and `hung`, the latter): no call may follow it in
    this process."""
    cp = kernel.cp
    row = {**shape.as_dict(), "inputs": kind, "seed": seed}
    if kernel.causal != causal:
        return {**row, "passed": False, "reason": f"{kernel.name} computes attention "
                f"{'under' if kernel.causal else 'without'} the causal mask, asked {'with' if causal else 'without'}"}
    reason = kernel.supports(shape)
    if reason:
        if kernel.skips_unsupported:  # a peer above its max_seq_len: not checked, never timed there
            return {**row, "passed": None, "reason": f"not checked: {reason}"}
        return {**row, "passed": False, "reason": f"a configured shape it cannot run: {reason}"}
    q, k, v, o = kernel.inputs(shape, cp.random.default_rng(seed), kind)
    if k.shape[1] != shape.H:  # grouped K/V heads
        row["H_kv"] = k.shape[1]
    given = {"Q": q.copy(), "K": k.copy(), "V": v.copy()}  # the reference's: the kernel may write into q, k, v
    try:
        out = cp.asarray(kernel(q, k, v, o)).view(q.dtype)  # a peer's bf16 comes back as int16
        if not finished_within(cp, HANG_AFTER_S):
            return {**row, "passed": False, "fatal": True, "hung": True,
                    "reason": f"the call had not finished after {HANG_AFTER_S:g} s: it hangs"}
        cp.cuda.runtime.deviceSynchronize()
    except (cp.cuda.driver.CUDADriverError, cp.cuda.runtime.CUDARuntimeError) as e:
        # a kernel that faults poisons the CUDA context: record it and check no further shape
        return {**row, "passed": False, "reason": f"kernel launch failed: {e}", "fatal": True}
    except NoKernelForShape as e:
        return {**row, "passed": None, "reason": f"not checked: {e}"}
    ref = attention.reference(*given.values(), cp, causal)
    measured = attention.errors(out, ref, cp)
    yardstick = attention.errors(attention.plain_code(*given.values(), cp, causal), ref, cp)
    verdict = gate.judge(measured, yardstick, float(cp.abs(ref).max()), elements.of_array(q))
    changed = [name for (name, before), after in zip(given.items(), (q, k, v))
               if bool((before.view(cp.uint16) != after.view(cp.uint16)).any())]  # bit for bit: NaN too
    if changed:
        verdict |= {"passed": False, "reason": f"the kernel changed its inputs ({', '.join(changed)}); "
                                               + (verdict["reason"] or "its output is within the bounds")}
    return {**row, **measured, **verdict}


def shapes_for(kernel, shapes: list[Shape], smallest: tuple[int, int] | None, ragged: tuple[Shape, ...] = ()
               ) -> list[Shape]:
    """The configured shapes; the `ragged` ones where the kernel or peer takes them (any S); and for a
    kernel the smallest S it takes at an odd B*H (`smallest`)."""
    extras = [shape for shape in ragged if kernel.supports(shape) is None]
    S = getattr(kernel, "smallest_seq_len", None)
    if smallest is not None and S is not None:
        extras.append(Shape(B=smallest[0], H=smallest[1], S=S, D=shapes[0].D))
    return list(dict.fromkeys([*shapes, *extras]))


def _verdict(r: dict) -> str:
    text = f"{r['inputs']} " + {True: "pass", False: "FAIL", None: "skipped"}[r["passed"]]
    if r.get("margin") is not None and math.isfinite(r["margin"]):
        text += f" ({r['margin']:.2f} of its bound)"
    return text + (f": {r['reason']}" if r["reason"] else "")


def check_kernel(kernel, shapes: list[Shape], gate: Gate, kinds=attention.INPUT_KINDS,
                 smallest: tuple[int, int] | None = None, progress=print, causal: bool = False,
                 ragged: tuple[Shape, ...] = ()) -> dict:
    """Check every shape (the first is the case, where the timing happens) on every kind of input.
    It passes when nothing failed and the case was checked on every kind: an implementation that
    skips the case (a peer with no kernel for it) is not checked there, so it is not timed there."""
    results = []
    shapes = shapes_for(kernel, shapes, smallest, ragged)
    for shape in shapes:
        here = []
        for kind in kinds:
            seed = secrets.randbits(32)  # fresh inputs every run, the seed kept to replay a failure
            here.append(check_shape(kernel, shape, gate, seed, kind, causal))
            if here[-1].get("fatal"):
                break
        progress(f"check {kernel.name}: {shape}: " + ", ".join(_verdict(r) for r in here))
        results += here
        if here[-1].get("fatal"):
            break
    failed = [r for r in results if r["passed"] is False]
    case = [r for r in results if Shape(r["B"], r["H"], r["S"], r["D"]) == shapes[0]]
    unchecked_case = [r for r in case if r["passed"] is None]
    reason = "; ".join(f"B={r['B']} H={r['H']} S={r['S']} {r['inputs']}: {r['reason']}" for r in failed + unchecked_case)
    if not failed and len(case) < len(kinds):
        reason = "the check stopped before the case was checked on every kind of input"
    passed = not reason
    return {
        "kernel": kernel.name,
        "gate": {"factor": gate.factor, "tolerance": gate.tolerance},
        "inputs": list(kinds),
        "passed": passed,
        "reason": reason or None,
        "shapes": results,
    }
