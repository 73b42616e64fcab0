"""Site profiles: load a YAML profile, validate it against ``schemas/site.schema.json``
and turn it into a typed, immutable ``Site``.

Owns the profile format and its error messages: every error names the file, the YAML
path of the bad value, the value and what is allowed (an unknown key lists the valid
keys). Knows nothing about schedulers beyond their names; adapters/ renders scripts.
"""

from __future__ import annotations

import difflib
import json
import re
import reprlib
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
    text = resources.files("pmc.schemas").joinpath("site.schema.json").read_text("utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def load_site(path: str | Path) -> Site:
    """Read, validate and convert the profile at ``path``."""
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
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(e, "problem", None) or str(e)
        raise SiteError(f"{where}: not valid YAML: {problem}") from e
    except RecursionError:
        raise SiteError(f"{source}: not a usable profile: nested too deeply") from None
    except ValueError as e:  # e.g. an integer of thousands of digits
        raise SiteError(f"{source}: not a usable profile: {e}") from None
    return parse_site(data, source)


def parse_site(data: object, source: str = "<profile>") -> Site:
    """Validate already-parsed YAML ``data`` and convert it."""
    if not isinstance(data, dict):
        raise SiteError(f"{source}: a site profile is a mapping of keys, got {_show(data)}")
    _check_keys(data, source)
    schema = _schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (list(e.absolute_path), e.message))
    if errors:
        raise SiteError("\n".join(_explain(source, e, schema) for e in _leaf_errors(errors)))
    return _convert(data, source)


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


def _explain(source: str, e: jsonschema.ValidationError, schema: dict[str, Any]) -> str:
    parts = list(e.absolute_path)
    where = f"{source}: {_path(parts)}"
    sub = _subschema(schema, e)
    if e.validator == "additionalProperties" and isinstance(e.instance, dict):
        allowed = sorted(sub.get("properties", {}))
        bad = sorted(k for k in e.instance if k not in allowed)
        lines = []
        for k in bad:
            near = difflib.get_close_matches(k, allowed, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            key_at = _path([*parts, k])
            lines.append(
                f"{source}: {key_at}: unknown key {k!r}{hint}; valid keys: {', '.join(allowed)}"
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
        return f"{where}: bad value {_show(e.instance)}: expected {want}"
    if e.validator == "oneOf":
        what = sub.get("description") or e.message
        return f"{where}: bad value {_show(e.instance)}: expected {what}"
    if e.validator in ("minimum", "maximum", "minLength"):
        limit = {"minimum": "at least", "maximum": "at most", "minLength": "length at least"}
        allowed_text = f"{limit[str(e.validator)]} {e.validator_value}"
        return f"{where}: bad value {_show(e.instance)}: must be {allowed_text}"
    return f"{where}: bad value {_show(e.instance)}: {e.message}"


_DURATION = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d{1,2}))?(?::(\d{1,2}))?$")


def parse_duration(value: int | str) -> int:
    """Seconds from Slurm-style time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS."""
    if isinstance(value, int):
        return value * 60
    m = _DURATION.match(value.strip())
    if not m:
        raise ValueError(f"bad duration {value!r}")
    days, a, b, c = m.groups()
    nums = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:
        # D-HH[:MM[:SS]]
        h, mi, s = [*nums, 0, 0][:3]
        return ((int(days) * 24 + h) * 60 + mi) * 60 + s
    if len(nums) == 1:
        return nums[0] * 60
    if len(nums) == 2:
        return nums[0] * 60 + nums[1]
    return (nums[0] * 60 + nums[1]) * 60 + nums[2]


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


def _convert(d: dict[str, Any], source: str) -> Site:
    scheduler: str = d["scheduler"]
    launcher: str = d.get("launcher", DEFAULT_LAUNCHER[scheduler])
    if scheduler == "loadleveler" and launcher != "poe":
        raise SiteError(
            f"{source}: launcher: bad value {launcher!r} for scheduler loadleveler; allowed: poe"
        )
    if launcher == "poe" and scheduler != "loadleveler":
        raise SiteError(
            f"{source}: launcher: bad value 'poe' for scheduler {scheduler}; "
            "poe runs only under loadleveler"
        )
    if launcher == "srun" and scheduler != "slurm":
        raise SiteError(
            f"{source}: launcher: bad value 'srun' for scheduler {scheduler}; "
            "srun runs only under slurm"
        )
    if "flavor" in d and scheduler != "pbs":
        raise SiteError(f"{source}: flavor: only meaningful for scheduler pbs, not {scheduler}")
    nodes, per_node = d.get("nodes", 1), d.get("ranks_per_node", 2)
    if nodes * per_node < 2:
        raise SiteError(
            f"{source}: ranks_per_node: bad value {per_node} with nodes {nodes}: pmc needs "
            "at least 2 ranks in all (rank 0 is the master, the others run tasks)"
        )
    walltime = parse_duration(d["walltime"]) if "walltime" in d else None
    margin = parse_duration(d["walltime_margin"]) if "walltime_margin" in d else None
    if margin is not None and walltime is None:
        raise SiteError(f"{source}: walltime_margin: needs a walltime")
    if margin is not None and walltime is not None and margin >= walltime:
        raise SiteError(
            f"{source}: walltime_margin: bad value {_show(d['walltime_margin'])}: "
            f"must be less than the walltime ({walltime} s)"
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
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)
