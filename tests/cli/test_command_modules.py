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
