"""The reports' jinja2 templates filled in, every value they put out escaped for markdown."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2
import jinja2.meta

from . import FlashbenchError, markdown


@functools.cache
def _templates(folder: str) -> jinja2.Environment:
    """The templates of one folder, every value they put out escaped for markdown (markdown.text;
    `| code` for a code span). Kept for the process: jinja2 compiles a template once per
    environment (a tenth of a report's render, paid again on every render in a process that renders
    several, as the tests do) and compiles it again when its file changes."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, finalize=markdown.text)
    env.filters["code"] = markdown.code
    env.globals["num"] = _number
    return env


def _number(x, fmt: str = "%.1f") -> str:
    """`num(x)` in a template: a value in `fmt`, or a dash where there is none."""
    return "—" if x is None else fmt % x


def check(template: Path | str) -> None:
    """Before anything is drawn: `template` is a jinja2 template file (.j2) that jinja2 reads; else one
    FlashbenchError naming it."""
    template = Path(template)
    if not template.is_file():
        raise FlashbenchError(f"template {template}: {'is a folder' if template.is_dir() else 'no such file'}")
    if template.suffix != ".j2":
        raise FlashbenchError(f"template {template}: not a jinja2 template (.j2) file")
    try:
        _templates(str(template.parent)).get_template(template.name)
    except jinja2.TemplateSyntaxError as e:
        raise FlashbenchError(f"template {template}: line {e.lineno}: {e.message}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise FlashbenchError(f"template {template}: cannot be read ({e})") from None


def fill(template: Path | str, **context) -> str:
    """A jinja2 template filled in. A name the template uses but is not given is an error: one its
    top level uses (another report's template given) a FlashbenchError naming them, any other (a
    value without a key the template reads) jinja2's own."""
    env, name = _templates(str(Path(template).parent)), Path(template).name
    try:
        return env.get_template(name).render(**context)
    except jinja2.UndefinedError:
        used = jinja2.meta.find_undeclared_variables(env.parse(env.loader.get_source(env, name)[0]))
        missing = sorted(used - set(context) - set(env.globals))
        if missing:
            names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
            raise FlashbenchError(f"template {template} uses {names}, which this report does not have: is it "
                                  "another report's template?") from None
        raise
