"""One atomic-write helper for the whole package, and every file writer going through it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from factories import make_acceptance, make_profile

import tabletune
import tabletune.core.atomic as atomic
from tabletune import doctor, evaluate
from tabletune.cli import main
from tabletune.controller.runtime import build_runtime
from tabletune.core.prior import Prior
from tabletune.core.atomic import atomic_replace, atomic_write_text
from tabletune.core.builder import build_table
from tabletune.core.step_times import StepTimes
from tabletune.core.contracts import save_json
from tabletune.core.tables import DraftTable
from tabletune.tuner import profiler

PACKAGE_DIR = Path(tabletune.__file__).parent
HELPER = Path(atomic.__file__)


def _break_replace(monkeypatch):
    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)


# ---------------------------------------------------------------------------- the helper


def test_atomic_write_text_replaces_the_whole_file_with_a_normal_mode(tmp_path):
    path = tmp_path / "doc.txt"
    atomic_write_text(path, "old\n")
    atomic_write_text(path, "néw → text\n")
    assert path.read_bytes() == "néw → text\n".encode()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert os.listdir(tmp_path) == ["doc.txt"]


@pytest.mark.parametrize("broken", ["replace", "fsync"])
def test_atomic_write_text_failure_keeps_the_old_file_and_no_temp_file(tmp_path, monkeypatch,
                                                                        broken):
    path = tmp_path / "doc.txt"
    atomic_write_text(path, "old\n")

    def boom(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, broken, boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(path, "new\n")
    monkeypatch.undo()
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["doc.txt"]


def test_atomic_write_text_encodes_before_creating_anything(tmp_path):
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(tmp_path / "doc.txt", "\udcff")
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_is_named_not_the_temp_file(tmp_path):
    target = tmp_path / "no" / "such" / "dir" / "t.json"
    with pytest.raises(FileNotFoundError) as err:
        atomic_write_text(target, "{}")
    assert str(target) in str(err.value) and ".tmp" not in str(err.value)
    assert not (tmp_path / "no").exists()  # the helper creates no directories


def test_atomic_replace_moves_a_staged_directory(tmp_path):
    staging = tmp_path / ".staging"
    staging.mkdir()
    (staging / "a.json").write_text("{}")
    atomic_replace(staging, tmp_path / "final")
    assert (tmp_path / "final" / "a.json").read_text() == "{}" and not staging.exists()


# ---------------------------------------------------------------------------- every writer


def _runtime(out_dir):
    profile = make_profile()
    acceptance = make_acceptance()
    doc = build_table(StepTimes.from_profile(profile), acceptance.rates).to_document({})
    return build_runtime(Prior(doc, profile, acceptance, "test"),
                         static_lookup=[0] + [1] * 64, num_spec_tokens=3, max_num_seqs=64,
                         out_dir=out_dir)


def _writers(tmp_path):
    """(name, write(version) -> None, files it writes) for every writer of a shared file."""
    control = tmp_path / "control.json"
    runtime_dir = tmp_path / "runtime"
    holder = {}

    def runtime_write(version):
        if "runtime" not in holder:
            holder["runtime"] = _runtime(runtime_dir)
        holder["runtime"].estimator._steps = version  # shows in state.json and metrics.prom
        holder["runtime"]._write_state()

    return [
        ("save_json", lambda v: save_json(tmp_path / "doc.json", {"v": v}),
         [tmp_path / "doc.json"]),
        ("profiler._write_control", lambda v: profiler._write_control(control, v), [control]),
        ("evaluate._select",
         lambda v: evaluate._select(control, evaluate.Arm(f"k{v}", "fixed-table", k=v)),
         [control]),
        ("doctor._pin", lambda v: doctor._pin(control, {"force_k": v}), [control]),
        ("ControllerRuntime._write_state", runtime_write,
         [runtime_dir / "state.json", runtime_dir / "metrics.prom"]),
    ]


@pytest.mark.parametrize("index", range(5))
def test_every_writer_is_atomic_and_leaves_no_temp_file(tmp_path, monkeypatch, index):
    name, write, files = _writers(tmp_path)[index]
    write(1)
    before = {f: f.read_bytes() for f in files}
    listing = {d: sorted(os.listdir(d)) for d in {f.parent for f in files}}
    _break_replace(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        write(2)
    monkeypatch.undo()
    assert {f: f.read_bytes() for f in files} == before, name
    assert {d: sorted(os.listdir(d)) for d in listing} == listing, f"{name} left a temp file"
    write(3)
    assert all(f.read_bytes() != before[f] for f in files), name


def test_control_files_keep_their_content(tmp_path):
    control = tmp_path / "control.json"
    profiler._write_control(control, 2)
    assert json.loads(control.read_text()) == {"force_k": 2}
    doctor._pin(control, {})
    assert json.loads(control.read_text()) == {}
    evaluate._select(control, evaluate.Arm("t", "table",
                                                  table=DraftTable.from_ranges([[1, 8, 2]])))
    assert json.loads(control.read_text()) == {"table": [[1, 8, 2]]}
    evaluate._select(control, evaluate.Arm("f", "fixed-table", k=1))
    assert json.loads(control.read_text()) == {"force_k": 1}
    evaluate._select(control, evaluate.Arm("controller", "controller", prior="p"))
    assert json.loads(control.read_text()) == {}  # nothing pinned: the controller decides
    assert os.listdir(tmp_path) == ["control.json"]


def test_out_dirs_that_were_created_before_still_are(tmp_path, capsys):
    # The controller's --out folder (nested, missing) is created as before.
    _runtime(tmp_path / "a" / "b" / "out")
    assert json.loads((tmp_path / "a" / "b" / "out" / "state.json").read_text())["steps"] == 0
    # `build --out` into a missing folder was an error before and still is (exit 2), but the
    # message names the requested file, not a random temp name.
    save_json(tmp_path / "profile.json", make_profile())
    save_json(tmp_path / "acceptance.json", make_acceptance())
    out = tmp_path / "missing" / "t.json"
    assert main(["build", "--profile", str(tmp_path / "profile.json"),
                 "--acceptance", str(tmp_path / "acceptance.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and ".tmp" not in err


# ---------------------------------------------------------------------------- consolidation


def test_os_replace_appears_only_in_the_shared_helper():
    """Every atomic write goes through tabletune.core.atomic; a second copy of the
    temp-file-and-rename dance (which is where partial files and stray .tmp files come from)
    fails this test."""
    pattern = re.compile(r"\bos\s*\.\s*(replace|rename)\s*\(|from\s+os\s+import\s+[^\n]*"
                         r"\b(replace|rename)\b")
    offenders = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        if path == HELPER:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(PACKAGE_DIR.parent)}:{number}: "
                                 f"{line.strip()}")
    assert offenders == [], ("os.replace outside tabletune/core/atomic.py; call "
                             "atomic_write_text / atomic_replace instead:\n" + "\n".join(offenders))
    assert "os.replace(" in HELPER.read_text(encoding="utf-8")
