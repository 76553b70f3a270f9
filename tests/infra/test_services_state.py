"""infra/local/services.sh says what state an earlier stack left (registered models, where the
Airflow database's DAGs came from, components serving another checkout) and `clean` removes it.

Runs the script itself on a temporary state dir with databases and a stand-in component of our
own; nothing of the real stack starts."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "local" / "services.sh"


def services(state: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TABLETUNE_SERVICES_DIR": str(state),
           "TABLETUNE_VENV_BIN": str(Path(sys.executable).parent)}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def earlier_stack(tmp_path) -> Path:
    """A state dir as an earlier stack from another checkout left it (stopped)."""
    state = tmp_path / "services"
    (state / "mlflow").mkdir(parents=True)
    (state / "airflow").mkdir()
    (state / "secrets.sh").write_text("TT_AIRFLOW_PASSWORD=kept\n")
    (state / "env.sh").write_text("# earlier\n")
    with sqlite3.connect(state / "mlflow" / "mlflow.db") as db:
        db.execute("CREATE TABLE registered_models (name TEXT)")
        db.executemany("INSERT INTO registered_models VALUES (?)",
                       [("tabletune-a",), ("tabletune-b",), ("tabletune-c",)])
    with sqlite3.connect(state / "airflow" / "airflow.db") as db:
        db.execute("CREATE TABLE dag (dag_id TEXT, fileloc TEXT)")
        db.executemany("INSERT INTO dag VALUES (?, ?)",
                       [("tabletune_promote", "/elsewhere/checkout/dags/tabletune_promote.py"),
                        ("tabletune_profile", "/elsewhere/checkout/dags/tabletune_profile.py")])
    return state


def test_state_names_what_an_earlier_stack_left_and_warns(earlier_stack):
    result = services(earlier_stack, "state")
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert f"[services] Airflow DAGs folder: {REPO}/dags" in err
    assert f"state dir {earlier_stack}: reusing an earlier stack's state" in err
    assert f"MLflow: 3 registered models in {earlier_stack}/mlflow/mlflow.db" in err
    # moto keeps objects in memory only: with S3 not running, those artifacts are gone.
    assert "WARNING: their artifacts were in the previous S3 server" in err
    assert "Airflow: 2 DAGs" in err and "last parsed from /elsewhere/checkout/dags" in err
    assert ("WARNING: the Airflow database's DAGs come from /elsewhere/checkout/dags, not this "
            f"checkout's {REPO}/dags") in err


def test_a_new_state_dir_is_called_new(tmp_path):
    result = services(tmp_path / "fresh", "state")
    assert result.returncode == 0, result.stderr
    assert f"state dir {tmp_path / 'fresh'}: new" in result.stderr
    assert "WARNING" not in result.stderr


def test_a_component_running_for_another_checkout_is_named(earlier_stack):
    (earlier_stack / "run").mkdir()
    # A stand-in dag processor: its command line says airflow, its environment another checkout.
    stand_in = subprocess.Popen(
        ["bash", "-c", "exec -a airflow-dag-processor sleep 60"], start_new_session=True,
        env={**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": "/elsewhere/checkout/dags"})
    # Reaped the moment it exits, as init reaps the real (detached) components: `stop` waits
    # until the pid is gone, and a zombie child of ours would still answer kill -0.
    reaper = threading.Thread(target=stand_in.wait, daemon=True)
    reaper.start()
    try:
        (earlier_stack / "run" / "airflow-dag-processor.pid").write_text(f"{stand_in.pid}\n")
        result = services(earlier_stack, "state")
        assert (f"WARNING: airflow-dag-processor (pid {stand_in.pid}) is already running with "
                "DAGs from /elsewhere/checkout/dags") in result.stderr
        # clean stops what start recorded, then removes the state; the secrets stay.
        result = services(earlier_stack, "clean")
        assert result.returncode == 0, result.stderr
        reaper.join(timeout=20)
        assert stand_in.returncode is not None
    finally:
        if stand_in.poll() is None:
            stand_in.kill()
            stand_in.wait()
    assert sorted(p.name for p in earlier_stack.iterdir()) == ["secrets.sh"]
    assert (earlier_stack / "secrets.sh").read_text() == "TT_AIRFLOW_PASSWORD=kept\n"
    assert "new" in services(earlier_stack, "state").stderr


def test_clean_refuses_a_folder_that_is_not_a_state_dir(tmp_path):
    (tmp_path / "precious.txt").write_text("keep me")
    result = services(tmp_path, "clean")
    assert result.returncode == 2
    assert "refusing to clean" in result.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_start_refuses_an_unknown_option(tmp_path):
    result = services(tmp_path / "s", "start", "--clear")
    assert result.returncode == 2 and "start [--clean]" in result.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was written
