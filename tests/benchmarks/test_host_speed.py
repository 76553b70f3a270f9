"""benchmarks/gpu/host_speed.py: bad arguments end with exit 2 and an error line, before any
measuring and without a file written."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmark_scripts import script_path

SCRIPT = script_path("host_speed.py")


def _run(*args, cwd):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("args, said", [
    ((), "out"),
    (("--host-only",), "out"),
    (("probe.jsonl", "--host-only"), "seconds"),
    (("probe.jsonl", "ten", "--host-only"), "ten"),
    (("probe.jsonl", "0", "--host-only"), "0"),
    (("missing/probe.jsonl", "1", "--host-only"), "missing/probe.jsonl"),
])
def test_bad_arguments_exit_2_with_an_error_line_and_write_nothing(tmp_path, args, said):
    done = _run(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    error = [line for line in done.stderr.splitlines() if "error:" in line]
    assert error and said in error[0]
    assert list(tmp_path.iterdir()) == []


def test_a_host_only_probe_writes_a_line_per_sample(tmp_path):
    done = _run("probe.jsonl", "0.5", "--host-only", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "probe.jsonl").read_text().splitlines()]
    assert rows and all(row["python_ms"] > 0 for row in rows)
