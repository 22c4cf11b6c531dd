"""docs/DESIGN.md's module map matches the tree (issue 11, "Done when").

A newcomer finds a concept's home from the map, so the map must name every
module of the product packages (a sub-package documented as a whole counts
for all its modules) and every path it names must exist. One row, one concept:
a row names one path, in a line short enough to read.

How the first cell of a row is read: every back-quoted token is a path
relative to the repository root; a token ending in ``/`` names a sub-package
as a whole. A package's ``__init__.py`` that defines nothing (a docstring,
imports, ``__all__``) needs no row of its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.kit.layout import PRODUCT_PACKAGES, ROOT

DESIGN = ROOT / "docs" / "DESIGN.md"
MAP_HEADING = "## Module map"
MAX_ROW_CHARS = 170  # a row reads in one glance; details belong in the module's docstring
_TOKEN = re.compile(r"`([^`]+)`")
_NAME = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\(\))?$")  # a back-quoted Python name, `f()` or `Thing`


def map_rows(text: str) -> list[str]:
    """The table rows of the module map section (header and separator dropped)."""
    section = text.split(MAP_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [row for row in rows[2:]]


def row_paths(row: str) -> list[str]:
    """The paths named in a row's first cell."""
    return _TOKEN.findall(row.split("|")[1])


def defines_something(path: Path) -> bool:
    """True if a module body has a def, a class or an assignment other than ``__all__``."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return True
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(not (isinstance(t, ast.Name) and t.id == "__all__") for t in targets):
                return True
    return False


def modules_needing_a_row(root: Path, packages: tuple[str, ...]) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if path.name == "__init__.py" and not defines_something(path):
                continue
            found.append(path.relative_to(root).as_posix())
    return found


def unmapped(modules: list[str], named: list[str]) -> list[str]:
    """The modules no named path covers (itself, or a sub-package named as a whole)."""
    files = set(named)
    packages = tuple(p for p in named if p.endswith("/"))
    return [m for m in modules if m not in files and not m.startswith(packages)]


def test_the_reader_finds_paths_packages_and_orphans(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Docstring only."""\nfrom pkg import a\n__all__ = ["a"]\n')
    (pkg / "a.py").write_text("")
    (pkg / "b.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("HANDLERS = {}\n")
    (pkg / "sub" / "c.py").write_text("")
    text = ("## Module map\n\n| module | concept |\n|---|---|\n| `pkg/a.py` | one | \n"
            "| `pkg/sub/` | all of sub |\n\n## Next\n| `pkg/b.py` | not in the map |\n")
    named = [p for row in map_rows(text) for p in row_paths(row)]
    assert named == ["pkg/a.py", "pkg/sub/"]
    assert unmapped(modules_needing_a_row(tmp_path, ("pkg",)), named) == ["pkg/b.py"]


def test_every_product_module_is_in_the_map() -> None:
    named = [p for row in map_rows(DESIGN.read_text(encoding="utf-8")) for p in row_paths(row)]
    missing = unmapped(modules_needing_a_row(ROOT, PRODUCT_PACKAGES), named)
    assert not missing, "modules docs/DESIGN.md's module map does not name (add a row each):\n" + "\n".join(missing)


def test_every_path_the_map_names_exists() -> None:
    named = [p for row in map_rows(DESIGN.read_text(encoding="utf-8")) for p in row_paths(row)]
    gone = [p for p in named if not (ROOT / p).exists() or (p.endswith("/") and not (ROOT / p).is_dir())]
    assert not gone, f"docs/DESIGN.md's module map names paths that do not exist: {gone}"


def test_each_module_has_one_row() -> None:
    named = [p for row in map_rows(DESIGN.read_text(encoding="utf-8")) for p in row_paths(row)]
    twice = sorted({p for p in named if named.count(p) > 1})
    assert not twice, f"docs/DESIGN.md's module map has more than one row for: {twice}"


def names_not_in_code(row: str, sources: str) -> list[str]:
    """The back-quoted Python names (with ``_``, ``()`` or a capital) of a row's concept that no product
    source contains: a row that names a function the code does not have misleads."""
    names = [m.group(1) for tok in _TOKEN.findall("|".join(row.split("|")[2:])) if (m := _NAME.match(tok))]
    wanted = [n for n in names if "_" in n.strip("_") or n[0].isupper() or f"`{n}()`" in row]
    return [n for n in wanted if not re.search(rf"\b{re.escape(n)}\b", sources)]


def test_the_names_a_row_gives_exist_in_the_code() -> None:
    sources = "\n".join(p.read_text(encoding="utf-8") for pkg in PRODUCT_PACKAGES for p in (ROOT / pkg).rglob("*.py"))
    assert names_not_in_code("| `m.py` | `record_fault`, `clear_faults()`, `Fault`, `bridges` |",
                             "def record_fault(): ...\nclass Fault: ...") == ["clear_faults"]
    stale = {row.split("|")[1].strip(): names_not_in_code(row, sources)
             for row in map_rows(DESIGN.read_text(encoding="utf-8"))}
    stale = {path: names for path, names in stale.items() if names}
    assert not stale, f"docs/DESIGN.md's module map names what the code does not have: {stale}"


def test_each_row_is_one_short_concept() -> None:
    rows = map_rows(DESIGN.read_text(encoding="utf-8"))
    crowded = [row for row in rows if len(row_paths(row)) != 1]
    assert not crowded, "a row names one module or sub-package:\n" + "\n".join(crowded)
    long = [row for row in rows if len(row) > MAX_ROW_CHARS]
    assert not long, f"rows over {MAX_ROW_CHARS} characters (move the detail to the docstring):\n" + "\n".join(long)
