"""JSON Schema (Draft 2020-12) as the pipeline applies it to config.yaml and to its records: a
`number` is a finite number (YAML's .nan and .inf, and Python's, are not numbers here: no comparison
keyword can reject NaN, which compares false with everything), and an error is one line naming the
key it is about."""
from __future__ import annotations

import functools
import math
from pathlib import Path

import jsonschema
import yaml

FOLDER = Path(__file__).resolve().parents[1] / "schemas"


def _finite_number(checker, instance) -> bool:
    return jsonschema.Draft202012Validator.TYPE_CHECKER.is_type(instance, "number") and math.isfinite(instance)


def _whole_number(checker, instance) -> bool:
    """An integer as written: 1024, not 1024.0 (which Draft 2020-12 counts as one, and which would reach a
    file name or a range() as a float)."""
    return isinstance(instance, int) and not isinstance(instance, bool)


Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many(
        {"number": _finite_number, "integer": _whole_number}),
)


class SafeLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """libyaml's safe loader where PyYAML was built with it (its wheels are: the same documents, parsed about
    ten times faster than by the pure-Python one, which a dry run would spend a third of its time in), that
    refuses a key given twice in one mapping, which safe_load lets the last one win."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: merged below, its keys overridable
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
            except TypeError:  # an unhashable key: the constructor below says so
                continue
            if twice:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str):
    """A YAML document as yaml.safe_load parses it, but for a key given twice in a mapping: refused."""
    return yaml.load(text, Loader=SafeLoader)


@functools.cache
def load(name: str) -> dict:
    """workflow/schemas/<name>.schema.yaml, parsed once per process (callers only read it)."""
    return parse_yaml((FOLDER / f"{name}.schema.yaml").read_text())


def key_name(path) -> str:
    """A path into a document as one key: check.shapes[1].S."""
    key = ""
    for part in path:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "(top level)"


def first_error(validator, instance) -> tuple[str, str] | None:
    """The first error (the shallowest, then by key) as (key, message), or None where it is valid."""
    errors = sorted(validator.iter_errors(instance), key=lambda e: (len(e.path), list(map(str, e.path))))
    if not errors:
        return None
    e = errors[0]
    while e.validator == "oneOf" and isinstance(e.instance, (list, dict)):  # a shape or a list of them, say:
        inside = [c for c in e.context if c.path or c.validator != "type"]  # the error inside its own form's
        if not inside:
            break
        e = min(inside, key=lambda c: (len(c.path), list(map(str, c.path))))
    path, message = list(e.absolute_path), e.message
    if e.validator == "required":  # name the missing key itself
        path.append(next(k for k in e.validator_value if k not in e.instance))
        message = "missing"
    elif e.validator == "const" and "description" in e.schema:  # a fixed value: its description says why
        message = f"must be {e.validator_value!r}, not {e.instance!r}: {e.schema['description']}"
    elif e.validator == "not" and "description" in e.schema:  # a value ruled out: its description says why
        message = f"{e.instance!r} is not allowed: {e.schema['description']}"
    elif e.validator == "anyOf" and "description" in e.schema:  # outside a closed set: its description says what is in it
        message = f"{e.instance!r} is not allowed: {e.schema['description']}"
    elif e.validator == "type" and isinstance(e.instance, float) and not math.isfinite(e.instance):
        message = f"{e.instance} is not a finite number"
    return key_name(path), message
