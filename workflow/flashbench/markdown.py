"""Text from config and records in the reports' markdown. Every value a template puts out passes
through `text` (the templates' finalize): it cannot end a table cell (`|`), a line (a line break
becomes a space), open HTML (a `<` or `&` that would start a tag, an autolink or an entity) or make a
link or an image (`[` and `]`: without them `](javascript:...)` and `![` are text). Inside a code
span, where markdown shows everything as written, `code` makes the span instead, fenced so that no
backtick in the text can end it."""
from __future__ import annotations

import re

from markupsafe import Markup

_SPECIAL = {"\\": "\\\\", "|": "\\|", "&": "&amp;", "<": "&lt;", "[": "\\[", "]": "\\]"}
# A `<` opens HTML (a tag, comment, declaration or autolink) only before a letter, / ! or ?, and an `&`
# an entity only before a letter or #: the others ("<= 128", "Q & K") stay as written.
_SPECIAL_RE = re.compile(r"\\|\||&(?=[A-Za-z#])|<(?=[A-Za-z/!?])|\[|\]")


def _one_line(value: str) -> str:
    return " ".join(value.splitlines())


def text(value):
    """A value as the template puts it out: a string escaped (not one `code` made), anything else as it is."""
    if isinstance(value, Markup) or not isinstance(value, str):
        return value
    return _SPECIAL_RE.sub(lambda m: _SPECIAL[m[0]], _one_line(value))


def code(value) -> Markup:
    """`value` as one inline code span, outside a table (a table cell needs `text`'s `\\|`)."""
    body = _one_line(str(value))
    fence = "`" * (max(map(len, re.findall("`+", body)), default=0) + 1)
    pad = " " if body.startswith("`") or body.endswith("`") else ""
    return Markup(f"{fence}{pad}{body}{pad}{fence}")
