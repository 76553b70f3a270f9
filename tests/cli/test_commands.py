"""The tuner's command modules (tabletune/commands/) stand without ``tabletune.cli``: the CLI
imports them through ``COMMANDS``, never the other way."""

from __future__ import annotations

import subprocess
import sys


def test_the_command_modules_load_without_the_cli_module():
    code = ("import sys, tabletune.commands.measure, tabletune.commands.tables; "
            "print(sorted(m for m in sys.modules if m.startswith('tabletune.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout
    assert "'tabletune.report.text'" in loaded
    assert "'tabletune.cli'" not in loaded


def test_each_command_module_adds_the_commands_it_is_listed_with():
    import argparse
    import importlib

    from tabletune.cli import COMMANDS

    for names, module, function in COMMANDS:
        if not module.startswith("tabletune.commands."):
            continue
        sub = argparse.ArgumentParser().add_subparsers()
        getattr(importlib.import_module(module), function)(sub)
        assert list(sub.choices) == [name.strip() for name in names.split(",")]
