"""Site profiles: load a YAML profile, apply command-line overrides, validate it against
``schemas/site.schema.json`` and turn it into a typed, immutable ``Site``.

Owns the profile format and its error messages: every error names the file (or the
command-line option) and the YAML path of the bad value, the value and what is allowed
(an unknown key lists the valid keys). Profiles are read as written: YAML 1.2 scalars
(``12:00:00`` is text, not the YAML 1.1 sexagesimal number 43200; ``yes`` is text, not
true; ``010`` is ten), a key given twice is an error, and a duration that could be read
two ways is refused with both readings. Also owns where the default profile is found
(``$PMC_SITE``, then ``$XDG_CONFIG_HOME/pmc/site.yaml``). Knows nothing about schedulers
beyond their names; adapters/ renders scripts.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import reprlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEDULERS = ("slurm", "pbs", "loadleveler", "local")
LAUNCHERS = ("srun", "mpiexec", "aprun", "poe")
DEFAULT_LAUNCHER = {"slurm": "srun", "pbs": "mpiexec", "loadleveler": "poe", "local": "mpiexec"}


class SiteError(Exception):
    """A profile that cannot be used; ``str()`` is the one message for the user."""


@dataclass(frozen=True)
class Container:
    image: str
    runtime: str = "apptainer"
    binds: tuple[str, ...] = ()
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class Site:
    """A validated site profile. Durations are seconds, memory is MB."""

    name: str
    scheduler: str
    launcher: str
    source: str = "<profile>"
    flavor: str = "pro"
    launcher_args: tuple[str, ...] = ()
    job_name: str | None = None
    account: str | None = None
    queue: str | None = None
    qos: str | None = None
    walltime: int | None = None
    walltime_margin: int | None = None
    nodes: int = 1
    ranks_per_node: int = 2
    cpus_per_rank: int = 1
    host_cpus: int | None = None
    host_memory: int | None = None
    reservation: str | None = None
    constraint: str | None = None
    node_usage: str | None = None
    output: str | None = None
    error: str | None = None
    environment: tuple[tuple[str, str], ...] = ()
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    container: Container | None = None
    pmc: dict[str, Any] = field(default_factory=dict)
    logging: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    directives: tuple[str, ...] = ()

    @property
    def ranks(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def margin(self) -> int | None:
        """Seconds kept free at the end of the allocation (None without a walltime)."""
        if self.walltime is None:
            return None
        if self.walltime_margin is not None:
            return self.walltime_margin
        return int(min(max(self.walltime * 0.1, 60), 600, self.walltime / 2))

    @property
    def max_wall_time_minutes(self) -> float | None:
        """The ``--max-wall-time`` for pmc run: the walltime less the margin."""
        if self.walltime is None or self.margin is None:
            return None
        return (self.walltime - self.margin) / 60


def _schema() -> dict[str, Any]:
    text = resources.files("pmc.adapters.schemas").joinpath("site.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


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
                            f"{source}:{line}: {_path([*where, key.value])}: given twice "
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


@dataclass(frozen=True)
class Override:
    """One command-line change to a profile: ``label`` is how errors name it
    (``--walltime``, ``--set pmc.tries``), ``key`` the dotted profile key."""

    label: str
    key: str
    value: object


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")


def _schema_at(key: str) -> dict[str, Any] | None:
    schema = _schema()
    node: dict[str, Any] = schema
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
            node = schema["$defs"][ref.rsplit("/", 1)[1]]
    return node


def _accepts_text(sub: dict[str, Any]) -> bool:
    types: list[Any] = []
    for alt in [sub, *sub.get("oneOf", [])]:
        t = alt.get("type")
        types += t if isinstance(t, list) else [t]
    if "enum" in sub:
        return all(isinstance(v, str) for v in sub["enum"])
    return "string" in types


def override(label: str, key: str, text: str) -> Override:
    """An override from command-line text. Keys whose values may be text (queue,
    walltime, environment values...) take the text as it is; others (nodes, lists,
    booleans) read it as a YAML 1.2 value, so ``--set nodes=4`` is the number 4 and
    ``--set modules=[a,b]`` a list. Validation happens with the whole profile."""
    if not _KEY.match(key):
        raise SiteError(f"{label}: bad key {key!r}: expected a profile key such as "
                        "walltime or pmc.tries")
    sub = _schema_at(key)
    if sub is not None and _accepts_text(sub):
        return Override(label, key, text)
    return Override(label, key, load_yaml(text, label))


def parse_set(text: str) -> Override:
    """``--set KEY=VALUE``."""
    key, eq, value = text.partition("=")
    if not eq:
        raise SiteError(f"--set {text}: expected KEY=VALUE, e.g. --set pmc.tries=3")
    return override(f"--set {key}", key, value)


def _apply(data: dict[str, Any], overrides: Sequence[Override], source: str) -> dict[str, Any]:
    data = dict(data)
    for o in overrides:
        parts = o.key.split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise SiteError(
                    f"{o.label}: {_path(parts[: i + 1])} in {source} is "
                    f"{_show(child)}, not a mapping of keys"
                )
            else:
                child = dict(child)  # copy: the loaded profile is left as it was
            node[part] = child
            node = child
        node[parts[-1]] = o.value
    return data


def default_site_path(environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
    """The profile to use without ``--site``, and where that choice came from:
    ``$PMC_SITE``, else ``$XDG_CONFIG_HOME/pmc/site.yaml`` (``~/.config`` by default)
    when it exists."""
    env = os.environ if environ is None else environ
    if env.get("PMC_SITE"):
        return env["PMC_SITE"], "$PMC_SITE"
    config = env.get("XDG_CONFIG_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".config"
    )
    path = os.path.join(config, "pmc", "site.yaml")
    if os.path.isfile(path):
        return path, "the user's config directory"
    return None


def load_site(path: str | Path, overrides: Sequence[Override] = ()) -> Site:
    """Read the profile at ``path``, apply ``overrides``, validate and convert."""
    source = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise SiteError(f"{source}: cannot read site profile: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise SiteError(f"{source}:{line}: not UTF-8 text (byte {raw[e.start]:#04x})") from None
    return parse_site(load_yaml(text, source), source, overrides)


def parse_site(data: object, source: str = "<profile>", overrides: Sequence[Override] = ()) -> Site:
    """Validate already-parsed YAML ``data`` (with ``overrides`` applied) and convert it."""
    if not isinstance(data, dict):
        raise SiteError(f"{source}: a site profile is a mapping of keys, got {_show(data)}")
    _check_keys(data, source)
    data = _apply(data, overrides, source)
    where = _Where(source, {tuple(o.key.split(".")): o.label for o in overrides})
    schema = _schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        raise SiteError("\n".join(_explain(where, e, schema) for e in _leaf_errors(errors)))
    return _convert(data, source, where)


class _Where:
    """How an error names a value: ``FILE: yaml.path``, or the command-line option that
    set it (``--set pmc.tries``, ``--walltime``)."""

    def __init__(self, source: str, origins: dict[tuple[str, ...], str]) -> None:
        self.source = source
        self.origins = origins

    def __call__(self, parts: Sequence[Any]) -> str:
        key = tuple(str(p) for p in parts)
        for n in range(len(key), 0, -1):
            label = self.origins.get(key[:n])
            if label is not None:
                return label if n == len(key) else f"{label}: {_path(list(parts))}"
        return f"{self.source}: {_path(list(parts))}"


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


def _path(parts: list[Any]) -> str:
    text = ""
    for p in parts:
        text += f"[{p}]" if isinstance(p, int) else (f".{p}" if text else str(p))
    return text or "(top level)"


MAX_VALUES = 100_000  # a site profile has dozens; YAML aliases can expand to billions


def _check_keys(data: dict[Any, Any], source: str) -> None:
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
                raise SiteError(f"{source}: {_path(where)}: expands to more than "
                                f"{MAX_VALUES} values (YAML aliases?); a profile has dozens")
            size[id(node)] = total
            continue
        stack.append((node, where, True))
        for key, value in items:
            if isinstance(node, dict) and not isinstance(key, str):
                raise SiteError(f"{source}: {_path(where)}: keys must be text, got {_show(key)}")
            if id(value) not in size:
                stack.append((value, [*where, key], False))


# Short, bounded renderings of bad values: an aliased structure may be enormous.
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80


def _show(value: object) -> str:
    if isinstance(value, bool | type(None)):
        return json.dumps(value)
    return _REPR.repr(value)


def _subschema(schema: dict[str, Any], e: jsonschema.ValidationError) -> dict[str, Any]:
    sub: dict[str, Any] = e.schema if isinstance(e.schema, dict) else {}
    ref = sub.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        resolved: dict[str, Any] = schema["$defs"][ref.rsplit("/", 1)[1]]
        return resolved
    return sub


# Words YAML 1.1 read as booleans; in a profile (YAML 1.2) they are text.
_YAML11_BOOLS = {"yes", "no", "on", "off", "y", "n"}


def _explain(at: _Where, e: jsonschema.ValidationError, schema: dict[str, Any]) -> str:
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
        return f"{where}: bad value {_show(e.instance)}; allowed: {allowed_values}"
    if e.validator == "propertyNames" or "propertyNames" in e.absolute_schema_path:
        return (
            f"{where}: bad variable name {_show(e.instance)}: letters, digits and _ "
            "only, not starting with a digit"
        )
    if e.validator == "pattern" and isinstance(e.instance, str):
        if "\\n" in str(e.validator_value):
            return (
                f"{where}: bad value {_show(e.instance)}: must be one line "
                "(a newline, carriage return or NUL would end the directive)"
            )
        return f"{where}: bad value {_show(e.instance)}: must match {e.validator_value}"
    if e.validator == "type":
        expected = e.validator_value
        want = " or ".join(expected) if isinstance(expected, list) else str(expected)
        fix = ""
        if want == "boolean" and str(e.instance).lower() in _YAML11_BOOLS:
            fix = " (write true or false; profiles are YAML 1.2, where yes/no/on/off are text)"
        elif want == "integer" and isinstance(e.instance, str) and ":" in e.instance:
            fix = " (a whole number)"
        return f"{where}: bad value {_show(e.instance)}: expected {want}{fix}"
    if e.validator == "oneOf":
        what = sub.get("description") or e.message
        fix = ""
        if isinstance(e.instance, float) and "minutes" in what:
            fix = "; whole minutes only: write 90 or '01:30:00', not 1.5"
        return f"{where}: bad value {_show(e.instance)}: expected {what}{fix}"
    if e.validator in ("minimum", "maximum", "minLength"):
        limit = {"minimum": "at least", "maximum": "at most", "minLength": "length at least"}
        allowed_text = f"{limit[str(e.validator)]} {e.validator_value}"
        return f"{where}: bad value {_show(e.instance)}: must be {allowed_text}"
    return f"{where}: bad value {_show(e.instance)}: {e.message}"


_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")


def parse_duration(value: int | str) -> int:
    """Seconds from a profile duration: a number of minutes, ``HH:MM:SS``, ``D-HH``,
    ``D-HH:MM`` or ``D-HH:MM:SS`` (Slurm's forms).

    Slurm's ``MM:SS`` is refused: ``1:30`` is a minute and a half to Slurm and an hour
    and a half to many people, and nothing in the profile says which was meant. The
    ``ValueError`` says why and how to write each reading."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError("expected minutes, HH:MM:SS or D-HH:MM:SS")
    if isinstance(value, int):
        if value < 1:
            raise ValueError("must be at least 1 minute")
        return value * 60
    text = value.strip()
    m = _DURATION.match(text)
    if not m:
        raise ValueError("expected minutes, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is None and len(nums) == 2:
        x, y = nums
        raise ValueError(
            f"ambiguous: Slurm reads {text!r} as {x} min {y} s (MM:SS), people often mean "
            f"{x} h {y} min; write '{hms(x * 60 + y)}' for {x} min {y} s "
            f"or '{hms((x * 60 + y) * 60)}' for {x} h {y} min"
        )
    if days is not None:
        h, mi, s = [*nums, 0, 0][:3]  # D-HH[:MM[:SS]]
        if h > 23:
            raise ValueError(f"hours after the days must be below 24, got {h}")
    elif len(nums) == 1:
        h, mi, s = 0, nums[0], 0
    else:
        h, mi, s = nums
    if len(nums) > 1 and (mi > 59 or s > 59):
        raise ValueError("minutes and seconds must be below 60 in HH:MM:SS")
    total = ((int(days or 0) * 24 + h) * 60 + mi) * 60 + s
    if total < 1:
        raise ValueError("must be more than zero")
    return total


def hms(seconds: int) -> str:
    """HH:MM:SS with hours unbounded (Slurm, PBS and LoadLeveler all accept it)."""
    h, rest = divmod(int(seconds), 3600)
    m, s = divmod(rest, 60)
    return f"{h:02d}:{m:02d}:{s:02d}"


_MEMORY = re.compile(r"^(\d+) *([KkMmGgTt])?[Bb]?$")


def parse_memory_mb(value: int | str) -> int:
    """MB from a number (MB) or a string with a K/M/G/T unit (powers of 1024)."""
    if isinstance(value, int):
        return value
    m = _MEMORY.match(value.strip())
    if not m:
        raise ValueError(f"bad memory size {value!r}")
    n, unit = int(m.group(1)), (m.group(2) or "M").upper()
    factor = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[unit]
    return max(1, int(n * factor))


def _duration(d: dict[str, Any], key: str, at: _Where) -> int | None:
    if key not in d:
        return None
    try:
        return parse_duration(d[key])
    except ValueError as e:
        raise SiteError(f"{at([key])}: bad value {_show(d[key])}: {e}") from None


def _convert(d: dict[str, Any], source: str, at: _Where) -> Site:
    scheduler: str = d["scheduler"]
    launcher: str = d.get("launcher", DEFAULT_LAUNCHER[scheduler])
    if scheduler == "loadleveler" and launcher != "poe":
        raise SiteError(
            f"{at(['launcher'])}: bad value {launcher!r} for scheduler loadleveler; allowed: poe"
        )
    if launcher == "poe" and scheduler != "loadleveler":
        raise SiteError(
            f"{at(['launcher'])}: bad value 'poe' for scheduler {scheduler}; "
            "poe runs only under loadleveler"
        )
    if launcher == "srun" and scheduler != "slurm":
        raise SiteError(
            f"{at(['launcher'])}: bad value 'srun' for scheduler {scheduler}; "
            "srun runs only under slurm"
        )
    if "flavor" in d and scheduler != "pbs":
        raise SiteError(f"{at(['flavor'])}: only meaningful for scheduler pbs, not {scheduler}")
    nodes, per_node = d.get("nodes", 1), d.get("ranks_per_node", 2)
    if nodes * per_node < 2:
        raise SiteError(
            f"{at(['ranks_per_node'])}: bad value {per_node} with nodes {nodes}: pmc needs "
            "at least 2 ranks in all (rank 0 is the master, the others run tasks)"
        )
    walltime = _duration(d, "walltime", at)
    margin = _duration(d, "walltime_margin", at)
    if margin is not None and walltime is None:
        raise SiteError(f"{at(['walltime_margin'])}: needs a walltime")
    if margin is not None and walltime is not None and margin >= walltime:
        raise SiteError(
            f"{at(['walltime_margin'])}: bad value {_show(d['walltime_margin'])}: "
            f"must be less than the walltime ({hms(walltime)})"
        )
    pmc = dict(d.get("pmc", {}))
    host = d.get("host", {})
    cont = d.get("container")
    env = d.get("environment", {})
    return Site(
        name=d["site"],
        scheduler=scheduler,
        launcher=launcher,
        source=source,
        flavor=d.get("flavor", "pro"),
        launcher_args=tuple(d.get("launcher_args", ())),
        job_name=d.get("job_name"),
        account=d.get("account"),
        queue=d.get("queue"),
        qos=d.get("qos"),
        walltime=walltime,
        walltime_margin=margin,
        nodes=nodes,
        ranks_per_node=per_node,
        cpus_per_rank=d.get("cpus_per_rank", 1),
        host_cpus=host.get("cpus"),
        host_memory=parse_memory_mb(host["memory"]) if "memory" in host else None,
        reservation=d.get("reservation"),
        constraint=d.get("constraint"),
        node_usage=d.get("node_usage"),
        output=d.get("output"),
        error=d.get("error"),
        environment=tuple((k, _env_value(v)) for k, v in env.items()),
        modules=tuple(d.get("modules", ())),
        setup=tuple(d.get("setup", ())),
        container=(
            Container(
                image=cont["image"],
                runtime=cont.get("runtime", "apptainer"),
                binds=tuple(cont.get("binds", ())),
                args=tuple(cont.get("args", ())),
            )
            if cont is not None
            else None
        ),
        pmc=pmc,
        logging=dict(d.get("logging", {})),
        metrics=dict(d.get("metrics", {})),
        directives=tuple(d.get("directives", ())),
    )


def _env_value(v: object) -> str:
    if isinstance(v, bool):  # from Python data; a file's values keep their text
        return "true" if v else "false"
    return str(v)
