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
    (envs.CACHE, "", None), (envs.TRACE_GRAPHS_EVERY_S, "0.5", 0.5),
    (envs.SWITCH_INTERVAL_S, "0.0005", 0.0005), (envs.TRACE_HOST, "1", True),
])
def test_values_are_parsed_as_the_readers_always_read_them(monkeypatch, var, raw, value):
    monkeypatch.setenv(var.name, raw)
    assert var.get() == value


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "inf", "nan"])
def test_a_trace_interval_must_be_seconds_above_zero(monkeypatch, raw):
    monkeypatch.setenv(envs.TRACE_GRAPHS_EVERY_S.name, raw)
    with pytest.raises(ValueError, match="TABLETUNE_TRACE_GRAPHS_EVERY_S"):
        envs.TRACE_GRAPHS_EVERY_S.get()


def test_only_the_table_reads_a_tabletune_variable_from_the_environment():
    """``os.environ.get(X)``, ``os.environ[X]``, ``os.getenv(X)`` with X a TABLETUNE_* name or
    one of ``vllm_contract``'s ``*_ENV`` aliases: only ``envs.EnvVar.get`` may (a second reader
    would parse the text its own way, as the prior cache's default once differed)."""
    def aliased(node) -> bool:
        return isinstance(node, ast.Name) and node.id.endswith("_ENV") or (
            isinstance(node, ast.Constant) and isinstance(node.value, str)
            and NAME.fullmatch(node.value) is not None)

    def environ(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    reads = []
    for path in sorted([*ROOT.glob("tabletune/**/*.py"), *ROOT.glob("dags/*.py"),
                        *ROOT.glob("plugins/*.py")]):
        if path == ROOT / "tabletune/core/envs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            key = None
            if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
                f = node.func
                if (f.attr == "get" and environ(f.value)) or (
                        f.attr == "getenv" and isinstance(f.value, ast.Name)):
                    key = node.args[0]
            elif isinstance(node, ast.Subscript) and environ(node.value) and isinstance(
                    node.ctx, ast.Load):
                key = node.slice
            if key is not None and aliased(key):
                reads.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert reads == []


def test_the_prior_cache_honours_xdg_cache_home_and_refuses_an_empty_value(monkeypatch,
                                                                           tmp_path):
    monkeypatch.delenv(envs.PRIOR_CACHE.name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert envs.prior_cache_dir() == str(tmp_path / "tabletune" / "priors")
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert envs.prior_cache_dir().endswith("/.cache/tabletune/priors")
    monkeypatch.setenv(envs.PRIOR_CACHE.name, str(tmp_path / "mine"))
    assert envs.prior_cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv(envs.PRIOR_CACHE.name, "")
    with pytest.raises(ValueError, match="TABLETUNE_PRIOR_CACHE: '' is empty"):
        envs.prior_cache_dir()


def test_a_registry_prior_with_an_empty_cache_variable_is_refused_naming_it(monkeypatch):
    from tabletune.core.errors import ContractError
    from tabletune.vllm.controller_setup import load_prior

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    monkeypatch.setenv(envs.PRIOR_CACHE.name, "")
    with pytest.raises(ContractError, match="TABLETUNE_PRIOR_CACHE: '' is empty"):
        load_prior("models:/tabletune-x@production")
