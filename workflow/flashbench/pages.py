"""Pages for Snakemake's HTML report (snakemake --report): each markdown report as one HTML page, its
figures inside it, and each table as an HTML table.

Snakemake's report shows an item in the page only where it is an image, HTML or PDF (anything else it
offers as a download), and shows HTML in an iframe whose source is the page itself as a data: URI,
where no relative path resolves: so each figure travels inside its page, as a data: URI too.
"""
from __future__ import annotations

import base64
import html
import mimetypes
import re
import xml.etree.ElementTree as etree
from pathlib import Path

import markdown
import pandas as pd
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor

from . import FlashbenchError

STYLE = """
body { font-family: system-ui, sans-serif; font-size: 15px; line-height: 1.45; max-width: 1640px;
       margin: 1em auto; padding: 0 1em; color: #1a1a1a; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 13px; }
th, td { border: 1px solid #c8c8c8; padding: 0.25em 0.5em; vertical-align: top; }
th { background: #f0f0f0; }
tr:nth-child(even) td { background: #fafafa; }
td { font-variant-numeric: tabular-nums; }
img { max-width: 100%; height: auto; }
code { font-size: 0.92em; background: #f3f3f3; padding: 0 0.2em; }
"""


def data_uri(path: Path) -> str:
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"


class _EmbedImages(Treeprocessor):
    """Each <img> whose source is a file beside the markdown gets that file as a data: URI; a link to
    a file beside it (another report) becomes its text, since no relative link leads anywhere from a
    data: URI (the report it names is an item of Snakemake's report too)."""

    def __init__(self, md, folder: Path):
        super().__init__(md)
        self.folder = folder

    def run(self, root: etree.Element) -> None:
        for img in root.iter("img"):
            path = self.folder / img.get("src", "")
            if not path.is_file():
                raise FlashbenchError(f"{self.folder}: the figure {img.get('src')!r} the report shows is not there")
            img.set("src", data_uri(path))
        for link in root.iter("a"):
            if "://" not in link.get("href", "://"):
                link.tag = "span"
                link.set("title", f"{(self.folder / link.attrib.pop('href')).as_posix()}: an item of this report")


class EmbedImages(Extension):
    def __init__(self, folder: Path):
        super().__init__()
        self.folder = folder

    def extendMarkdown(self, md) -> None:
        md.treeprocessors.register(_EmbedImages(md, self.folder), "embed_images", 0)


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{html.escape(title)}</title>\n"
            f"<style>{STYLE}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n")


def markdown_page(source: Path | str) -> str:
    """A markdown report as a page of its own, its figures (files beside it) inside it."""
    source = Path(source)
    try:
        text = source.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise FlashbenchError(f"{source}: cannot be read as a markdown report ({e})") from None
    body = markdown.markdown(text, extensions=["tables", EmbedImages(source.parent)], output_format="html")
    return page(str(source), body)


def table_page(source: Path | str) -> str:
    """A CSV table as an HTML table, every row and column, empty cells left empty; no whitespace between
    its tags (pandas indents every cell: summary.csv of twenty configurations made a 1.8 MB page, above
    the 2 MB a browser shows once Snakemake's report makes it a base64 URL)."""
    source = Path(source)
    try:
        table = pd.read_csv(source, keep_default_na=False, dtype=str)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise FlashbenchError(f"{source}: cannot be read as a table ({e})") from None
    compact = re.sub(r">\s+<", "><", table.to_html(index=False, border=0, escape=True))
    body = f"<h1>{html.escape(str(source))}</h1>\n" + compact
    return page(str(source), body)


def absent_page(table: str) -> str:
    """The page of a table the run did not make (a run without the stages that write it)."""
    body = (f"<h1>{html.escape(table)}.csv</h1>\n<p>Not in this archive: its run had no {html.escape(table)} "
            f"stage (config.yaml asks for it).</p>")
    return page(f"{table}.csv", body)


def render(source: Path | str) -> str:
    """The page of a markdown report (.md) or a table (.csv)."""
    suffix = Path(source).suffix
    if suffix == ".md":
        return markdown_page(source)
    if suffix == ".csv":
        return table_page(source)
    raise FlashbenchError(f"{source}: no page for a {suffix or 'suffix-less'} file (a .md report or a .csv table)")
