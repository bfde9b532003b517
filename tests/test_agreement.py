"""Two runs side by side: no opposite verdicts, a verdict changed only at the band's edge or where a
back-to-back ratio is fair in one run only, fair ratios within 1.5% and cycles within 1% on one GPU
(2.5% each across two of a kind), or each way they do not agree, named."""
import pytest

from flashbench import FlashbenchError, agreement, cli
from flashbench.files import write_json, write_text

import records

PAIRED = {"v15": 600.0, "v14": 550.0, "sdpa_auto": 560.0}
UUID = "GPU-5fb2f8a4-9f4c-f1c7-3e2b-6a8c2b7a1e7b"
OTHER_UUID = "GPU-77aa0c31-1d2e-4b5f-8a9c-0e1f2a3b4c5d"


def unfair_step_at_2048(h2h, cyc):
    """v14's back-to-back ratio at S=2048 timed Python's dispatch (in both runs)."""
    h2h.loc[where(h2h, version="v14", method="step", S=2048), "fair"] = False


def kernels_json(gpu: str, uuid: str | None) -> dict:
    """A run's kernels.json as agreement reads it: each kernel's provenance, and the head-to-head's band."""
    return {"gpu_arch": "sm_90", "case": records.CASE, "gate": records.GATE, "inputs": records.INPUTS,
            **records.SETTINGS,
            "kernels": [{"name": k["name"], "kind": k["kind"], "change": k["change"],
                         "published_tflops": k["published_tflops"], "check_passed": True, "check_reason": None,
                         "skipped": None, "timed": False, "timing": None,
                         "provenance": records.provenance(k["name"], gpu=gpu, gpu_uuid=uuid)}
                        for k in records.KERNELS + records.PEERS]}


def run(folder, *changes, gpu="NVIDIA H200", uuid=UUID):
    """A run's head_to_head.csv, cycles.csv and kernels.json in `folder`, on the GPU `uuid` (None: its
    records predate the UUID), after `changes` of its tables (each changes them in place, or returns
    the tables it makes of them)."""
    h2h, cyc = records.paired_tables(records.KERNELS, {"v11": 140.0}, PAIRED)
    for change in (unfair_step_at_2048, *changes):
        h2h, cyc = change(h2h, cyc) or (h2h, cyc)
    write_text(folder / "head_to_head.csv", h2h.to_csv(index=False))
    write_text(folder / "cycles.csv", cyc.to_csv(index=False))
    write_json(folder / "kernels.json", kernels_json(gpu, uuid))
    return folder


def where(h2h, version="v15", rival="sdpa_auto", method="graph", S=1024):
    return (h2h.version == version) & (h2h.rival == rival) & (h2h.method == method) & (h2h.S == S)


def estimate(ratio, low, high, verdict):
    """A change setting the case's v15 vs sdpa_auto by graph to this ratio, interval and verdict."""
    def change(h2h, cyc):
        h2h.loc[where(h2h), ["ratio", "ci_low", "ci_high", "verdict"]] = [ratio, low, high, verdict]

    return change


def cycles_moved(factor, kernel="sdpa_auto", S=1024):
    def change(h2h, cyc):
        cyc.loc[(cyc.kernel == kernel) & (cyc.S == S), "cycles"] *= factor

    return change


def ratio_moved(factor):
    def change(h2h, cyc):
        h2h.loc[where(h2h), "ratio"] *= factor

    return change


def problems(tmp_path, first_changes=(), second_changes=(), **second):
    first = run(tmp_path / "first", *first_changes)
    return agreement.disagreements(first, run(tmp_path / "second", *second_changes, **second))["problems"]


def test_two_runs_alike_agree_and_the_spreads_are_printed(tmp_path):
    result = agreement.disagreements(run(tmp_path / "first"),
                                     run(tmp_path / "second", ratio_moved(1.01), cycles_moved(1.004)))
    assert result["problems"] == [] and len(result["paired"]) == 2 * 3 * 3 and len(result["cycles"]) > 3
    lines = agreement.report_lines(result)
    assert lines[0] == f"both runs on one NVIDIA H200, {UUID}: fair ratios held to 1.5%, cycle counts to 1.0%"
    assert lines[1] == ("17 paired ratios fair in both runs: median move 0.00%, largest 1.00% "
                        "(v15 vs sdpa_auto at S=1024 by graph)")
    assert lines[2].startswith("1 back-to-back ratios not fair in either run (Python's dispatch), not held: ")
    assert lines[3] == ("verdicts: 18 of 18 the same, 0 opposite (ahead in one run, behind in the other), 0 changed "
                        "where an interval ends within 1% of the band's edge, 0 changed far from it, 0 of a "
                        "back-to-back ratio fair in one run only")
    assert lines[4] == f"{len(result['cycles'])} cycle counts: median move 0.00%, largest 0.40% (sdpa_auto at S=1024)"


def test_opposite_verdicts_disagree(tmp_path):
    def behind(h2h, cyc):
        flipped = where(h2h, method="step", S=512)
        h2h.loc[flipped, ["ratio", "ci_low", "ci_high"]] *= 0.99  # within 1.5%, and each run's figures apart
        h2h.loc[flipped, "verdict"] = "behind"

    assert problems(tmp_path, second_changes=[behind]) == [
        "v15 vs sdpa_auto at S=512 by step: ahead 1.072 [1.070, 1.075] in the first run, "
        "behind 1.061 [1.059, 1.064] in the second (opposite verdicts)"]


def test_a_verdict_may_move_between_level_and_ahead_only_where_an_interval_ends_at_the_bands_edge(tmp_path):
    # the edge is 1.01: the first run's lower end 0.5% below it, the second's 2% above
    near = problems(tmp_path, [estimate(1.030, 1.005, 1.050, "level")], [estimate(1.035, 1.030, 1.050, "ahead")])
    assert near == []
    # both lower ends 1.5% from it
    far = problems(tmp_path, [estimate(1.035, 0.995, 1.060, "level")], [estimate(1.045, 1.025, 1.060, "ahead")])
    assert far == ["v15 vs sdpa_auto at S=1024 by graph: level 1.035 [0.995, 1.060] in the first run, ahead 1.045 "
                   "[1.025, 1.060] in the second (neither interval's lower end within 1% of the band's edge)"]


def test_a_verdict_may_move_between_level_and_behind_only_where_an_interval_ends_at_the_bands_edge(tmp_path):
    # the edge is 0.99; the first run's upper end 0.3% above it
    assert problems(tmp_path, [estimate(0.975, 0.960, 0.993, "level")], [estimate(0.970, 0.960, 0.985, "behind")]) == []
    assert problems(tmp_path, [estimate(0.975, 0.960, 1.010, "level")],
                    [estimate(0.970, 0.960, 0.970, "behind")])[0].endswith(
        "(neither interval's upper end within 1% of the band's edge)")


def test_a_back_to_back_ratio_fair_in_one_run_only_may_change_its_verdict_and_move(tmp_path):
    def unfair(h2h, cyc):
        row = where(h2h, version="v14", method="step", S=1024)
        h2h.loc[row, "fair"] = False
        h2h.loc[row, ["ratio", "verdict"]] = [h2h.loc[row, "ratio"].iloc[0] * 1.05, "ahead"]

    result = agreement.disagreements(run(tmp_path / "first"), run(tmp_path / "second", unfair))
    assert result["problems"] == []
    assert agreement.report_lines(result)[3].endswith("1 of a back-to-back ratio fair in one run only")


def test_on_one_gpu_a_cycle_count_moves_1_percent_at_most_a_ratio_1_5_across_two_of_a_kind_2_5(tmp_path):
    moved = [cycles_moved(1.012)]
    assert problems(tmp_path, second_changes=moved) == [
        "cycles of sdpa_auto at S=1024: 110442 -> 111767, moved 1.2% (more than 1.0%)"]
    assert problems(tmp_path, second_changes=moved, uuid=OTHER_UUID) == []
    assert problems(tmp_path, second_changes=[cycles_moved(1.03)], uuid=OTHER_UUID) == [
        "cycles of sdpa_auto at S=1024: 110442 -> 113755, moved 3.0% (more than 2.5%)"]
    assert problems(tmp_path, second_changes=[ratio_moved(1.02)]) == [
        "v15 vs sdpa_auto at S=1024 by graph: ratio 1.072 -> 1.094, moved 2.0% (more than 1.5%)"]
    assert problems(tmp_path, second_changes=[ratio_moved(1.02)], uuid=OTHER_UUID) == []


def test_a_run_without_a_uuid_is_taken_as_another_gpu_of_its_kind_and_said_so(tmp_path):
    result = agreement.disagreements(run(tmp_path / "first"), run(tmp_path / "second", cycles_moved(1.012), uuid=None))
    assert result["problems"] == []
    assert agreement.report_lines(result)[0] == (
        "the second run names no GPU UUID (records made before UUIDs were recorded): taken as two NVIDIA H200s: "
        "fair ratios held to 2.5%, cycle counts to 2.5%")
    result = agreement.disagreements(run(tmp_path / "first", uuid=None), run(tmp_path / "second", uuid=None))
    assert agreement.report_lines(result)[0].startswith(
        "neither run names a GPU UUID (records made before UUIDs were recorded): taken as two NVIDIA H200s")


def test_runs_on_two_kinds_of_gpu_are_not_compared(tmp_path):
    with pytest.raises(FlashbenchError, match="^the first run is on NVIDIA H200, the second on NVIDIA H100 80GB HBM3: "
                                              "only runs on GPUs of one kind are compared$"):
        agreement.disagreements(run(tmp_path / "first"), run(tmp_path / "second", gpu="NVIDIA H100 80GB HBM3",
                                                              uuid=OTHER_UUID))


def test_a_row_or_a_count_missing_in_a_run_is_named(tmp_path):
    def change(h2h, cyc):
        cyc.loc[(cyc.kernel == "v12") & (cyc.S == 1024), "cycles"] = float("nan")
        return h2h[~where(h2h, S=2048)], cyc  # the second run lacks a row

    assert problems(tmp_path, second_changes=[change]) == [
        "paired ratio of v15 vs sdpa_auto at S=2048 by graph: only in the first run",
        "cycles of v12 at S=1024: not counted in the second run"]


def test_a_method_one_run_did_not_time_a_version_by_is_left_out_and_said_but_a_missing_version_is_not(tmp_path):
    """The second run timed v14 by graph alone (config's back_to_back): its back-to-back rows in the first are
    not compared, and the output names them; v15 missing from a run is still a disagreement."""
    def graph_alone(h2h, cyc):
        return h2h[~((h2h.version == "v14") & (h2h.method == "step"))], cyc

    result = agreement.disagreements(run(tmp_path / "first"), run(tmp_path / "second", graph_alone))
    assert result["problems"] == [] and result["by_one_method"] == ["step of v14"]
    assert "timed so in one run alone, not compared: step of v14" in agreement.report_lines(result)

    def without_v15(h2h, cyc):
        return h2h[h2h.version != "v15"], cyc

    missing = problems(tmp_path, second_changes=[without_v15])
    assert "paired ratio of v15 vs sdpa_auto at S=1024 by step: only in the first run" in missing


@pytest.mark.parametrize("option", ["--ratio-within", "--cycles-within"])
@pytest.mark.parametrize("value", ["nan", "-1", "0", "inf"])
def test_a_tolerance_is_a_positive_finite_fraction(tmp_path, capsys, option, value):
    first, second = run(tmp_path / "first"), run(tmp_path / "second", cycles_moved(1.5))
    assert cli.main(["agreement", str(first), str(second), option, value]) == 1
    out = capsys.readouterr()
    what = "ratio" if option == "--ratio-within" else "cycle"
    assert out.err == (f"error: the {what} tolerance must be a positive finite fraction (0.015 for 1.5%), "
                       f"not {float(value)}\n")
    assert out.out == ""


def test_the_command_fails_in_one_line_where_they_do_not_agree_or_a_table_is_missing(tmp_path, capsys):
    first = run(tmp_path / "first")
    assert cli.main(["agreement", str(first), str(run(tmp_path / "same"))]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "the two runs agree"

    moved = run(tmp_path / "moved", lambda h2h, cyc: cyc.__setitem__("cycles", cyc.cycles * 1.02))
    assert cli.main(["agreement", str(first), str(moved)]) == 1
    out = capsys.readouterr()
    counts = len((first / "cycles.csv").read_text().splitlines()) - 1
    assert out.err == f"error: the two runs do not agree: {counts} disagreements above\n"
    assert sum(line.startswith("disagrees: cycles of ") for line in out.out.splitlines()) == counts
    assert cli.main(["agreement", str(first), str(moved), "--cycles-within", "0.03"]) == 0  # asked for: held to it

    (moved / "head_to_head.csv").unlink()
    (tmp_path / "nothing").mkdir()  # a folder without a run's tables
    for missing, name in ((moved, "head_to_head.csv"), (tmp_path / "nothing", "kernels.json")):
        assert cli.main(["agreement", str(first), str(missing)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and name in err[0]


def test_a_folder_given_twice_is_refused(tmp_path):
    first = run(tmp_path / "first")
    with pytest.raises(FlashbenchError, match=r"first is given twice: agreement compares two runs' folders$"):
        agreement.disagreements(first, tmp_path / "first" / ".." / "first")
