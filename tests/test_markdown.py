"""Text from config and records is escaped in every report: it cannot break a table, a line or a list,
nor inject HTML, a link or an image."""
import json
import re

import markdown as python_markdown
import pandas as pd
import pytest

from flashbench import gpu_comparison, gpu_reports, markdown

import records
from conftest import ROOT, shipped_settings

TEMPLATES = ROOT / "workflow" / "templates"
GOAL = shipped_settings().goal  # the Hopper report's
EVIL_CHANGE = "fused | unfused\nnext line <script>alert(1)</script> &amp; <!-- c -->"
EVIL_NAME = "<img src=x onerror=alert(1)>"
ESCAPED_CHANGE = "fused \\| unfused next line &lt;script>alert(1)&lt;/script> &amp;amp; &lt;!-- c -->"


def test_text_escapes_what_would_break_a_table_a_line_or_open_html():
    assert markdown.text(EVIL_CHANGE) == ESCAPED_CHANGE
    assert markdown.text("a \\| b") == "a \\\\\\| b"  # a backslash of its own cannot unescape the pipe
    assert markdown.text("P = 2^(<= t), Q & K, v11 -> v12") == "P = 2^(<= t), Q & K, v11 -> v12"  # no HTML there
    assert markdown.text(210.0) == 210.0 and markdown.text(None) is None


def test_text_escapes_the_brackets_of_a_link_or_an_image():
    assert markdown.text("[x](javascript:alert(1))") == "\\[x\\](javascript:alert(1))"
    assert markdown.text("![x](javascript:alert(1))") == "!\\[x\\](javascript:alert(1))"  # no [: no image
    assert markdown.text("[x][ref] [ref]: javascript:alert(1)") == "\\[x\\]\\[ref\\] \\[ref\\]: javascript:alert(1)"
    assert markdown.text("<javascript:alert(1)>") == "&lt;javascript:alert(1)>"  # no autolink either
    assert markdown.text("\\[x](y)") == "\\\\\\[x\\](y)"  # a backslash of its own cannot unescape the bracket


def test_a_code_span_shows_its_text_as_written_and_cannot_be_ended_early():
    assert markdown.code("if (a && b < c) {") == "`if (a && b < c) {`"
    assert markdown.code("x = `y` +\n1") == "``x = `y` + 1``"
    assert markdown.code("`tick") == "`` `tick ``"


def table_rows(text: str) -> list[list[str]]:
    """Every markdown table of `text` as its rows' cell counts (a pipe escaped with \\ is no border)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            current.append(len(re.split(r"(?<!\\)\|", line)))
        elif current:
            tables.append(current)
            current = []
    return tables


EVIL_GPU = "NVIDIA H200 [click](javascript:alert(1)) ![seen](javascript:alert(2))"


@pytest.fixture(scope="module")
def evil_reports(tmp_path_factory):
    """Every report (report.md, hopper.md, README.md) rendered once, for the tests below, from records
    whose text would break a table, a line or a list, or inject HTML, a link or an image: v12's and v14's
    change, a peer's name no config allows (as an edited archive would carry it), and the GPU's name."""
    tmp = tmp_path_factory.mktemp("evil")
    kernels = [{**k, "change": EVIL_CHANGE} if k["name"] in ("v12", "v14") else k
               for k in records.KERNELS + records.HOPPER]
    out = records.results_folder(tmp, {**records.LIKE_THE_WRITEUP, "v14": 400.0, "v15": 450.0}, kernels=kernels)
    # a name no config allows, as an edited archive would carry it
    for table in ("summary.csv", "cycles.csv"):
        rows = pd.read_csv(out / table)
        rows.loc[rows.kernel == "unfused", "kernel"] = EVIL_NAME
        rows.to_csv(out / table, index=False)
    meta = json.loads((out / "kernels.json").read_text())
    next(k for k in meta["kernels"] if k["name"] == "unfused")["name"] = EVIL_NAME
    for k in meta["kernels"]:
        if k["provenance"]:
            k["provenance"]["gpu"] = EVIL_GPU
    (out / "kernels.json").write_text(json.dumps(meta))

    reports = tmp / "reports"
    gpu_reports.render(out, reports, TEMPLATES / "report.md.j2", "nvidia-h200", GOAL)
    gpu_comparison.render([out], TEMPLATES / "compare.md.j2", reports / "README.md", reports / "compare.png")
    return reports


def test_every_report_escapes_text_from_config_and_records(evil_reports):
    reports = evil_reports
    for name in ("report.md", "hopper.md", "README.md"):
        text = (reports / name).read_text()
        assert "<script" not in text and "<img" not in text and "<!--" not in text, name
        for rows in table_rows(text):
            assert len(set(rows)) == 1, (name, rows)  # every row of a table has the header's cells
    assert f"| v12 | {ESCAPED_CHANGE} | **219.0** |" in (reports / "report.md").read_text()
    assert f"| v14 | {ESCAPED_CHANGE} | **400.0** |" in (reports / "hopper.md").read_text()
    assert "| &lt;img src=x onerror=alert(1)> (peer) | 120.0 | 156.50 |" in (reports / "README.md").read_text()


def test_no_report_makes_a_link_or_an_image_of_a_gpus_name(evil_reports):
    reports = evil_reports
    for name in ("report.md", "hopper.md", "README.md"):
        text = (reports / name).read_text()
        assert "[click\\](javascript:alert(1))" in text, name
        page = python_markdown.markdown(text, extensions=["tables"])
        assert "javascript" not in "".join(re.findall(r'(?:href|src)="[^"]*"', page)), name
