"""Every option of every command says what it is for, and shows its default."""

from __future__ import annotations

import argparse

import pytest

from tabletune.cli import build_parser
from tabletune.pipeline.cli import build_registry_parser


def _walk(parser: argparse.ArgumentParser, path: str):
    """(command path, parser) for ``parser`` and every subcommand below it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")


def _parsers():
    yield from _walk(build_parser(), "tabletune")
    yield from _walk(build_registry_parser(), "tabletune registry")


def test_every_option_of_every_command_has_help_text():
    missing = [f"{path} {'/'.join(action.option_strings) or action.dest}"
               for path, parser in _parsers() for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and not (action.help or "").strip()]
    assert missing == []


def test_the_commands_checked_include_every_subcommand():
    paths = {path for path, _ in _parsers()}
    assert {"tabletune tune", "tabletune build", "tabletune simulate", "tabletune doctor",
            "tabletune evaluate", "tabletune registry seed", "tabletune registry show"} <= paths


@pytest.mark.parametrize("command, shown", [
    (["build"], ["--tie-margin TIE_MARGIN", "(default: 0.005)"]),
    (["tune"], ["(default: tabletune-out)", "(default: 160)", "(default: 600.0)"]),
])
def test_help_shows_defaults(command, shown, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args([*command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for piece in shown:
        assert piece in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_simulate_help_shows_the_shipped_scenarios_defaults(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "'duration_s': dense-fast-gpu 30," in text and " moe 40" in text
    assert "'seed': dense-fast-gpu 2," in text and " moe 1" in text
