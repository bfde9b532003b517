"""What guards the archive without Snakemake: whole-or-nothing writes, folders that are no archive,
the report's commit, one-line errors from the command line, and builds that are the same in any
checkout."""
import fcntl
import json
import os
import re
import shutil
import sys
import threading
from pathlib import Path

import pytest

from flashbench import FlashbenchError, archives, cli, figures, gpu, gpu_reports, gpulock, hopper_report
from flashbench.compile import compile_kernel
from flashbench.config import ConfigError
from flashbench.files import read_json, staged

from conftest import ROOT, shipped_settings

TEMPLATES = ROOT / "workflow" / "templates"
ARCHIVE = ROOT / "results" / "nvidia-h200"
GOAL = shipped_settings().goal  # the Hopper report's


def test_two_renders_at_once_never_share_a_temporary_name(tmp_path, monkeypatch):
    """A second render saving the same figure while the first is still writing it (two renders at once,
    or --nolock): each writes its own temporary file, and both land."""
    import matplotlib.figure

    path = tmp_path / "tflops.png"
    save = matplotlib.figure.Figure.savefig
    nested = []

    def savefig_with_a_second_render_meanwhile(fig, where, **kwargs):
        save(fig, where, **kwargs)
        if not nested:
            nested.append(where)
            figures._save(figures._axes(2, 2)[0], path)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig_with_a_second_render_meanwhile)
    figures._save(figures._axes(2, 2)[0], path)
    assert path.stat().st_size > 0 and [p.name for p in tmp_path.iterdir()] == ["tflops.png"]


def test_a_render_that_fails_leaves_every_report_file_as_it_was(tmp_path, monkeypatch):
    reports = tmp_path / "reports"
    reports.mkdir()
    for name in gpu_reports.WRITTEN:  # an archived report, other than the one these results render to
        (reports / name).write_text(f"archived {name}")
    before = {p.name: p.read_bytes() for p in reports.iterdir()}

    def fail(*args, **tables):
        raise FlashbenchError("the hopper line cannot be rendered")

    monkeypatch.setattr(hopper_report, "context", fail)  # after report.md and three figures are drawn
    with pytest.raises(FlashbenchError, match="cannot be rendered"):
        gpu_reports.render(ARCHIVE, reports, TEMPLATES / "report.md.j2", "nvidia-h200", GOAL)
    assert {p.name: p.read_bytes() for p in reports.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]  # no staging folder left behind


def test_a_staged_file_lands_whole_or_not_at_all(tmp_path):
    path = tmp_path / "record.json"
    path.write_text("archived")
    with pytest.raises(RuntimeError):
        with staged(path) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert path.read_text() == "archived" and [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_folder_under_results_that_is_no_archive_is_skipped_saying_why(tmp_path):
    shutil.copytree(ARCHIVE, tmp_path / "nvidia-h200")
    shutil.copytree(ARCHIVE, tmp_path / "nvidia-h200.bak")
    (tmp_path / "nvidia-b300" / "check").mkdir(parents=True)  # a run that never got to its tables
    (tmp_path / ".nvidia-h200.tmp").mkdir()  # a render's staging
    found, skipped = archives.find(tmp_path)
    assert found == ["nvidia-h200"]
    assert skipped == [f"{tmp_path}/nvidia-b300: not a GPU archive (no summary.csv, resources.csv, profile.csv, "
                       f"kernels.json), skipped",
                       f"{tmp_path}/nvidia-h200.bak: not a GPU archive (not a GPU's folder name, such as "
                       f"nvidia-h200), skipped"]
    assert archives.find(tmp_path, running="nvidia-b300")[1] == skipped[1:]  # the folder being measured


def test_a_report_folder_whose_tables_are_gone_is_vanished_but_not_the_measured_gpus(tmp_path):
    """reports/<gpu>/ with files while results/<gpu>/ lacks a table: vanished. A first run that stopped
    before summarize (results/<gpu>/check/ alone, no report yet) is not, nor the GPU a run measures."""
    results, reports = tmp_path / "results", tmp_path / "reports"
    shutil.copytree(ARCHIVE, results / "nvidia-h200")
    shutil.copytree(ROOT / "reports" / "nvidia-h200", reports / "nvidia-h200")
    (reports / "README.md").write_text("the side by side")
    (results / "nvidia-b300" / "check").mkdir(parents=True)  # a first run that stopped early
    for folder in (".nvidia-h200.tmp", "nvidia-h200.bak"):  # a render's staging; no GPU's folder name
        (reports / folder).mkdir()
        (reports / folder / "report.md").write_text("a copy")
    (reports / "nvidia-gb200").mkdir()  # empty: no report archived
    assert archives.vanished(results, reports) == {}

    (results / "nvidia-h200" / "summary.csv").unlink()
    assert archives.vanished(results, reports) == {"nvidia-h200": ["summary.csv"]}
    assert archives.vanished(results, reports, running="nvidia-h200") == {}  # its run summarizes it again
    shutil.rmtree(results / "nvidia-h200")  # or the folder renamed
    (reports / "nvidia-b300").mkdir()
    (reports / "nvidia-b300" / "report.md").write_text("a report")
    gone = archives.vanished(results, reports)
    assert gone == {"nvidia-b300": list(archives.TABLES), "nvidia-h200": list(archives.TABLES)}
    assert archives.vanished_message(gone, results, reports) == (
        f"{reports}/nvidia-b300/ and {reports}/nvidia-h200/ are archived, but the tables they are rendered from are "
        f"gone ({results}/nvidia-b300/ lacks summary.csv, resources.csv, profile.csv, kernels.json; "
        f"{results}/nvidia-h200/ is not there): restore them with `git checkout {results}/nvidia-b300 "
        f"{results}/nvidia-h200` (or `git restore {results}/nvidia-b300 {results}/nvidia-h200`), or retire a GPU by "
        f"removing both its {results}/<gpu>/ and {reports}/<gpu>/")


@pytest.mark.parametrize("content, message", [(None, ": cannot be read \\(No such file or directory\\)"),
                                              ('{"kernel": "v11", "pass', ": not valid JSON .*cut short")])
def test_a_missing_or_cut_record_is_one_clear_error(tmp_path, content, message):
    path = tmp_path / "v11.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(FlashbenchError, match=message):
        read_json(path)


def test_the_report_names_the_commit_the_numbers_were_measured_at(tmp_path):
    """A run given FLASHBENCH_GIT_COMMIT in a checkout whose copied .git answers another commit: the
    given one is the commit, and the reports say git's answer is not it."""
    assert gpu.measured_commit({"git_commit": "57362c2+dirty", "given_commit": "a6bb607"}) == "a6bb607"
    assert gpu.measured_commit({"git_commit": "abc123"}) == "abc123"
    archive = tmp_path / "results" / "nvidia-h200"
    shutil.copytree(ARCHIVE, archive)
    meta = json.loads((archive / "kernels.json").read_text())
    for k in meta["kernels"]:
        if k.get("provenance"):
            k["provenance"] = {**k["provenance"], "git_commit": "57362c2+dirty", "given_commit": "a6bb607"}
    (archive / "kernels.json").write_text(json.dumps(meta))
    text = gpu_reports.render(archive, tmp_path, TEMPLATES / "report.md.j2", "nvidia-h200", GOAL).read_text()
    assert "| measured at commit | a6bb607 |" in text
    assert ("git in that checkout answered 57362c2+dirty instead (a copied `.git` knows the HEAD it was copied "
            "at): that is not the commit the numbers were measured at") in text
    hopper = (tmp_path / "hopper.md").read_text()
    assert "Measured at commit a6bb607 (given to the run as `FLASHBENCH_GIT_COMMIT`; git in its copied checkout " \
           "answered 57362c2+dirty, which is not" in hopper


def test_results_reached_through_a_link_are_named_by_the_link(tmp_path):
    storage = tmp_path / "storage" / "run42"
    shutil.copytree(ARCHIVE, storage)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "nvidia-h200").symlink_to(storage)
    report = gpu_reports.render(tmp_path / "results" / "nvidia-h200", tmp_path / "reports", TEMPLATES / "report.md.j2",
                                "nvidia-h200", GOAL)
    assert "`nvidia-h200`" in report.read_text()
    with pytest.raises(FlashbenchError, match=r"slug 'nvidia-h200': the results given \(.*run42\) are run42's"):
        gpu_reports.render(storage, tmp_path / "elsewhere", TEMPLATES / "report.md.j2", "nvidia-h200", GOAL)


def test_the_archived_report_names_the_commit_of_its_records():
    provenance = read_json(ARCHIVE / "check" / "v11.json")["provenance"]
    hopper = (ROOT / "reports" / "nvidia-h200" / "hopper.md").read_text()
    assert f"Measured at commit {gpu.measured_commit(provenance)}" in hopper


def bad_invocations(tmp_path, settings_file):
    """Each command given a bad argument: its argv and what its one line says (a regex). The files they
    name are made by with_bad_inputs."""
    no_passed = tmp_path / "no-passed.json"  # a check record without `passed`
    edited = tmp_path / "edited" / Path(settings_file).name  # a settings file changed since the workflow wrote it
    none = str(tmp_path / "none.json")  # no such file
    cubin, record = str(tmp_path / "v11.cubin"), str(tmp_path / "record.json")  # a cubin without a record beside it
    not_a_folder = tmp_path / "no-passed.json" / "below"  # under a file: a folder that cannot be made
    s = ["--settings", settings_file]
    out = ["--out", str(tmp_path / "out.json")]
    compile_args = ["compile", *s, "--arch", "sm_90", "--cubin", str(tmp_path / "x.cubin"), "--record",
                    str(tmp_path / "x.json")]
    render = ["render", *s, "--results", "results/nvidia-h200", "--reports", str(tmp_path / "reports"), "--slug",
              "nvidia-h200"]
    report_template = ["--template", "workflow/templates/report.md.j2"]
    compare = ["compare", "--results", "results/nvidia-h200", "--table", str(tmp_path / "README.md"), "--figure",
               str(tmp_path / "compare.png")]
    compare_template = ["--template", "workflow/templates/compare.md.j2"]
    pages = ["pages", "--out-dir", str(tmp_path / "pages")]
    summarize = ["summarize", *s, "--checks", str(no_passed), "--benches", str(no_passed), "--compiled",
                 str(no_passed)]
    h2h = ["head-to-head", *s, "--S", "1024", "--checks", str(no_passed)]
    wheelhouse = ["wheelhouse", "--python", "3.12", "--platform", "manylinux_2_28_x86_64"]
    ncu = str(tmp_path / "ncu")  # a file that is not executable
    peer_bench = ["--peer", "sdpa_auto", "--check", str(no_passed)]
    unreadable = "cannot be read \\(No such file or directory\\)"
    cannot_be_made = f"cannot be made or written \\({no_passed} is not a folder\\)"
    return {
        "no settings file": (["check", "--settings", str(tmp_path / "none.json"), "--peer", "sdpa_auto", *out],
                             "none.json: cannot be read"),
        "an edited settings file": (["check", "--settings", str(edited), "--peer", "sdpa_auto", *out],
                                    "is not a settings file the workflow wrote"),
        "a kernel the settings do not run": (compile_args + ["--kernel", "v99"], "no kernel or peer named 'v99' is run"),
        "an arch no GPU of the kernels has": (["compile", *s, "--kernel", "v11", "--arch", "sm_42", "--cubin",
                                               str(tmp_path / "x.cubin"), "--record", str(tmp_path / "x.json")],
                                              "--arch sm_42: v11 is built for sm_90, "),
        "an arch the kernel is not built for": (compile_args + ["--kernel", "v14"], "--arch sm_90: v14 is built for "
                                                                                    "sm_90a$"),
        "a peer the settings do not have": (["check", *s, "--peer", "sdpa_nope", *out], "no peer named 'sdpa_nope'"),
        "a kernel's record that is not there": (["check", *s, "--cubin", cubin, "--record", none, *out],
                                                f"argument --record: {none}: {unreadable}"),
        "a cubin that is no cubin": (["check", *s, "--cubin", record, "--record", record, *out],
                                     f"argument --cubin: {record}: not a .cubin file"),
        "an out that is a folder": (["check", *s, "--peer", "sdpa_auto", "--out", str(tmp_path / "folder.json")],
                                    "argument --out: .*folder.json: is a folder, not a file"),
        "an out whose folder cannot be made": (["check", *s, "--peer", "sdpa_auto", "--out",
                                                str(not_a_folder / "out.json")],
                                               f"argument --out: .*its folder cannot be made or written \\({no_passed} "
                                               "is not a folder\\)"),
        "an out that is no JSON file": (["check", *s, "--peer", "sdpa_auto", "--out", str(tmp_path / "out.txt")],
                                        "argument --out: .*out.txt: not a .json file"),
        "a head-to-head point the settings do not have": (["head-to-head", *s, "--S", "3000", "--checks",
                                                           str(no_passed), *out], "the head-to-head has no point at "
                                                                                  "S=3000"),
        "a head-to-head without a contestant's check": (h2h + out, "--checks has no check record of the contestant "
                                                                   "v25"),
        "a head-to-head in a configuration the settings lack": (h2h + ["--configuration", "sliding", *out],
                                                                "--configuration 'sliding': not a configuration of "
                                                                "the settings \\(dense, causal, bf16, gqa, d64, d256, gqa_causal, "
                                                                "d64_causal, d256_causal, gqa_d64, gqa_d256, gqa_d64_causal, gqa_d256_causal, "
                                                                "causal_bf16, gqa_bf16, d64_bf16, d256_bf16, gqa_causal_bf16, "
                                                                "d64_causal_bf16, d256_causal_bf16, gqa_d64_bf16, gqa_d256_bf16, "
                                                                "gqa_d64_causal_bf16, gqa_d256_causal_bf16\\)"),
        "a head-to-head check record that is not there": (["head-to-head", *s, "--S", "1024", "--checks", none, *out],
                                                          f"argument --checks: {none}: {unreadable}"),
        "a head-to-head cubin without its compile record": (h2h + ["--cubins", cubin, *out],
                                                            f"--cubins {cubin}: its compile record .*v11.json is not "
                                                            "beside it"),
        "a head-to-head out whose folder cannot be made": (h2h + ["--out", str(not_a_folder / "h.json")],
                                                           "argument --out: .*its folder cannot be made"),
        "a count that is no number": (["head-to-head", *s, "--S", "big", "--checks", str(no_passed), *out],
                                      "argument --S: invalid int value: 'big'"),
        "a shape the kernels do not take": (["launch-once", "--cubin", cubin, "--record", record, "--shape",
                                             '{"B": 1, "H": 2, "S": 100, "D": 128}'], "argument --shape: S: 100 is less than"),
        "garbage --shape": (["launch-once", "--cubin", cubin, "--record", record, "--shape", "garbage"],
                            "argument --shape: not JSON"),
        "a launch-once cubin that is not there": (["launch-once", "--cubin", str(tmp_path / "none.cubin"), "--record",
                                                   record, "--shape", '{"B": 1, "H": 2, "S": 128, "D": 128}'],
                                                  f"argument --cubin: .*none.cubin: {unreadable}"),
        "a launch-once record that is no JSON file": (["launch-once", "--cubin", cubin, "--record", cubin, "--shape",
                                                       '{"B": 1, "H": 2, "S": 128, "D": 128}'],
                                                      "argument --record: .*v11.cubin: not a .json file"),
        "an identity-out whose folder cannot be made": (["launch-marked", *s, "--peer", "sdpa_auto", "--identity-out",
                                                         str(not_a_folder / "identity.json")],
                                                        "argument --identity-out: .*its folder cannot be made"),
        "a missing --check file": (["bench", *s, "--peer", "sdpa_auto", "--check", str(tmp_path / "none.json"), *out],
                                   "none.json: cannot be read \\(No such file or directory\\)"),
        "a check record without passed": (["bench", *s, *peer_bench, *out], "no-passed.json: key '\\w+': missing"),
        "a check record that is a folder": (["sweep", *s, "--peer", "sdpa_auto", "--check", str(tmp_path), *out],
                                            "argument --check: .*: is a folder, not a file"),
        "a --depends-on that is not there": (["sweep", *s, *peer_bench, *out, "--depends-on", none],
                                             f"argument --depends-on: {none}: {unreadable}"),
        "an ncu that is not executable": (["cycles", *s, *peer_bench, "--ncu", ncu, *out],
                                          f"argument --ncu: {ncu}: not an executable"),
        "an ncu that is not found": (["profile", *s, "--ncu", "no-such-ncu", "--cubin", cubin, "--record", record,
                                      "--check", str(no_passed), *out], "argument --ncu: no-such-ncu: not an executable"),
        "a profile's cubin that is not there": (["profile", *s, "--ncu", sys.executable, "--cubin",
                                                 str(tmp_path / "none.cubin"), "--record", record, "--check",
                                                 str(no_passed), *out], f"argument --cubin: .*none.cubin: {unreadable}"),
        "missing paths to compare": (["compare", "--results", str(tmp_path / "nowhere"), "--template", "t", "--table",
                                      str(tmp_path / "t.md"), "--figure", str(tmp_path / "f.png")],
                                     "argument --results: .*nowhere: no such folder"),
        "results to compare that lack their tables": (["compare", "--results", str(tmp_path), *compare_template,
                                                       "--table", str(tmp_path / "t.md"), "--figure",
                                                       str(tmp_path / "f.png")], "lacks summary.csv"),
        "a comparison template that is not there": (compare + ["--template", str(tmp_path / "nope.j2")],
                                                    f"argument --template: .*nope.j2: {unreadable}"),
        "another report's template to compare": (compare + report_template,
                                                 "template workflow/templates/report.md.j2 uses .*, which this report "
                                                 "does not have: is it another report's template\\?"),
        "a comparison table whose folder cannot be made": (["compare", *compare_template, "--table",
                                                            str(not_a_folder / "README.md"), "--figure",
                                                            str(tmp_path / "compare.png")],
                                                           "argument --table: .*its folder cannot be made"),
        "a comparison figure that is no PNG": (["compare", *compare_template, "--table", str(tmp_path / "README.md"),
                                                "--figure", str(tmp_path / "compare.svg")],
                                               "argument --figure: .*compare.svg: not a .png file"),
        "a report template that is not there": (render + ["--template", "nope.j2"],
                                                f"argument --template: nope.j2: {unreadable}"),
        "a report template that is no template": (render + ["--template", "README.md"],
                                                  "argument --template: README.md: not a .j2 file"),
        "a report template jinja2 cannot read": (render + ["--template", str(tmp_path / "bad.j2")],
                                                 "template .*bad.j2: line 1: "),
        "a report template without hopper's beside it": (render + ["--template", str(tmp_path / "lone" /
                                                                                  "report.md.j2")],
                                                         "template .*lone/hopper.md.j2: no such file"),
        "another report's template to render": (render + compare_template,
                                                "template workflow/templates/compare.md.j2 uses columns, figure, "
                                                "published, which this report does not have"),
        "results to render that are no folder": (["render", *s, "--results", "README.md", "--reports",
                                                  str(tmp_path / "reports"), "--slug", "nvidia-h200", *report_template],
                                                 "argument --results: README.md: not a folder"),
        "reports that cannot be made": (["render", *s, "--results", "results/nvidia-h200", "--reports",
                                         str(not_a_folder / "reports"), "--slug", "nvidia-h200", *report_template],
                                        f"argument --reports: .*{cannot_be_made}"),
        "a slug that is no GPU's folder name": (["render", *s, "--results", "results/nvidia-h200", "--reports",
                                                 str(tmp_path / "reports"), "--slug", "NVIDIA H200", *report_template],
                                                "slug 'NVIDIA H200': not a GPU's folder name"),
        "another GPU's slug": (["render", *s, "--results", "results/nvidia-h200", "--reports",
                                str(tmp_path / "reports"), "--slug", "nvidia-h100", *report_template],
                               "slug 'nvidia-h100': the results given \\(results/nvidia-h200\\) are nvidia-h200's; "
                               "a GPU's reports are named after its results' folder"),
        "two runs to agree that are no folders": (["agreement", str(no_passed), "results/nvidia-h200"],
                                                  "argument first: .*no-passed.json: not a folder"),
        "a second run that is not there": (["agreement", "results/nvidia-h200", str(tmp_path / "nowhere")],
                                           "argument second: .*nowhere: no such folder"),
        "a page's source that is not there": (pages + ["--sources", str(tmp_path / "none.md")],
                                              f"argument --sources: .*none.md: {unreadable}"),
        "a page's source of no kind": (pages + ["--sources", "README.md", "pyproject.toml"],
                                       "argument --sources: pyproject.toml: not a .md or .csv file"),
        "a page's table that is no table": (pages + ["--sources", "README.md", str(tmp_path / "bad.csv")],
                                            "bad.csv: cannot be read as a table"),
        "two pages of one name": (pages + ["--sources", "results/nvidia-h200/summary.csv", "results/nvidia-h200/"
                                           "summary.csv"], "make summary.html twice"),
        "an absent table that is always made": (pages + ["--sources", "README.md", "--absent", "summary"],
                                                "argument --absent: invalid choice: 'summary'"),
        "pages that cannot be made": (["pages", "--sources", "README.md", "--out-dir", str(not_a_folder)],
                                      f"argument --out-dir: .*{cannot_be_made}"),
        "a project that is no folder": (wheelhouse + ["--project", "README.md", str(tmp_path / "wh")],
                                        "argument --project: README.md: not a folder"),
        "a project that is not this one": (wheelhouse + ["--project", str(tmp_path / "other"), str(tmp_path / "wh")],
                                           "other/pyproject.toml has no 'tool': not this project's"),
        "a wheelhouse that cannot be made": (wheelhouse + [str(not_a_folder)], f"argument folder: .*{cannot_be_made}"),
        "missing paths to summarize": (["summarize", *s, "--checks", str(tmp_path / "none.json"), "--benches", "b",
                                        "--compiled", "c", "--gpu-arch", "sm_90", "--out-dir", str(tmp_path / "s")],
                                       "none.json: cannot be read"),
        "an arch to summarize that no GPU of the kernels has": (summarize + ["--gpu-arch", "sm_91", "--out-dir",
                                                                             str(tmp_path / "s")],
                                                                "argument --gpu-arch: 'sm_91': not a GPU architecture"),
        "tables that cannot be made": (summarize + ["--gpu-arch", "sm_90", "--out-dir", str(not_a_folder)],
                                       f"argument --out-dir: .*{cannot_be_made}"),
        "neither a kernel nor a peer": (["check", *s, *out], "needs --cubin and --record"),
    }


def with_bad_inputs(tmp_path, settings_file):
    """The files bad_invocations names, there."""
    (tmp_path / "no-passed.json").write_text('{"kernel": "v11"}')
    edited = tmp_path / "edited" / Path(settings_file).name
    edited.parent.mkdir()
    edited.write_text(Path(settings_file).read_text().replace('"steps": 100', '"steps": 1'))
    (tmp_path / "v11.cubin").write_bytes(b"")
    (tmp_path / "record.json").write_text("{}")
    (tmp_path / "folder.json").mkdir()
    (tmp_path / "bad.j2").write_text("{% if %}\n")
    (tmp_path / "lone").mkdir()
    shutil.copy(TEMPLATES / "report.md.j2", tmp_path / "lone")
    (tmp_path / "bad.csv").write_text('a,b\n1,2,3\n"cut\n')
    (tmp_path / "ncu").write_text("#!/bin/sh\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "pyproject.toml").write_text('[project]\nname = "other"\n')


@pytest.mark.parametrize("case", list(bad_invocations(Path("."), "settings.json")))
def test_every_bad_argument_is_one_error_line_and_exit_1(case, tmp_path, capsys, monkeypatch, settings_file):
    """Refused in one line before anything runs: nothing is written, and no program started."""
    monkeypatch.chdir(ROOT)
    with_bad_inputs(tmp_path, settings_file)
    before = sorted(tmp_path.rglob("*"))
    argv, message = bad_invocations(tmp_path, settings_file)[case]
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and re.search(message, err), err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
def test_a_peer_asks_for_the_gpu_before_torch(tmp_path, capsys, monkeypatch, settings_file):
    """Without a GPU a peer's check fails, as a kernel's does: it never records "skipped: torch is not
    installed", which would stand in the archive as that peer's result."""
    monkeypatch.chdir(ROOT)
    out = tmp_path / "sdpa_auto.json"
    assert cli.main(["check", "--settings", settings_file, "--peer", "sdpa_auto", "--out", str(out)]) == 1
    assert capsys.readouterr().err.startswith("error: no NVIDIA GPU found") and not out.exists()


def test_a_busy_lock_whose_holder_cannot_be_read_still_waits_saying_so(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHBENCH_LOCK_DIR", str(tmp_path))
    path = gpulock.lock_path("0000:19:00.0")
    path.with_suffix(".holder").mkdir(parents=True)  # unreadable as a file, whoever runs the test
    other = os.open(path, os.O_RDONLY | os.O_CREAT)
    fcntl.flock(other, fcntl.LOCK_EX)
    threading.Timer(0.2, os.close, [other]).start()
    said = []
    with gpulock.hold("0000:19:00.0", "check v11", progress=said.append):
        pass
    assert said == ["waiting for the GPU at 0000:19:00.0: held by another job (its "
                    "flashbench-gpu-0000-19-00.0.holder cannot be read: Is a directory)"]


@pytest.mark.parametrize("value", ["$(touch {marker})", "`touch {marker}`", "1; touch {marker}"])
def test_a_define_that_a_shell_would_run_is_refused_before_nvcc(tmp_path, settings, value):
    marker = tmp_path / "ran"
    with pytest.raises(ConfigError, match=r"defines Y: .* is not valid under any of the given schemas"):
        compile_kernel("v11", ROOT / "kernels" / "v11.cu", "sm_90", settings.nvcc_flags,
                       {"Y": value.format(marker=marker)}, tmp_path / "v11.cubin")
    with pytest.raises(ConfigError, match=r"nvcc flags \[\d+\]: .* is not allowed"):
        compile_kernel("v11", ROOT / "kernels" / "v11.cu", "sm_90", [*settings.nvcc_flags, f"-DZ={value.format(marker=marker)}"],
                       {}, tmp_path / "v11.cubin")
    assert not marker.exists()


def test_the_same_source_builds_the_same_cubin_and_record_in_any_checkout_and_toolkit_folder(tmp_path, settings,
                                                                                            needs_nvcc, monkeypatch):
    """Two copies in folders of different depth, their files of different times (as two clones made
    at different times), the second built by the same nvcc reached through another folder (as on a
    machine where the toolkit is installed elsewhere): the same cubin, byte for byte, with its line
    info still there, and the same record."""
    import subprocess

    dryrun = subprocess.run(["nvcc", "--dryrun", "-ptx", "x.cu"], capture_output=True, text=True).stderr
    toolkit = Path(re.search(r"^#\$ TOP=(.+)$", dryrun, re.M)[1]).resolve()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cuda").symlink_to(toolkit)
    records = []
    for i, folder in enumerate([tmp_path / "a", tmp_path / "deeper" / "clone"]):
        shutil.copytree(ROOT / "kernels", folder / "kernels")
        for source in (folder / "kernels").iterdir():
            os.utime(source, (1e9 + i * 1e6, 1e9 + i * 1e6))
        monkeypatch.chdir(folder)
        if i:
            monkeypatch.setenv("PATH", f"{tmp_path / 'elsewhere' / 'cuda' / 'bin'}{os.pathsep}{os.environ['PATH']}")
        records.append(compile_kernel("v14", "kernels/v14.cu", "sm_90a", settings.nvcc_flags, {}, "build/v14.cubin"))
        assert str(folder) not in (folder / "build" / "v14.cubin").read_bytes().decode("latin-1")
    assert records[0] == records[1]
    ptx = (folder / "build" / "v14.ptx").read_text()
    assert '.file\t1 "kernels/v14.cu", 1, ' in ptx and '"<cuda>/include/cuda_fp16.hpp", 1, ' in ptx


def test_a_toolkit_header_is_named_alike_whichever_of_the_toolkits_folders_is_the_real_one(tmp_path):
    """One toolkit installed with include/ the real folder and targets/<t>/include a link to it, the
    other the other way round (a wheel's layout, a runfile's): cicc names a header through
    targets/<t>/include either way, and the line info names it alike."""
    from flashbench.compile import reproducible_line_info

    for name, real, link in (("wheel", "include", "targets/x86_64-linux/include"),
                             ("runfile", "targets/x86_64-linux/include", "include")):
        (tmp_path / name / real).mkdir(parents=True)
        (tmp_path / name / real / "cuda_fp16.hpp").write_text("x" * 120)
        (tmp_path / name / link).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name / link).symlink_to(tmp_path / name / real)
        (tmp_path / name / "bin").mkdir()
    lines = [reproducible_line_info(f'\t.file\t4 "{tmp_path / name}/bin/../targets/x86_64-linux/include/cuda_fp16.hpp"\n')
             for name in ("wheel", "runfile")]
    assert lines == ['\t.file\t4 "<cuda>/include/cuda_fp16.hpp", 1, 120\n'] * 2
