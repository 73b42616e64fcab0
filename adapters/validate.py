"""Validation of a site profile's data against its schema, and the error explanations.

The schema is ``schemas/site.schema.json`` with the run option keys (the ``pmc``,
``logging`` and ``metrics`` sections) generated from ``pmc.options.OPTIONS`` when it is
loaded, so a profile takes exactly the options ``pmc run`` has. ``validate`` checks the
keys (text only, no alias bomb), the schema, and each run option's value with the
converter ``pmc run`` itself uses; every error names the value (``Where``), the value
and what is allowed (an unknown key lists the valid keys).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import functools
import json
from importlib import resources
from typing import Any

import jsonschema

from pmc import options

from . import schedulers
from .messages import SiteError, Where, path, show


@functools.cache
def schema() -> dict[str, Any]:
    """The profile schema, run options merged in (shared: not to be changed)."""
    text = resources.files("pmc.adapters.schemas").joinpath("site.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    loaded["properties"]["scheduler"]["enum"] = list(schedulers.NAMES)
    for section, props in options.profile_schema().items():
        node = loaded["properties"][section].setdefault("properties", {})
        clash = set(node) & set(props)
        assert not clash, f"site.schema.json defines run option keys {sorted(clash)}"
        node.update(copy.deepcopy(props))
    return loaded


@functools.cache
def _validator() -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema())


def schema_at(key: str) -> dict[str, Any] | None:
    """The schema of a dotted profile key; None when the profile has no such key."""
    root = schema()
    node: dict[str, Any] = root
    for part in key.split("."):
        props = node.get("properties", {})
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            node = root["$defs"][ref.rsplit("/", 1)[1]]
    return node


MAX_VALUES = 100_000  # a site profile has dozens; YAML aliases can expand to billions


def check_keys(data: dict[Any, Any], source: str) -> None:
    """Every mapping key is text (YAML also allows numbers, lists...), and the document is
    not an alias bomb: the values it expands to, counting shared ones every time they are
    referred to, stay few. Iterative, each object visited once."""
    size: dict[int, int] = {}  # id -> expanded number of values below and including it
    stack: list[tuple[object, list[Any], bool]] = [(data, [], False)]
    while stack:
        node, where, children_done = stack.pop()
        if id(node) in size:
            continue
        if isinstance(node, dict):
            items = list(node.items())
        elif isinstance(node, list):
            items = list(enumerate(node))
        else:
            size[id(node)] = 1
            continue
        if children_done:
            total = 1 + sum(size.get(id(v), 1) for _k, v in items)
            if total > MAX_VALUES:
                raise SiteError(f"{source}: {path(where)}: expands to more than "
                                f"{MAX_VALUES} values (YAML aliases?); a profile has dozens")
            size[id(node)] = total
            continue
        stack.append((node, where, True))
        for key, value in items:
            if isinstance(node, dict) and not isinstance(key, str):
                raise SiteError(f"{source}: {path(where)}: keys must be text, got {show(key)}")
            if id(value) not in size:
                stack.append((value, [*where, key], False))


def validate(data: dict[str, Any], where: Where) -> None:
    """Raise ``SiteError`` listing every problem of ``data`` (overrides applied)."""
    errors = sorted(_validator().iter_errors(data),
                    key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        raise SiteError("\n".join(_explain(where, e, schema()) for e in _leaf_errors(errors)))
    for o in options.profile_options():
        assert o.profile is not None
        section, _, key = o.profile.partition(".")
        values = data.get(section, {})
        if key in values:
            try:
                options.check_profile_value(o, values[key])
            except (argparse.ArgumentTypeError, ValueError) as e:
                raise SiteError(f"{where([section, key])}: bad value {show(values[key])}: "
                                f"{e}") from None


def _leaf_errors(errors: list[jsonschema.ValidationError]) -> list[jsonschema.ValidationError]:
    # For oneOf failures the sub-errors only repeat the alternatives: report the
    # oneOf itself once, with its description saying what is allowed.
    seen: set[tuple[str, ...]] = set()
    out = []
    for e in errors:
        key = (*(str(p) for p in e.absolute_path), str(e.validator))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def _subschema(schema: dict[str, Any], e: jsonschema.ValidationError) -> dict[str, Any]:
    sub: dict[str, Any] = e.schema if isinstance(e.schema, dict) else {}
    ref = sub.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved: dict[str, Any] = schema["$defs"][ref.rsplit("/", 1)[1]]
        return resolved
    return sub


# Words YAML 1.1 read as booleans; in a profile (YAML 1.2) they are text.
_YAML11_BOOLS = {"yes", "no", "on", "off", "y", "n"}


def _explain(at: Where, e: jsonschema.ValidationError, schema: dict[str, Any]) -> str:
    parts = list(e.absolute_path)
    where = at(parts)
    sub = _subschema(schema, e)
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        allowed = sorted(sub.get("properties", {}))
        bad = sorted(k for k in e.instance if k not in allowed)
        lines = []
        for k in bad:
            near = difflib.get_close_matches(k, allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            lines.append(
                f"{at([*parts, k])}: unknown key {k!r}{hint}; valid keys: {', '.join(allowed)}"
            )
        return "\n".join(lines)
    if e.validator == "required":
        return f"{where}: {e.message.replace(' is a required property', '')} is required"
    if e.validator == "enum":
        allowed_values = ", ".join(str(v) for v in list(sub.get("enum", [])))
        return f"{where}: bad value {show(e.instance)}; allowed: {allowed_values}"
    if e.validator == "propertyNames" or "propertyNames" in e.absolute_schema_path:
        return (
            f"{where}: bad variable name {show(e.instance)}: letters, digits and _ "
            "only, not starting with a digit"
        )
    if e.validator == "pattern" and isinstance(e.instance, str):
        if "\\n" in str(e.validator_value):
            return (
                f"{where}: bad value {show(e.instance)}: must be one line "
                "(a newline, carriage return or NUL would end the directive)"
            )
        return f"{where}: bad value {show(e.instance)}: must match {e.validator_value}"
    if e.validator == "type":
        expected = e.validator_value
        want = " or ".join(expected) if isinstance(expected, list) else str(expected)
        fix = ""
        if want == "boolean" and str(e.instance).lower() in _YAML11_BOOLS:
            fix = " (write true or false; profiles are YAML 1.2, where yes/no/on/off are text)"
        elif want == "integer" and isinstance(e.instance, str) and ":" in e.instance:
            fix = " (a whole number)"
        return f"{where}: bad value {show(e.instance)}: expected {want}{fix}"
    if e.validator == "oneOf":
        what = sub.get("description") or e.message
        fix = ""
        if isinstance(e.instance, float) and "minutes" in what:
            fix = "; whole minutes only: write 90 or '01:30:00', not 1.5"
        return f"{where}: bad value {show(e.instance)}: expected {what}{fix}"
    if e.validator in ("minimum", "maximum", "minLength", "exclusiveMinimum"):
        limit = {"minimum": "at least", "maximum": "at most", "minLength": "length at least",
                 "exclusiveMinimum": "more than"}
        allowed_text = f"{limit[str(e.validator)]} {e.validator_value}"
        return f"{where}: bad value {show(e.instance)}: must be {allowed_text}"
    return f"{where}: bad value {show(e.instance)}: {e.message}"
