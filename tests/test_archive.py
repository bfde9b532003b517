"""What guards the archive without Snakemake: whole-or-nothing writes, folders that are no archive,
the report's commit, one-line errors from the command line, and builds that are the same in any
checkout."""
import fcntl
import json
import os
import re
import shutil
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


def test_the_archived_report_names_the_commit_of_its_records():
    provenance = read_json(ARCHIVE / "check" / "v11.json")["provenance"]
    hopper = (ROOT / "reports" / "nvidia-h200" / "hopper.md").read_text()
    assert f"Measured at commit {gpu.measured_commit(provenance)}" in hopper


def bad_invocations(tmp_path, settings_file):
    no_passed = tmp_path / "no-passed.json"  # a check record without `passed`
    edited = tmp_path / "edited" / Path(settings_file).name  # a settings file changed since the workflow wrote it
    s = ["--settings", settings_file]
    out = ["--out", str(tmp_path / "out.json")]
    compile_args = ["compile", *s, "--arch", "sm_90", "--cubin", str(tmp_path / "x.cubin"), "--record",
                    str(tmp_path / "x.json")]
    return {
        "no settings file": (["check", "--settings", str(tmp_path / "none.json"), "--peer", "sdpa_auto", *out],
                             "none.json: cannot be read"),
        "an edited settings file": (["check", "--settings", str(edited), "--peer", "sdpa_auto", *out],
                                    "is not a settings file the workflow wrote"),
        "a kernel the settings do not run": (compile_args + ["--kernel", "v99"], "no kernel named 'v99' is run"),
        "a peer the settings do not have": (["check", *s, "--peer", "sdpa_nope", *out], "no peer named 'sdpa_nope'"),
        "a head-to-head point the settings do not have": (["head-to-head", *s, "--S", "3000", "--checks", "x.json",
                                                           *out], "the head-to-head has no point at S=3000"),
        "a head-to-head without a contestant's check": (["head-to-head", *s, "--S", "1024", "--checks",
                                                         str(no_passed), *out], "--checks has no check record of the "
                                                                                "contestant v24"),
        "a count that is no number": (["head-to-head", *s, "--S", "big", "--checks", "x.json", *out],
                                      "argument --S: invalid int value: 'big'"),
        "a shape the kernels do not take": (["launch-once", "--cubin", "c", "--record", "r", "--shape",
                                             '{"B": 1, "H": 2, "S": 100, "D": 128}'], "argument --shape: S: 100 is less than"),
        "garbage --shape": (["launch-once", "--cubin", "c", "--record", "r", "--shape", "garbage"],
                            "argument --shape: not JSON"),
        "a missing --check file": (["bench", *s, "--peer", "sdpa_auto", "--check", str(tmp_path / "none.json"), *out],
                                   "none.json: cannot be read \\(No such file or directory\\)"),
        "a check record without passed": (["bench", *s, "--peer", "sdpa_auto", "--check", str(no_passed), *out],
                                          "no-passed.json: key '\\w+': missing"),
        "missing paths to compare": (["compare", "--results", str(tmp_path / "nowhere"), "--template", "t", "--table",
                                      str(tmp_path / "t.md"), "--figure", str(tmp_path / "f.png")],
                                     "nowhere lacks summary.csv"),
        "missing paths to summarize": (["summarize", *s, "--checks", str(tmp_path / "none.json"), "--benches", "b",
                                        "--compiled", "c", "--gpu-arch", "sm_90", "--out-dir", str(tmp_path / "s")],
                                       "none.json: cannot be read"),
        "neither a kernel nor a peer": (["check", *s, *out], "needs --cubin and --record"),
    }


@pytest.mark.parametrize("case", list(bad_invocations(Path("."), "settings.json")))
def test_every_bad_argument_is_one_error_line_and_exit_1(case, tmp_path, capsys, monkeypatch, settings_file):
    monkeypatch.chdir(ROOT)
    (tmp_path / "no-passed.json").write_text('{"kernel": "v11"}')
    edited = tmp_path / "edited" / Path(settings_file).name
    edited.parent.mkdir()
    edited.write_text(Path(settings_file).read_text().replace('"steps": 100', '"steps": 1'))
    argv, message = bad_invocations(tmp_path, settings_file)[case]
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and re.search(message, err), err
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "x.cubin").exists()


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


def test_the_same_source_builds_the_same_cubin_in_any_checkout(tmp_path, settings, needs_nvcc, monkeypatch):
    """Two copies in folders of different depth, their files of different times (as two clones made
    at different times): the same cubin, byte for byte, with its line info still there."""
    hashes = []
    for i, folder in enumerate([tmp_path / "a", tmp_path / "deeper" / "clone"]):
        shutil.copytree(ROOT / "kernels", folder / "kernels")
        for source in (folder / "kernels").iterdir():
            os.utime(source, (1e9 + i * 1e6, 1e9 + i * 1e6))
        monkeypatch.chdir(folder)
        record = compile_kernel("v14", "kernels/v14.cu", "sm_90a", settings.nvcc_flags, {}, "build/v14.cubin")
        hashes.append(record["cubin_sha256"])
        assert str(folder) not in (folder / "build" / "v14.cubin").read_bytes().decode("latin-1")
    assert hashes[0] == hashes[1]
    assert '.file\t1 "kernels/v14.cu", 1, ' in (folder / "build" / "v14.ptx").read_text()
