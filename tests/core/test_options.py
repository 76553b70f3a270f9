"""Every numeric option of every command is declared with its range (core/options.py), and a
value out of range exits 2 naming the option, before any engine, service or file is touched."""

from __future__ import annotations

import argparse

import pytest

from tabletune.core.errors import ContractError
from tabletune.core.options import Checked, check_options, int_list, integer, number


def _parsers():
    from tabletune.cli import build_parser
    from tabletune.pipeline.cli import build_registry_parser
    from tabletune.simulator.cli import add_simulate_parser

    standalone = argparse.ArgumentParser(prog="sim")
    add_simulate_parser(standalone.add_subparsers(dest="command"))
    roots = [("tabletune", build_parser()), ("tabletune registry", build_registry_parser()),
             ("simulate alone", standalone)]
    seen = []
    while roots:
        name, parser = roots.pop()
        seen.append((name, parser))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                roots.extend((f"{name} {sub}", p) for sub, p in action.choices.items())
    return seen


def test_no_option_of_any_command_is_a_bare_int_or_float():
    bare = [f"{name} {action.option_strings[0]}"
            for name, parser in _parsers() for action in parser._actions
            if action.type in (int, float)]
    assert bare == [], "declare these with tabletune.core.options.integer()/number()"
    checked = sum(isinstance(a.type, Checked) for _, p in _parsers() for a in p._actions)
    assert checked > 40  # the rule covers the commands, not a handful of options


def test_checked_types_convert_and_check_after_parsing():
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=integer(1, 10))
    p.add_argument("--x", type=number(positive=True, below=1))
    p.add_argument("--levels", type=int_list(1))
    for argv, message in ((["--n", "0"], "--n: 0 is not an integer >= 1"),
                          (["--n", "11"], "--n: 11 is above 10, the largest value allowed here"),
                          (["--x", "nan"], "--x: nan is not a positive number"),
                          (["--x", "inf"], "--x: inf is not a finite number"),
                          (["--x", "1"], "--x: 1.0 is not a number below 1"),
                          (["--levels", "1,0"], "--levels: 0 is not an integer >= 1"),
                          (["--levels", ","], "--levels: () is empty")):
        args = p.parse_args(argv)
        with pytest.raises(ContractError) as err:
            check_options(p, args)
        assert str(err.value) == message
    args = p.parse_args(["--n", "3", "--x", "0.5", "--levels", "1,2"])
    check_options(p, args)
    assert (args.n, args.x, args.levels) == (3, 0.5, (1, 2))


@pytest.mark.parametrize(("argv", "message"), [
    (["tune", "--temperature", "nan"], "--temperature: nan is not a number >= 0"),
    (["tune", "--startup-timeout", "nan"], "--startup-timeout: nan is not a positive number"),
    (["tune", "--serving-resolve", "-1"], "--serving-resolve: -1.0 is not a number >= 0"),
    (["tune", "--max-batch-size", str(10**7)], "--max-batch-size: 10000000 is above 1048576"),
    (["acceptance", "--max-tokens", "0"], "--max-tokens: 0 is not an integer >= 1"),
    (["acceptance", "--seed", "-1"], "--seed: -1 is not an integer >= 0"),
    (["profile", "--max-batch-size", "0"], "--max-batch-size: 0 is not an integer >= 1"),
    (["profile", "--drift-bound", "inf"], "--drift-bound: inf is not a finite number"),
    (["evaluate", "--requests-per-client", "0"],
     "--requests-per-client: 0 is not an integer >= 1"),
    (["evaluate", "--parallel-startups", "0"], "--parallel-startups: 0 is not an integer >= 1"),
    (["evaluate", "--concurrency", "1,0"], "--concurrency: 0 is not an integer >= 1"),
    (["evaluate", "--min-seconds", "-1"], "--min-seconds: -1.0 is not a positive number"),
    (["evaluate", "--target-interval", "0"], "--target-interval: 0.0 is not a positive number"),
    (["evaluate", "--level-budget", "-1"], "--level-budget: -1.0 is not a positive number"),
    (["doctor", "--startup-timeout", "0"], "--startup-timeout: 0.0 is not a positive number"),
    (["doctor", "--max-noise", "1"], "--max-noise: 1.0 is not a number below 1"),
    (["simulate", "--scenario", "moe", "--duration", "1e308"],
     "--duration: 1e+308 is above 3600, the largest value allowed here"),
    (["simulate", "--scenario", "moe", "--seed", "-1"], "--seed: -1 is not an integer >= 0"),
    (["build", "--profile", "p", "--acceptance", "a", "--out", "t", "--tie-margin", "nan"],
     "--tie-margin: nan is not a number >= 0"),
])
def test_every_command_refuses_an_out_of_range_option_by_name(argv, message, capsys, tmp_path,
                                                              monkeypatch):
    from tabletune import cli
    from tabletune.commands import measure

    monkeypatch.chdir(tmp_path)
    for name in ("engine_spec_from_args", "_run_profile", "_run_acceptance"):
        monkeypatch.setattr(measure, name, lambda *a, **k: pytest.fail("engine work started"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tabletune {argv[0]}: error: {message}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing written, no folder made


def test_argparse_conversion_errors_name_the_option(capsys):
    from tabletune.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--concurrency", "1,x"])
    assert exit_info.value.code == 2
    assert "argument --concurrency: '1,x' is not a comma-separated list of integers" in (
        capsys.readouterr().err)
