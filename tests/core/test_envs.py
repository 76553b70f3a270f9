"""Every TABLETUNE_* environment variable is defined once, in tabletune.core.envs, with a
default, a parser and a reason; nothing else in the package, the DAGs or the plugin spells a
name as a string of its own."""

import ast
import re
from pathlib import Path

import pytest

from tabletune.core import envs

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"TABLETUNE_[A-Z0-9_]+")


def test_every_name_in_the_code_is_spelled_only_in_the_table():
    spelled = []
    for path in sorted([*ROOT.glob("tabletune/**/*.py"), *ROOT.glob("dags/*.py"),
                        *ROOT.glob("plugins/*.py")]):
        if path == ROOT / "tabletune/core/envs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and NAME.fullmatch(node.value):
                spelled.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value}")
    assert spelled == []


def test_each_variable_has_a_reason_and_its_default_when_unset(monkeypatch):
    for name, var in envs.ENV_VARS.items():
        assert var.name == name and NAME.fullmatch(name) and var.doc.strip()
        monkeypatch.delenv(name, raising=False)
        assert var.get() == var.default


@pytest.mark.parametrize("var, raw, value", [
    (envs.COMPAT, "off", False), (envs.COMPAT, " No ", False), (envs.COMPAT, "1", True),
    (envs.TRACE_GRAPHS, "0", False), (envs.TRACE_GRAPHS, "yes", True),
    (envs.REJECT_ALL, "", False), (envs.CONTROLLER_ALLOW_FOREIGN_PRIOR, "TRUE", True),
    (envs.CONTROLLER_ALLOW_FOREIGN_PRIOR, "2", False), (envs.TASK_RETRIES, "3", 3),
    (envs.CACHE, "", None),
])
def test_values_are_parsed_as_the_readers_always_read_them(monkeypatch, var, raw, value):
    monkeypatch.setenv(var.name, raw)
    assert var.get() == value
