"""Two runs side by side: the same verdicts, ratios within 1.5%, cycles within 1%, or each way they
do not agree, named."""
from flashbench import agreement, cli
from flashbench.files import write_text

import records

PAIRED = {"v15": 600.0, "v14": 550.0, "sdpa_auto": 560.0}


def unfair_step_at_2048(h2h, cyc):
    """v14's back-to-back ratio at S=2048 timed Python's dispatch (in both runs)."""
    h2h.loc[where(h2h, version="v14", method="step", S=2048), "fair"] = False


def run(folder, *changes):
    """A run's head_to_head.csv and cycles.csv in `folder`, after `changes` of its tables (each changes
    them in place, or returns the tables it makes of them)."""
    h2h, cyc = records.paired_tables(records.KERNELS, {"v11": 140.0}, PAIRED)
    for change in (unfair_step_at_2048, *changes):
        h2h, cyc = change(h2h, cyc) or (h2h, cyc)
    write_text(folder / "head_to_head.csv", h2h.to_csv(index=False))
    write_text(folder / "cycles.csv", cyc.to_csv(index=False))
    return folder


def where(h2h, version="v15", rival="sdpa_auto", method="graph", S=1024):
    return (h2h.version == version) & (h2h.rival == rival) & (h2h.method == method) & (h2h.S == S)


def test_two_runs_alike_agree(tmp_path):
    result = agreement.compare(run(tmp_path / "first"), run(tmp_path / "second"), 0.015, 0.01)
    assert result["problems"] == [] and len(result["paired"]) == 2 * 3 * 3 and len(result["cycles"]) > 3
    summary = agreement.summary(result)
    assert "verdicts: 18 of 18 the same, 0 opposite (ahead in one run, behind in the other)" in summary
    assert summary[1].startswith("1 back-to-back ratios not fair in a run")


def test_every_disagreement_is_named_and_an_unfair_ratio_moves_freely(tmp_path):
    def change(h2h, cyc):
        h2h.loc[where(h2h), "ratio"] *= 1.02  # moved 2%
        flipped = where(h2h, method="step", S=512)
        h2h.loc[flipped, ["ratio", "ci_low", "ci_high"]] *= 0.99  # within 1.5%, and each run's figures apart
        h2h.loc[flipped, "verdict"] = "behind"
        unfair = where(h2h, version="v14", method="step", S=2048)  # not fair in either run: free to move
        h2h.loc[unfair, "ratio"] *= 1.10
        h2h.loc[unfair, "verdict"] = "behind"
        h2h.loc[where(h2h, version="v14", method="step", S=1024), "fair"] = False  # fair in the first run only
        cyc.loc[(cyc.kernel == "v11") & (cyc.S == 1024), "cycles"] *= 1.015
        cyc.loc[(cyc.kernel == "v12") & (cyc.S == 1024), "cycles"] = float("nan")
        return h2h[~where(h2h, S=2048)], cyc  # the second run lacks a row

    result = agreement.compare(run(tmp_path / "first"), run(tmp_path / "second", change), 0.015, 0.01)
    problems = result["problems"]
    assert len(problems) == 6, problems
    assert problems[0] == "paired ratio of v15 vs sdpa_auto at S=2048 by graph: only in the first run"
    assert problems[1] == ("v15 vs sdpa_auto at S=512 by step: ahead 1.071 [1.067, 1.076] in the first run, "
                           "behind 1.061 [1.056, 1.065] in the second (opposite verdicts)")
    assert problems[2] == ("v14 vs sdpa_auto at S=1024 by step: level 0.985 [0.979, 0.992] in the first run, "
                           "not fair 0.985 [0.979, 0.992] in the second")
    assert problems[3].startswith("v15 vs sdpa_auto at S=1024 by graph: ratio ") and "moved 2.0%" in problems[3]
    assert problems[4].startswith("cycles of v11 at S=1024: ") and "moved 1.5%" in problems[4]
    assert problems[5] == "cycles of v12 at S=1024: not counted in the second run"
    assert "verdicts: 15 of 17 the same, 1 opposite (ahead in one run, behind in the other)" in agreement.summary(result)


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

    assert cli.main(["agreement", str(first), str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "head_to_head.csv" in err[0]
