"""summarize + render from synthetic records (tests/records.py), no GPU."""
import json
import re

import numpy as np
import pandas as pd
import pytest

from flashbench import (FlashbenchError, archive_tables, attention, chapter_report, claims, figures, findings,
                        gpu_comparison, gpu_reports, hopper_report)
from flashbench.files import write_json
from flashbench.summary import SUMMARY_COLUMNS, choices, own_choices

import records
from conftest import ROOT, shipped_settings
from records import results_folder

TEMPLATE = ROOT / "workflow" / "templates" / "report.md.j2"
GOAL = shipped_settings().goal  # the Hopper report's
# TFLOPS at the case of the chapter's kernels, for most of the tests below
G3 = {"v11": 140.0, "v12": 210.0, "v13": 220.0, "br128": 190.0, "hybrid_smem": 221.0}


def test_summary_has_one_row_per_kernel_and_shape(tmp_path):
    out = results_folder(tmp_path, G3)
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS
    runs = len(records.KERNELS) + len(records.PEERS)
    checked, swept = summary[summary.series == "check"], summary[summary.series == "sweep"]
    assert len(checked) == runs * 2 * len(records.INPUTS) and len(swept) == runs * len(records.SWEEP_S)
    assert set(checked.inputs) == set(records.INPUTS)
    case = checked[checked.is_case & (checked.inputs == "normal")].set_index("kernel")
    assert case.loc["v12", "tflops_graph"] == pytest.approx(210.0 / 0.98) and case.loc["v12", "throttled"] == False  # noqa: E712
    assert checked[checked.inputs != "normal"].tflops.isna().all()  # the timing sits on the normal-input row
    assert case.loc["v12", "tflops"] == 210.0 and case.loc["br128", "kind"] == "ablation"
    assert case.loc["sdpa_auto", "kind"] == "peer" and pd.isna(case.loc["sdpa_auto", "registers"])
    assert checked[~checked.is_case].tflops.isna().all()  # only the case is timed among the checked shapes
    assert case.loc["br128", "spill_bytes"] == 128
    # the sweep: every length timed, except above a peer's max_seq_len, which says why
    unfused = swept[swept.kernel == "unfused"].set_index("S")
    assert unfused.loc[1024, "tflops"] > 0 and pd.isna(unfused.loc[2048, "tflops"])
    assert "max_seq_len" in unfused.loc[2048, "reason"]
    assert not swept[swept.kernel != "unfused"].tflops.isna().any()
    profile = pd.read_csv(out / "profile.csv").set_index("kernel")
    assert list(profile.index) == [k["name"] for k in records.KERNELS]
    assert profile.loc["v11", "lsu_pipe_pct"] == 50.0 and profile.loc["v11", "softmax_in_top_lines"] == 2


@pytest.fixture(scope="module")
def g3_rendered(tmp_path_factory, settings_file):
    """The render command run on G3's timings for the chapter's kernels alone, once for the tests that
    read what it wrote (a render with its figures takes over a second): its exit status, what it
    printed, and the reports folder."""
    import contextlib
    import io

    from flashbench.cli import main

    tmp = tmp_path_factory.mktemp("g3")
    out, reports, printed = results_folder(tmp, G3), tmp / "reports", io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["render", "--results", str(out), "--reports", str(reports), "--template", str(TEMPLATE),
                     "--slug", "nvidia-h200", "--settings", settings_file])
    return code, printed.getvalue(), reports


@pytest.fixture(scope="module")
def g3_report(g3_rendered):
    """g3_rendered's report.md (the render command renders as gpu_reports.render, the goal its settings')."""
    return g3_rendered[2] / "report.md"


def test_report_renders_tables_figure_and_data_driven_findings(g3_report):
    text = g3_report.read_text()
    assert (g3_report.parent / "tflops.png").stat().st_size > 1000
    assert "| v12 | fragment reshape | **210.0** |" in text
    assert "+50.0%" in text  # 210 / 140
    assert "+51.8%" in text  # the write-up's 219.15 / 144.41
    assert "-13.6%" in text  # br128 against its parent v13
    assert "+4.8%" in text  # v13 against v12
    assert "inputs fit in L2" in text
    assert "br128 spills on sm_90: 64 bytes stored" in text
    assert "The largest step between versions here is v11 -> v12 (+50.0%)" in text
    assert "abc123" in text and "sm_103" in text
    assert "v11 on sm_90: 126 registers" in text and "the write-up reports about 96 registers for it" in text
    # an ablation shares its parent's file and choices; the report names the parameters it is built with
    assert "- **hybrid_smem** (`kernels/v13.cu` built with `-DBLOCK_ROWS=128`, `-DHYBRID_SMEM=1`): the choices of v13" in text


def test_a_failed_kernel_is_never_reported_as_a_speed(tmp_path):
    out = results_folder(tmp_path, G3, failing="v12")
    text = gpu_reports.render(out, tmp_path / "reports", TEMPLATE, "nvidia-h200", GOAL).read_text()
    assert "| v12 | fragment reshape | failed check |" in text
    assert "210.0" not in text
    assert "**v12** failed its correctness check" in text
    assert "| v12 | normal | 0/2, **2 failed** |" in text
    assert "- v12, B=1 H=64 S=1024, normal: worst row's relative error" in text


def test_findings_only_state_what_the_numbers_show(tmp_path):
    out = results_folder(tmp_path, {"v11": 200.0, "v12": 150.0, "v13": 160.0, "br128": 150.0, "hybrid_smem": 161.0})
    summary, resources, _, meta = archive_tables.read_tables(out)
    text = " ".join(findings.findings(summary, resources, meta, "NVIDIA H200"))
    assert "v12 against v11: -25.0%" in text  # a regression is stated as one
    assert "The largest step between versions here is v12 -> v13 (+6.7%)" in text
    assert "in the write-up it is v11 -> v12 (+51.8%)" in text


def test_missing_results_are_a_clear_error(tmp_path):
    with pytest.raises(FlashbenchError, match="lacks summary.csv"):
        gpu_reports.render(tmp_path, tmp_path / "out", TEMPLATE, "x", GOAL)
    assert not (tmp_path / "out" / "report.md").exists()


def test_kernel_choices_are_read_from_the_source_one_paragraph_each():
    assert len(choices(ROOT / "kernels" / "v11.cu")) == 1 and choices(ROOT / "kernels" / "v11.cu")[0].startswith("stmatrix")
    v14 = choices(ROOT / "kernels" / "v14.cu")
    assert len(v14) == 4 and v14[-1] == "O is stored with plain 4-byte stores from the accumulator layout (a TMA store is later)."
    assert not any("Choice:" in c for c in v14)


def test_each_version_lists_its_own_choices_not_those_it_restates(settings):
    sources = {k.name: ROOT / k.source for k in settings.kernels}
    own = own_choices([{"name": k.name, "kind": k.kind} for k in settings.kernels], sources)
    versions = [k.name for k in settings.kernels if k.kind == "version"]
    for before, after in zip(versions, versions[1:]):
        assert own[after] and not set(own[after]) & set(choices(sources[before])), after
    # V19's file restates V18's two schedule choices word for word: they are V18's; its own are its stages and O tile
    assert any(c.startswith("row tiles vary fastest") for c in own["v18"])
    assert not any(c.startswith("row tiles vary fastest") or c.startswith("a static schedule") for c in own["v19"])
    assert any(c.startswith("2 K/V stages") for c in own["v19"]) and any(c.startswith("a dedicated O tile") for c in own["v19"])
    assert own["br128"] == own["v13"] == choices(ROOT / "kernels" / "v13.cu")  # an ablation: its parent's file


def test_the_check_shapes_say_which_kernels_were_checked_where():
    summary, _, _, meta = archive_tables.read_tables(ROOT / "results" / "nvidia-h200")
    summary, meta, _ = archive_tables.view(summary, meta, {}, archive_tables.configurations(meta)[0])  # the report's
    shapes = chapter_report.checked_shapes(summary[summary.series == "check"])
    hopper = [k["name"] for k in meta["kernels"] if k.get("line") == "hopper"]  # the archive's own, V14 on
    by_head = ["v25"]  # any S: the ragged shapes (V25's two entries), and its smallest S is 1
    peers = [k["name"] for k in meta["kernels"] if k["kind"] == "peer"]
    assert hopper[0] == "v14" and hopper[-1] == "v25"
    assert shapes["shared_shapes"] == ["B=1 H=8 S=8192", "B=2 H=16 S=2048", "B=4 H=3 S=384"]
    assert shapes["own_shapes"] == {"B=3 H=5 S=64": ["v11", "v12", "v13"],
                                    "B=3 H=5 S=128": ["br128", "hybrid_smem", *hopper[:-1]],
                                    "B=1 H=5 S=1000": [*by_head, *peers], "B=1 H=5 S=1050": [*by_head, *peers],
                                    "B=3 H=5 S=1": by_head}


def test_the_report_says_what_each_configured_kind_of_input_is(g3_report):
    """Each kind the run checked is named with what it is, whichever kinds config lists (the records'
    two here) and in its order."""
    text = g3_report.read_text()
    assert records.INPUTS == ["normal", "late_max"]
    assert ("fresh random inputs of 2 kinds (normal: normal values; late_max: each row's maximum only in the "
            "last 64 keys)") in text
    assert set(attention.INPUT_KIND_TEXT) == set(attention.INPUT_KINDS)


def test_the_render_log_names_every_file_it_wrote(g3_rendered):
    code, printed, reports = g3_rendered
    assert code == 0
    logged = [line.removeprefix("wrote ") for line in printed.splitlines()]
    assert sorted(logged) == sorted(str(p) for p in reports.iterdir()) and len(logged) == 7


ARCHIVED = sorted(p.parent.name for p in (ROOT / "results").glob("*/summary.csv"))


@pytest.mark.parametrize("slug", ARCHIVED)
def test_archived_report_is_what_its_results_render_to(slug, tmp_path):
    """Archived reports are generated, never edited: re-rendering the archived results reproduces them."""
    fresh = gpu_reports.render(ROOT / "results" / slug, tmp_path, TEMPLATE, slug, GOAL)
    for name in ("report.md", "hopper.md"):
        archived = (ROOT / "reports" / slug / name).read_text()
        assert (fresh.parent / name).read_text() == archived, \
            f"reports/{slug}/{name} differs from its results: run `snakemake report`"


@pytest.mark.parametrize("slug", ARCHIVED)
def test_a_configuration_held_to_anothers_cycles_renders_its_own_next_goal(slug, tmp_path):
    """The archive's causal part judged as bf16 is (its cycles against dense's, nothing else asked): the
    next goal's words and table say so, with no rival or efficiency table."""
    from dataclasses import replace

    asked = replace(GOAL, next=replace(GOAL.next, configurations={"causal": {
        "factors": {}, "efficiency_case": None, "efficiency_long": None,
        "cycles_of": {"configuration": "dense", "within": 0.02}}}))
    fresh = gpu_reports.render(ROOT / "results" / slug, tmp_path, TEMPLATE, slug, asked)
    causal = (fresh.parent / "hopper.md").read_text().split("# The line in the configuration causal", 1)[1]
    next_goal = causal.split("## The next goal: past FlashAttention-3", 1)[1].split("\n## ", 1)[0]
    assert ": its cycles at most 2% above those of the best version of dense." in next_goal
    assert "| at | cycles over dense's | asked at most | met |" in next_goal and "| case |" in next_goal
    assert "| rival |" not in next_goal and "efficiency per cycle |" not in next_goal


def test_bench_refuses_a_kernel_that_failed_its_check(tmp_path, records_settings):
    from flashbench.cli import main

    paths = records.write(tmp_path, G3, failing="v12")
    failed_check = paths["checks"][1]
    out = tmp_path / "bench.json"
    record = tmp_path / "build" / "sm_90" / "v12.json"
    record.with_suffix(".cubin").write_bytes(b"")  # its build: never read, as it is not timed
    assert main(["bench", *records_settings, "--cubin", str(record.with_suffix(".cubin")), "--record", str(record),
                 "--check", str(failed_check), "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["timed"] is False and record["reason"].startswith("failed its check")
    assert "timing" not in record


# ---- the chapter's claims and conclusions ----------------------------------------------------------

def judged(tmp_path, tflops, failing=None):
    summary, resources, _, meta = archive_tables.read_tables(results_folder(tmp_path, tflops, failing))
    summary = summary[summary.series == "check"]  # what the report judges on, as chapter_report.context does
    return ({j.statement: j for j in claims.claims(summary, resources, meta)},
            {j.statement: j for j in claims.conclusions(summary, resources, meta, "NVIDIA H200")})


def verdicts(judgements):
    return [j.verdict for j in judgements.values()]


def test_numbers_like_the_writeups_reproduce_every_claim(tmp_path):
    said, concluded = judged(tmp_path, records.LIKE_THE_WRITEUP)
    assert verdicts(said) == ["reproduced"] * 4
    assert verdicts(concluded) == ["holds"] * 4
    spills = said["Br = 128 is a regression, caused by register spills"].evidence
    assert "199.0 vs 227.0 TFLOPS (-12.3%)" in spills and "br128 128 registers, 64 B spill stores" in spills


def test_each_claim_can_fail(tmp_path):
    said, concluded = judged(tmp_path, {"v11": 150.0, "v12": 160.0, "v13": 155.0, "br128": 170.0, "hybrid_smem": 200.0})
    assert verdicts(said) == ["reproduced"] + ["not reproduced"] * 3
    assert said["V13 (warp specialisation) is at or above V12"].evidence == "155.0 vs 160.0 TFLOPS (-3.1%)"
    assert "(+29.0%: above, level meaning within +-3%)" in said[
        "The hybrid (Br = 128, part of the state in shared memory) removes the spill and is level with V13, no gain"].evidence
    assert verdicts(concluded)[:3] == ["does not hold"] * 3
    assert "without the spill, Br = 128 is +29.0% over Br = 64" in concluded[
        "Br has a sweet spot at 64: Br = 32 reuses K and V too little, Br = 128 spills"].evidence
    said, _ = judged(tmp_path / "later", {**records.LIKE_THE_WRITEUP, "v12": 150.0})
    assert said["V12 (fragment reshape) is the biggest single step"].verdict == "not reproduced"


def test_a_kernel_that_failed_its_check_leaves_its_claims_unmeasured(tmp_path):
    said, concluded = judged(tmp_path, records.LIKE_THE_WRITEUP, failing="v13")
    assert verdicts(said) == ["not measured"] * 4
    assert said["V13 (warp specialisation) is at or above V12"].evidence.startswith("v13 not measured")
    # the shared-memory conclusion stands on ptxas alone, and says the kernel was not measured
    smem = concluded["58 KB broke the 48 KB static limit; more shared memory must be traded against occupancy"]
    assert smem.verdict == "holds" and "it was not measured" in smem.evidence


def test_the_report_gives_each_claim_its_verdict(tmp_path):
    out = results_folder(tmp_path, records.LIKE_THE_WRITEUP)
    text = gpu_reports.render(out, tmp_path / "reports", TEMPLATE, "nvidia-h200", GOAL).read_text()
    assert "| V12 (fragment reshape) is the biggest single step | V11 -> V12 +51.8%, V12 -> V13 +3.5% |" in text
    assert text.count("**reproduced**") == 4 + 3  # the chapter's claims, then its profiler readings
    assert "4. *58 KB broke the 48 KB static limit" in text and "this **holds**" in text


def profiler_verdicts(tmp_path, **edits):
    out = results_folder(tmp_path, records.LIKE_THE_WRITEUP)
    summary, resources, profile, meta = archive_tables.read_tables(out)
    for column, (kernel, value) in edits.items():
        profile.loc[profile.kernel == kernel, column] = value
    return {j.statement.split(" (")[0]: j for j in claims.profiler_claims(profile, resources, meta)}


def test_the_chapters_profiler_readings_get_verdicts(tmp_path):
    judged = profiler_verdicts(tmp_path)
    assert [j.verdict for j in judged.values()] == ["reproduced"] * 3
    assert judged["LSU utilisation falls from V11 to V12"].evidence.startswith("50.0% -> 20.0%")
    softmax = judged["The softmax leaves the stall list from V11 to V12"].evidence
    assert "v11: 2 of its top 5 stall lines in the softmax (lines 150, 151)" in softmax
    assert "v12: 0 of its top 5 stall lines in the softmax (none)" in softmax

    assert profiler_verdicts(tmp_path / "b", lsu_pipe_pct=("v12", 60.0))[
        "LSU utilisation falls from V11 to V12"].verdict == "not reproduced"
    assert profiler_verdicts(tmp_path / "d", softmax_share=("v12", 0.5))[
        "The softmax leaves the stall list from V11 to V12"].verdict == "reproduced"  # the top lines decide
    assert profiler_verdicts(tmp_path / "e", lsu_pipe_pct=("v12", float("nan")))[
        "LSU utilisation falls from V11 to V12"].verdict == "not measured"
    assert profiler_verdicts(tmp_path / "c", registers=("v13", 136))[
        "V13 runs at about 124 registers per thread, under the 128 that two blocks per SM allow, without spilling"
    ].verdict == "not reproduced"


def test_without_a_profile_the_readings_are_not_measured_and_the_report_says_why(tmp_path):
    out = results_folder(tmp_path, records.LIKE_THE_WRITEUP)
    (out / "profile.csv").write_text((out / "profile.csv").read_text().splitlines()[0] + "\n")
    meta = json.loads((out / "kernels.json").read_text())
    meta["profile_note"] = "skipped: ncu was not found on this machine"
    for k in meta["kernels"]:
        k["profile"] = None
    write_json(out / "kernels.json", meta)
    text = gpu_reports.render(out, tmp_path / "reports", TEMPLATE, "nvidia-h200", GOAL).read_text()
    assert "Not profiled in this run: skipped: ncu was not found on this machine." in text
    assert text.count("**not measured**") == 3


def test_peers_skipped_without_torch_are_said_so_and_leave_no_baseline(tmp_path):
    out = results_folder(tmp_path, records.LIKE_THE_WRITEUP, skipped="sdpa_auto")
    text = gpu_reports.render(out, tmp_path / "reports", TEMPLATE, "nvidia-h200", GOAL).read_text()
    assert "**sdpa_auto skipped: torch is not installed.**" in text
    assert "| sdpa_auto (peer) | torch SDPA | skipped |" in text
    assert "| of baseline |" in text and "of sdpa_auto" not in text  # no fraction of a baseline not measured
    assert "| unfused (peer) | unfused PyTorch | **120.0** |" in text


def test_the_softmax_reading_fails_when_v12_still_stalls_in_its_softmax(tmp_path):
    out = results_folder(tmp_path, records.LIKE_THE_WRITEUP)
    summary, resources, profile, meta = archive_tables.read_tables(out)
    v12 = next(k for k in meta["kernels"] if k["name"] == "v12")
    v12["profile"]["top_lines"][3]["softmax"] = True
    judged = {j.statement.split(" (")[0]: j for j in claims.profiler_claims(profile, resources, meta)}
    softmax = judged["The softmax leaves the stall list from V11 to V12"]
    assert softmax.verdict == "not reproduced" and "v12: 1 of its top 5 stall lines in the softmax (lines 153)" in softmax.evidence


def test_the_shared_memory_conclusion_fails_without_the_trade(tmp_path):
    out = results_folder(tmp_path, records.LIKE_THE_WRITEUP)
    summary, resources, profile, meta = archive_tables.read_tables(out)
    summary = summary[summary.series == "check"]
    hybrid = resources.kernel == "hybrid_smem"
    resources.loc[hybrid, "smem_bytes"] = resources.loc[resources.kernel == "v13", "smem_bytes"].iloc[0]
    smem = claims.conclusions(summary, resources, meta, "NVIDIA H200")[3]
    assert smem.statement.startswith("58 KB") and smem.verdict == "does not hold"


def test_a_subset_of_the_chapter_leaves_the_rest_unmeasured(tmp_path):
    out = results_folder(tmp_path, records.LIKE_THE_WRITEUP)
    summary, resources, profile, meta = archive_tables.read_tables(out)
    meta["kernels"] = [k for k in meta["kernels"] if k["name"] in ("v11", "v12")]
    summary = summary[summary.kernel.isin(["v11", "v12"])]
    said = claims.claims(summary[summary.series == "check"], resources, meta)
    assert [j.verdict for j in said] == ["not measured"] * 4


def test_the_hopper_line_gets_its_own_report_and_the_chapters_stays_as_it_is(tmp_path, g3_report):
    alone = g3_report
    out = results_folder(tmp_path / "b", {**G3, "v14": 436.0, "v15": 590.0}, kernels=records.KERNELS + records.HOPPER,
                         paired={"v15": 590.0, "v14": 436.0, "sdpa_auto": 560.0})
    both = gpu_reports.render(out, tmp_path / "b" / "reports", TEMPLATE, "nvidia-h200", GOAL)
    assert both.read_text() == alone.read_text()  # the chapter's report does not see the line
    for figure in ("tflops.png", "sweep.png", "stalls.png"):
        assert (tmp_path / "b" / "reports" / figure).read_bytes() == (alone.parent / figure).read_bytes()
    text = (tmp_path / "b" / "reports" / "hopper.md").read_text()
    assert "| v14 | TMA + wgmma | **436.0** |" in text and "+98.2% on v13" in text  # 436 / 220
    assert "| v15 | warp specialisation | **590.0** |" in text and "+35.3% on v14" in text
    # the goal, head to head: v15 against SDPA auto (590 / 560 by graph at every point), the only rival here
    assert re.search(r"\| case \| sdpa_auto \| \*\*1\.0[56]\*\* \| \[1\.0\d, 1\.0\d\] \| ahead \|", text)
    assert re.search(r"\| case \| sdpa_auto \|( [^|]+ \|){6} 1\.05 \|", text)  # its cycles over v15's: 590 / 560
    assert re.search(r"\| case \| sdpa_auto \|( [^|]+ \|){8} 58\d\.\d / 55\d\.\d \|", text)  # sustained: 1% below
    assert "each timing at least 50 ms and started after 100 ms of the same contestant's graph" in text
    assert "**Goal reached**" in text
    assert "- **sdpa_auto**: ahead at case, S=512, S=2048." in text and "- **v14**: " not in text
    assert re.search(r"\| case \| v14 \| graph \| 1\.3[56] \|", text)  # v15 against its predecessor, 590 / 436
    assert "| v15 | 104.8k |" in text  # cycles at the case: 34.36 GFLOP at 590 TFLOPS and 1.8 GHz
    # each version's own choices, one a line
    assert "## Each version's own choices" in text
    assert "- **v14** (`kernels/v14.cu`):\n    - QK^T and PV each wait for their own wgmma group" in text
    assert "\n    - as in V14, the row sums are kept per thread" in text  # v15's
    assert (tmp_path / "b" / "reports" / "hopper_sweep.png").stat().st_size > 1000
    slow = results_folder(tmp_path / "c", {**G3, "v14": 436.0, "v15": 550.0}, kernels=records.KERNELS + records.HOPPER,
                          paired={"v15": 550.0, "v14": 436.0, "sdpa_auto": 560.0})
    tables = archive_tables.read_tables(slow)
    goal = hopper_report.context(*tables, GOAL, **archive_tables.read_paired(slow, tables[3], tables[0]))["goal_verdicts"]
    assert goal["best"] == "v15" and goal["complete"] and not goal["reached"]
    assert "sdpa_auto at case (graph)" in goal["behind"]
    none = results_folder(tmp_path / "d", {**G3, "v14": 436.0, "v15": 550.0}, kernels=records.KERNELS + records.HOPPER)
    gpu_reports.render(none, tmp_path / "d" / "reports", TEMPLATE, "nvidia-h200", GOAL)
    assert "the goal is not judged" in (tmp_path / "d" / "reports" / "hopper.md").read_text()


def test_an_archive_from_an_older_pipeline_is_refused_with_one_clear_error(tmp_path):
    out = results_folder(tmp_path, G3)
    summary = pd.read_csv(out / "summary.csv")
    summary.drop(columns=["inputs", "margin"]).to_csv(out / "summary.csv", index=False)
    with pytest.raises(FlashbenchError, match="summary.csv was written by an older pipeline or cut short \\(no inputs, margin\\)"):
        gpu_reports.render(out, tmp_path / "reports", TEMPLATE, "nvidia-h200", GOAL)


# ---- the figures ---------------------------------------------------------------------------------------

DPI = 120  # figures._save's
LAPTOP_WIDTH = 1600  # px: a figure at most this wide reads at 100% on a laptop's screen
SMALLEST_FONT = 9  # pt, 15 px at DPI


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    """Every figure of a render of the chapter and the Hopper line, and of the comparison: {file name:
    the matplotlib figure as saved}."""
    tmp = tmp_path_factory.mktemp("figures")
    out = results_folder(tmp, {**G3, "v14": 436.0, "v15": 590.0}, kernels=records.KERNELS + records.HOPPER)
    drawn, save = {}, figures._save

    def keep(fig, path):
        save(fig, path)
        drawn[path.name] = fig

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(figures, "_save", keep)
        gpu_reports.render(out, tmp / "reports", TEMPLATE, "nvidia-h200", GOAL)
        gpu_comparison.render([out], ROOT / "workflow" / "templates" / "compare.md.j2", tmp / "README.md", tmp / "compare.png")
    return drawn


def test_every_figure_reads_at_100_percent_on_a_laptop(drawn):
    assert set(drawn) == {*chapter_report.FIGURES.values(), *hopper_report.FIGURES.values(), "compare.png"}
    for name, fig in drawn.items():
        width, height = fig.get_size_inches() * DPI
        assert 800 <= width <= LAPTOP_WIDTH and height <= 1200, (name, width, height)
        texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
                 if t.get_text().strip() and t.get_visible()]
        assert texts and min(t.get_fontsize() for t in texts) >= SMALLEST_FONT, name


def test_bars_fill_our_kernels_hatch_the_peers_and_read_horizontally(drawn):
    peers = {p["name"] for p in records.PEERS}
    for name in ("tflops.png", "hopper_tflops.png", "compare.png"):
        ax = drawn[name].axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]  # the kernels and peers, one a row
        assert peers <= set(labels) and len(labels) > len(peers), name
        bars = [bar for container in ax.containers for bar in container]
        assert bars and all(bar.get_width() > bar.get_height() for bar in bars), name
        for bar in bars:
            kernel = labels[round(bar.get_y() + bar.get_height() / 2)]
            assert (bar.get_hatch() == "///") == (kernel in peers), (name, kernel)
        legends = list(dict.fromkeys(a for a in ax.get_children() if isinstance(a, type(ax.legend_))))
        assert [legend.get_title().get_text() for legend in legends] == ["TFLOPS from", "implementation"], name


def test_sweep_lines_each_their_own_ours_solid_peers_dashed_the_emphasized_thicker(drawn):
    peers = {p["name"] for p in records.PEERS}
    for name, emphasized in (("sweep.png", {"v13", "sdpa_auto"}), ("hopper_sweep.png", {"v15", "sdpa_auto"})):
        ax = drawn[name].axes[0]
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert peers <= set(lines) and len(lines) > len(peers), name
        looks = {(tuple(line.get_color()), line.get_linestyle(), line.get_marker()) for line in lines.values()}
        assert len(looks) == len(lines), f"{name}: two lines look alike"
        assert len({tuple(line.get_color()) for line in lines.values()}) == len(lines), f"{name}: a colour twice"
        for label, line in lines.items():
            assert (line.get_linestyle() == "--") == (label in peers), (name, label)  # dashes show as "--"
            assert (line.get_linewidth() == figures.EMPHASIZED_WIDTH) == (label in emphasized), (name, label)
        legends = list(dict.fromkeys(a for a in ax.get_children() if isinstance(a, type(ax.legend_))))
        assert [legend.get_title().get_text() for legend in legends] == ["our kernels (solid)",
                                                                         "PyTorch peers (dashed)"], name


def _next_goal_inputs(graph_low: float, cycles: float, efficiency: float):
    """A head-to-head (as goal_verdicts leaves it) at the case and S=8192 against cuDNN and FlashAttention's
    kernel, every lower end and cycle ratio the same, and the version's cycle counts there."""
    points = [{"where": w, "S": s, "is_case": w == "case", "rival": r, "cycles_ratio": cycles,
               "graph": {"ci_low": graph_low}}
              for w, s in (("case", 1024), ("S=8192", 8192)) for r in ("sdpa_cudnn", "flash_attn_cute")]
    points.append({"where": "S=512", "S": 512, "is_case": False, "rival": "sdpa_cudnn", "cycles_ratio": 0.5,
                   "graph": {"ci_low": 0.5}})  # below the next goal's min_s: not a mark
    cycles = pd.DataFrame([{"kernel": "v23", "S": s, "is_case": s == 1024, "efficiency_per_cycle": efficiency}
                           for s in (512, 1024, 8192)] + [{"kernel": "v22", "S": 8192, "is_case": False,
                                                          "efficiency_per_cycle": 0.1}])
    meta = {"kernels": [{"name": "sdpa_cudnn", "kind": "peer", "backend": "cudnn"},
                        {"name": "flash_attn_cute", "kind": "peer", "backend": "flash_attn_cute"},
                        {"name": "sdpa_auto", "kind": "peer", "backend": "auto"}]}
    return {"best": "v23", "points": points}, cycles, meta


def test_the_next_goal_needs_both_ratios_at_each_rivals_factor_and_the_efficiency_per_cycle():
    goal_verdicts, cycles, meta = _next_goal_inputs(1.11, 1.12, 0.90)
    goal = hopper_report.next_goal(goal_verdicts, cycles, meta, GOAL)
    assert goal["complete"] and goal["reached"] and len(goal["ratios"]) == 4 and len(goal["efficiency"]) == 2
    assert goal["missing"] == []
    goal_verdicts, cycles, meta = _next_goal_inputs(1.08, 1.12, 0.90)  # cuDNN short by graph only
    goal = hopper_report.next_goal(goal_verdicts, cycles, meta, GOAL)
    assert not goal["reached"] and goal["misses"] == ["sdpa_cudnn at case", "sdpa_cudnn at S=8192"]
    goal_verdicts, cycles, meta = _next_goal_inputs(1.11, 1.12, 0.80)  # 80%: the case's 75%, not long S's 85%
    assert hopper_report.next_goal(goal_verdicts, cycles, meta, GOAL)["misses"] == ["80.0% per cycle at S=8192"]
    del goal_verdicts["points"][3]  # FlashAttention's kernel at S=8192 missing: not judged, and said where
    goal = hopper_report.next_goal(goal_verdicts, cycles, meta, GOAL)
    assert not goal["complete"] and not goal["reached"] and goal["missing"] == ["flash_attn_cute at S=8192"]
    del goal_verdicts["points"][1]  # FlashAttention's kernel nowhere (flash-attn-4 not installed): named once
    goal_verdicts["points"][0]["cycles_ratio"] = None
    goal = hopper_report.next_goal(goal_verdicts, cycles[cycles.S != 8192], meta, GOAL)
    assert goal["missing"] == ["flash_attn_cute (not in this run's head-to-head)", "sdpa_cudnn's cycles at case",
                               "the best version's cycles at S >= 8192"] and not goal["complete"]


def test_a_configuration_may_ask_to_be_level_with_a_rival_below_a_factor_of_one():
    """D=256: level with FlashAttention's kernel (0.99: at most 1% behind, by graph and by cycles), 1.10x
    cuDNN, no efficiency: 0.995 behind it meets the goal there, 0.985 does not."""
    from dataclasses import replace

    asked = replace(GOAL, next=replace(GOAL.next, configurations={"d256": {
        "factors": {"flash_attn_cute": 0.99, "cudnn": 1.10}, "efficiency_case": None, "efficiency_long": None}}))
    goal_verdicts, cycles, meta = _next_goal_inputs(1.11, 1.12, 0.50)
    for point in goal_verdicts["points"]:
        if point["rival"] == "flash_attn_cute":
            point["graph"]["ci_low"], point["cycles_ratio"] = 0.995, 0.995
    level = hopper_report.next_goal(goal_verdicts, cycles, meta, asked.in_configuration("d256"))
    assert level["reached"] and level["complete"] and level["efficiency"] == []
    assert {(r["rival"], r["factor"]) for r in level["ratios"]} == {("flash_attn_cute", 0.99), ("sdpa_cudnn", 1.10)}
    goal_verdicts["points"][3]["cycles_ratio"] = 0.985  # FlashAttention's kernel at S=8192, 1.5% ahead by cycles
    behind = hopper_report.next_goal(goal_verdicts, cycles, meta, asked.in_configuration("d256"))
    assert not behind["reached"] and behind["misses"] == ["flash_attn_cute at S=8192"]


def test_a_configuration_may_ask_the_next_goal_for_other_efficiencies():
    """goal.next.configurations: under the mask config asks nothing at the case and 85% from S=16384;
    a configuration it does not name is judged against goal.next itself."""
    from dataclasses import replace

    asked = replace(GOAL, next=replace(GOAL.next, configurations={"causal": {"efficiency_case": None, "long_s": 16384}}))
    goal_verdicts, cycles, meta = _next_goal_inputs(1.11, 1.12, 0.50)  # 50% everywhere: short of every floor
    dense = hopper_report.next_goal(goal_verdicts, cycles, meta, asked.in_configuration("dense"))
    assert dense["misses"] == ["50.0% per cycle at case", "50.0% per cycle at S=8192"]
    causal = hopper_report.next_goal(goal_verdicts, cycles, meta, asked.in_configuration("causal"))
    assert causal["efficiency"] == [] and causal["missing"] == ["the best version's cycles at S >= 16384"]
    assert not causal["complete"] and "the best version's cycles at the case" not in causal["missing"]


def test_a_configuration_may_hold_its_cycles_to_another_configurations_and_ask_no_efficiency():
    """bf16: nothing of the rivals or the efficiency, its best version's cycles at most 2% above the fp16
    configuration's best version's at the case and at every S from min_s; grouped K/V heads: FlashAttention's
    kernel alone, no efficiency."""
    from dataclasses import replace

    asked = replace(GOAL, next=replace(GOAL.next, configurations={
        "bf16": {"factors": {}, "efficiency_case": None, "efficiency_long": None,
                 "cycles_of": {"configuration": "dense", "within": 0.02}},
        "gqa": {"factors": {"flash_attn_cute": 1.05}, "efficiency_case": None, "efficiency_long": None}}))
    goal_verdicts, cycles, meta = _next_goal_inputs(1.11, 1.12, 0.50)
    cycles["cycles"] = [100.0, 200.0, 300.0, 50.0]  # v23 at 512, 1024 (the case), 8192; v22 at 8192
    dense = pd.DataFrame([{"kernel": "v23", "S": 1024, "is_case": True, "cycles": 198.0},
                          {"kernel": "v23", "S": 8192, "is_case": False, "cycles": 290.0}])
    bf16 = hopper_report.next_goal(goal_verdicts, cycles, meta, asked.in_configuration("bf16"), dense)
    assert bf16["ratios"] == [] and bf16["efficiency"] == [] and bf16["complete"]
    assert [(c["where"], round(c["ratio"], 4), c["met"]) for c in bf16["cycles_of"]] == [
        ("case", round(200 / 198, 4), True), ("S=8192", round(300 / 290, 4), False)]
    assert bf16["misses"] == [f"{300 / 290:.3f}x dense's cycles at S=8192"] and not bf16["reached"]
    unpaired = hopper_report.next_goal(goal_verdicts, cycles, meta, asked.in_configuration("bf16"), dense.iloc[:1])
    assert unpaired["missing"] == ["dense's cycles at S=8192"] and not unpaired["complete"]
    uncounted = hopper_report.next_goal(goal_verdicts, cycles[cycles.S != 8192], meta, asked.in_configuration("bf16"),
                                        dense)  # the best version not counted at S=8192: not judged, and said
    assert uncounted["missing"] == ["best version's cycles at S=8192"] and not uncounted["reached"]
    gqa = hopper_report.next_goal(goal_verdicts, cycles, meta, asked.in_configuration("gqa"))
    assert [r["rival"] for r in gqa["ratios"]] == ["flash_attn_cute"] * 2 and gqa["efficiency"] == []
    assert gqa["reached"] and gqa["cycles_of"] == []


def test_a_ragged_length_is_judged_against_the_next_multiple_of_128_by_its_paired_interval():
    """sweep.ragged: the line's best at S=4000 over its TFLOPS at S=4096, each with its own FLOPs. Judged
    by the paired rounds (kernels.json's `ragged`, the sweep's) and their interval's lower end against
    goal.ragged_within; the sweep's two figures, minutes apart, are shown but judge nothing."""
    from dataclasses import replace

    sweep = pd.DataFrame([{"kernel": "v25", "S": 4000, "tflops_graph": 600.0},
                          {"kernel": "v25", "S": 4096, "tflops_graph": 625.0}])
    flops_ratio = (4000 / 4096) ** 2
    # each round 1% slower at 4096 than at 4000 for 4.9% more work, the clock drifting over the rounds
    rounds = [{"graph_s": t, "near_graph_s": t * 1.01 * (1 + 0.001 * (i % 3))} for i, t in
              enumerate(np.linspace(1e-3, 1.2e-3, 20))]
    timing = {"rounds": 20, "warmup": 10, "min_timing_ms": 1000, "lead_in_ms": 100}
    meta = {"case": {"B": 1, "H": 64, "S": 1024, "D": 128}, "head_to_head": {"confidence": 0.95, "resamples": 2000},
            "sweep": {"S": [4096], "ragged": [4000], "ragged_pair": timing},
            "kernels": [{"name": "v25", "ragged": [{"S": 4000, "near": 4096, "causal": False, "rounds": rounds,
                                                    "calls_per_timing": {"4000": 9, "4096": 9}}]}]}
    asked = replace(GOAL, ragged_within=0.03)
    point = hopper_report.ragged_point(sweep, meta, "v25", 4000, asked)
    assert point["near"] == 4096 and point["unpaired_ratio"] == pytest.approx(0.96)
    assert point["timing"] == timing  # what the report says of how the pair was timed
    paired = point["paired"]
    assert paired["rounds"] == 20 and paired["ci_low"] <= paired["ratio"] <= paired["ci_high"]
    assert paired["ratio"] == pytest.approx(flops_ratio * 1.011, rel=2e-3)  # 0.964: 3.6% short
    assert point["met"] is False
    assert hopper_report.ragged_point(sweep, meta, "v25", 4000, replace(GOAL, ragged_within=0.05))["met"] is True
    unpaired = hopper_report.ragged_point(sweep, {**meta, "kernels": [{"name": "v25"}]}, "v25", 4000, asked)
    assert unpaired["paired"] is None and unpaired["met"] is None  # the sweep's figures alone: not judged
    assert unpaired["asked"]  # a run that did not pair where its configuration asks it
    elsewhere = {**meta, "kernels": [{"name": "v25"}], "configuration": {"name": "d64"},
                 "sweep": {**meta["sweep"], "ragged_pair": {**timing, "configurations": ["dense"]}}}
    assert not hopper_report.ragged_point(sweep, elsewhere, "v25", 4000, asked)["asked"]  # not asked there
    assert hopper_report.ragged_point(sweep[sweep.S == 4000], meta, "v25", 4000, asked)["unpaired_ratio"] is None
    counted = pd.DataFrame([{"kernel": "v25", "S": 4000, "efficiency_per_cycle": 0.64},
                            {"kernel": "v25", "S": 4096, "efficiency_per_cycle": 0.67},
                            {"kernel": "v24", "S": 4000, "efficiency_per_cycle": 0.9}])
    assert hopper_report.ragged_point(sweep, meta, "v25", 4000, asked, counted)["cycles_ratio"] == pytest.approx(0.64 / 0.67)
    assert hopper_report.ragged_point(sweep, meta, "v25", 4000, asked, counted[counted.S == 4000])["cycles_ratio"] is None


def test_each_configuration_after_the_first_gets_its_bars_and_a_panel_against_s(tmp_path, monkeypatch):
    """hopper.md's figures hold every configuration: a group of bars of its own at the case, below the first's
    bars (each kernel or peer that runs in more than the first, in its own colour throughout), and a panel
    of its own against S below the first's (lower: figures.OTHER_PANEL_HEIGHT), each name drawn in the same
    style in both."""
    import struct

    from flashbench import figures

    case = {"B": 1, "H": 64, "S": 1024, "D": 128}
    dense = pd.DataFrame([{"kernel": k, "kind": kind, "S": S, "tflops": t * S / 1024}
                          for k, kind, t in (("v25", "version", 600.0), ("sdpa_cudnn", "peer", 550.0))
                          for S in (1024, 4000, 4096)])
    causal = dense.assign(tflops=dense.tflops * 0.7)
    figures.sweep_figure(dense, ["v25", "sdpa_cudnn"], {}, "GPU", case, tmp_path / "one.png")
    figures.sweep_figure(dense, ["v25", "sdpa_cudnn"], {}, "GPU", case, tmp_path / "two.png",
                         (("causal", causal, {"v25": "the line's best"}),))
    height = {n: struct.unpack(">II", (tmp_path / f"{n}.png").read_bytes()[16:24])[1] for n in ("one", "two")}
    expected = 1 + figures.OTHER_PANEL_HEIGHT / figures.FIRST_PANEL_HEIGHT  # the causal panel below the first's
    assert expected - 0.1 < height["two"] / height["one"] < expected + 0.1

    drawn = []
    draw = figures._bars
    monkeypatch.setattr(figures, "_bars", lambda ax, bars, order, kinds, title, **by: drawn.append((bars, order, by))
                        or draw(ax, bars, order, kinds, title, **by))
    rows = [{"name": "v24", "kind": "version", "tflops": 610.0, "published_tflops": None},
            {"name": "v25", "kind": "version", "tflops": 600.0, "published_tflops": None},
            {"name": "sdpa_cudnn", "kind": "peer", "tflops": 550.0, "published_tflops": None}]
    figures.tflops_figure(rows, "GPU", case, tmp_path / "bars.png", (("causal", rows[1:]),), first="dense")
    (first, first_order, _), (by_configuration, labels, by) = drawn
    assert [(b["kernel"], b["source"]) for b in first] == [
        ("v24", "measured, GPU"), ("v25", "measured, GPU"), ("sdpa_cudnn", "measured, GPU")]
    assert first_order == ["v24", "v25", "sdpa_cudnn"]
    # below, a group per configuration of what runs in more than the first, each kernel in its colour
    assert labels == ["dense", "causal"] and by == {"y": "configuration", "hue": "kernel", "hue_title": "kernel or peer"}
    assert [(b["configuration"], b["kernel"]) for b in by_configuration] == [
        ("dense", "v25"), ("dense", "sdpa_cudnn"), ("causal", "v25"), ("causal", "sdpa_cudnn")]
    assert (tmp_path / "bars.png").stat().st_size > 0
