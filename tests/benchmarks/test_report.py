"""benchmarks/gpu/report.py and its readers (reports/): an evaluation's repeats joined with the
host samples taken beside them, the long steps of a request turnover in a step log, the loss
tables, the losses computed again with the code installed now, two tunes compared, and what it
says of a folder it cannot read."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from tabletune.core.step_log import StepLogWriter

from benchmark_scripts import load_report, load_script

command = load_script("report.py")
report = load_report("evaluation")
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _sample(t, steal, sm, power):
    return {"t": t, "cpu": {"steal": steal}, "cores_busy": 1.5, "mhz": [2100.0],
            "gpu": {"clocks.sm": str(sm), "power.draw": str(power), "utilization.gpu": "60",
                    "temperature.gpu": "55", "clocks_event_reasons.active": "0x4"}}


def test_a_repeat_is_set_beside_the_samples_taken_during_it_and_its_arm_level_median():
    samples = [_sample(100.0 + i, 0.0, 1980, 600) for i in range(5)] + \
              [_sample(200.0 + i, 0.01, 1900, 400) for i in range(5)]
    host = report.host_during(samples, 101.0, 103.0)
    assert host["samples"] == 3 and host["sm_mhz"] == 1980 and host["power_w"] == 600
    assert host["clock_reasons"] == ["0x4"]
    assert report.host_during(samples, 150.0, 160.0) is None

    def result(repeat, started, step_ms):
        return {"arm": "fixed k=1", "concurrency": 8, "repeat": repeat, "started_at": started,
                "wall_s": 3.0, "window": {"step_ms": step_ms, "generation_tokens": 100.0,
                                          "steps": 50.0},
                "steps": {"pure_decode": {"median_ms": step_ms * 0.8},
                          "with_prefill": {"median_ms": step_ms, "share_of_steps": 0.2}}}

    doc = {"results": [result(0, 100.0, 4.0), result(1, 200.0, 5.0), result(2, 300.0, 4.0)]}
    rows = report.repeats_table(doc, samples)
    assert [r["rel_step"] for r in rows] == [1.0, 1.25, 1.0]
    assert rows[1]["rel_pure_ms"] == pytest.approx(1.25)
    assert rows[1]["power_w"] == 400 and rows[2]["power_w"] is None  # no sample then
    # fewer than three repeats: no median to set a repeat against
    assert report.repeats_table({"results": doc["results"][:2]}, samples) == []


def test_the_long_steps_of_a_request_turnover_are_counted_from_an_xz_step_log(tmp_path):
    log = tmp_path / "evaluate" / "logs" / "arm0.steps"
    log.parent.mkdir(parents=True)
    writer = StepLogWriter(log, capacity=256)
    t = 0
    for i in range(120):
        turnover = i % 10 == 5  # a request finished: 31 of 32 requests, the next step admits
        admits = i % 10 == 6
        period = 14_000_000 if turnover else 4_000_000
        t += period
        requests = 31 if turnover else 32
        writer.append(t, period, requests, 1 if admits else 0, requests - (1 if admits else 0),
                      1, 2 * requests + (28 if admits else 0), requests, requests // 2)
    writer.close()
    (log.parent / "arm0.steps.xz").write_bytes(lzma.compress(log.read_bytes()))
    log.unlink()
    doc = {"arms": ["fixed k=1"], "results": [{"concurrency": 32}]}
    [header, rule, row] = report.turnover_stalls(tmp_path, doc)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["fixed k=1", "32", "119", "4.00"]  # the last step has no next one
    assert cells[4] == "12 (10%)" and cells[6] == "12 (100%)"


def test_a_paired_referee_s_losses_are_against_the_best_pinned_length_not_a_server():
    assert report.loss_baseline({"paired_lengths": {"window_s": 0.5}}) == (
        "the level's best pinned length on the one server")
    assert report.loss_baseline({"one_server": False}) == (
        "the level's best fixed-K server")


def _loss(by_level):
    return {"loss_by_concurrency": {str(c): v for c, v in by_level.items()},
            "loss_interval_by_concurrency": {str(c): [v - 0.1, v + 0.1]
                                             for c, v in by_level.items()}}


def test_a_run_without_fixed_k_servers_reports_its_losses_against_adaptive_verification():
    doc = {"levels": [{"concurrency": 1}, {"concurrency": 8}], "losses": None,
           "against_adaptive": {"adaptive k=3": {"arms": {
               "adaptive k=3": _loss({1: 0.0, 8: 0.0}),
               "table t.json": _loss({1: -0.05, 8: -0.78})}}}}
    text = "\n".join(report.loss_sections(doc))
    assert "No fixed-K server in this run." in text
    assert "## Loss against adaptive k=3 [90 % interval; below 0: the arm is ahead]" in text
    assert "| table t.json | -5.0 % [-15.0, 5.0] | -78.0 % [-88.0, -68.0] |" in text
    assert "| adaptive k=3 |" not in text  # the baseline against itself says nothing


def test_a_run_with_fixed_k_servers_reports_that_table_first_and_no_adaptive_one_it_lacks():
    doc = {"levels": [{"concurrency": 8}],
           "losses": {"arms": {"table t.json": _loss({8: 0.02})}}}
    lines = report.loss_sections(doc)
    assert lines[0] == "## Loss against the level's best fixed-K server [90 % interval]"
    assert "| table t.json | 2.0 % [-8.0, 12.0] |" in lines
    assert not any("adaptive" in line for line in lines)


def _row(arm, c, rate, repeat):
    return {"arm": arm, "concurrency": c, "tokens_per_s": rate, "requests": 1,
            "output_tokens": 1, "wall_s": 0.5, "repeat": repeat}


def _evaluation(folder, paired=True):
    """The rounds of a paired referee alone (no levels: an older evaluate.json's shape)."""
    machine = [0.9, 1.0, 1.1, 0.95]
    rows = []
    for i, m in enumerate(machine):
        rows += [_row("fixed k=1", 1, 90.0 * m, i), _row("fixed k=1", 64, 1000.0 * m, i),
                 _row("fixed k=3", 1, 100.0 * m, i), _row("fixed k=3", 64, 800.0 * m, i),
                 _row("table table.json", 1, 100.0 * m, i),
                 _row("table table.json", 64, 1000.0 * m, i)]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "evaluate.json").write_text(json.dumps(
        {"paired_lengths": {"window_s": 0.5} if paired else None, "results": rows}))
    return folder


def test_losses_computed_again_name_the_best_single_length_and_the_gap_to_it(tmp_path, capsys):
    folder = _evaluation(tmp_path / "paired")
    assert command.main([str(folder), "--recompute-losses"]) == 0
    out = capsys.readouterr().out
    assert "no levels or arms (an older format)" in out
    # k = 1's worst 10 % (c = 1), k = 3's 20 % (c = 64); the table serves each level's winner.
    assert "table table.json    0.0% (c=1)" in out
    assert ("worst-load loss against the best single length's (fixed k=1, 10.0%): -10.0% "
            "[-10.0%, -10.0%], lower") in out
    # Named baselines: k = 3 alone, so it is the best single length too.
    doc = json.loads((folder / "evaluate.json").read_text())
    lines = report.recomputed_losses(doc, "evaluate.json", ["fixed k=3"])
    assert "(fixed k=3, 0.0%)" in "\n".join(lines)
    with pytest.raises(ValueError, match="baseline fixed k=9: not an arm .*table table.json"):
        report.recomputed_losses(doc, "evaluate.json", ["fixed k=9"])


@pytest.mark.parametrize("content, message", [
    ("{", "evaluate.json: not JSON"),
    (json.dumps({"results": []}), "results: no rounds"),
    (json.dumps({"results": [{"arm": "fixed k=1"}]}), "results[0]: missing concurrency"),
])
def test_an_evaluation_it_cannot_read_is_exit_2_naming_it(tmp_path, capsys, content, message):
    (tmp_path / "evaluate.json").write_text(content)
    assert command.main([str(tmp_path), "--recompute-losses"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_a_folder_it_cannot_read_is_exit_2_saying_what_it_looked_for(tmp_path, capsys):
    assert command.main([str(tmp_path / "missing")]) == 2
    assert "missing: no such folder" in capsys.readouterr().err
    (tmp_path / "README.md").write_text("a run\n")
    assert command.main([str(tmp_path)]) == 2
    assert "no tune (profile.json, acceptance.json, table.json) and no evaluate.json" in (
        capsys.readouterr().err)
    assert command.main([str(tmp_path), str(tmp_path)]) == 2
    assert "not a tune folder" in capsys.readouterr().err


def test_two_committed_tunes_are_compared_each_table_under_the_other_s_measurements(capsys):
    run = RESULTS / "h100-v026-tune-pair"
    assert command.main([str(run / "tune-cold"), str(run / "tune-warm")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Two tunes of one deployment")
    assert "| | tune-cold | tune-warm |" in out
    assert "| table | `[[1, 137, 3], [138, 256, 2]]` | `[[1, 130, 3], [131, 256, 2]]` |" in out
    assert "| B | k | tune-cold reject-all | tune-warm reject-all |" in out
    assert "| tune-cold | tune-warm |" in out and "| tune-warm | tune-cold |" in out


def test_a_run_folder_reports_each_part_it_holds(capsys):
    assert command.main([str(RESULTS / "h100-v026-tune-pair")]) == 0
    out = capsys.readouterr().out
    for title in ("# Tune tune-cold", "# Tune tune-warm", "# Two tunes of one deployment",
                  "# Evaluation evaluate", "# Evaluation paired"):
        assert title in out


def test_three_tunes_are_compared_pairwise_with_what_the_step_log_cost(capsys):
    pair, b160 = RESULTS / "h100-v026-tune-pair", RESULTS / "h100-v026-tune-pair-b160"
    folders = [pair / "tune-cold", pair / "tune-warm", b160 / "tune-warm"]
    assert command.main([str(f) for f in folders]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Tunes of one deployment")
    # Names alike: run/tune.
    assert "| h100-v026-tune-pair/tune-cold / h100-v026-tune-pair/tune-warm |" in out
    assert "| h100-v026-tune-pair-b160/tune-warm | (no step log kept) | | | | | |" in out
