"""The reports' jinja2 templates filled in, every value they put out escaped for markdown."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from . import markdown


@functools.cache
def _templates(folder: str) -> jinja2.Environment:
    """The templates of one folder, every value they put out escaped for markdown (markdown.text;
    `| code` for a code span). Kept for the process: jinja2 compiles a template once per
    environment (a tenth of a report's render, paid again on every render in a process that renders
    several, as the tests do) and compiles it again when its file changes."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, finalize=markdown.text)
    env.filters["code"] = markdown.code
    return env


def fill(template: Path | str, **context) -> str:
    """A jinja2 template filled in; a name the template uses but is not given is an error."""
    return _templates(str(Path(template).parent)).get_template(Path(template).name).render(**context)
