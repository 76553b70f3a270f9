"""The same error exits the same way from every entry point: `tabletune`, its simulator's own
entry point and the pipeline's registry command (tabletune.core.exits)."""

import errno

import pytest

from tabletune import cli
from tabletune.adapters import mlflow_registry
from tabletune.commands import tables
from tabletune.pipeline.cli import registry_main
from tabletune.simulator import run as simulator_run
from tabletune.simulator.cli import main as simulator_main


def _raising(exc):
    def raise_it(*args, **kwargs):
        raise exc
    return raise_it


def _entry_points(monkeypatch, exc):
    """Each entry point, made to meet ``exc`` where its command does its work."""
    monkeypatch.setattr(tables, "cmd_show", _raising(exc))
    monkeypatch.setattr(simulator_run, "run_simulation", _raising(exc))

    class Registry:
        def __init__(self, *args, **kwargs):
            pass

        reconcile = staticmethod(_raising(exc))

    monkeypatch.setattr(mlflow_registry, "MlflowRegistry", Registry)
    return {
        "tabletune": lambda: cli.main(["show", "table.json"]),
        "simulator": lambda: simulator_main(["simulate", "--scenario", "moe"]),
        "registry": lambda: registry_main(["--tracking-uri", "http://127.0.0.1:9", "show",
                                           "--model-name", "m"]),
    }


@pytest.mark.parametrize("exc, status", [
    (OSError(errno.EROFS, "Read-only file system", "/out/x.json"), 2),
    (OSError(errno.ENOSPC, "No space left on device"), 2),
    (ValueError("x.json: table.ranges[0]: [0, 4, 1] does not start at 1"), 2),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), 1),
])
def test_the_same_error_exits_the_same_way_from_every_entry_point(monkeypatch, capsys, exc,
                                                                  status):
    for name, run in _entry_points(monkeypatch, exc).items():
        assert run() == status, name
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err, (name, err)
