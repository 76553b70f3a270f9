"""The command modules share engine and prompt options through modules of their own:
``evaluate`` and ``doctor`` never import ``tabletune.cli`` (which imports them)."""

from __future__ import annotations

import subprocess
import sys


def test_evaluate_and_doctor_load_without_the_cli_module():
    code = ("import sys, tabletune.evaluate, tabletune.doctor; "
            "print(sorted(m for m in sys.modules if m.startswith('tabletune.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout
    assert "'tabletune.engine_args'" in loaded and "'tabletune.prompt_args'" in loaded
    assert "'tabletune.cli'" not in loaded


def test_every_engine_command_gets_its_options_from_one_place():
    from tabletune.cli import build_parser
    from tabletune.engine_args import engine_spec_from_args

    engine = ["--model", "/m/t", "--drafter", "/m/d", "--runner", "v2",
              "--engine-arg=--enforce-eager", "--max-num-seqs", "48"]
    specs = {}
    for command in ("tune", "profile", "acceptance", "evaluate", "doctor"):
        prompts = [] if command == "profile" else ["--num-prompts", "7"]
        args = build_parser().parse_args([command, *engine, *prompts])
        specs[command] = engine_spec_from_args(args)
        if prompts:
            assert args.num_prompts == 7
    assert len(set(specs.values())) == 1
    spec = specs["tune"]
    assert (spec.runner, spec.extra_args, spec.max_num_seqs) == ("v2", ("--enforce-eager",), 48)


def test_every_command_is_registered_in_one_table_and_a_missing_module_fails_loudly(
        monkeypatch, capsys):
    from tabletune import cli

    names = {action.dest for action in cli.build_parser()._subparsers._group_actions}
    assert names == {"command"}
    listed = {name.strip() for names, _, _ in cli.COMMANDS for name in names.split(",")}
    assert listed == set(cli.build_parser()._subparsers._group_actions[0].choices)
    monkeypatch.setattr(cli, "COMMANDS", (*cli.COMMANDS,
                                          ("nowhere", "tabletune.no_such_module", "add")))
    assert cli.main(["show", "t.json"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tabletune: error: tabletune nowhere: cannot import "
                          "tabletune.no_such_module: No module named 'tabletune.no_such_module'")


def test_registry_is_dispatched_through_the_same_parser_as_every_command(monkeypatch, capsys):
    from tabletune import cli

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = cli.build_parser().parse_args(["registry", "--tracking-uri", "http://h:1", "show",
                                          "--model-name", "m"])
    assert (args.command, args.registry_command, args.tracking_uri) == ("registry", "show",
                                                                         "http://h:1")
    assert cli.main(["registry", "seed", "--engine-default", "--profile", "p",
                     "--acceptance", "a", "--max-batch-size", "0"]) == 2
    assert capsys.readouterr().err.startswith(
        "tabletune registry seed: error: --max-batch-size: 0 is not an integer >= 1")
