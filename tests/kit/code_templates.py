"""The format strings our code and the libraries it logs through can print (test kit).

Every string literal, f-string and ``"..." + x`` concatenation (docstrings aside) of our packages
and of Celery, kombu, RedBeat, nats-py and redis-py, its ``%s``/``{}`` fields read as ``HOLE``;
plus the few lines printed by what is not Python source here. ``doc_quotes`` matches the docs'
quoted lines against them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUR_CODE = ("bridges", "tasks", "workers", "ops", "deploy", "devstack")
LIBRARIES = ("celery", "kombu", "redbeat", "nats", "redis")  # whose own log lines the docs quote
# Lines printed by programs that are not Python source we can read, with where each comes from.
EXTERNAL_TEMPLATES = {
    "nats: 'Authorization Violation'": "nats-server's -ERR, which nats-py prefixes with 'nats: '",
    "nats: permissions violation for publish to \x01": "nats-server's -ERR, lower-cased by nats-py's parser",
    "nats: permissions violation for subscription to \x01": "nats-server's -ERR, lower-cased by nats-py's parser",
    "Field required": "pydantic-core's message for a missing field",
    "Value error, \x01": "pydantic-core's prefix for a ValueError raised in a validator",
    "Connection refused": "the operating system's strerror(ECONNREFUSED), in redis-py's connection error",
    "in \x01 seconds": "celery.utils.time.humanize_seconds, which fills the worker's 'Trying again {when}'",
}
HOLE = "\x01"  # a format field of the code
MAX_TEMPLATE_CHARS = 400  # longer literals are help texts and documentation, not log lines
# The installed libraries' format strings, kept in the virtualenv (one per checkout, never committed):
# parsing their ~570 files costs ~10 s of CPU, paid again by every pytest-xdist worker that matched a quote.
LIBRARY_CACHE = Path(sys.prefix) / ".switchyard-doc-templates.json"
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(?:\d+|\*)?(?:\.\d+)?[sdrfgiuxXeEcaob]")
_BRACE_FIELD = re.compile(r"\{[^{}]*\}")
_VALUE = re.compile(r"[A-Za-z_][\w.:/-]{0,47}")


def _template(node: ast.AST) -> str | None:
    """A string node as text with ``HOLE`` for each field; None if it is not a string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(str(v.value) if isinstance(v, ast.Constant) else HOLE for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is None and right is None:
            return None
        return (left if left is not None else HOLE) + (right if right is not None else HOLE)
    return None


def _fields_as_holes(text: str) -> str:
    text = _PERCENT_FIELD.sub(HOLE, text.replace("%%", "\x03"))
    return _BRACE_FIELD.sub(HOLE, text).replace("\x03", "%")


def _docstrings(tree: ast.AST) -> set[int]:
    """``id()`` of every docstring node: prose, not something printed."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _templates_of(path: Path) -> set[str]:
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except SyntaxError:
        return set()
    skip, found = _docstrings(tree), set()
    for node in ast.walk(tree):
        text = None if id(node) in skip else _template(node)
        if text and len(text) <= MAX_TEMPLATE_CHARS and re.search(r"[A-Za-z]{2,}", text):
            found.add(" ".join(_fields_as_holes(text).split()))
    return found


def _library_dirs() -> Iterator[Path]:
    for name in LIBRARIES:
        loaded = getattr(sys.modules.get(name), "__file__", None)  # kombu, once imported, has no __spec__
        if loaded:
            yield Path(loaded).parent
            continue
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            yield Path(next(iter(spec.submodule_search_locations)))


def _message_like(template: str) -> bool:
    """Two words or more, or one word and a field (``pool {queue}``); a lone word is a value (values())."""
    words = len(re.findall(r"[A-Za-z]{2,}", template.replace(HOLE, " ")))
    return words >= 2 or (words == 1 and HOLE in template)


@functools.cache
def our_templates() -> frozenset[str]:
    return frozenset(t for d in OUR_CODE for path in (ROOT / d).rglob("*.py") for t in _templates_of(path)
                     if _message_like(t))


def _library_templates(root: Path) -> set[str]:
    """Every format string of one installed library, read from :data:`LIBRARY_CACHE` while neither the
    library's files (their paths, sizes and mtimes) nor this module changed."""
    paths = sorted(root.rglob("*.py"))
    key = hashlib.sha256(Path(__file__).read_bytes())
    for path in paths:
        st = path.stat()
        key.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    try:
        cache = json.loads(LIBRARY_CACHE.read_text())
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(str(root))
    if isinstance(entry, dict) and entry.get("key") == key.hexdigest():
        return set(entry["templates"])
    found: set[str] = set()
    for path in paths:
        found |= _templates_of(path)
    cache[str(root)] = {"key": key.hexdigest(), "templates": sorted(found)}
    tmp = LIBRARY_CACHE.with_name(f"{LIBRARY_CACHE.name}.{os.getpid()}")
    try:  # written whole, then renamed: another xdist worker reads the old file or the new one
        tmp.write_text(json.dumps(cache))
        os.replace(tmp, LIBRARY_CACHE)
    except OSError:
        tmp.unlink(missing_ok=True)
    return found


@functools.cache
def templates() -> tuple[str, ...]:
    found: set[str] = set(EXTERNAL_TEMPLATES) | our_templates()
    for root in _library_dirs():
        found |= _library_templates(root)
    return tuple(sorted(t for t in found if _message_like(t)))


@functools.cache
def values() -> frozenset[str]:
    """Single-token string constants of our code (``nak``, ``Redis``, ``fetch_source``, ``cpu``): what
    it fills into a message's fields, so a quoted line may show them."""
    found: set[str] = set()
    for root in (ROOT / d for d in OUR_CODE):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and _VALUE.fullmatch(node.value):
                    found.add(node.value)
    return frozenset(found)
