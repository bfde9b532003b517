"""Every GPU side by side (reports/README.md, reports/compare.png), from results folders alone."""
import json
import re

import pandas as pd
import pytest

from flashbench import FlashbenchError, gpu, gpu_comparison

import records
from conftest import ROOT
from records import results_folder

TEMPLATE = ROOT / "workflow" / "templates" / "compare.md.j2"
ARCHIVED = sorted(p.parent for p in (ROOT / "results").glob("*/summary.csv"))


def table(text: str) -> dict:
    """The comparison's rows, {kernel: [cells]}, read back from its markdown."""
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return {re.sub(r" \(.*\)$", "", row[0].strip()): [c.strip() for c in row[1:]] for row in rows[1:]}


def measured(results_dir) -> dict:
    """Each kernel's and peer's TFLOPS at the case, as summary.csv holds them (check rows, 100-step), in
    the case's configuration (the first: the comparison's)."""
    import json

    summary = pd.read_csv(results_dir / "summary.csv")
    configurations = json.loads((results_dir / "kernels.json").read_text()).get("configurations")
    if configurations:
        summary = summary[summary.config == configurations[0]["name"]]
    case = summary[(summary.series == "check") & summary.is_case & summary.tflops.notna()]
    return {r.kernel: f"{r.tflops:.1f}" for r in case.itertuples()}


def test_the_archived_comparison_is_what_the_archived_results_render_to(tmp_path, settings):
    """reports/README.md is generated, never edited: every archived GPU's column is its summary.csv."""
    path = gpu_comparison.render(ARCHIVED, TEMPLATE, tmp_path / "README.md", tmp_path / "compare.png")
    text = path.read_text()
    assert text == (ROOT / "reports" / "README.md").read_text(), "reports/README.md differs: run `snakemake report`"
    assert (tmp_path / "compare.png").stat().st_size > 1000
    rows = table(text)
    for i, results_dir in enumerate(ARCHIVED):
        assert f"({results_dir.name}/report.md)" in text
        timed = measured(results_dir)
        assert {name: cells[i] for name, cells in rows.items() if name in timed} == timed
    # the write-up's column is config's, for every kernel an archive holds (a version added since the
    # last archive has no row until a GPU runs it)
    published = {k.name: k.published_tflops for k in settings.kernels + settings.peers}
    assert set(rows) <= set(published)
    assert {name: cells[-1] for name, cells in rows.items()} == {
        name: f"{published[name]:.2f}" if published[name] is not None else "—" for name in rows}


def test_two_gpus_side_by_side(tmp_path):
    first = results_folder(tmp_path / "a", records.LIKE_THE_WRITEUP, slug="gpu-a")
    second = results_folder(tmp_path / "b", {**records.LIKE_THE_WRITEUP, "v11": 300.0}, failing="v12",
                            skipped="sdpa_auto", slug="gpu-b")
    reports = tmp_path / "reports"
    text = gpu_comparison.render([first, second], TEMPLATE, reports / "README.md", reports / "compare.png").read_text()
    assert (reports / "compare.png").stat().st_size > 1000
    # both are an NVIDIA H200 (records.provenance): the folder tells them apart
    assert ("| kernel | [NVIDIA H200 (gpu-a)](gpu-a/report.md) | [NVIDIA H200 (gpu-b)](gpu-b/report.md) "
            "| write-up, B300 |") in text
    rows = table(text)
    assert list(rows) == [k["name"] for k in records.KERNELS + records.PEERS]
    assert {name: cells[0] for name, cells in rows.items()} == measured(first)
    assert {name: cells[1] for name, cells in rows.items() if name in measured(second)} == measured(second)
    assert rows["v11"] == ["144.0", "300.0", "144.41"]
    assert rows["v12"][1] == "failed check" and rows["sdpa_auto"][1] == "skipped"
    assert "![TFLOPS per kernel and peer on each GPU, and the write-up's B300](compare.png)" in text


def test_a_kernel_one_gpu_did_not_run_is_a_dash(tmp_path):
    both = results_folder(tmp_path / "a", records.LIKE_THE_WRITEUP, slug="gpu-a")
    meta = (both / "kernels.json").read_text()
    fewer = tmp_path / "b" / "results" / "gpu-b"
    fewer.mkdir(parents=True)
    summary = pd.read_csv(both / "summary.csv")
    summary[summary.kernel != "br128"].to_csv(fewer / "summary.csv", index=False)
    trimmed = json.loads(meta)
    trimmed["kernels"] = [k for k in trimmed["kernels"] if k["name"] != "br128"]
    (fewer / "kernels.json").write_text(json.dumps(trimmed))
    text = gpu_comparison.render([fewer, both], TEMPLATE, tmp_path / "README.md", tmp_path / "compare.png").read_text()
    assert table(text)["br128"] == ["—", "199.0", "198.96"]


def test_no_gpu_archived_yet(tmp_path):
    text = gpu_comparison.render([], TEMPLATE, tmp_path / "README.md", tmp_path / "compare.png").read_text()
    assert "No GPU is archived under `results/` yet" in text and (tmp_path / "compare.png").exists()


def test_a_run_given_its_commit_is_measured_at_that_commit():
    """A copied working tree may carry a stale git: the commit the run was told it is made from is the
    commit, and git's own answer is named beside it."""
    assert gpu.commits([{"git_commit": "abc123"}]) == {"measured": ["abc123"], "git_said": []}
    assert gpu.commits([{"git_commit": "abc123+dirty", "given_commit": "def456"}]) == {
        "measured": ["def456"], "git_said": ["abc123+dirty"]}


def test_a_results_folder_given_twice_is_refused_before_anything_is_written(tmp_path):
    first = results_folder(tmp_path / "a", records.LIKE_THE_WRITEUP, slug="gpu-a")
    reports = tmp_path / "reports"
    with pytest.raises(FlashbenchError, match=r"gpu-a given twice: each GPU's results once, one column each$"):
        gpu_comparison.render([first, first / ".." / "gpu-a"], TEMPLATE, reports / "README.md",
                              reports / "compare.png")
    assert not reports.exists()
