"""The run option table and what is made from it agree: the command lines of pmc run and
pegasus-mpi-cluster, the site profile schema, the pmc run line of a batch script and
the environment aliases."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from pmc.adapters import script_for
from pmc.adapters.base import pmc_run_argv
from pmc.adapters.site import parse_site
from pmc.adapters.validate import schema

from pmc import log, options
from pmc.commands import cli
from pmc.core.protocol import WorkerConfig
from pmc.options import OPTIONS, RunOptions
from pmc.runtime.startup import worker_config

REPO = Path(__file__).resolve().parents[1]


def sample(o: options.Option) -> tuple[Any, str]:
    """A value a profile could give for ``o`` that is not its default, and its text."""
    if o.kind == "flag":
        return True, ""
    if o.kind == "count":
        return 2, ""
    if o.choices is not None:
        return o.choices[-1], o.choices[-1]
    kind = o.schema().get("type")
    if o.dest == "metrics_port":
        return 9400, "9400"
    if o.dest == "maxfds":
        return 64, "64"
    if o.dest == "open_tcp":
        return "127.0.0.1:0", "127.0.0.1:0"
    if o.dest == "site_profile":
        path = str(REPO / "configs" / "site-slurm-local.yaml")
        return path, path
    if kind == "integer":
        return 3, "3"
    if kind == "number":
        return 2.5, "2.5"
    return f"a {o.dest} value", f"a {o.dest} value"


def run_parser() -> argparse.ArgumentParser:
    for action in cli.build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices["run"]
    raise AssertionError("no run subcommand")


def parse(argv: list[str], monkeypatch: pytest.MonkeyPatch, dropin: bool = False,
          **env: str) -> RunOptions:
    for o in OPTIONS:
        if o.env:
            monkeypatch.delenv(o.env, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    p = cli.pegasus_parser() if dropin else run_parser()
    return cli.options_from_args(p, p.parse_args(argv), dropin)


def test_flags_are_unique_and_every_option_has_help() -> None:
    flags = [f for o in OPTIONS for f in o.flags]
    assert len(flags) == len(set(flags))
    assert all(o.help for o in OPTIONS)
    assert all(hasattr(RunOptions("d"), o.attr) for o in OPTIONS if o.attr)


def test_a_bare_command_line_gives_the_default_run_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """RunOptions' defaults are the table's: what ``pmc run DAG`` with nothing else
    gives (but the progress line, which only a terminal or a command line turns on)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", "/nonexistent")
    given = parse(["--no-site", "w.dag"], monkeypatch)
    assert given._replace(progress_interval=None, live_progress=False) == RunOptions("w.dag")


@pytest.mark.parametrize("o", OPTIONS, ids=lambda o: o.long)
@pytest.mark.parametrize("dropin", [False, True], ids=["pmc run", "pegasus-mpi-cluster"])
def test_every_flag_is_accepted_by_both_parsers(o: options.Option, dropin: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _, text = sample(o)
    for flag in o.flags:
        argv = [flag] if o.kind in ("flag", "count", "const") else [flag, text]
        opts = parse([*argv, "w.dag"], monkeypatch, dropin)
        if o.kind == "const":
            assert opts.mode == o.const
        elif o.dest == "verbose":
            assert opts.log_level == log.INFO + 1
        elif o.dest == "quiet":
            assert opts.log_level == log.INFO - 1
        elif o.attr:
            assert getattr(opts, o.attr) != getattr(parse(["w.dag"], monkeypatch, dropin),
                                                    o.attr)


def test_extensions_are_in_the_pmc_options_group_of_help() -> None:
    text = run_parser().format_help()
    ours = text[text.index("pmc options:"):]
    for o in OPTIONS:
        if o.help == argparse.SUPPRESS:
            assert o.long not in text
        else:
            assert (o.long in ours) == o.extension, o.long


def test_every_profile_key_is_in_the_schema() -> None:
    props = schema()["properties"]
    keys = {o.profile for o in options.profile_options()}
    for key in keys:
        assert key is not None
        section, _, name = key.partition(".")
        assert name in props[section]["properties"], key
    # The hand-written sections hold only what is not a run option.
    for section in ("pmc", "logging", "metrics"):
        generated = {k for k in props[section]["properties"] if f"{section}.{k}" in keys}
        assert set(props[section]["properties"]) - generated <= {"command", "args"}
    for key in ("pmc.no_prefetch", "pmc.no_host_sockets", "pmc.host_script_timeout",
                "pmc.workers", "pmc.progress_interval"):
        assert key in keys
    assert "embedded mode only" in props["pmc"]["properties"]["workers"]["description"]


def profile_table() -> dict[str, str]:
    """docs/adapters.md's table of profile keys ("pmc run and the profile"): each key the
    first cell names (``host.cpus`` under ``host``), and the row's text."""
    text = (REPO / "docs" / "adapters.md").read_text()
    section = text.split("## pmc run and the profile", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first, rest = line[1:].split("|", 1)
        for key in re.findall(r"`([a-z_.]+)`", first):
            rows[key.split(".")[0]] = rows.get(key.split(".")[0], "") + first + rest
    return rows


def test_every_profile_key_is_in_the_docs_table() -> None:
    rows = profile_table()
    for name, prop in schema()["properties"].items():
        assert name in rows, f"docs/adapters.md: no row for the profile key {name}"
        for sub in prop.get("properties", {}):
            assert f"`{sub}`" in rows[name] or f"`{name}.{sub}`" in rows[name], \
                f"docs/adapters.md: the row of {name} does not name {name}.{sub}"
    for o in options.profile_options():
        assert o.profile is not None
        section, _, key = o.profile.partition(".")
        assert f"`{key}`" in rows[section], o.profile


def full_profile() -> tuple[dict[str, Any], dict[str, Any]]:
    """A profile setting every run option key; and the values by dest."""
    data: dict[str, Any] = {"site": "every key", "scheduler": "slurm", "walltime": 90,
                            "host": {"cpus": 8, "memory": "4G"}}
    values: dict[str, Any] = {}
    for o in options.profile_options():
        assert o.profile is not None
        section, _, key = o.profile.partition(".")
        value, _ = sample(o)
        if o.dest == "set_affinity":
            value = False  # not with --host-cpus
        if o.dest == "schedule":
            value = "priority"  # the only one of an open run (--open)
        data.setdefault(section, {})[key] = value
        values[o.dest] = value
    return data, values


def test_profile_argv_parses_back_to_the_same_options(monkeypatch: pytest.MonkeyPatch) -> None:
    data, values = full_profile()
    site = parse_site(data, "s.yaml")
    argv = pmc_run_argv(site, "w.dag")
    assert argv[:2] == ["pmc", "run"] and argv[-1] == "w.dag"
    opts = parse(argv[2:], monkeypatch)
    for o in options.profile_options():
        want = values[o.dest]
        if o.dest in ("verbose", "quiet"):
            continue
        if o.dest == "open_tcp":
            want = o.type(want)  # the text, read as an address
        if o.attr:
            want = o.to_field(want) if o.to_field else want
            assert getattr(opts, o.attr) == want, o.dest
    assert opts.progress_interval == values["progress_interval"]
    assert opts.log_level == log.INFO + values["verbose"] - values["quiet"]
    assert opts.site == "every key"
    assert (opts.host_cpus, opts.host_memory) == (8, 4096)
    assert opts.max_wall_time == site.max_wall_time_minutes


def test_a_profile_value_pmc_run_would_refuse_is_a_profile_error() -> None:
    from pmc.adapters.site import SiteError

    for key, value, words in (("host_script_timeout", float("nan"), "positive number"),
                              ("host_script_timeout", 0, "must be more than 0"),
                              ("progress_interval", float("inf"), "seconds >= 0"),
                              ("workers", 0, "at least 1")):
        with pytest.raises(SiteError) as e:
            parse_site({"site": "x", "scheduler": "slurm", "pmc": {key: value}}, "s.yaml")
        assert str(e.value).startswith(f"s.yaml: pmc.{key}: bad value "), str(e.value)
        assert words in str(e.value)


def test_an_open_run_with_another_schedule_is_a_profile_error() -> None:
    from pmc.adapters.site import SiteError

    with pytest.raises(SiteError) as e:
        parse_site({"site": "x", "scheduler": "slurm",
                    "pmc": {"open": True, "schedule": "critical-path"}}, "s.yaml")
    assert str(e.value) == ("s.yaml: pmc.open: an open run orders its tasks by priority: "
                            "not with pmc.schedule 'critical-path'"), str(e.value)
    site = parse_site({"site": "x", "scheduler": "slurm", "pmc": {"open": True}}, "s.yaml")
    assert "--open" in pmc_run_argv(site, "w.dag")


def test_the_script_passes_the_site_name_quoted() -> None:
    name = "lab's cluster; $(id) -x"
    site = parse_site({"site": name, "scheduler": "slurm", "pmc": {"stdout": "-odd"}}, "s.yaml")
    line = next(x for x in script_for(site, "w.dag").splitlines() if x.startswith("srun "))
    words = shlex.split(line)
    run = words[words.index("run"):]
    assert run[1:4] == ["--site-name", name, "--no-site"]
    assert "--stdout=-odd" in run  # a value that looks like an option stays a value
    assert words[-1] == "w.dag"


def test_a_site_name_that_looks_like_an_option_stays_a_value(
        monkeypatch: pytest.MonkeyPatch) -> None:
    site = parse_site({"site": "-v", "scheduler": "local"}, "s.yaml")
    argv = pmc_run_argv(site, "w.dag")
    assert parse(argv[2:], monkeypatch).site == "-v"


@pytest.mark.parametrize(("var", "text", "attr", "value"), [
    ("PMC_HOST_MEMORY", "2048", "host_memory", 2048),
    ("PMC_HOST_MEMORY", "0", "host_memory", None),
    ("PMC_HOST_CPUS", "4", "host_cpus", 4),
    ("PMC_MAX_WALL_TIME", "1.5", "max_wall_time", 1.5),
    ("PMC_HOST_SCRIPT", "/bin/setup", "host_script", "/bin/setup"),
    ("PMC_HOST_SCRIPT", "", "host_script", None),
    ("PMC_SITE_NAME", "lab", "site", "lab"),
    ("PMC_HOST_GPUS", "4", "host_gpus", 4),
    ("PMC_HOST_GPUS", "0", "host_gpus", 0),
])
def test_environment_aliases(var: str, text: str, attr: str, value: object,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert var in {o.env for o in OPTIONS}
    for dropin in (False, True):
        assert getattr(parse(["w.dag"], monkeypatch, dropin, **{var: text}), attr) == value


def test_a_flag_wins_over_its_environment_alias(monkeypatch: pytest.MonkeyPatch) -> None:
    for o in OPTIONS:
        if o.env is None:
            continue
        _, text = sample(o)
        env_text = "/elsewhere" if o.type is str else "5"
        opts = parse([o.long, text, "w.dag"], monkeypatch, **{o.env: env_text})
        assert getattr(opts, o.attr) == (o.to_field or (lambda v: v))(o.type(text)), o.long


def test_run_option_flags_are_spelled_only_in_the_table() -> None:
    """Other modules name options in messages and docs, never as a quoted flag string.
    (pmc/dag reads a TASK line's own options, some of the same names: not run options.)"""
    flags = {f for o in OPTIONS for f in o.flags if f.startswith("--")}
    # Other commands' own options of the same name.
    elsewhere = {"pmc/commands/cli.py": {"--rescue"},  # pmc status -r
                 "adapters/cli.py": {"--site"},  # pmc script --site SITE.yaml
                 "adapters/base.py": {"--rescue"},  # the script's pmc status -r
                 # Looked for before the table is imported (held to it below).
                 "pmc/commands/mpirank.py": {"--local"}}
    literal = re.compile(r"""["'](--[a-z][a-z-]*)["']""")
    for path in [*(REPO / "pmc").rglob("*.py"), *(REPO / "adapters").rglob("*.py")]:
        if path == REPO / "pmc" / "options.py" or "dag" in path.relative_to(REPO).parts:
            continue
        rel = str(path.relative_to(REPO))
        found = set(literal.findall(path.read_text())) & flags - elsewhere.get(rel, set())
        assert not found, f"{rel} spells {sorted(found)}"


def test_the_embedded_mode_flag_looked_for_before_parsing_is_the_tables() -> None:
    from pmc.commands import mpirank

    local = [o for o in OPTIONS if o.dest == "mode" and o.const == "local"]
    assert [o.flags for o in local] == [(mpirank.LOCAL,)]


def test_worker_config_holds_the_options_marked_for_workers() -> None:
    derived = {"dag_path", "out_path", "err_path", "log_level"}
    marked = {o.attr for o in options.OPTIONS if o.worker}
    assert set(WorkerConfig._fields) == derived | marked
    opts = RunOptions(dag="w.dag", worker_slots=3, strict_limits=True, log_format="json")
    cfg = worker_config(opts, "w.dag.out.{rank}", "w.dag.err.{rank}")
    assert (cfg.worker_slots, cfg.strict_limits, cfg.log_format) == (3, True, "json")


def test_gpu_and_task_launcher_options(monkeypatch: pytest.MonkeyPatch) -> None:
    o = parse(["--host-gpus", "2", "--task-launcher", "mpiexec -n {ranks}", "w.dag"],
              monkeypatch)
    assert (o.host_gpus, o.task_launcher) == (2, "mpiexec -n {ranks}")
    by_dest = {opt.dest: opt for opt in OPTIONS}
    assert by_dest["host_gpus"].extension and by_dest["host_gpus"].worker
    assert by_dest["task_launcher"].profile == "pmc.task_launcher"
    cfg = worker_config(o, "o", "e")
    assert (cfg.host_gpus, cfg.task_launcher) == (2, "mpiexec -n {ranks}")
    assert parse(["w.dag"], monkeypatch).host_gpus is None  # probed


def test_a_bad_gpu_count_is_a_usage_error(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--host-gpus", "-1", "w.dag"], monkeypatch)
    assert "--host-gpus" in capsys.readouterr().err


def test_an_option_without_effect_in_the_mode_says_so(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    from pmctest import pmc, write_dag

    opts = parse(["--no-sleep-on-recv", "--no-host-sockets", "w.dag"], monkeypatch)
    assert options.without_effect(opts, "local") == [
        "--no-sleep-on-recv has no effect in embedded mode (MPI mode only)",
        "--no-host-sockets has no effect in embedded mode (MPI mode only)"]
    assert options.without_effect(opts, "mpi") == []
    opts = parse(["--workers", "3", "w.dag"], monkeypatch)
    assert options.without_effect(opts, "mpi") == [
        "--workers has no effect in MPI mode (embedded mode only)"]
    assert options.without_effect(opts, "local") == []
    plain = parse(["w.dag"], monkeypatch)
    assert options.without_effect(plain, "mpi") == options.without_effect(plain, "local") == []
    # The run says it, and runs.
    dag = write_dag(tmp_path / "w.dag", "TASK A /bin/true\n")
    r = pmc(["run", "--workers", "1", "--no-sleep-on-recv", dag.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(
        "[warn] --no-sleep-on-recv has no effect in embedded mode (MPI mode only)\n")


def test_a_profile_gives_a_range_of_metrics_ports() -> None:
    from pmc.adapters.site import SiteError

    site = parse_site({"site": "x", "scheduler": "slurm",
                       "metrics": {"port": "9466-9470", "file_sd": "/shared/targets"}}, "s.yaml")
    argv = pmc_run_argv(site, "w.dag")
    assert argv[argv.index("--metrics-port") + 1] == "9466-9470"
    assert argv[argv.index("--metrics-file-sd") + 1] == "/shared/targets"
    for bad in ("9470-9466", "0-10", "x"):
        with pytest.raises(SiteError, match=r"s\.yaml: metrics\.port: bad value"):
            parse_site({"site": "x", "scheduler": "slurm", "metrics": {"port": bad}}, "s.yaml")
    # One port from the command line (--set takes text for a key that may be text).
    from pmc.adapters.site import parse_set

    for port in ("9466", "0"):
        site = parse_site({"site": "x", "scheduler": "slurm"}, "s.yaml",
                          [parse_set(f"metrics.port={port}")])
        argv = pmc_run_argv(site, "w.dag")
        assert argv[argv.index("--metrics-port") + 1] == port
