"""Container packaging: the Containerfile's stages, apptainer.def, and their agreement.

Apptainer is not available where the tests run, so apptainer.def is checked by parsing
it: both recipes must install the same wheel with the same extra, run the same console
script, use the same base image default and the same venv. The image itself is built
and tested by ci/container-test.sh (and by the `container` test below when asked).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTAINERFILE = ROOT / "Containerfile"
APPTAINER_DEF = ROOT / "apptainer.def"


# --- a small Containerfile reader -----------------------------------------------------


@dataclass
class Instruction:
    keyword: str  # upper case
    args: str  # continuation lines joined, comments removed
    line: int  # where the instruction starts


@dataclass
class Stage:
    name: str | None
    source: str  # the image or stage after FROM
    instructions: list[Instruction] = field(default_factory=list)

    def args_of(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def parse_containerfile(text: str) -> tuple[list[Instruction], list[Stage]]:
    """Instructions before the first FROM, and the stages in order."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue  # comments may sit between continuation lines, as in Docker
        if not pending:
            start = lineno
        if stripped.endswith("\\"):
            pending.append(stripped[:-1])
            continue
        pending.append(stripped)
        keyword, _, args = " ".join(pending).strip().partition(" ")
        instructions.append(Instruction(keyword.upper(), " ".join(args.split()), start))
        pending = []
    assert not pending, "Containerfile ends inside a continuation line"

    preamble: list[Instruction] = []
    stages: list[Stage] = []
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(name, words[0]))
        elif stages:
            stages[-1].instructions.append(ins)
        else:
            preamble.append(ins)
    return preamble, stages


# --- a small apptainer.def reader ----------------------------------------------------
# spython's recipe parser lower-cases the From line, drops %arguments and rewrites %test
# for Docker, so the checks below read the file with this parser; spython is used only to
# check that it reads the file at all (test_spython_reads_the_definition).


@dataclass
class Definition:
    header: dict[str, str]
    sections: dict[str, str]  # name -> body, indentation removed

    def lines(self, section: str) -> list[str]:
        return [ln for ln in self.sections.get(section, "").splitlines() if ln.strip()]

    def arguments(self) -> dict[str, str]:
        pairs = (ln.strip().partition("=") for ln in self.lines("arguments"))
        return {k.strip(): v.strip() for k, _, v in pairs if not k.startswith("#")}


def parse_definition(text: str) -> Definition:
    header: dict[str, str] = {}
    bodies: dict[str, list[str]] = {}
    current: list[str] | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        m = re.match(r"^%(\w+)\s*$", raw)
        if m:
            assert m.group(1) not in bodies, f"apptainer.def:{lineno}: %{m.group(1)} twice"
            current = bodies.setdefault(m.group(1), [])
        elif current is not None:
            current.append(raw)
        elif raw.strip() and not raw.lstrip().startswith("#"):
            key, sep, value = raw.partition(":")
            assert sep, f"apptainer.def:{lineno}: header line without ':': {raw!r}"
            header[key.strip()] = value.strip()
    sections = {}
    for name, body in bodies.items():
        indents = [len(ln) - len(ln.lstrip()) for ln in body if ln.strip()]
        cut = min(indents, default=0)
        sections[name] = "\n".join(ln[cut:] for ln in body).strip("\n")
    return Definition(header, sections)


# --- fixtures and shared extraction ---------------------------------------------------


@pytest.fixture(scope="module")
def containerfile() -> tuple[list[Instruction], list[Stage]]:
    return parse_containerfile(CONTAINERFILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def stages(containerfile: tuple[list[Instruction], list[Stage]]) -> dict[str, Stage]:
    return {s.name: s for s in containerfile[1] if s.name}


@pytest.fixture(scope="module")
def definition() -> Definition:
    return parse_definition(APPTAINER_DEF.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


# `pip install "$(echo DIR/pmc-*.whl)[EXTRAS]"`: the built wheel, installed with extras.
WHEEL_INSTALL = re.compile(r"""pip install [^;&|]*?"\$\(echo (\S+)/pmc-\*\.whl\)\[([\w,-]+)\]\"""")


def wheel_installs(script: str) -> list[tuple[str, set[str]]]:
    return [(m.group(1), set(m.group(2).split(","))) for m in WHEEL_INSTALL.finditer(script)]


def base_default(containerfile: tuple[list[Instruction], list[Stage]]) -> str:
    preamble, _ = containerfile
    args = dict(i.args.partition("=")[::2] for i in preamble if i.keyword == "ARG")
    return args["BASE"]


# --- Containerfile --------------------------------------------------------------------


def test_containerfile_has_builder_runtime_and_test_stages(
    stages: dict[str, Stage],
) -> None:
    assert {"builder", "runtime", "test"} <= stages.keys()
    # The tests run in the runtime image itself, not in a sibling of it.
    assert stages["test"].source == "runtime"
    # The runtime image gets the wheel from the builder, not the build tools.
    assert stages["runtime"].source != "builder"
    assert any("--from=builder" in c for c in stages["runtime"].args_of("COPY"))


def test_containerfile_base_image_is_a_build_argument(
    containerfile: tuple[list[Instruction], list[Stage]],
) -> None:
    preamble, all_stages = containerfile
    assert [i.keyword for i in preamble] == ["ARG"]
    default = base_default(containerfile)
    # A public, fully qualified default that podman and docker both resolve.
    assert re.fullmatch(r"docker\.io/library/python:3\.1[1-9][\w.-]*", default), default
    assert all_stages[0].source in ("${BASE}", "$BASE")
    # Every other stage builds on an earlier stage, so BASE is the only external image.
    names = [s.name for s in all_stages]
    for i, stage in enumerate(all_stages[1:], 1):
        assert stage.source in names[:i], f"stage {stage.name} starts from {stage.source}"


def test_builder_builds_the_wheel_and_runtime_installs_it_with_the_mpi_extra(
    stages: dict[str, Stage], pyproject: dict
) -> None:
    builder_runs = " ".join(stages["builder"].args_of("RUN"))
    assert re.search(r"pip wheel --no-deps --wheel-dir /dist\b", builder_runs)
    installs = wheel_installs(" ".join(stages["runtime"].args_of("RUN")))
    assert installs == [("/tmp/dist", {"mpi"})]
    mpi_extra = pyproject["project"]["optional-dependencies"]["mpi"]
    assert any(req.startswith("mpich") for req in mpi_extra)


def test_runtime_entrypoint_is_the_pmc_console_script(
    stages: dict[str, Stage], pyproject: dict
) -> None:
    (entrypoint,) = stages["runtime"].args_of("ENTRYPOINT")
    argv = json.loads(entrypoint)
    assert argv == ["pmc"]
    assert argv[0] in pyproject["project"]["scripts"]


def test_test_stage_runs_the_suite_against_the_installed_wheel(
    stages: dict[str, Stage], pyproject: dict
) -> None:
    runs = stages["test"].args_of("RUN")
    assert wheel_installs(" ".join(runs)) == [("/tmp/dist", {"mpi", "test"})]
    pytest_runs = [r for r in runs if "pytest" in r]
    assert len(pytest_runs) == 1
    argv = shlex.split(pytest_runs[0].rpartition(";")[2])
    assert argv[:3] == ["python", "-m", "pytest"]
    options = argv[3:]
    deselect = options[options.index("-m") + 1]
    assert deselect == "not slurm and not container"
    # The deselected markers are real markers of the suite.
    declared = {m.partition(":")[0] for m in pyproject["tool"]["pytest"]["ini_options"]["markers"]}
    assert {"slurm", "container"} <= declared
    # The sources are removed so that `import pmc` finds the wheel, not /src/pmc.
    assert any(re.search(r"rm -rf /src/pmc\b", r) for r in runs)


def test_ignore_files_keep_git_and_caches_out_of_the_context() -> None:
    container = (ROOT / ".containerignore").read_text(encoding="utf-8")
    docker = (ROOT / ".dockerignore").read_text(encoding="utf-8")
    assert container == docker
    entries = {ln.strip() for ln in container.splitlines()}
    assert {".git", ".venv", "**/__pycache__", ".mypy_cache", "*.sif"} <= entries


# --- apptainer.def --------------------------------------------------------------------


def test_definition_bootstraps_from_the_same_base_default(
    definition: Definition, containerfile: tuple[list[Instruction], list[Stage]]
) -> None:
    assert definition.header["Bootstrap"] == "docker"
    template = re.fullmatch(r"\{\{\s*(\w+)\s*\}\}", definition.header["From"])
    assert template, definition.header["From"]
    assert definition.arguments()[template.group(1)] == base_default(containerfile)


def test_definition_installs_the_same_wheel_and_extra_as_the_runtime_image(
    definition: Definition, stages: dict[str, Stage]
) -> None:
    post = definition.sections["post"]
    runtime = wheel_installs(" ".join(stages["runtime"].args_of("RUN")))
    assert [extras for _, extras in wheel_installs(post)] == [e for _, e in runtime]
    # Both install into the same venv, whose bin/ comes first on PATH.
    assert "python3 -m venv /opt/pmc" in post
    assert "python3 -m venv /opt/pmc" in " ".join(stages["base"].args_of("RUN"))
    environment = definition.sections["environment"]
    assert 'export PATH="/opt/pmc/bin:$PATH"' in environment
    (env,) = stages["base"].args_of("ENV")
    assert "PATH=/opt/pmc/bin:" in env


def test_definition_copies_every_source_the_wheel_build_needs(
    definition: Definition, pyproject: dict
) -> None:
    files = dict(ln.split() for ln in definition.lines("files"))
    m = re.search(r"pip wheel .*--wheel-dir \S+ (\S+)$", definition.sections["post"], re.M)
    assert m, "no `pip wheel` in %post"
    src = m.group(1)
    assert all(dest == f"{src}/{name}" for name, dest in files.items())
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {d.split("/")[0] for d in pyproject["tool"]["setuptools"]["package-dir"].values()}
    assert needed <= files.keys()


def test_runscript_runs_the_pmc_console_script(
    definition: Definition, stages: dict[str, Stage], pyproject: dict
) -> None:
    assert definition.sections["runscript"] == 'exec pmc "$@"'
    (entrypoint,) = stages["runtime"].args_of("ENTRYPOINT")
    assert json.loads(entrypoint) == ["pmc"]
    assert "pmc" in pyproject["project"]["scripts"]


def test_definition_test_section_runs_a_valid_smoke_dag(
    definition: Definition, tmp_path: Path
) -> None:
    body = definition.sections["test"]
    m = re.search(r"cat > (\S+) <<'EOF'\n(.*?)\nEOF\n", body, re.S)
    assert m, "%test writes no DAG with a quoted here-document"
    name, text = m.groups()
    assert f"pmc run {name}" in body
    assert f"mpiexec -n 3 pmc run {name}" in body

    from pmc.dag import parse_dag

    path = tmp_path / name
    path.write_text(text + "\n", encoding="utf-8")
    dag = parse_dag(str(path))
    assert list(map(dag.name_of, range(len(dag)))) == ["A", "B", "C", "D"]
    assert dag.edge_count() == 4


@pytest.mark.mpi
def test_definition_test_section_passes_with_this_installation(
    definition: Definition, tmp_path: Path
) -> None:
    # Apptainer runs %test with /bin/sh inside the image; run the same script against the
    # pmc, python and mpiexec installed next to this interpreter (in the image: /opt/pmc).
    bindir = Path(sys.executable).parent
    if shutil.which("mpiexec", path=str(bindir)) is None:
        pytest.skip(f"no mpiexec in {bindir}: install the mpi extra")
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    env["TMPDIR"] = str(tmp_path)
    env = {k: v for k, v in env.items() if k not in ("PMI_RANK", "PMI_SIZE", "PMI_FD")}
    env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "OMPI_", "PMIX_"))}
    with subprocess.Popen(
        ["/bin/sh", "-c", definition.sections["test"]],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            output, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # pmc and its workers too
            output, _ = proc.communicate()
            pytest.fail(f"%test did not finish in 240 s:\n{output[-4000:]}")
    assert proc.returncode == 0, output[-4000:]
    assert output.rstrip().endswith("pmc smoke DAG: ok")
    assert "MPICH" in output
    # The temporary directory %test made is gone again.
    assert list(tmp_path.iterdir()) == []


def test_definition_has_help_and_the_same_labels_as_the_image(
    definition: Definition, stages: dict[str, Stage]
) -> None:
    assert "apptainer exec pmc.sif pmc run" in definition.sections["help"]
    labels = dict(ln.split(None, 1) for ln in definition.lines("labels"))
    image_labels = dict(
        (k, v.strip('"'))
        for k, v in re.findall(r'(\S+)=("[^"]*"|\S+)', " ".join(stages["runtime"].args_of("LABEL")))
    )
    assert labels == image_labels
    assert labels["org.opencontainers.image.title"] == "pmc"


def test_spython_reads_the_definition(definition: Definition) -> None:
    parsers = pytest.importorskip("spython.main.parse.parsers")
    recipes = parsers.SingularityParser(str(APPTAINER_DEF)).recipe
    assert len(recipes) == 1, f"spython sees several stages: {list(recipes)}"
    (recipe,) = recipes.values()
    assert recipe.files == definition.lines("files")
    assert recipe.cmd == definition.sections["runscript"]
    assert recipe.labels == definition.lines("labels")


def test_parse_definition_reports_header_and_sections() -> None:
    d = parse_definition(
        "Bootstrap: docker\nFrom: {{ B }}\n# note: ignored\n\n%arguments\n    B=x:1\n"
        "%post\n    set -eu\n    if true; then\n        echo ok\n    fi\n"
    )
    assert d.header == {"Bootstrap": "docker", "From": "{{ B }}"}
    assert d.arguments() == {"B": "x:1"}
    assert d.sections["post"] == "set -eu\nif true; then\n    echo ok\nfi"


def test_parse_containerfile_joins_continuations_and_tracks_stages() -> None:
    preamble, parsed = parse_containerfile(
        "# c\nARG BASE=img\nFROM ${BASE} AS one\nRUN a \\\n  # inner comment\n    b\n"
        "FROM one AS two\nCOPY --from=one /x /y\n"
    )
    assert [(i.keyword, i.args) for i in preamble] == [("ARG", "BASE=img")]
    assert [(s.name, s.source) for s in parsed] == [("one", "${BASE}"), ("two", "one")]
    assert parsed[0].instructions[0].args == "a b"
    assert parsed[0].instructions[0].line == 4


# --- the installed distribution and the CI script -------------------------------------


def test_installed_console_scripts_match_pyproject(pyproject: dict) -> None:
    installed = {
        ep.name: ep.value
        for ep in importlib.metadata.distribution("pmc").entry_points
        if ep.group == "console_scripts"
    }
    assert installed == pyproject["project"]["scripts"]
    assert {"pmc", "pegasus-mpi-cluster"} <= installed.keys()


def test_every_source_package_goes_into_the_wheel(pyproject: dict) -> None:
    # The images install the wheel, not the tree: a package directory missing from the
    # explicit list would be missing there only.
    setuptools = pyproject["tool"]["setuptools"]
    roots = {pkg: ROOT / d for pkg, d in setuptools["package-dir"].items()}
    if not all(path.is_dir() for path in roots.values()):
        pytest.skip("no source tree here (the image's test stage tests the installed wheel)")
    found = {
        ".".join((pkg, *module.parent.relative_to(top).parts))
        for pkg, top in roots.items()
        for module in top.rglob("*.py")
    }
    assert "pmc" in found
    missing = found - set(setuptools["packages"])
    assert not missing, f"not in [tool.setuptools] packages: {sorted(missing)}"


def test_container_scripts_are_valid_bash() -> None:
    for name in ("container-test.sh", "container-mpi-models.sh", "build-sif.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "ci" / name)], check=True)
    text = (ROOT / "ci" / "container-test.sh").read_text(encoding="utf-8")
    assert "--target test" in text
    assert '--build-arg "BASE=$BASE"' in text
    assert "bash ci/container-mpi-models.sh" in text
    # pmc.sif is built from the runtime image just built, and tested.
    assert 'bash ci/build-sif.sh "$TAG:latest" pmc.sif' in text
    assert "tests/test_sif.py" in text
    for section in ("files", "post", "environment", "test"):
        assert f"section {section}" in text, f"ci/container-test.sh skips %{section}"


@pytest.mark.container
@pytest.mark.skipif(
    os.environ.get("PMC_TEST_CONTAINER") != "1" or shutil.which("podman") is None,
    reason="builds the OCI image: set PMC_TEST_CONTAINER=1 (needs podman as root)",
)
def test_image_builds_and_its_test_stage_passes() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "ci" / "container-test.sh")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tail = "\n".join(result.stdout.splitlines()[-40:])
    assert result.returncode == 0, tail
    assert "test stage passed" in result.stdout
