"""benchmarks/gpu/convergence_levels.py: a convergence run's rebuilds filed by level, and the
target of one table change per 10 rebuilds after a level's first 3."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load_script

convergence_levels = load_script("convergence_levels.py")


def _run(tmp_path, levels, rebuilds):
    """levels: (c, started_at, wall_s); rebuilds: (time, changed)."""
    (tmp_path / "controller").mkdir()
    (tmp_path / "evaluate.json").write_text(json.dumps({"results": [
        {"arm": "controller", "concurrency": c, "started_at": start, "wall_s": wall,
         "tokens_per_s": 1000.0 * c} for c, start, wall in levels]}))
    (tmp_path / "controller" / "rebuilds.jsonl").write_text("".join(
        json.dumps({"time": t, "index": i, "changed": changed,
                    "new_ranges": [[1, 256, 3]], "held_by": {"step_time_noise": 2},
                    "step_time_ratio": 0.99}) + "\n"
        for i, (t, changed) in enumerate(rebuilds, 1)))
    return tmp_path


def _rows(out):
    return {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1:]
            for line in out.splitlines()[2:] if line.startswith("| ")}


def test_each_level_gets_the_rebuilds_of_its_window(tmp_path, capsys):
    run = _run(tmp_path, [(64, 100.0, 50.0), (256, 150.5, 50.0)],
               [(90.0, False)] + [(100.0 + 4 * i, False) for i in range(12)]
               + [(160.0, True), (170.0, False)])
    convergence_levels.main([str(run)])
    out = capsys.readouterr().out
    c64 = [json.loads(x) for x in (run / "c64" / "rebuilds.jsonl").read_text().splitlines()]
    c256 = [json.loads(x) for x in (run / "c256" / "rebuilds.jsonl").read_text().splitlines()]
    assert [r["index"] for r in c64] == list(range(2, 14))  # the warm-up's first one: no level
    assert [r["index"] for r in c256] == [14, 15]
    rows = _rows(out)
    assert rows["64"][:4] == ["12", "9", "0", "0.0 (met)"]
    # At c = 256 the change is among the first 3: nothing after them to judge.
    assert rows["256"][:4] == ["2", "0", "0", "- (no rebuild after the first 3)"]
    assert "1 rebuild(s) outside every level's window" in out


def test_two_changes_in_ten_settled_rebuilds_miss_the_target(tmp_path, capsys):
    changes = {5, 9}
    run = _run(tmp_path, [(128, 0.0, 100.0)], [(float(i), i in changes) for i in range(13)])
    convergence_levels.main([str(run)])
    assert _rows(capsys.readouterr().out)["128"][:4] == ["13", "10", "2", "2.0 (missed)"]


@pytest.mark.parametrize("damage, message", [
    (lambda run: (run / "evaluate.json").unlink(), "evaluate.json: no such file"),
    (lambda run: (run / "evaluate.json").write_text("{"), "evaluate.json: not JSON"),
    (lambda run: (run / "evaluate.json").write_text('{"results": []}'),
     "evaluate.json: no result of arm 'controller'"),
    (lambda run: (run / "controller" / "rebuilds.jsonl").write_text('{"time": 1}\n'),
     "rebuilds.jsonl: line 1: not a rebuild record"),
    (lambda run: (run / "controller" / "rebuilds.jsonl").write_text("x\n"),
     "rebuilds.jsonl: line 1: not JSON"),
    (lambda run: ((run / "controller" / "rebuilds.jsonl").unlink(),
                  (run / "controller" / "rebuilds.jsonl").mkdir()),
     "rebuilds.jsonl: Is a directory"),
    (lambda run: (run / "controller" / "rebuilds.jsonl").write_bytes(b"\xff\xfe"),
     "rebuilds.jsonl: not text"),
])
def test_bad_input_exits_2_naming_the_file_and_writes_nothing(tmp_path, capsys, damage,
                                                               message):
    run = _run(tmp_path, [(64, 0.0, 10.0)], [(1.0, False)])
    damage(run)
    with pytest.raises(SystemExit) as ended:
        convergence_levels.main([str(run)])
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {run}/") and message in err
    assert not (run / "c64").exists()


def test_a_file_where_a_level_folder_goes_exits_2_naming_it(tmp_path, capsys):
    run = _run(tmp_path, [(64, 0.0, 10.0)], [(1.0, False)])
    (run / "c64").write_text("not a folder")
    with pytest.raises(SystemExit) as ended:
        convergence_levels.main([str(run)])
    assert ended.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: {run}/c64: ")
    assert (run / "c64").read_text() == "not a folder"
