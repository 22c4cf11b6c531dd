"""The ``switchyard`` console script: where it points, and how a new verb plugs in."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from ops import cli
from ops.commands import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_the_console_script_is_ops_cli_main_and_ops_is_packaged() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["switchyard"] == "ops.cli:main"
    assert "ops*" in project["tool"]["setuptools"]["packages"]["find"]["include"]


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for command in COMMANDS:
        assert isinstance(command, ModuleType)  # each command is a module
        name = command.__name__.rpartition(".")[2]
        assert f"    {name} " in text, text


def test_a_new_verb_with_sub_verbs_plugs_in_as_one_module(capsys: pytest.CaptureFixture[str]) -> None:
    """What ``switchyard strava webhook show`` will look like: a module with ``register``, no edit to the CLI."""
    calls: list[argparse.Namespace] = []

    def register(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        strava = verbs.add_parser("strava").add_subparsers(dest="topic", required=True)
        webhook = strava.add_parser("webhook").add_subparsers(dest="action", required=True)
        show = webhook.add_parser("show")
        show.add_argument("--timeout", type=float, default=5.0)

        def run(args: argparse.Namespace) -> int:
            calls.append(args)
            return 3

        show.set_defaults(run=run)

    strava_module = SimpleNamespace(register=register)
    # the real ``ops.commands.strava`` has landed: the stand-in replaces it (one verb name per module)
    others = tuple(c for c in COMMANDS if getattr(c, "__name__", "") != "ops.commands.strava")
    assert cli.main(["strava", "webhook", "show", "--timeout", "2"], commands=(*others, strava_module)) == 3
    assert calls[0].timeout == 2.0
    with pytest.raises(SystemExit):
        cli.main(["strava", "webhook"], commands=(*others, strava_module))  # a group alone is a usage error
    assert "required" in capsys.readouterr().err
