"""The longest functions and modules of pmc/ and adapters/, longest first.

``python tests/longest.py [N]`` prints the N longest of each (10 by default);
``tests/test_longest.py`` fails when a function passes ``FUNCTION_LIMIT`` lines or a
module ``MODULE_LIMIT``. A function's lines run from its ``def`` (decorators left out) to
its last line, its docstring and comments included."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pmc.adapters

import pmc

ROOT = Path(__file__).resolve().parent.parent
# The sources as imported: pmc/ and adapters/ in a checkout, pmc/ alone (adapters inside
# it) where pmc is installed, as in the image.
SOURCES = {Path(pmc.__file__).resolve().parent, Path(pmc.adapters.__file__).resolve().parent}
FUNCTION_LIMIT = 80
MODULE_LIMIT = 500


def _files() -> list[Path]:
    return sorted({path for source in SOURCES for path in source.rglob("*.py")})


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def functions() -> list[tuple[int, str]]:
    """(lines, "file:line qualified.name") for every function, longest first."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, path: Path, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    found.append((length, f"{_shown(path)}:{child.lineno} {name}"))
                visit(child, path, name + ".")
            else:
                visit(child, path, prefix)

    for path in _files():
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), path, "")
    return sorted(found, key=lambda row: -row[0])


def modules() -> list[tuple[int, str]]:
    """(lines, file) for every module, longest first."""
    rows = [(len(p.read_text(encoding="utf-8").splitlines()), _shown(p))
            for p in _files()]
    return sorted(rows, key=lambda row: -row[0])


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 10
    print(f"longest functions (limit {FUNCTION_LIMIT} lines):")
    for length, where in functions()[:n]:
        print(f"  {length:4d}  {where}")
    print(f"longest modules (limit {MODULE_LIMIT} lines):")
    for length, where in modules()[:n]:
        print(f"  {length:4d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
