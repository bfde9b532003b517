"""Every table a report is rendered from is checked against itself and kernels.json as it is read, as
summary.csv is: an edited, cut or damaged head_to_head.csv, cycles.csv, resources.csv or profile.csv
is one line naming the file, the CSV line (the header is line 1) and what is wrong, and nothing is
rendered from it. The archived tables pass as they are."""
import csv
import io
import shutil

import pytest

from flashbench import archive_tables, archives, headtohead
from flashbench.cli import main
from flashbench.files import read_json, write_json
from flashbench.validation import BadRecord

from conftest import ROOT

ARCHIVE = ROOT / "results" / "nvidia-h200"
TEMPLATE = ROOT / "workflow" / "templates" / "report.md.j2"
TABLES = (*archives.TABLES, "head_to_head.csv", "cycles.csv")


@pytest.fixture(scope="module")
def archived():
    """The archive's summary.csv and kernels.json, read (and checked) once."""
    return archive_tables.read_summary(ARCHIVE)


@pytest.fixture
def copy(tmp_path):
    """The archive's tables and kernels.json, copied: what a render reads."""
    out = tmp_path / "results" / "nvidia-h200"
    out.mkdir(parents=True)
    for name in TABLES:
        shutil.copy(ARCHIVE / name, out / name)
    return out


def lines(path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(path.read_text())))


def write_lines(path, rows: list[list[str]]) -> None:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(rows)
    path.write_text(text.getvalue())


def set_cells(path, line: int | None, **cells) -> None:
    """Set `cells` (column=value) of CSV line `line` (the header is 1; None: every row)."""
    rows = lines(path)
    for n, row in enumerate(rows[1:], start=2):
        if line is None or n == line:
            for column, value in cells.items():
                row[rows[0].index(column)] = str(value)
    write_lines(path, rows)


def drop(path, *dropped: int) -> None:
    write_lines(path, [row for n, row in enumerate(lines(path), start=1) if n not in dropped])


def duplicate(path, line: int) -> None:
    rows = lines(path)
    write_lines(path, [*rows, rows[line - 1]])


def line_of(path, **cells) -> int:
    rows = lines(path)
    return next(n for n, row in enumerate(rows[1:], start=2)
                if all(row[rows[0].index(c)] == str(v) for c, v in cells.items()))


def refused(out, archived, table: str, message: str) -> None:
    """The tables at `out`, read as the render reads them, are refused with one line naming `table`
    and `message`."""
    summary, meta = archived
    with pytest.raises(BadRecord) as raised:
        if table in ("resources.csv", "profile.csv"):
            archive_tables.read_tables(out)
        else:
            archive_tables.read_paired(out, meta, summary)
    said = str(raised.value)
    assert "\n" not in said and said.startswith(f"{out / table}: {message}"), said
    assert said.endswith("; run summarize on that GPU again"), said


# ---- the archive -------------------------------------------------------------------------------------

def test_the_archived_tables_pass_as_they_are(archived):
    summary, meta = archived
    tables = archive_tables.read_tables(ARCHIVE)
    paired = archive_tables.read_paired(ARCHIVE, meta, summary)
    assert len(tables[1]) == 45 and len(tables[2]) == 17 and len(paired["head_to_head"]) == 125
    assert len(paired["cycles"]) == 237


# ---- head_to_head.csv --------------------------------------------------------------------------------

FIRST = "v25 against v24 by step at the case"  # head_to_head.csv's line 2
FIRST_INTERVAL = "[0.9821880153546074, 1.0476939862969552]"
FIRST_CAUSAL = "v25 against sdpa_cudnn by graph at the case"  # line 72: the causal configuration's first


@pytest.mark.parametrize("damage, message", [
    (lambda p: set_cells(p, None, verdict="behind"),
     (f"line 2 ({FIRST}): verdict 'behind', but its interval {FIRST_INTERVAL} and the band (level_within 0.01) "
     "give 'level'")),
    (lambda p: set_cells(p, 2, ratio="inf"), f"line 2 ({FIRST}): ratio inf is not a positive finite number"),
    (lambda p: set_cells(p, 2, ratio=""), f"line 2 ({FIRST}): no ratio"),
    (lambda p: set_cells(p, 2, ratio="nan"), f"line 2 ({FIRST}): no ratio"),
    (lambda p: set_cells(p, 2, ratio=-1.14, ci_low=-5.0, ci_high=1.16),
     f"line 2 ({FIRST}): ratio -1.14 is not a positive finite number"),
    (lambda p: set_cells(p, 2, ratio="abc"), f"line 2 ({FIRST}): ratio 'abc' is not a number"),
    (lambda p: set_cells(p, 2, ratio=1.2), f"line 2 ({FIRST}): ratio 1.2 is outside its interval {FIRST_INTERVAL}"),
    (lambda p: set_cells(p, 2, ci_low=1.0), (f"line 2 ({FIRST}): ratio 0.9986223080932539 is outside its interval "
                                           "[1.0, 1.0476939862969552]")),
    (lambda p: drop(p, 5), ("line 5: no row for v25 against sdpa_cudnn by graph at the case, where kernels.json says "
                           "both were run: cut short or edited")),
    (lambda p: drop(p, 71), "line 71: no row for v24 against flash_attn_cute by graph at S=16384"),
    (lambda p: drop(p, *range(2, 72)), "line 2: no row for v25 against v24 by step at the case"),
    (lambda p: set_cells(p, 3, rival="fa3"), ("line 3 (v25 against fa3 by graph at the case): fa3 is not one of v25's "
                                             "rivals in kernels.json (v24, sdpa_cudnn, sdpa_auto, flash_attn_cute)")),
    (lambda p: set_cells(p, 16, version="v22"), ("line 16 (v22 against v24 by step at S=2048): v22 is not one of "
                                                "kernels.json's headline versions (v25, v24)")),
    (lambda p: duplicate(p, 2), f"line 127 ({FIRST}): a second row for it (the first is line 2)"),
    (lambda p: set_cells(p, 2, S=3072), ("line 2 (v25 against v24 by step at S=3072): B=1 H=64 S=3072 D=128 is not a "
                                        "point of the head-to-head")),
    (lambda p: set_cells(p, 2, is_case=False),
     f"line 2 ({FIRST}): is_case False, but B=1 H=64 S=1024 D=128 is the case"),
    (lambda p: set_cells(p, 3, fair=False), "line 3 (v25 against v24 by graph at the case): fair False by graph"),
    (lambda p: set_cells(p, 3, fair="maybe"),
     "line 3 (v25 against v24 by graph at the case): fair 'maybe' is neither True nor False"),
    (lambda p: set_cells(p, 2, is_case=""), f"line 2 ({FIRST}): no is_case"),
    (lambda p: set_cells(p, 2, rounds=19), f"line 2 ({FIRST}): rounds 19, but the head-to-head ran 10"),
    (lambda p: set_cells(p, 2, rival_tflops=-282.7), f"line 2 ({FIRST}): rival_tflops -282.7 is not a positive finite"),
    # a configuration's rows are checked as a run of that configuration, named by its kernels and peers
    (lambda p: set_cells(p, 72, rival="fa3"), ("in the configuration causal, line 72 (v25 against fa3 by graph at the "
                                              "case): fa3 is not one of v25's rivals in kernels.json (sdpa_cudnn, "
                                              "sdpa_auto, flash_attn_cute)")),
    (lambda p: drop(p, 73), ("in the configuration causal, line 73: no row for v25 against sdpa_auto by graph at the "
                            "case, where kernels.json says both were run")),
    (lambda p: set_cells(p, 72, verdict="level"), f"in the configuration causal, line 72 ({FIRST_CAUSAL}): verdict 'level'"),
], ids=["every-verdict-behind", "ratio-inf", "ratio-empty", "ratio-nan", "ratio-negative", "ratio-abc",
        "ratio-above-interval", "ratio-below-interval", "dropped-row", "dropped-last-row", "header-only",
        "unknown-rival", "unknown-version", "duplicated-row", "unknown-point", "is-case", "graph-not-fair",
        "fair-not-a-flag", "is-case-empty", "rounds",
        "negative-tflops", "causal-unknown-rival", "causal-dropped-row", "causal-verdict"])
def test_a_damaged_head_to_head_is_refused(copy, archived, damage, message):
    damage(copy / "head_to_head.csv")
    refused(copy, archived, "head_to_head.csv", message)


def with_rounds(row: list[str], rounds: int) -> list[str]:
    """A head_to_head.csv row (its cells) as a point of that many rounds would have it."""
    return [str(rounds) if i == headtohead.COLUMNS.index("rounds") else cell for i, cell in enumerate(row)]


def test_a_contestant_kernels_json_says_failed_its_check_has_no_head_to_head(copy, archived):
    summary, meta = archived
    meta = {**meta, "kernels": [{**k, "check_passed": False} if k["name"] == "sdpa_auto" else k
                                for k in meta["kernels"]]}
    with pytest.raises(BadRecord, match=r"line 6 \(v25 against sdpa_auto by step at the case\): kernels.json says "
                                        "sdpa_auto did not pass its check: it is never in the head-to-head"):
        archive_tables.read_paired(copy, meta, summary)
    h2h = copy / "head_to_head.csv"  # without its rows (nor its counts), the table is whole
    # and four contestants at each point without the mask run whole designs of four
    write_lines(h2h, [with_rounds(row, 12) if row[0] == "dense" else row for row in lines(h2h) if "sdpa_auto" not in row])
    cycles = copy / "cycles.csv"
    write_lines(cycles, [row for row in lines(cycles) if row[0] != "sdpa_auto"])
    # its rows against the two headline versions; under the mask its run (sdpa_auto.causal) passed
    assert len(archive_tables.read_paired(copy, meta, summary)["head_to_head"]) == 125 - 2 * 2 * 5


def test_a_contestant_the_sweep_found_no_kernel_for_at_a_length_has_no_rows_there(copy, archived):
    """As the sweep, the head-to-head and the cycle counts pass over a length where a peer's library
    has no kernel (NoKernelForShape): summary.csv's sweep row there, untimed with its reason, says so."""
    summary, meta = archived
    summary = summary.copy()
    sweep = (summary.series == "sweep") & (summary.kernel == "flash_attn_cute") & (summary.S == 16384)
    timed = [c for c in summary.columns if c.startswith(("tflops", "ms_", "gib", "issue", "dispatch", "sm_clock",
                                                         "power", "throttle"))]
    summary.loc[sweep, timed] = None
    summary.loc[sweep, "reason"] = "torch has no flash_attn_cute kernel for these inputs"
    h2h, cycles = copy / "head_to_head.csv", copy / "cycles.csv"
    write_lines(h2h, [with_rounds(row, 12) if row[:4] == ["dense", "1", "64", "16384"] else row  # four contestants
                      for row in lines(h2h) if not (row[3] == "16384" and row[7] == "flash_attn_cute")])
    write_lines(cycles, [row for row in lines(cycles) if not (row[0] == "flash_attn_cute" and row[5] == "16384")])
    archive_tables.read_paired(copy, meta, summary)
    with pytest.raises(BadRecord, match="line 64: no row for v25 against flash_attn_cute by step at S=16384"):
        archive_tables.read_paired(copy, *archived[::-1])


# ---- cycles.csv --------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, message", [
    (lambda p: set_cells(p, 2, cycles=-439700),
     "line 2 (v11 at the case): cycles -439700.0 is not a positive finite number"),
    (lambda p: set_cells(p, 2, cycles=0), "line 2 (v11 at the case): cycles 0.0 is not a positive finite number"),
    (lambda p: set_cells(p, 2, cycles="nan"), "line 2 (v11 at the case): no cycles"),
    (lambda p: set_cells(p, 2, efficiency_per_cycle="inf"),
     "line 2 (v11 at the case): efficiency_per_cycle inf is not a number in (0, 1]"),
    (lambda p: set_cells(p, 2, efficiency_per_cycle=0.15),
     "line 2 (v11 at the case): efficiency_per_cycle 0.15 is not what 439136 cycles on 132 SMs come to (0.144716)"),
    (lambda p: set_cells(p, 2, cycles=445000.0), ("line 2 (v11 at the case): cycles 445000.0 is not between cycles_min "
                                                 "437313.0 and cycles_max 439492.0")),
    (lambda p: set_cells(p, 2, launches=6),
     "line 2 (v11 at the case): launches 6, but the run counted 7 at each shape"),
    (lambda p: drop(p, 2), "line 2: no row for v11 at the case, where kernels.json says it was counted"),
    (lambda p: drop(p, *range(2, 50)), "line 2: no row for v11 at the case"),
    (lambda p: duplicate(p, 3), "line 239 (v12 at the case): a second row for it (the first is line 3)"),
    (lambda p: set_cells(p, 2, S=2048), "line 2 (v11 at S=2048): v11 is counted at the case only"),
    (lambda p: set_cells(p, 2, kernel="v10"), "line 2 (v10 at the case): v10 is not among the kernels of kernels.json"),
    (lambda p: set_cells(p, 2, kind="peer"),
     "line 2 (v11 at the case): kind 'peer', but kernels.json says v11 is a version"),
], ids=["negative-cycles", "zero-cycles", "nan-cycles", "inf-efficiency", "efficiency-disagrees",
        "cycles-outside-spread", "launches", "dropped-row", "header-only", "duplicated-row", "unknown-shape",
        "unknown-kernel", "kind"])
def test_damaged_cycle_counts_are_refused(copy, archived, damage, message):
    damage(copy / "cycles.csv")
    refused(copy, archived, "cycles.csv", message)


def test_a_contestants_dropped_count_at_one_length_is_refused(copy, archived):
    cycles = copy / "cycles.csv"
    line = line_of(cycles, kernel="sdpa_cudnn", S=4096)
    drop(cycles, line)
    refused(copy, archived, "cycles.csv", f"line {line}: no row for sdpa_cudnn at S=4096")


def test_a_run_that_counted_the_headline_at_the_ragged_length_has_those_rows(copy, archived):
    """cycles.ragged: the headline versions counted at sweep.ragged too, where they take it (V24 takes
    whole tiles only: the sweep's refusal says so, and no row of it is missed). The archive's run asked
    for that: without the best's row there it is refused; and a run that did not ask has no such row."""
    summary, meta = archived
    assert meta["cycles"]["ragged"] and archive_tables.read_paired(copy, meta, summary)["cycles"] is not None
    cycles = copy / "cycles.csv"
    line = line_of(cycles, kernel="v25", S=4000)
    unasked = {**meta, "cycles": {**meta["cycles"], "ragged": False}}
    refused(copy, (summary, unasked), "cycles.csv", f"line {line} (v25 at S=4000): v25 is counted at the case, S=2048")
    drop(cycles, line)
    refused(copy, archived, "cycles.csv", f"line {line}: no row for v25 at S=4000, where kernels.json says it was "
                                          "counted")


def test_cycle_rows_where_the_run_says_it_counted_none_are_refused(copy, archived):
    summary, meta = archived
    uncounted = {**meta, "cycles_note": "skipped: ncu was not found on this machine"}
    refused(copy, (summary, uncounted), "cycles.csv", "line 2 (v11 at the case): kernels.json says the run counted no "
                                                      "cycles (skipped: ncu was not found on this machine)")


def test_a_kernel_ncu_could_not_count_has_no_cycle_rows_and_is_not_missed(copy, archived):
    """A count that failed (no permission for the counters, say) is in kernels.json with its reason: its
    rows are not expected, and a row of it is refused."""
    cycles, meta_path = copy / "cycles.csv", copy / "kernels.json"
    meta = read_json(meta_path)
    for k in meta["kernels"]:
        if k["name"] == "v11":
            k["count"] = {"counted": False, "reason": "ERR_NVGPUCTRPERM"}
    write_json(meta_path, meta)
    summary, meta = archive_tables.read_summary(copy)
    refused(copy, (summary, meta), "cycles.csv", "line 2 (v11 at the case): kernels.json says v11 was not counted "
                                                 "(ERR_NVGPUCTRPERM)")
    drop(cycles, line_of(cycles, kernel="v11", S=1024))
    assert archive_tables.read_paired(copy, meta, summary)["cycles"] is not None  # no v11 row, and none missed


# ---- resources.csv -----------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, message", [
    (lambda p: set_cells(p, 2, registers=-1),
     "line 2 (v11 for sm_103): registers -1 is not a whole number in [1, 255]"),
    (lambda p: set_cells(p, 2, registers=""), "line 2 (v11 for sm_103): no registers"),
    (lambda p: set_cells(p, 2, registers=256),
     "line 2 (v11 for sm_103): registers 256 is not a whole number in [1, 255]"),
    (lambda p: drop(p, 9), "line 9: no row for br128 for sm_90, which kernels.json's run builds it for"),
    (lambda p: drop(p, 8, 9), "line 8: no row for br128 for sm_103"),
    (lambda p: drop(p, *range(2, 25)), "line 2: no row for v11 for sm_103"),  # the run's archs, its settings say
    (lambda p: duplicate(p, 12), "line 47 (v14 for sm_90a): a second row for it (the first is line 12)"),
    (lambda p: set_cells(p, 12, arch="sm_90"), "line 12 (v14 for sm_90): v14 is built for sm_90a"),
    (lambda p: set_cells(p, 13, dynamic_smem_bytes=240000, smem_bytes=240000),
     "line 13 (v15 for sm_90a): dynamic_smem_bytes 240000 is not a whole number in [0, 232448]"),
    (lambda p: set_cells(p, 2, smem_bytes=37000), ("line 2 (v11 for sm_103): smem_bytes 37000 is not static_smem_bytes "
                                                  "37760 + dynamic_smem_bytes 0")),
    (lambda p: set_cells(p, 2, blocks_per_sm=8),
     ("line 2 (v11 for sm_103): 8 blocks per SM limited by registers, but 128 threads, 126 registers and 37760 "
      "bytes of shared memory allow 4 on sm_103, limited by registers")),
    (lambda p: set_cells(p, 2, threads=2048),
     "line 2 (v11 for sm_103): threads 2048 is not a whole number in [1, 1024]"),
    (lambda p: set_cells(p, 2, spill_store_bytes=-4), "line 2 (v11 for sm_103): spill_store_bytes -4 is not a whole"),
    (lambda p: set_cells(p, 2, kernel="sdpa_auto"), "line 2 (sdpa_auto for sm_103): sdpa_auto is a peer"),
    (lambda p: set_cells(p, 2, cubin_sha256="0f" * 31), f"line 2 (v11 for sm_103): cubin_sha256 '{'0f' * 31}' is not a "
                                                         "sha256"),
    (lambda p: set_cells(p, 2, cubin_sha256="G" * 64), "line 2 (v11 for sm_103): cubin_sha256 'GGGG"),
    (lambda p: set_cells(p, 2, kernel=""), "line 2: no kernel"),
], ids=["registers-negative", "registers-empty", "registers-256", "dropped-row-br128", "dropped-kernel", "header-only",
        "duplicated-row", "unbuilt-arch", "smem-above-a-block", "smem-parts", "blocks-per-sm", "threads", "spills",
        "peer", "sha-short", "sha-not-hex", "no-kernel"])
def test_damaged_resources_are_refused(copy, archived, damage, message):
    damage(copy / "resources.csv")
    refused(copy, archived, "resources.csv", message)


def test_with_its_settings_kernels_json_says_which_archs_the_run_built_for(copy):
    """An archive whose kernels.json embeds its settings: their archs, and the GPU's own, are those of
    every kernel without archs of its own."""
    from flashbench import config

    meta = read_json(copy / "kernels.json")
    write_json(copy / "kernels.json", {**meta, "settings": meta.get("settings") or config.read(ROOT / "config.yaml")})
    # (the archive's own settings, where it embeds them, else today's config)
    resources = copy / "resources.csv"
    archive_tables.read_tables(copy)
    write_lines(resources, lines(resources)[:1])
    with pytest.raises(BadRecord, match="resources.csv: line 2: no row for v11 for sm_103, which kernels.json's run "
                                        "builds it for"):
        archive_tables.read_tables(copy)


@pytest.mark.parametrize("line", [2, 13], ids=["v11-for-sm_103", "v15-for-sm_90a"])
def test_a_block_may_have_227_kib_of_shared_memory_on_hopper_and_sm_103(archived, line):
    """The most shared memory a block may opt in to (occupancy's limits, those of sm_90, sm_90a, sm_100
    and sm_103): up to it a row passes, a byte over is refused."""
    import pandas as pd

    from flashbench.occupancy import blocks_per_sm
    from flashbench.archive_tables import resources_problem

    _, meta = archived
    resources = pd.read_csv(ARCHIVE / "resources.csv")
    row = line - 2
    for smem, problem in ((232448, None), (232449, f"line {line} ")):
        arch, threads, registers = resources.loc[row, ["arch", "threads", "registers"]]
        allowed = blocks_per_sm(arch, int(threads), int(registers), smem)
        resources.loc[row, ["static_smem_bytes", "dynamic_smem_bytes", "smem_bytes", "blocks_per_sm", "limited_by"]] = [
            0, smem, smem, max(allowed["blocks_per_sm"], 1), " + ".join(allowed["limited_by"])]
        said = resources_problem(resources, meta)
        assert (said is None) if problem is None else said.startswith(
            f"{problem}({resources.kernel[row]} for {arch}): dynamic_smem_bytes 232449 is not a whole number in "
            "[0, 232448]"), said


def test_no_block_fitting_an_sm_is_refused_only_in_a_build_that_ran(archived):
    """A build whose registers and threads leave no block room on an SM cannot launch: the kernel fails
    its check, and its row may stay; the one that passed its check on this GPU ran, so it fitted."""
    import pandas as pd

    from flashbench.archive_tables import resources_problem

    _, meta = archived
    resources = pd.read_csv(ARCHIVE / "resources.csv")
    v11 = 1  # its build for sm_90, the one that ran
    resources.loc[v11, ["registers", "threads", "blocks_per_sm", "limited_by"]] = [255, 1024, 0, "registers"]
    assert resources_problem(resources, meta) == (
        "line 3 (v11 for sm_90): no block fits an SM (limited by registers), but kernels.json says v11 passed its "
        "check on sm_90")
    failed = {**meta, "kernels": [{**k, "check_passed": False} if k["name"] == "v11" else k for k in meta["kernels"]]}
    assert resources_problem(resources, failed) is None


# ---- profile.csv -------------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, message", [
    (lambda p: drop(p, *range(2, 18)), "line 2: no row for v11, which kernels.json says was profiled: cut short"),
    (lambda p: drop(p, 5), "line 5: no row for br128, which kernels.json says was profiled"),
    (lambda p: duplicate(p, 2), "line 19 (v11): a second row for it (the first is line 2)"),
    (lambda p: set_cells(p, 2, registers=126), "line 2 (v11): registers 126, but its build for sm_90 has 123"),
    (lambda p: set_cells(p, 2, achieved_occupancy_pct=123.9), ("line 2 (v11): achieved_occupancy_pct 123.9 is not a "
                                                              "number in [0, 100]")),
    (lambda p: set_cells(p, 2, stall_barrier=-0.46), "line 2 (v11): stall_barrier -0.46 is not a number in [0, inf)"),
    (lambda p: set_cells(p, 2, softmax_share=0.9), "line 2 (v11): softmax_share 0.9, but kernels.json says 0.5643095149944465"),
    (lambda p: set_cells(p, 2, softmax_in_top_lines=4), ("line 2 (v11): softmax_in_top_lines 4, but kernels.json's top "
                                                        "stall lines have 2")),
    (lambda p: set_cells(p, 2, kernel="sdpa_auto"), "line 2 (sdpa_auto): kernels.json says sdpa_auto was not profiled"),
], ids=["header-only", "dropped-row", "duplicated-row", "registers", "occupancy", "stall", "softmax-share",
        "softmax-lines", "unprofiled"])
def test_a_damaged_profile_is_refused(copy, archived, damage, message):
    damage(copy / "profile.csv")
    refused(copy, archived, "profile.csv", message)


# ---- the render command ------------------------------------------------------------------------------

@pytest.mark.parametrize("table, damage, message", [
    ("head_to_head.csv", lambda p: set_cells(p, None, verdict="behind"), f"line 2 ({FIRST}): verdict 'behind'"),
    ("head_to_head.csv", lambda p: set_cells(p, 3, rival="fa3"),
     "line 3 (v25 against fa3 by graph at the case): fa3 is not one of v25's rivals"),
    ("head_to_head.csv", lambda p: drop(p, *range(2, 72)), "line 2: no row for v25 against v24 by step at the case"),
    ("cycles.csv", lambda p: set_cells(p, 2, cycles=-439700),
     "line 2 (v11 at the case): cycles -439700.0 is not a positive"),
    ("resources.csv", lambda p: drop(p, 9), "line 9: no row for br128 for sm_90"),
    ("profile.csv", lambda p: drop(p, *range(2, 19)), "line 2: no row for v11, which kernels.json says was profiled"),
], ids=["verdicts", "unknown-rival", "head-to-head-header-only", "negative-cycles", "dropped-resources-row",
        "profile-header-only"])
def test_render_refuses_a_damaged_table_in_one_line_and_writes_nothing(copy, tmp_path, capsys, settings_file, table,
                                                                       damage, message):
    damage(copy / table)
    reports = tmp_path / "reports" / "nvidia-h200"
    assert main(["render", "--settings", settings_file, "--results", str(copy), "--reports", str(reports),
                 "--template", str(TEMPLATE), "--slug", "nvidia-h200"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"error: {copy / table}: {message}"), err
    assert not (tmp_path / "reports").exists()


def test_a_report_left_by_an_earlier_render_stays_as_it_was(copy, tmp_path, capsys, settings_file):
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "hopper.md").write_text("as it was\n")
    set_cells(copy / "head_to_head.csv", 2, ratio="abc")
    assert main(["render", "--settings", settings_file, "--results", str(copy), "--reports", str(reports),
                 "--template", str(TEMPLATE), "--slug", "nvidia-h200"]) == 1
    assert capsys.readouterr().err.startswith(f"error: {copy / 'head_to_head.csv'}: line 2 ({FIRST}): ratio 'abc'")
    assert [p.name for p in reports.iterdir()] == ["hopper.md"] and (reports / "hopper.md").read_text() == "as it was\n"


def test_a_damaged_ragged_pair_in_kernels_json_is_refused(copy):
    """kernels.json's `ragged` (a headline version's paired rounds, which hopper.md judges by): a time that
    is not positive, a pair against another length than the next multiple of 128, other rounds than
    the sweep's pair timing's, or two pairs at one length are refused before anything is drawn."""
    from flashbench.config import pair_timing

    meta_path = copy / "kernels.json"
    meta = read_json(meta_path)
    v25 = next(i for i, k in enumerate(meta["kernels"]) if k["name"] == "v25")
    rounds = pair_timing(meta["sweep"], meta["head_to_head"])["rounds"]
    pair = {"S": 4000, "near": 4096, "causal": False, "calls_per_timing": {"4000": 60, "4096": 61},
            "rounds": [{"graph_s": 7.4e-4, "near_graph_s": 7.5e-4}] * rounds}
    for pairs, said in (([pair], None),
                        ([{**pair, "rounds": [{"graph_s": -7.4e-4, "near_graph_s": 7.5e-4}] * rounds}], "graph_s"),
                        ([{**pair, "near": 4224}], f"kernels\\[{v25}\\].ragged\\[0\\].near"),
                        ([{**pair, "rounds": pair["rounds"][:-1]}], f"rounds': {rounds - 1}, but the pair is timed in {rounds}"),
                        ([pair, pair], "pairs at S = \\[4000, 4000\\]: one a length")):
        meta["kernels"][v25]["ragged"] = pairs
        write_json(meta_path, meta)
        if said is None:
            archive_tables.read_summary(copy)
            continue
        with pytest.raises(BadRecord, match=said):
            archive_tables.read_summary(copy)
