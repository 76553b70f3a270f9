"""Scenario files are held to the same limits as the options that override them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tabletune.core.errors import ContractError
from tabletune.simulator.scenario import MAX_DURATION_S, load_scenario


def test_a_scenario_asking_for_an_endless_run_is_refused_naming_the_field(tmp_path):
    from tabletune.simulator.scenario import SCENARIO_DIR

    doc = json.loads((SCENARIO_DIR / "dense-fast-gpu.json").read_text())
    doc["duration_s"] = 1e308
    path = tmp_path / "endless.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ContractError, match=r"endless.json: scenario\[dense-fast-gpu\].duration_s: 1e\+308 is above 3600"):
        load_scenario(path)
    assert MAX_DURATION_S == 3600.0
    # Through the standalone entry point: exit 2 with one line, at once.
    proc = subprocess.run([sys.executable, "-m", "tabletune.simulator.cli", "simulate",
                           "--scenario", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "duration_s" in proc.stderr and "Traceback" not in proc.stderr
