"""benchmarks/gpu/step_estimators.py: serving turns cut from a tune's step log, and estimators
of a cell's step compared between two tunes and against a referee."""

from __future__ import annotations

import dataclasses
import lzma

from tabletune.core.step_log import Step, StepLogWriter
from tabletune.core.tables import DraftTable

from benchmark_scripts import load_script

step_estimators = load_script("step_estimators.py")


def _turn(n, requests, k, periods, accepted=1, new_every=5, start_s=10.0):
    """n steps from ``start_s`` on (a closed loop's first 2 s are its warm-up)."""
    out, t = [], int(start_s * 1e9)
    for i in range(n):
        period = int(periods[i % len(periods)] * 1e6)
        t += period
        out.append(Step(t_ns=t, period_ns=period, requests=requests,
                        new_requests=1 if i % new_every == 0 else 0, verifying=requests, k=k,
                        tokens=requests * (1 + k), verified_drafts=requests * k,
                        accepted=accepted))
    return out


def _loop(*turns_):
    """Turns one after another in one closed loop, after a 2-s warm-up at B = 128, k = 1."""
    steps = _turn(220, 128, 1, [10.0], start_s=0.0)
    for t in turns_:
        shift = steps[-1].t_ns - t[0].t_ns + t[0].period_ns
        steps += [dataclasses.replace(s, t_ns=s.t_ns + shift) for s in t]
    return steps


def test_only_serving_turns_count_never_the_reject_all_profile():
    # A turn ends where the length or the number of requests moves on; a loop's warm-up is
    # no turn (the 2.2 s at k = 1 before these lose their first 2 s, and 20 steps stay).
    steps = _loop(_turn(20, 64, 2, [10.0], accepted=0),  # the profile: no draft accepted
                  _turn(20, 128, 2, [10.0]),            # serving at k = 2
                  _turn(20, 128, 3, [12.0]),            # the next length's turn
                  _turn(10, 128, 1, [8.0]),             # too short
                  _turn(20, 192, 1, [8.0], new_every=100)[1:])  # took in no request
    found = step_estimators.turns(steps)
    assert [(t[0].k, len(t)) for t in found] == [(1, 20), (2, 20), (3, 20)]


def test_the_pair_median_keeps_paired_periods_whole_where_the_median_reads_one_side():
    # Asynchronous scheduling can hand out a short period and a long one per step pair.
    turn = [(p, False) for p in [4.0, 16.0] * 10 + [4.0]]
    assert step_estimators.median([turn]) == 4.0
    assert step_estimators.pair_median([turn]) == 10.0
    assert step_estimators.mean([turn]) == (4.0 * 11 + 16.0 * 10) / 21


def _write_log(path, steps):
    raw = path.with_suffix("")
    writer = StepLogWriter(raw)
    for s in steps:
        writer.append(s.t_ns, s.period_ns, s.requests, s.new_requests, s.verifying, s.k,
                      s.tokens, s.verified_drafts, s.accepted)
    writer.close()
    path.write_bytes(lzma.compress(raw.read_bytes()))


def test_two_equal_tunes_agree_and_a_referee_of_the_same_ratio_gives_no_error(tmp_path):
    steps = _loop(_turn(30, 128, 2, [10.0]), _turn(30, 128, 3, [12.0]))
    for name in ("tune-cold", "tune-warm"):
        (tmp_path / name / "logs").mkdir(parents=True)
        _write_log(tmp_path / name / "logs" / "tune.steps.xz", steps)
    (tmp_path / "paired" / "logs").mkdir(parents=True)
    _write_log(tmp_path / "paired" / "logs" / "paired.steps.xz",
               _loop(_turn(30, 126, 2, [20.0]), _turn(30, 126, 3, [24.0])))
    lines = step_estimators.run(tmp_path)
    row = next(line for line in lines if line.startswith("| window mean (now) |"))
    # Cells at B = 128, k = 1 (the warm-up's last 20 steps), 2 and 3; one pair (k = 2 and 3)
    # with a referee level near it in each tune.
    assert row == "| window mean (now) | 0.0%, 0.0% (3) | 0.0%, 0.0% (2) |"


def test_a_run_without_its_files_or_with_a_broken_step_log_is_named_with_exit_2(tmp_path, capsys):
    assert step_estimators.main([]) == 2
    assert capsys.readouterr().err.startswith("usage: python benchmarks/gpu/step_estimators.py")
    assert step_estimators.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'tune-cold' / 'profile.json'}: not found (a RUN_DIR holds "
        "tune-cold/ and tune-warm/ with profile.json, acceptance.json, logs/tune.steps.xz)\n")
    for tune in ("tune-cold", "tune-warm"):
        (tmp_path / tune / "logs").mkdir(parents=True)
        (tmp_path / tune / "profile.json").write_text("{}")
        (tmp_path / tune / "acceptance.json").write_text("{}")
        (tmp_path / tune / "logs" / "tune.steps.xz").write_bytes(b"not xz")
    assert step_estimators.main([str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(
        f"error: {tmp_path / 'tune-cold' / 'logs' / 'tune.steps.xz'}: cannot read the step log: ")


def test_a_tables_referee_losses_are_against_the_best_fixed_length_at_each_level():
    table = DraftTable.from_lookup((3,) * 100 + (2,) * 100)
    levels = {64: {2: 95.0, 3: 100.0}, 160: {2: 100.0, 3: 90.0}, 8: {1: 10.0}}
    assert step_estimators.referee_losses(table, levels) == "c = 64: 0.0%, c = 160: 0.0%"
    late = DraftTable.from_lookup((3,) * 200)
    assert step_estimators.referee_losses(late, levels) == "c = 64: 0.0%, c = 160: 10.0%"
    assert step_estimators.referee_losses(late, {}) == "no referee"
