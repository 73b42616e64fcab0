"""The layers of docs/architecture.md, checked: a module imports only its own layer and
the layers below it, and the runtime never imports the outputs (it tells them what
happened through ``core.events.Observer``). Every import counts, those inside functions
and under ``TYPE_CHECKING`` too: a layer that needs a name from above is drawn wrong.

``python tests/test_layers.py`` prints the imports that run back up, if any."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Highest first, as docs/architecture.md draws them. A module not named is in the base.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("commands", ("pmc.commands", "pmc.__main__")),
    ("runtime", ("pmc.runtime",)),
    ("outputs", ("pmc.outputs",)),
    ("transport", ("pmc.transport",)),
    ("core", ("pmc.core",)),
    ("adapters", ("pmc.adapters",)),
    ("dag", ("pmc.dag",)),
    ("options", ("pmc.options", "pmc.optiontypes", "pmc.launchtemplate")),
    ("base", ("pmc",)),
)
# Pairs the order alone would allow but the drawing forbids: (importer, imported).
FORBIDDEN = {("runtime", "outputs")}
RANK = {name: len(LAYERS) - i for i, (name, _) in enumerate(LAYERS)}


def layer_of(module: str) -> str | None:
    """The layer of a pmc module (None for anything not pmc's own)."""
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + "."):
                return name
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[0] == "adapters":
        parts.insert(0, "pmc")  # installed as pmc.adapters
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, module) for every import in ``path``; ``from pmc import x`` gives pmc.x."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                # `from pmc import errors` imports a module; `from pmc.x import name`
                # a name of pmc.x: either way the submodule's layer is the one that counts.
                found.append((node.lineno, f"{source}.{alias.name}"
                              if layer_of(f"{source}.{alias.name}") != layer_of(source)
                              else source))
    return found


def sources() -> list[Path]:
    return sorted([*ROOT.joinpath("pmc").rglob("*.py"), *ROOT.joinpath("adapters").rglob("*.py")])


def upward_imports() -> list[str]:
    """One line per import that breaks the layers: file:line, what, and the two layers."""
    bad: list[str] = []
    for path in sources():
        module = module_name(path)
        mine = layer_of(module)
        assert mine is not None, module
        for line, target in imported(path, module):
            theirs = layer_of(target)
            if theirs is None or theirs == mine:
                continue
            if RANK[theirs] > RANK[mine] or (mine, theirs) in FORBIDDEN:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} ({mine}) imports "
                           f"{target} ({theirs})")
    return bad


def test_no_import_runs_back_up() -> None:
    bad = upward_imports()
    assert not bad, "imports against docs/architecture.md's layers:\n" + "\n".join(bad)


def test_every_module_has_a_layer() -> None:
    """The table above names each folder: a new top-level package must be placed."""
    folders = {p.parent for p in sources() if p.name == "__init__.py"}
    for folder in folders:
        module = module_name(folder / "__init__.py")
        if module in ("pmc", "pmc.adapters"):
            continue
        top = ".".join(module.split(".")[:2])
        assert layer_of(top) != "base", f"{folder.relative_to(ROOT)} has no layer in LAYERS"




def test_no_test_module_imports_another() -> None:
    """Helpers shared by tests live in helper modules (pmctest, fakes, the *kit files):
    a test module imported by another would run its tests twice and hide where they are."""
    bad = []
    for path in sorted(ROOT.joinpath("tests").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names
                    if name.rpartition(".")[2].startswith("test_")]
    assert not bad, "test modules importing test modules:\n" + "\n".join(bad)


if __name__ == "__main__":
    lines = upward_imports()
    print("\n".join(lines) if lines else "no import runs back up")
    sys.exit(1 if lines else 0)
