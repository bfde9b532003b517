"""The pages of Snakemake's HTML report: markdown reports with their figures inside, tables as tables."""
import base64

import pytest

from flashbench import FlashbenchError, pages

PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")


def test_a_report_page_holds_its_tables_and_figures_and_no_dead_links(tmp_path):
    (tmp_path / "tflops.png").write_bytes(PNG)
    report = tmp_path / "report.md"
    report.write_text("# Title\n\nSee [the other report](other/report.md) or [the web](https://example.org).\n\n"
                      "| kernel | TFLOPS |\n|---|---:|\n| v11 | **141.1** |\n\n![TFLOPS per kernel](tflops.png)\n")
    page = pages.render(report)
    assert page.startswith("<!DOCTYPE html>") and f"<title>{report}</title>" in page
    assert '<td>v11</td>\n<td style="text-align: right;"><strong>141.1</strong></td>' in page
    assert f'<img alt="TFLOPS per kernel" src="data:image/png;base64,{base64.b64encode(PNG).decode()}"' in page
    assert f'<span title="{tmp_path.as_posix()}/other/report.md: an item of this report">the other report</span>' in page
    assert '<a href="https://example.org">the web</a>' in page


def test_a_report_whose_figure_is_missing_is_refused(tmp_path):
    report = tmp_path / "report.md"
    report.write_text("![TFLOPS](tflops.png)\n")
    with pytest.raises(FlashbenchError, match="the figure 'tflops.png' the report shows is not there"):
        pages.render(report)


def test_a_table_page_shows_every_row_and_column_as_written(tmp_path):
    table = tmp_path / "summary.csv"
    table.write_text("kernel,tflops,reason\nv11,141.10,\nunfused,,above max_seq_len <4096>\n")
    page = pages.render(table)
    assert "<th>kernel</th><th>tflops</th><th>reason</th>" in page  # no whitespace between the tags
    assert "<td>v11</td><td>141.10</td><td></td>" in page  # as written: no NaN, no reformatting
    assert "<td>above max_seq_len &lt;4096&gt;</td>" in page


def test_only_reports_and_tables_have_pages(tmp_path):
    with pytest.raises(FlashbenchError, match="no page for a .png file"):
        pages.render(tmp_path / "tflops.png")
