"""YAML read as written: PyYAML with the YAML 1.2 core schema's implicit types
(``12:00:00`` is text, not the YAML 1.1 sexagesimal 43200; ``yes`` is text; ``010`` is
ten), a key given twice in a mapping refused, environment values kept as their text,
and every failure (bad YAML, too deep, too big a number) a ``SiteError`` naming the
file and line."""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

from .messages import SiteError, path


class ProfileLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the YAML 1.2 core schema's implicit types.

    PyYAML implements YAML 1.1, where an unquoted ``12:00:00`` is the base-60 number
    43200, ``1:00:00`` is 3600, ``010`` is octal 8 and ``yes``/``on`` are true. A
    profile is read as written instead: only ``true``/``false``, ``null``/``~``,
    decimal, ``0o`` and ``0x`` integers and plain decimal floats are typed; everything
    else is text. Merge keys (``<<``) are kept: they are common in hand-written YAML.
    """

    yaml_implicit_resolvers: dict[str | None, list[tuple[str, re.Pattern[str]]]] = {}


def _resolver(tag: str, pattern: str, first: str) -> None:
    ProfileLoader.add_implicit_resolver(f"tag:yaml.org,2002:{tag}", re.compile(pattern), first)


_resolver("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF")
# int before float: a plain decimal integer also matches the float pattern.
_resolver("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789")
_resolver(
    "float",
    r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
    "-+.0123456789",
)
_resolver("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""])  # type: ignore[arg-type]
_resolver("merge", r"^(?:<<)$", "<")


def _construct_int(loader: yaml.SafeLoader, node: yaml.Node) -> int:
    text = str(loader.construct_scalar(node))  # type: ignore[arg-type]
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)  # leading zeros are decimal in YAML 1.2


def _construct_float(loader: yaml.SafeLoader, node: yaml.Node) -> float:
    text = str(loader.construct_scalar(node)).lower()  # type: ignore[arg-type]
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


def _construct_bool(loader: yaml.SafeLoader, node: yaml.Node) -> bool:
    return str(loader.construct_scalar(node)).lower() == "true"  # type: ignore[arg-type]


ProfileLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
ProfileLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)
ProfileLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)


def _duplicate_keys(root: yaml.Node, source: str) -> None:
    """A key given twice in one mapping is an error (PyYAML keeps the last silently,
    so a profile would not be read as written). Each node is visited once: aliases
    share nodes."""
    seen: set[int] = set()
    stack: list[tuple[yaml.Node, list[Any]]] = [(root, [])]
    while stack:
        node, where = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[str, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in lines:
                        raise SiteError(
                            f"{source}:{line}: {path([*where, key.value])}: given twice "
                            f"(first on line {lines[key.value]}); keep one"
                        )
                    lines[key.value] = line
                    stack.append((value, [*where, key.value]))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, [*where, i]) for i, item in enumerate(node.value))


def _environment_as_written(root: yaml.Node, data: dict[str, Any]) -> None:
    """Environment values are exported as text: keep the text of plain numbers and
    booleans as written (``1.10`` stays ``1.10``, not ``1.1``; ``true`` stays ``true``)."""
    env = data.get("environment")
    if not isinstance(root, yaml.MappingNode) or not isinstance(env, dict):
        return
    typed = ("int", "float", "bool")
    for key, value in root.value:
        if not (
            isinstance(key, yaml.ScalarNode)
            and key.value == "environment"
            and isinstance(value, yaml.MappingNode)
        ):
            continue
        for k, v in value.value:
            if (
                isinstance(k, yaml.ScalarNode)
                and isinstance(v, yaml.ScalarNode)
                and v.tag.rsplit(":", 1)[-1] in typed
                and k.value in env
            ):
                env[k.value] = v.value


def load_yaml(text: str, source: str) -> Any:
    """YAML text read as written (see ``ProfileLoader``); errors as ``SiteError``."""
    loader: ProfileLoader | None = None
    try:
        # The constructor already reads the text: a character YAML does not allow (a
        # control character, a lone surrogate) is refused here, as a YAMLError too.
        loader = ProfileLoader(text)
        root = loader.get_single_node()
        if root is None:
            return None
        _duplicate_keys(root, source)
        data = loader.construct_document(root)
        if isinstance(data, dict):
            _environment_as_written(root, data)
        return data
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(e, "problem", None) or str(e)
        raise SiteError(f"{where}: not valid YAML: {problem}") from e
    except RecursionError:
        raise SiteError(f"{source}: not a usable profile: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise SiteError(f"{source}: not a usable profile: {e}") from None
    finally:
        if loader is not None:
            loader.dispose()

