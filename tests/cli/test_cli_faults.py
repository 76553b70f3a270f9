"""The second reliability pass: bad input as an operator on a bad day gives it. Each test holds
a row of docs/faults.md ("Second pass"); those about processes run the real command."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tabletune import cli
from tabletune.cli import main
from tabletune.commands import measure, tables
from tabletune.core.contracts import save_json
from factories import make_acceptance, make_profile

REPO = Path(__file__).resolve().parents[2]


def _run(args, cwd, timeout=60, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tabletune.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


@pytest.fixture
def docs(tmp_path):
    save_json(tmp_path / "profile.json", make_profile())
    save_json(tmp_path / "acceptance.json", make_acceptance())
    return tmp_path


@pytest.fixture
def no_engine(monkeypatch):
    def tripwire(*args, **kwargs):
        raise AssertionError("engine work started")

    for name in ("engine_spec_from_args", "_run_profile", "_run_acceptance"):
        monkeypatch.setattr(measure, name, tripwire)


def _build(docs, out):
    return main(["build", "--profile", str(docs / "profile.json"),
                 "--acceptance", str(docs / "acceptance.json"), "--out", str(out)])


def _one_line(err: str, command: str) -> str:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"tabletune {command}: error: "), err
    return err


def test_build_never_replaces_a_fifo_or_a_device(docs, capsys):
    fifo = docs / "fifo"
    os.mkfifo(fifo)
    assert _build(docs, fifo) == 2
    assert "--out: " in _one_line(capsys.readouterr().err, "build")
    assert fifo.is_fifo()
    before = os.stat("/dev/null")
    assert _build(docs, "/dev/null") == 2
    assert "/dev/null is a character device" in capsys.readouterr().err
    assert os.stat("/dev/null").st_ino == before.st_ino


@pytest.mark.parametrize("make, message", [
    (lambda d: (d / "l1").symlink_to(d / "l2") or (d / "l2").symlink_to(d / "l1") or d / "l1",
     "a symlink loop"),
    (lambda d: (d / "f").write_text("x") and d / "f" / "t.json", "a part of the path is a file"),
])
def test_build_out_paths_the_os_refuses_are_one_line_errors(docs, capsys, make, message):
    out = make(docs)
    assert _build(docs, out) == 2
    assert message in _one_line(capsys.readouterr().err, "build")


def test_a_symlink_loop_given_as_an_input_names_the_file(docs, capsys):
    (docs / "l1").symlink_to(docs / "l2")
    (docs / "l2").symlink_to(docs / "l1")
    assert main(["build", "--profile", str(docs / "l1"), "--acceptance",
                 str(docs / "acceptance.json"), "--out", str(docs / "t.json")]) == 2
    err = _one_line(capsys.readouterr().err, "build")
    assert f"{docs / 'l1'}: cannot read profile JSON: a symlink loop" in err


def test_a_full_disk_while_writing_keeps_the_old_file_and_is_one_line(docs, capsys,
                                                                       monkeypatch):
    import tabletune.core.atomic as atomic

    out = docs / "t.json"
    out.write_text("precious")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(atomic.os, "fsync", full)
    assert _build(docs, out) == 2
    err = _one_line(capsys.readouterr().err, "build")
    assert err == f"tabletune build: error: {out}: No space left on device\n"
    assert out.read_text() == "precious"
    assert sorted(p.name for p in docs.iterdir()) == ["acceptance.json", "profile.json", "t.json"]


def test_a_read_only_file_system_mid_command_is_one_line_naming_the_path(docs, capsys,
                                                                         monkeypatch):
    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(docs / "plots"))

    monkeypatch.setattr(tables, "_write_plots", read_only)
    assert main(["build", "--profile", str(docs / "profile.json"), "--acceptance",
                 str(docs / "acceptance.json"), "--out", str(docs / "t.json"), "--plots"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"tabletune build: error: {docs / 'plots'}: Read-only file system\n")


def test_show_into_a_closed_pipe_exits_quietly(docs):
    assert _build(docs, docs / "t.json") == 0
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`head`) is gone before anything is written
    try:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, "-m", "tabletune.cli", "show",
                               str(docs / "t.json")], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=60, env=env)
    finally:
        os.close(write_end)
    assert done.returncode == 128 + signal.SIGPIPE
    assert done.stderr == ""  # no BrokenPipeError, no "Exception ignored"


def test_a_fifo_given_as_prompts_or_table_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # A FIFO nobody writes to: a command that opened it would block until the timeout.
    for args, message in ((["acceptance", "--prompts", str(fifo)], "is not a file (a FIFO)"),
                          (["tune", "--prompts", str(fifo)], "is not a file (a FIFO)"),
                          (["doctor", "--table", str(fifo)], "not a regular file (a FIFO)")):
        done = _run(args, cwd=tmp_path, timeout=60)
        assert done.returncode == 2, done.stderr
        assert message in _one_line(done.stderr, args[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


@pytest.mark.parametrize("content, message", [
    ("ok\n".encode("utf-16"), "cannot read prompts: the file is UTF-16"),
    (b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe", "cannot read prompts: not UTF-8 text"),
    (b'{"prompt": "a"}\n{"prompt": "b"\n', ":2: cannot read prompt line JSON"),
    (b'{"prompt": "a", "prompt": "b"}\n', ":1: cannot read prompt line JSON: duplicate key"),
    (b'["a"]\n', ":1: ['a'] is not a JSON object"),
])
def test_tune_reads_its_prompts_before_any_engine_and_names_the_file(tmp_path, capsys,
                                                                     no_engine, content,
                                                                     message):
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(content)
    out = tmp_path / "out"
    assert main(["tune", "--prompts", str(prompts), "--out-dir", str(out)]) == 2
    err = _one_line(capsys.readouterr().err, "tune")
    assert f"{prompts}" in err and message in err
    assert not out.exists()


def test_a_directory_given_as_prompts_is_refused(tmp_path, capsys, no_engine):
    assert main(["acceptance", "--prompts", str(tmp_path), "--out",
                 str(tmp_path / "a.json")]) == 2
    assert f"--prompts: {tmp_path} is not a file (a directory)" in capsys.readouterr().err


def test_prompts_are_read_once_so_a_file_removed_later_changes_nothing(tmp_path):
    from tabletune.prompt_args import prompts_from_args

    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\n")
    args = cli.build_parser().parse_args(["acceptance", "--prompts", str(prompts)])
    assert prompts_from_args(args) == ["one", "two"]
    prompts.unlink()  # the operator cleans up while the engine starts
    assert prompts_from_args(args) == ["one", "two"]


@pytest.mark.parametrize("engine_arg, flag", [
    ("--port=8001", "--port"), ("--max-num-seqs=4", "--max-num-seqs"),
    ("--max_num_seqs=4", "--max-num-seqs"), ("--speculative-config={}", "--speculative-config"),
])
def test_an_engine_arg_repeating_a_flag_tabletune_sets_is_refused(tmp_path, capsys, engine_arg,
                                                                  flag):
    out = tmp_path / "out"
    assert main(["tune", f"--engine-arg={engine_arg}", "--out-dir", str(out)]) == 2
    err = _one_line(capsys.readouterr().err, "tune")
    assert f"--engine-arg: {engine_arg!r} sets {flag}, which TableTune sets itself" in err
    assert not out.exists()


@pytest.mark.parametrize("command", ["tune", "evaluate", "doctor"])
def test_a_model_path_that_is_no_model_folder_is_refused_before_any_engine(tmp_path, capsys,
                                                                           command):
    """vLLM takes a missing path for a Hub id and fails only after every server started."""
    empty = tmp_path / "empty"
    empty.mkdir()
    out = tmp_path / "out"
    for model, why in ((tmp_path / "missing", "no such folder"),
                       (empty, "the folder has no config.json")):
        argv = [command, "--model", str(model), "--drafter", str(model), "--method", "eagle3",
                "--out-dir", str(out)]
        assert main(argv) == 2, argv
        err = _one_line(capsys.readouterr().err, command)
        assert f"--model: {model}: {why}" in err
    assert not out.exists()


def test_a_model_cache_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, monkeypatch):
    (tmp_path / "cache").write_text("x")
    monkeypatch.setenv("TABLETUNE_CACHE", str(tmp_path / "cache"))
    assert main(["acceptance", "--out", str(tmp_path / "a.json")]) == 2
    err = _one_line(capsys.readouterr().err, "acceptance")
    assert f"TABLETUNE_CACHE: {tmp_path / 'cache'}: " in err and "is a file" in err


def test_out_dirs_that_are_files_are_refused_by_every_command(tmp_path, capsys, no_engine):
    f = tmp_path / "f"
    f.write_text("x")
    for argv in (["evaluate", "--out-dir", str(f)], ["doctor", "--out-dir", str(f)],
                 ["plot", "--profile", "p", "--acceptance", "a", "--out-dir", str(f)],
                 ["simulate", "--scenario", "moe", "--out", str(f)]):
        assert main(argv) == 2, argv
        assert f"{f} is a file, not a directory" in capsys.readouterr().err
    assert f.read_text() == "x"


def _table(docs) -> dict:
    assert _build(docs, docs / "t.json") == 0
    return json.loads((docs / "t.json").read_text())


@pytest.mark.parametrize("change, message", [
    (lambda d: d["provenance"].update(profile_flagged_cells=5),
     "table.provenance.profile_flagged_cells: 5 is not a list"),
    (lambda d: d["provenance"].update(profile_flagged_cells=[{"why": 3}]),
     "table.provenance.profile_flagged_cells[0].why: 3 is not a list"),
    (lambda d: d["provenance"].update(profile_inconsistent="x"),
     "table.provenance.profile_inconsistent: 'x' is not a list"),
    (lambda d: d["goodput"].update(out_of_sample={"worst_loss_mean": "a lot"}),
     "table.goodput.out_of_sample.worst_loss_mean: 'a lot' is not a finite number"),
])
def test_show_names_provenance_and_out_of_sample_fields_of_the_wrong_type(docs, capsys,
                                                                         change, message):
    doc = _table(docs)
    change(doc)
    (docs / "bad.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["show", str(docs / "bad.json")]) == 2
    assert message in _one_line(capsys.readouterr().err, "show")


@pytest.mark.parametrize("edit, message", [
    (lambda text: text.replace('"provenance": {', '"provenance": {"x": 1, "x": 2, ', 1),
     "duplicate key 'x'"),
    (lambda text: text.replace('"goodput": {', '"goodput": {"late": NaN, ', 1),
     "goodput.late: NaN is not JSON"),
])
def test_show_refuses_duplicate_keys_and_nan_instead_of_printing_nan(docs, capsys, edit,
                                                                     message):
    _table(docs)
    (docs / "bad.json").write_text(edit((docs / "t.json").read_text()))
    capsys.readouterr()
    assert main(["show", str(docs / "bad.json")]) == 2
    err = _one_line(capsys.readouterr().err, "show")
    assert message in err and "nan%" not in err


def test_ctrl_c_mentions_a_checkpoint_only_for_commands_that_have_one(docs, capsys,
                                                                      monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tables, "build_document", interrupt)
    assert _build(docs, docs / "t.json") == 128 + signal.SIGINT
    assert capsys.readouterr().err == "tabletune build: interrupted (SIGINT)\n"
    monkeypatch.setattr(measure, "_run_profile", interrupt)
    monkeypatch.setattr(measure, "engine_spec_from_args", lambda *a, **k: None)
    assert main(["profile", "--out", str(docs / "p.json")]) == 128 + signal.SIGINT
    err = capsys.readouterr().err
    assert "engines stopped" in err and "kept in the checkpoint" in err


def test_registry_bad_input_exits_2_before_any_registry_call(docs, capsys, monkeypatch):
    from tabletune.adapters import mlflow_registry
    from tabletune.pipeline.cli import registry_main

    monkeypatch.setattr(mlflow_registry, "MlflowRegistry",
                        lambda *a, **k: pytest.fail("a registry call was made"))
    (docs / "empty.json").write_text("{}")
    for argv, message in (
            (["--tracking-uri", "http://127.0.0.1:9", "promote", "--model-name", "m",
              "--version", "../../etc"], "--version: '../../etc' is not a model version"),
            (["--tracking-uri", "ftp://host", "show", "--model-name", "m"],
             "--tracking-uri: 'ftp://host' has the scheme 'ftp'"),
            (["--tracking-uri", "http://127.0.0.1:9", "seed", "--model-name", "m", "--profile",
              str(docs / "empty.json"), "--acceptance", str(docs / "acceptance.json")],
             f"{docs / 'empty.json'}: profile.schema: None is missing"),
            (["--tracking-uri", "http://127.0.0.1:9", "seed", "--model-name", "m", "--profile",
              str(docs / "profile.json"), "--acceptance", str(docs / "acceptance.json"),
              "--max-batch-size", "0"], "--max-batch-size: 0 is not an integer >= 1")):
        assert registry_main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_registry_client_failures_are_one_line_not_a_traceback(capsys, monkeypatch):
    from tabletune.adapters import mlflow_registry
    from tabletune.pipeline.cli import registry_main

    class Looping:
        def __init__(self, *args, **kwargs):
            pass

        def reconcile(self, *args, **kwargs):
            raise RuntimeError("Exceeded 30 redirects.\nmore detail")

    monkeypatch.setattr(mlflow_registry, "MlflowRegistry", Looping)
    assert registry_main(["--tracking-uri", "http://127.0.0.1:9", "show",
                          "--model-name", "m"]) == 1
    assert capsys.readouterr().err == ("tabletune registry show: error: registry "
                                       "http://127.0.0.1:9: RuntimeError: Exceeded 30 "
                                       "redirects.\n")


def test_a_controller_arm_whose_prior_cannot_serve_this_engine_exits_2_before_any_engine(
        tmp_path, capsys, monkeypatch):
    """The controller in vLLM would refuse such a prior and serve the static table: the arm
    would measure something else without a word."""
    from factories import make_acceptance, make_profile

    from tabletune import evaluate
    from tabletune.core.builder import build_table
    from tabletune.core.contracts import save_json
    from tabletune.core.step_times import StepTimes

    monkeypatch.setattr(evaluate, "run_arms",
                        lambda *a, **k: pytest.fail("engine work started"))
    out = tmp_path / "eval"
    for name, max_k, rates, message in (
            ("k2", 2, (0.8, 0.6), "profile.json: prior profile.max_k: 2 but the engine drafts "
                                  "up to num_speculative_tokens=3"),
            ("disagree", 3, (0.8, 0.6), "acceptance.json (with ")):
        folder = tmp_path / name
        folder.mkdir()
        profile = make_profile(max_k=max_k)
        table = build_table(StepTimes.from_profile(profile), (0.8, 0.6, 0.45)[:max_k])
        save_json(folder / "table.json", table.to_document({}))
        save_json(folder / "profile.json", profile)
        save_json(folder / "acceptance.json", make_acceptance(rates))
        assert main(["evaluate", "--max-k", "3", "--arms", f"fixed:1,controller:{folder}",
                     "--out-dir", str(out)]) == 2
        err = _one_line(capsys.readouterr().err, "evaluate")
        assert f"{folder}/{message}" in err, err
    assert not out.exists()


def test_bad_evaluate_arms_exit_2_naming_the_arm_or_file_before_any_engine(tmp_path, capsys,
                                                                          monkeypatch):
    from tabletune import evaluate

    monkeypatch.setattr(evaluate, "run_arms",
                        lambda *a, **k: pytest.fail("engine work started"))
    cpu = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"
    doc = json.loads(cpu.read_text())
    doc["provenance"]["workload"] = {"output_tokens": 0.5}
    bad_workload = tmp_path / "workload.json"
    bad_workload.write_text(json.dumps(doc))
    out = tmp_path / "eval"
    for arms, message in (
            ("fixed:9", "--arms: 'fixed:9' is not none, fixed:K, fixed-table:K, adaptive:K "
                        "(1 <= K <= 3)"),
            ("fixed:x", "--arms: 'fixed:x' is not none"),
            ("fixed:2,docs,fixed:2", "--arms: 'fixed k=2': given twice"),
            (f"table:{tmp_path / 'missing.json'}", f"{tmp_path / 'missing.json'}"),
            (f"table:{bad_workload}",
             f"{bad_workload}: provenance.workload.output_tokens: 0.5 must be >= 1")):
        assert main(["evaluate", "--max-k", "3", "--arms", arms, "--out-dir", str(out)]) == 2
        err = _one_line(capsys.readouterr().err, "evaluate")
        assert message in err, err
    assert not out.exists()


def test_a_profile_batch_size_past_the_bound_is_refused_naming_the_file(docs, capsys):
    profile = json.loads((docs / "profile.json").read_text())
    largest = max(c["batch_size"] for c in profile["cells"])
    for cell in profile["cells"]:
        if cell["batch_size"] == largest:
            cell["batch_size"] = (1 << 20) + 1
    (docs / "profile.json").write_text(json.dumps(profile))
    out = docs / "table.json"
    assert _build(docs, out) == 2
    err = _one_line(capsys.readouterr().err, "build")
    assert f"{docs / 'profile.json'}: profile.cells[" in err
    assert ".batch_size: 1048577 is above 1048576, the largest value allowed here" in err
    assert not out.exists()
