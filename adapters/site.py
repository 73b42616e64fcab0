"""Site profiles: load a YAML profile, apply command-line overrides, validate it and
turn it into a typed, immutable ``Site``.

The public face of the profile format: ``load_site``, ``parse_site``, ``override`` /
``parse_set`` (command-line changes) live here, with the checks that span several keys
and the conversion to ``Site``; ``default_site_path`` (``$PMC_SITE``, then
``$XDG_CONFIG_HOME/pmc/site.yaml``) is ``pmc.sitepath``'s, passed on. The rooms behind
it: ``yaml12`` (YAML read as written), ``validate`` (the schema, with the run options of
``pmc.options``, and the error explanations), ``messages`` (``SiteError`` and how errors
name a value) and ``units`` (durations and memory sizes). Knows nothing about schedulers
beyond their names; adapters/ renders scripts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pmc.sitepath import default_site_path

from . import schedulers
from .messages import SiteError, Where, path, show
from .units import hms, parse_duration, parse_memory_mb
from .validate import check_keys, schema_at, validate
from .yaml12 import load_yaml

__all__ = [
    "DEFAULT_LAUNCHER", "LAUNCHERS", "SCHEDULERS", "Container", "Override", "Site",
    "SiteError", "default_site_path", "hms", "load_site", "load_yaml", "override",
    "parse_duration", "parse_memory_mb", "parse_set", "parse_site",
]

SCHEDULERS = schedulers.NAMES
LAUNCHERS = ("srun", "mpiexec", "aprun", "poe")
DEFAULT_LAUNCHER = {e.name: e.launcher for e in schedulers.ENTRIES}


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
    mpi: str = "mpich"  # the MPI family: its launcher's flags (launchers.py)
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
    host_gpus: int | None = None  # GPUs per node: --host-gpus and the scheduler's request
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


@dataclass(frozen=True)
class Override:
    """One command-line change to a profile: ``label`` is how errors name it
    (``--walltime``, ``--set pmc.tries``), ``key`` the dotted profile key."""

    label: str
    key: str
    value: object


_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")


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
    sub = schema_at(key)
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
                    f"{o.label}: {path(parts[: i + 1])} in {source} is "
                    f"{show(child)}, not a mapping of keys"
                )
            else:
                child = dict(child)  # copy: the loaded profile is left as it was
            node[part] = child
            node = child
        node[parts[-1]] = o.value
    return data


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
        raise SiteError(f"{source}: a site profile is a mapping of keys, got {show(data)}")
    check_keys(data, source)
    data = _apply(data, overrides, source)
    where = Where(source, {tuple(o.key.split(".")): o.label for o in overrides})
    validate(data, where)
    return _convert(data, source, where)


def _duration(d: dict[str, Any], key: str, at: Where) -> int | None:
    if key not in d:
        return None
    try:
        return parse_duration(d[key])
    except ValueError as e:
        raise SiteError(f"{at([key])}: bad value {show(d[key])}: {e}") from None


def _check_launcher(d: dict[str, Any], scheduler: str, launcher: str, at: Where) -> None:
    """The launcher runs under the scheduler, and ``mpi`` is one it has flags for."""
    runs = schedulers.BY_NAME[scheduler].launchers
    if launcher not in runs:
        owners = [e.name for e in schedulers.ENTRIES if launcher in e.launchers]
        why = (f"allowed: {', '.join(runs)}" if len(runs) == 1 or not owners
               else f"{launcher} runs only under {' or '.join(owners)}")
        raise SiteError(
            f"{at(['launcher'])}: bad value {launcher!r} for scheduler {scheduler}; {why}")
    if "mpi" in d and launcher not in ("mpiexec", "srun"):
        raise SiteError(f"{at(['mpi'])}: only meaningful for the launchers mpiexec and srun, "
                        f"not {launcher}, which starts the ranks of its own MPI")


def _convert(d: dict[str, Any], source: str, at: Where) -> Site:
    scheduler: str = d["scheduler"]
    launcher: str = d.get("launcher", DEFAULT_LAUNCHER[scheduler])
    _check_launcher(d, scheduler, launcher, at)
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
            f"{at(['walltime_margin'])}: bad value {show(d['walltime_margin'])}: "
            f"must be less than the walltime ({hms(walltime)})"
        )
    pmc = dict(d.get("pmc", {}))
    opened = "open_tcp" if pmc.get("open_tcp") is not None else "open"
    if pmc.get(opened) and pmc.get("schedule", "priority") != "priority":
        raise SiteError(f"{at(['pmc', opened])}: an open run orders its tasks by priority: "
                        f"not with pmc.schedule {show(pmc['schedule'])}")
    host = d.get("host", {})
    cont = d.get("container")
    env = d.get("environment", {})
    return Site(
        name=d["site"],
        scheduler=scheduler,
        launcher=launcher,
        source=source,
        flavor=d.get("flavor", "pro"),
        mpi=d.get("mpi", "mpich"),
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
        host_gpus=host.get("gpus"),
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

