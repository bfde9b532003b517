"""The report's findings: sentences derived from the measured tables, each stating only what the
numbers show (the chapter's claims and conclusions, judged, are claims')."""
from __future__ import annotations

import pandas as pd

from .summary import case_rows


def change(ratio: float) -> str:
    """A ratio as the change it is, in percent with its sign: 1.341 -> +34.1%."""
    return f"{(ratio - 1) * 100:+.1f}%"


def steps(case: pd.DataFrame, kernels: list[dict]) -> list[dict]:
    """Each timed kernel against the row it follows: a version against the previous timed version,
    an ablation against its parent. Measured and published ratios side by side."""
    timed = {r.kernel: r for r in case.itertuples() if pd.notna(r.tflops)}
    published = {k["name"]: k.get("published_tflops") for k in kernels}
    out, previous = [], None
    for k in kernels:
        if k["kind"] == "peer":  # peers are set against the baseline, not against a previous row
            continue
        name = k["name"]
        base = k.get("parent") if k["kind"] == "ablation" else previous
        if name in timed and base in timed:
            pub_new, pub_old = published.get(name), published.get(base)
            out.append({
                "kernel": name, "base": base,
                "ratio": timed[name].tflops / timed[base].tflops,
                "published_ratio": pub_new / pub_old if pub_new and pub_old else None,
            })
        if k["kind"] == "version" and name in timed:
            previous = name
    return out


def findings(summary: pd.DataFrame, resources: pd.DataFrame, meta: dict, gpu_name: str) -> list[str]:
    case = case_rows(summary)
    kernels, arch = meta["kernels"], meta["gpu_arch"]
    out = []
    for k in kernels:
        row = case[case.kernel == k["name"]]
        if k.get("skipped"):
            out.append(f"**{k['name']}** was skipped: {k['skipped']}.")
            continue
        if not k["check_passed"]:
            out.append(f"**{k['name']}** failed its correctness check ({k['check_reason']}), so it is not "
                       f"reported as a speed.")
            continue
        if row.empty or pd.isna(row.iloc[0].tflops):
            out.append(f"**{k['name']}** passed its check but was not timed ({k.get('not_timed_reason')}).")
            continue
        r = row.iloc[0]
        text = (f"**{k['name']}** runs at {r.tflops:.1f} TFLOPS on the {gpu_name} by the write-up's "
                f"{_steps_word(meta)} method (median per call {r.tflops_median:.1f})")
        if k.get("published_tflops"):
            text += f", {r.tflops / k['published_tflops']:.2f}x the write-up's {k['published_tflops']} on B300"
        out.append(text + ".")

    all_steps = steps(case, kernels)
    for s in all_steps:
        text = f"{s['kernel']} against {s['base']}: {change(s['ratio'])} on the {gpu_name}"
        if s["published_ratio"]:
            text += f" (write-up on B300: {change(s['published_ratio'])})"
        out.append(text + ".")

    kinds = {k["name"]: k["kind"] for k in kernels}
    version_steps = [s for s in all_steps if kinds[s["kernel"]] == "version"]
    if len(version_steps) >= 2:
        best = max(version_steps, key=lambda s: s["ratio"])
        with_pub = [s for s in version_steps if s["published_ratio"]]
        text = f"The largest step between versions here is {best['base']} -> {best['kernel']} ({change(best['ratio'])})"
        if with_pub:
            pub = max(with_pub, key=lambda s: s["published_ratio"])
            text += f"; in the write-up it is {pub['base']} -> {pub['kernel']} ({change(pub['published_ratio'])})"
        out.append(text + ".")

    here = resources[resources.arch == arch]
    spilling = here[(here.spill_store_bytes + here.spill_load_bytes) > 0]
    if spilling.empty:
        out.append(f"No kernel spills registers on {arch} (ptxas).")
    for r in spilling.itertuples():
        out.append(f"{r.kernel} spills on {arch}: {r.spill_store_bytes} bytes stored, {r.spill_load_bytes} loaded, "
                   f"{r.stack_frame_bytes}-byte stack frame (ptxas).")
    published_registers = {k["name"]: k.get("published_registers") for k in kernels}
    for r in here.itertuples():
        text = (f"{r.kernel} on {arch}: {r.registers} registers, {r.smem_bytes / 1024:.1f} KiB shared memory per "
                f"block, {r.blocks_per_sm} blocks ({r.blocks_per_sm * r.threads // 32} warps) per SM, limited by "
                f"{r.limited_by}")
        if published_registers.get(r.kernel):
            text += f" (the write-up reports about {published_registers[r.kernel]} registers for it)"
        out.append(text + ".")
    return out


def _steps_word(meta: dict) -> str:
    timings = [k["timing"] for k in meta["kernels"] if k.get("timing")]
    return f"{timings[0]['steps']}-step" if timings else "multi-step"
