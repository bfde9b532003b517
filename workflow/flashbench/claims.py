"""Chapter G3's claims about its table and its four conclusions, each judged on the measured tables.

Every verdict is computed from results/<gpu>/ (TFLOPS of kernels that passed their check, ptxas
resources on the GPU's arch); the write-up supplies only the published figures it is set against.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .findings import change
from .occupancy import SMEM_WITHOUT_OPT_IN, blocks_by_shared_memory
from .profile import TOP_LINES
from .summary import case_rows

# The chapter's kernels by role (config.yaml names). A judgement that needs a kernel that was not
# run, failed its check or was not timed says so instead of guessing.
V11, V12, V13, BR128, HYBRID = "v11", "v12", "v13", "br128", "hybrid_smem"
LEVEL = 0.03     # "level with": within +-3% (the write-up's hybrid is 0.2% below its V13)
G2_GAIN = 0.11   # all of G2's tuning in the write-up; G2's versions are not rebuilt here

REPRODUCED, NOT_REPRODUCED, HOLDS, DOES_NOT_HOLD, NOT_MEASURED = (
    "reproduced", "not reproduced", "holds", "does not hold", "not measured")


@dataclass(frozen=True)
class Judgement:
    statement: str  # the chapter's claim or conclusion
    published: str  # what the write-up measured on B300
    verdict: str
    evidence: str   # the measured numbers behind the verdict


def _spilled(resource) -> int:
    """Bytes a kernel spills, stores and loads, by its row of resources.csv."""
    return int(resource.spill_store_bytes + resource.spill_load_bytes)


class _Data:
    def __init__(self, summary: pd.DataFrame, resources: pd.DataFrame, meta: dict):
        case = case_rows(summary)
        self.tflops = {r.kernel: r.tflops for r in case.itertuples() if r.passed and pd.notna(r.tflops)}
        self.published = {k["name"]: k.get("published_tflops") for k in meta["kernels"]}
        self.arch = meta["gpu_arch"]
        self.res = {r.kernel: r for r in resources[resources.arch == self.arch].itertuples()}

    def missing(self, *names: str) -> str | None:
        gone = [n for n in names if n not in self.tflops]
        return f"{', '.join(gone)} not measured (not run, failed its check or not timed)" if gone else None

    def ratio(self, new: str, old: str) -> float:
        return self.tflops[new] / self.tflops[old]

    def published_ratio(self, new: str, old: str) -> str:
        a, b = self.published.get(new), self.published.get(old)
        return change(a / b) if a and b else "n/a"

    def spill(self, name: str) -> int:
        return _spilled(self.res[name])

    def spill_text(self, name: str) -> str:
        r = self.res[name]
        if not self.spill(name):
            return f"{name} {r.registers} registers, no spill"
        return (f"{name} {r.registers} registers, {r.spill_store_bytes} B spill stores / {r.spill_load_bytes} B loads, "
                f"{r.stack_frame_bytes} B stack")


def claims(summary: pd.DataFrame, resources: pd.DataFrame, meta: dict) -> list[Judgement]:
    d = _Data(summary, resources, meta)
    out = []

    statement = "V12 (fragment reshape) is the biggest single step"
    published = f"V11 -> V12 {d.published_ratio(V12, V11)}, V12 -> V13 {d.published_ratio(V13, V12)}"
    if gone := d.missing(V11, V12, V13):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    else:
        up12, up13 = d.ratio(V12, V11), d.ratio(V13, V12)
        out.append(Judgement(statement, published, REPRODUCED if up12 > max(up13, 1.0) else NOT_REPRODUCED,
                             f"V11 -> V12 {change(up12)}, V12 -> V13 {change(up13)}"))

    statement = "V13 (warp specialisation) is at or above V12"
    published = f"{d.published.get(V13)} vs {d.published.get(V12)} ({d.published_ratio(V13, V12)})"
    if gone := d.missing(V12, V13):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    else:
        up = d.ratio(V13, V12)
        out.append(Judgement(statement, published, REPRODUCED if up >= 1.0 else NOT_REPRODUCED,
                             f"{d.tflops[V13]:.1f} vs {d.tflops[V12]:.1f} TFLOPS ({change(up)})"))

    statement = "Br = 128 is a regression, caused by register spills"
    published = f"{d.published.get(BR128)} vs V13 {d.published.get(V13)} ({d.published_ratio(BR128, V13)}), spilling"
    if gone := d.missing(V13, BR128):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    else:
        down = d.ratio(BR128, V13)
        caused = d.spill(BR128) > 0 and d.spill(V13) == 0
        verdict = REPRODUCED if down < 1.0 and caused else NOT_REPRODUCED
        out.append(Judgement(statement, published, verdict,
                             f"{d.tflops[BR128]:.1f} vs {d.tflops[V13]:.1f} TFLOPS ({change(down)}); ptxas on "
                             f"{d.arch}: {d.spill_text(BR128)}; {d.spill_text(V13)}"))

    statement = "The hybrid (Br = 128, part of the state in shared memory) removes the spill and is level with V13, no gain"
    published = f"{d.published.get(HYBRID)} vs V13 {d.published.get(V13)} ({d.published_ratio(HYBRID, V13)})"
    if gone := d.missing(V13, HYBRID):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    else:
        vs = d.ratio(HYBRID, V13)
        level = abs(vs - 1) <= LEVEL
        verdict = REPRODUCED if level and d.spill(HYBRID) == 0 else NOT_REPRODUCED
        where = "level" if level else ("above" if vs > 1 else "below")
        out.append(Judgement(statement, published, verdict,
                             f"{d.tflops[HYBRID]:.1f} vs {d.tflops[V13]:.1f} TFLOPS ({change(vs)}: {where}, "
                             f"level meaning within +-{LEVEL:.0%}); {d.spill_text(HYBRID)}"))
    return out


def conclusions(summary: pd.DataFrame, resources: pd.DataFrame, meta: dict, gpu_name: str,
                profile: pd.DataFrame | None = None) -> list[Judgement]:
    d = _Data(summary, resources, meta)
    profiled = {r.kernel: r for r in profile.itertuples()} if profile is not None else {}
    out = []

    statement = "An architecture-level change (V12) outweighs all of G2's tuning"
    published = f"V12 {d.published_ratio(V12, V11)} against G2's +{G2_GAIN:.0%}"
    if gone := d.missing(V11, V12):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    else:
        up = d.ratio(V12, V11)
        out.append(Judgement(statement, published, HOLDS if up - 1 > G2_GAIN else DOES_NOT_HOLD,
                             f"V11 -> V12 {change(up)} on the {gpu_name}, against the write-up's +{G2_GAIN:.0%} for "
                             f"G2 (V6-V10 are not rebuilt here)"))

    statement = "Br has a sweet spot at 64: Br = 32 reuses K and V too little, Br = 128 spills"
    published = (f"Br 32 (V11) {d.published.get(V11)}, Br 64 (V13) {d.published.get(V13)}, Br 128 {d.published.get(BR128)} "
                 f"(spilling), {d.published.get(HYBRID)} (hybrid)")
    if gone := d.missing(V11, V13, BR128, HYBRID):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    else:
        best_128 = max((BR128, HYBRID), key=d.tflops.get)
        above = d.ratio(best_128, V13)
        holds = d.tflops[V13] > d.tflops[V11] and above <= 1 + LEVEL
        text = (f"Br 32 (V11) {d.tflops[V11]:.1f}, Br 64 (V13) {d.tflops[V13]:.1f}, Br 128 {d.tflops[BR128]:.1f} "
                f"(spilling), {d.tflops[HYBRID]:.1f} (hybrid, {d.spill_text(HYBRID)})")
        if not holds and above > 1 + LEVEL:
            text += (f": without the spill, Br = 128 is {change(above)} over Br = 64 on the {gpu_name}, so 64 is the "
                     f"sweet spot only for V13's all-in-registers state under the 128-register cap")
        out.append(Judgement(statement, published, HOLDS if holds else DOES_NOT_HOLD, text))

    statement = "Warp specialisation helps, with diminishing returns (cp.async near its limit, TMA next)"
    published = f"V12 -> V13 {d.published_ratio(V13, V12)} after V11 -> V12 {d.published_ratio(V12, V11)}"
    if gone := d.missing(V11, V12, V13):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    else:
        up12, up13 = d.ratio(V12, V11), d.ratio(V13, V12)
        holds = 1 < up13 < up12
        text = f"V12 -> V13 {change(up13)} after V11 -> V12 {change(up12)}"
        if V12 in profiled and V13 in profiled:
            a, b = profiled[V12], profiled[V13]
            largest = max(("barrier", "long_scoreboard", "short_scoreboard", "mio_throttle", "wait"),
                          key=lambda s: getattr(b, f"stall_{s}"))
            text += (f". Nsight Compute, cycles per issued instruction: the wait on loads (long scoreboard) "
                     f"{a.stall_long_scoreboard:.2f} -> {b.stall_long_scoreboard:.2f}, the barrier "
                     f"{a.stall_barrier:.2f} -> {b.stall_barrier:.2f}; V13's largest stall is {largest.replace('_', ' ')}, "
                     + ("so what V13 leaves is less the copy than the wait of the warps that finished their share"
                        if largest == "barrier" else "so the loads still dominate"))
        else:
            text += "; whether cp.async is near its limit needs the profile, not run here"
        out.append(Judgement(statement, published, HOLDS if holds else DOES_NOT_HOLD, text))

    statement = "58 KB broke the 48 KB static limit; more shared memory must be traded against occupancy"
    published = "V13 58 KB, dynamic with the opt-in, 2 blocks per SM"
    if V13 not in d.res or HYBRID not in d.res:
        out.append(Judgement(statement, published, NOT_MEASURED, f"{V13} or {HYBRID} not compiled for {d.arch}"))
    else:
        v13, hybrid = d.res[V13], d.res[HYBRID]
        by_smem = {n: blocks_by_shared_memory(d.arch, int(d.res[n].smem_bytes)) for n in (V13, HYBRID)}
        holds = v13.smem_bytes > SMEM_WITHOUT_OPT_IN and by_smem[HYBRID] < by_smem[V13]
        ran = "ran and passed its check" if V13 in d.tflops else "was not measured"
        out.append(Judgement(statement, published, HOLDS if holds else DOES_NOT_HOLD,
                             f"V13 takes {v13.smem_bytes / 1024:.1f} KiB per block (dynamic, with the opt-in; it "
                             f"{ran}); on {d.arch} its {v13.registers} registers allow {v13.blocks_per_sm} blocks per "
                             f"SM and its shared memory {by_smem[V13]}. The hybrid's "
                             f"{hybrid.smem_bytes / 1024:.1f} KiB allow only {by_smem[HYBRID]} blocks by shared "
                             f"memory (resident: {hybrid.blocks_per_sm}, limited by {hybrid.limited_by})"))
    return out


def profiler_claims(profile: pd.DataFrame, resources: pd.DataFrame, meta: dict) -> list[Judgement]:
    """The chapter's Nsight Compute readings, against this GPU's (results/<gpu>/profile.csv)."""
    rows = {r.kernel: r for r in profile.itertuples()}

    def unmeasured(*names: str) -> str | None:
        """Why a reading of these kernels is missing (not profiled, or ncu gave no value), or None."""
        gone = [n for n in names if n not in rows]
        if gone:
            return f"{', '.join(gone)}: {meta.get('profile_note') or 'not profiled in this run'}"
        return None

    lines = {k["name"]: (k.get("profile") or {}).get("top_lines") for k in meta["kernels"]}
    arch = meta["gpu_arch"]
    spills = {r.kernel: _spilled(r) for r in resources[resources.arch == arch].itertuples()}
    out = []

    statement = "LSU utilisation falls from V11 to V12"
    published = "89% -> 63%"
    if gone := unmeasured(V11, V12):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    elif pd.isna(rows[V11].lsu_pipe_pct) or pd.isna(rows[V12].lsu_pipe_pct):
        out.append(Judgement(statement, published, NOT_MEASURED, "ncu gave no LSU reading"))
    else:
        a, b = rows[V11].lsu_pipe_pct, rows[V12].lsu_pipe_pct
        out.append(Judgement(statement, published, REPRODUCED if b < a else NOT_REPRODUCED,
                             f"{a:.1f}% -> {b:.1f}% (LSU pipe, % of peak while active)"))

    statement = f"The softmax leaves the stall list from V11 to V12 (ncu's top {TOP_LINES} stall lines)"
    published = "softmax among V11's top stalls, gone in V12"
    if gone := unmeasured(V11, V12):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    elif not lines.get(V11) or not lines.get(V12):
        out.append(Judgement(statement, published, NOT_MEASURED, "stall samples not attributed to source lines"))
    else:
        def describe(name: str) -> str:
            hits = [line["line"] for line in lines[name] if line["softmax"]]
            share = rows[name].softmax_share
            where = f"lines {', '.join(map(str, hits))}" if hits else "none"
            return (f"{name}: {len(hits)} of its top {len(lines[name])} stall lines in the softmax ({where}), the "
                    f"softmax {share:.0%} of all stall samples")
        left = any(line["softmax"] for line in lines[V11]) and not any(line["softmax"] for line in lines[V12])
        out.append(Judgement(statement, published, REPRODUCED if left else NOT_REPRODUCED,
                             f"{describe(V11)}; {describe(V12)}"))

    statement = "V13 runs at about 124 registers per thread, under the 128 that two blocks per SM allow, without spilling"
    published = "124 registers"
    if gone := unmeasured(V13):
        out.append(Judgement(statement, published, NOT_MEASURED, gone))
    elif pd.isna(rows[V13].registers):
        out.append(Judgement(statement, published, NOT_MEASURED, "ncu gave no register count"))
    else:
        registers = int(rows[V13].registers)
        fits = registers <= 128 and spills.get(V13, 0) == 0
        out.append(Judgement(statement, published, REPRODUCED if fits else NOT_REPRODUCED,
                             f"{registers} registers per thread (ncu), {spills.get(V13, 0)} B spilled (ptxas on {arch}), "
                             f"achieved occupancy {rows[V13].achieved_occupancy_pct:.1f}%"))
    return out
