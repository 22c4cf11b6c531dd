"""``app.json`` (the Heroku Button) agrees with the code and with docs/operations.md.

A one-click deploy reads nothing but this file, so each disagreement an
operator met is a rule here (issue 14 §5):

* every variable the fleet reads is declared (settings classes found by
  import, plus the direct ``os.environ`` reads of the fleet's code), and
  every declared one is read and documented;
* nothing blocks the deploy form: a variable is required only when it has a
  value or a generator; a variable one *side* needs says "Required for the
  <side> side", and that side's bridge starts out of the formation
  (quantity 0: a bridge without its side exits at once, and Heroku restarts
  even a clean exit);
* the Redis plan keeps an append-only file, as docs/operations.md §2.4 asks.

The media store's enforcement on Heroku is a start-up rule of the Voicy
settings, proven by running the Procfile's bridge in ``tests/fleet/test_procfile.py``.
"""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
APP_JSON = ROOT / "app.json"
OPERATIONS_MD = ROOT / "docs" / "operations.md"
# The code every dyno runs (the operator tools in ops/ run on the operator's machine, not in the app).
FLEET_CODE = ("bridges", "tasks", "workers", "deploy/flowerconfig.py")
ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*[A-Z0-9]$")
ENV_READ_CALL = re.compile(r"(?:^|\.)(?:environ\.get|getenv|_env_number)$")
ENV_CONSTANT = re.compile(r"(?:^ENV_|_ENVS?$)")  # module constants naming variables (S3_ENDPOINT_ENVS)

ADDON_VARIABLES = {"REDIS_URL": "set by the heroku-redis add-on"}
PLATFORM_VARIABLES = {"PORT": "set by Heroku for web", "DYNO": "set by Heroku on every dyno",
                      "HONCHO_PROCESS_NAME": "set by honcho, not on Heroku"}
# Read, but deliberately not declared: each is a second name of a declared variable, or another tool's switch.
FALLBACKS = {
    "CAIRN_INSTANCE_ID": "second name of CAIRN_WORKER_INSTANCE_ID (the Strava worker's first)",
    "TOKEN": "Voicy's client name, read after VOICY_WORKER_TELEGRAM_BOT_TOKEN",
    "VOICY_WHISPER_MODEL": "Voicy's adapter name, read after VOICY_WORKER_MODEL",
    "AWS_DEFAULT_REGION": "boto's name, read after AWS_REGION",
    "AWS_ENDPOINT_URL": "boto's name, read after VOICY_WORKER_S3_ENDPOINT_URL",
    "HF_HUB_OFFLINE": "Hugging Face's own switch (tests, air-gapped GPU hosts)",
    "TRANSFORMERS_OFFLINE": "Hugging Face's older name of the same switch",
    "OMP_NUM_THREADS": "OpenMP's and OpenBLAS's own switch (a CUDA gpu process sets it itself, docs 4.2)",
    "CUDA_VISIBLE_DEVICES": "CUDA's own switch (read to guess device=auto before CTranslate2 loads)",
}
ALWAYS_REQUIRED = {"FLOWER_PASSWORD": "the web process refuses to serve Flower without authentication"}
_BRIDGE_LINE = re.compile(r"^([\w-]+):.*\bpython -m bridges (\w+)", re.M)  # a Procfile type running a bridge
# Variables a side cannot run without on Heroku beyond its switches (the bridge's SIDE_VARIABLES).
SIDE_NEEDS = {"voicy": ("VOICY_WORKER_MEDIA_STORE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
# Heroku Key-Value Store tiers that persist with an append-only file (appendfsync everysec); mini has none.
AOF_PLAN_TIERS = ("premium-", "private-", "shield-")


def app_json() -> dict[str, Any]:
    return json.loads(APP_JSON.read_text())


def _settings_classes() -> Iterator[type[BaseSettings]]:
    """Every pydantic-settings class of the fleet, found by importing its packages."""
    from pydantic_settings import BaseSettings

    for package in ("workers", "tasks"):
        if package == "tasks":
            importlib.import_module("tasks.settings")  # ``import tasks`` would build the Celery app
            continue
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if ".pb" not in info.name:
                importlib.import_module(info.name)
    pending = list(BaseSettings.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith(("workers.", "tasks.")):  # not ops' (the health verb's), nor a test's,
            yield cls  # which another test module of this xdist worker may have imported first


def settings_variables() -> set[str]:
    from workers.config import env_name

    return {env_name(cls, field)
            for cls in _settings_classes() for field in cls.model_fields}


def _fleet_files() -> Iterator[Path]:
    for entry in FLEET_CODE:
        path = ROOT / entry
        yield from ([path] if path.is_file() else sorted(path.rglob("*.py")))


def _constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [v for elt in node.elts for v in _constants(elt)]
    if isinstance(node, ast.Dict):
        return [v for value in node.values for v in _constants(value)]
    return []


def direct_reads() -> dict[str, str]:
    """Variables the fleet's code reads itself (``os.environ.get("X")``, ``X in os.environ``,
    ``*_ENVS`` constants), each with one file that reads it."""
    found: dict[str, str] = {}
    for path in _fleet_files():
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Call) and ENV_READ_CALL.search(ast.unparse(node.func)) and node.args:
                names = _constants(node.args[0])
            elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("environ"):
                names = _constants(node.slice)
            elif isinstance(node, ast.Compare) and any(ast.unparse(c).endswith("environ") for c in node.comparators):
                names = _constants(node.left)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and ENV_CONSTANT.search(t.id)
                                                      for t in node.targets):
                names = _constants(node.value)
            elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SIDE_VARIABLES"
                                                      for t in node.targets):
                names = _constants(node.value)
            for name in names:
                if ENV_NAME.match(name):
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def read_by_others() -> set[str]:
    """Variables read beyond the settings fields and direct reads: the Procfile's own lines, each pool's
    ``CAIRN_POOL_<pool>_*`` credentials, Flower's options (``FLOWER_<OPTION>``) and boto3's credentials,
    each taken from the code that reads it."""
    import botocore.credentials
    import flower.options  # noqa: F401 - defines Flower's tornado options
    from tornado.options import options

    from workers.cairn.settings import POOL_CREDENTIALS, CairnSettings, pool_variable

    procfile = (ROOT / "Procfile").read_text()
    names = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", procfile))
    # A pool's own credentials, CAIRN_POOL_<pool>_*, for each pool the Procfile runs (CairnSettings reads them).
    pools = set(re.findall(r"CAIRN_WORKER_NAME=([\w-]+)", procfile))
    pools.add(CairnSettings.model_fields["worker_name"].default)
    names |= {pool_variable(pool, field) for pool in pools for field in POOL_CREDENTIALS}
    names |= {f"FLOWER_{option.replace('-', '_').upper()}" for option in options._options}
    names |= {botocore.credentials.EnvProvider.ACCESS_KEY, botocore.credentials.EnvProvider.SECRET_KEY}
    return names


def test_the_scan_finds_what_the_fleet_reads() -> None:
    """The scan itself: a direct read in each form above is found (else the next test proves nothing)."""
    reads = direct_reads()
    for name in ("FLOWER_PASSWORD", "FLOWER_INSPECT_TIMEOUT", "AWS_REGION", "AWS_ENDPOINT_URL",
                 "VOICY_MAX_MEDIA_FILE_SIZE_MB", "DYNO", "CAIRN_NATS_URL", "VOICY_WORKER_TOKEN"):
        assert name in reads, name
    assert {"REDIS_URL", "VOICY_WORKER_API_URL", "CAIRN_WORKER_INSTANCE_ID",
            "CAIRN_STRAVA_WEBHOOK_VERIFY_TOKEN"} <= settings_variables()


def test_every_variable_the_fleet_reads_is_declared_and_every_declared_one_is_read() -> None:
    env = app_json()["env"]
    read = settings_variables() | set(direct_reads())
    undeclared = read - set(env) - set(ADDON_VARIABLES) - set(PLATFORM_VARIABLES) - set(FALLBACKS)
    assert not undeclared, f"app.json does not declare {sorted(undeclared)}"
    stale = set(env) - read - read_by_others()
    assert not stale, f"app.json declares {sorted(stale)}, which nothing in the fleet reads"
    assert not (set(ADDON_VARIABLES) | set(PLATFORM_VARIABLES)) & set(env)


def test_every_declared_variable_is_documented() -> None:
    docs = OPERATIONS_MD.read_text()
    missing = sorted(name for name in app_json()["env"] if f"`{name}`" not in docs)
    assert not missing, f"docs/operations.md does not document {missing}"


def test_nothing_blocks_the_deploy_form_and_side_variables_say_which_side() -> None:
    from bridges.__main__ import SIDE_VARIABLES

    env = app_json()["env"]
    for name, spec in env.items():
        required = spec.get("required", True)  # Heroku's default
        assert not required or "value" in spec or "generator" in spec, (
            f"{name} is required without a value: the deploy form would block on it")
    for name, why in ALWAYS_REQUIRED.items():
        assert env[name].get("required", True) and env[name].get("generator") == "secret", (name, why)
    for side, switches in SIDE_VARIABLES.items():
        for name in (*switches, *SIDE_NEEDS.get(side, ())):
            assert env[name].get("required") is False, name
            assert f"Required for the {side.capitalize()} side" in env[name]["description"], name


def test_bridges_start_out_of_the_formation_and_the_docs_say_so() -> None:
    """Heroku restarts a dyno even after exit 0: a bridge whose side is unset would loop. Every Procfile
    type that runs ``python -m bridges`` starts at 0, and the docs say how to scale it up."""
    from bridges.__main__ import SIDE_VARIABLES

    app, docs = app_json(), OPERATIONS_MD.read_text()
    bridges = dict(_BRIDGE_LINE.findall((ROOT / "Procfile").read_text()))
    assert {"voicy_bridge", "cairn_bridge"} <= set(bridges) and set(bridges.values()) <= set(SIDE_VARIABLES)
    for bridge in bridges:
        assert app["formation"][bridge]["quantity"] == 0, bridge
        assert f"heroku ps:scale {bridge}=1" in docs, bridge
    for ptype in ("web", "beat"):
        assert app["formation"][ptype]["quantity"] == 1


def test_the_redis_plan_keeps_an_append_only_file() -> None:
    """docs/operations.md §2.4 runs Redis with appendonly yes; Heroku's mini plan has no persistence."""
    plans = [a["plan"] if isinstance(a, dict) else a for a in app_json()["addons"]]
    [redis_plan] = [p for p in plans if p.startswith("heroku-redis:")]
    tier = redis_plan.partition(":")[2]
    assert tier.startswith(AOF_PLAN_TIERS), f"{redis_plan} keeps no AOF"
    docs = OPERATIONS_MD.read_text()
    assert f"`{redis_plan}`" in docs and "appendonly yes" in docs


@pytest.mark.parametrize("name", sorted(FALLBACKS))
def test_each_undeclared_fallback_is_really_read(name: str) -> None:
    """The allow-list stays honest: a fallback nothing reads any more is removed from it."""
    assert name in direct_reads() or name in _alias_names(), name


def _alias_names() -> set[str]:
    names: set[str] = set()
    for cls in _settings_classes():
        for info in cls.model_fields.values():
            names |= {c.upper() for c in getattr(info.validation_alias, "choices", ()) if isinstance(c, str)}
    return names
