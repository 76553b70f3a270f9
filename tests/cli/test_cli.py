"""The command line on bad arguments and hostile files: exit 2 with ``error: ...``, no traceback,
nothing written, and no engine started (the engine helpers are replaced by tripwires)."""

from __future__ import annotations

import json
import re
import warnings

import pytest
from factories import make_acceptance, make_profile

from tabletune.cli import main
from tabletune.commands import measure
from tabletune.core.contracts import save_json


@pytest.fixture
def docs(tmp_path):
    save_json(tmp_path / "profile.json", make_profile())
    save_json(tmp_path / "acceptance.json", make_acceptance())
    return tmp_path


@pytest.fixture
def no_engine(monkeypatch):
    """Fail the test (not the command) if a command gets as far as engine work."""

    def tripwire(*args, **kwargs):
        raise AssertionError("engine work started")

    for name in ("engine_spec_from_args", "_run_profile", "_run_acceptance"):
        monkeypatch.setattr(measure, name, tripwire)


def build(docs, *extra):
    return main(["build", "--profile", str(docs / "profile.json"),
                 "--acceptance", str(docs / "acceptance.json"), *extra])


def test_build_refuses_an_out_that_is_one_of_its_inputs(docs, capsys):
    before = {n: (docs / n).read_bytes() for n in ("profile.json", "acceptance.json")}
    for option, out in (("profile", docs / "profile.json"),
                        ("acceptance", docs / "sub" / ".." / "acceptance.json")):
        rc = build(docs, "--out", str(out))
        err = capsys.readouterr().err
        assert rc == 2
        assert f"tabletune build: error: --out: {out} is the same file as --{option}" in err
    # Another name for the same file (a symlink) is the same file too.
    (docs / "link.json").symlink_to(docs / "profile.json")
    assert build(docs, "--out", str(docs / "link.json")) == 2
    assert "is the same file as --profile" in capsys.readouterr().err
    assert {n: (docs / n).read_bytes() for n in before} == before


def test_build_profile_and_acceptance_refuse_an_out_that_is_a_directory(docs, capsys,
                                                                         no_engine):
    rc = build(docs, "--out", str(docs))
    assert rc == 2
    assert capsys.readouterr().err == f"tabletune build: error: --out: {docs} is a directory\n"
    for command in ("profile", "acceptance"):
        assert main([command, "--out", str(docs)]) == 2
        err = capsys.readouterr().err
        assert err == f"tabletune {command}: error: --out: {docs} is a directory\n"
    assert not any(p.name.endswith(".tmp") for p in docs.iterdir())


def test_profile_refuses_an_out_that_is_its_checkpoint(docs, capsys, no_engine):
    ckpt = docs / "ckpt.jsonl"
    assert main(["profile", "--checkpoint", str(ckpt), "--out", str(ckpt)]) == 2
    assert "is the same file as --checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["show", "build-profile", "build-acceptance", "plot"])
def test_deeply_nested_json_is_an_error_naming_the_file_not_a_recursion_error(docs, capsys,
                                                                               command):
    deep = docs / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    p, a = str(docs / "profile.json"), str(docs / "acceptance.json")
    argv = {
        "show": ["show", str(deep)],
        "build-profile": ["build", "--profile", str(deep), "--acceptance", a,
                          "--out", str(docs / "t.json")],
        "build-acceptance": ["build", "--profile", p, "--acceptance", str(deep),
                             "--out", str(docs / "t.json")],
        "plot": ["plot", "--profile", str(deep), "--acceptance", a, "--out-dir", str(docs)],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"error: {deep}: cannot read" in err and "nested too deeply" in err
    assert not (docs / "t.json").exists()


def _table(docs):
    assert build(docs, "--out", str(docs / "table.json")) == 0
    return json.loads((docs / "table.json").read_text())


def test_show_names_a_goodput_block_without_lengths(docs, capsys):
    doc = _table(docs)
    del doc["goodput"]["lengths"]
    path = docs / "nolengths.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (f"tabletune show: error: {path}: table.goodput.lengths: None is missing "
                   "(needed to report the loss)\n")


@pytest.mark.parametrize(("change", "message"), [
    (lambda g: g.update(chosen=g["chosen"][:-1]), r"table\.goodput\.chosen: '127 entries' do not"),
    (lambda g: g["tokens_per_s"][3].pop(), r"table\.goodput\.tokens_per_s\[3\]: '3 entries'"),
    (lambda g: g["tokens_per_s"][0].__setitem__(0, -1.0),
     r"table\.goodput\.tokens_per_s\[0\]\[0\]: -1\.0 is not a non-negative number"),
    (lambda g: g.update(chosen=[7] * len(g["chosen"])), r"table\.goodput\.chosen\[0\]: 7 is not"),
])
def test_show_names_a_goodput_block_of_the_wrong_shape(docs, capsys, change, message):
    doc = _table(docs)
    change(doc["goodput"])
    path = docs / "bad.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["show", str(path)]) == 2
    assert re.search(rf"error: {re.escape(str(path))}: {message}", capsys.readouterr().err)


def test_show_prints_no_nan_for_an_all_zero_goodput_block(docs, capsys):
    doc = _table(docs)
    g = doc["goodput"]
    g["tokens_per_s"] = [[0.0] * len(row) for row in g["tokens_per_s"]]
    path = docs / "zero.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    with _no_warnings():
        assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out
    assert "none to report: the goodput block is zero at every batch size" in out
    # One zero row among real ones is left out of the loss, not turned into nan.
    doc = _table(docs)
    doc["goodput"]["tokens_per_s"][5] = [0.0] * len(doc["goodput"]["lengths"])
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "this table (modelled, in-sample): " in out


def test_show_names_the_batch_sizes_held_by_noise_as_runs(docs, capsys):
    doc = _table(docs)
    g = doc["goodput"]
    g["edges"] = [{"batch_size": 198, "from_k": 3, "to_k": 2, "gain": 0.138,
                   "uncertainty": 0.126}]
    g["held_by_noise_batch_sizes"] = [149, 150, 151, 192, 193, 194, 200]
    g["interpolated_batch_sizes"] = [149, 150, 151, 193, 194, 200]
    path = docs / "held.json"
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert ("within the noise at batch sizes 149–151 (interpolated), 192, 193–194 "
            "(interpolated), 200 (interpolated): T there is interpolated") in out


class _no_warnings:
    """Fail on any warning (numpy's 'invalid value encountered in divide' among them)."""

    def __enter__(self):
        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error")

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def test_build_table_max_batch_size_is_validated_and_used(docs, capsys):
    out = docs / "t.json"
    assert build(docs, "--table-max-batch-size", "0", "--out", str(out)) == 2
    assert capsys.readouterr().err == ("tabletune build: error: --table-max-batch-size: 0 is not "
                                       "an integer >= 1\n")
    assert build(docs, "--max-batch-size", "-3", "--out", str(out)) == 2
    assert "--max-batch-size: -3 is not an integer >= 1" in capsys.readouterr().err
    assert build(docs, "--table-max-batch-size", "8", "--max-batch-size", "16",
                 "--out", str(out)) == 2
    assert "--table-max-batch-size: 8 differs from --max-batch-size 16" in capsys.readouterr().err
    assert not out.exists()
    assert build(docs, "--table-max-batch-size", "16", "--out", str(out)) == 0
    ranges = json.loads(out.read_text())["num_speculative_tokens_per_batch_size"]
    assert ranges[-1][1] == 16


def test_build_max_batch_size_beyond_reason_is_an_error_not_an_overflow(docs, capsys):
    assert build(docs, "--max-batch-size", str(10**30), "--out", str(docs / "t.json")) == 2
    assert (f"--max-batch-size: {10**30} is above 1048576"
            in capsys.readouterr().err)
    assert not (docs / "t.json").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--max-batch-size", "0"], "--max-batch-size: 0 is not an integer >= 1"),
    (["--lengths", "0,9"], "--lengths: 9 is not a draft length 0..--max-k (3)"),
    (["--lengths=-1,2"], "--lengths: -1 is not a draft length 0..--max-k (3)"),
    (["--lengths", ","], "--lengths: () is empty"),
    (["--tie-margin=-1"], "--tie-margin: -1.0 is not a number >= 0"),
    (["--tie-margin", "nan"], "--tie-margin: nan is not a number >= 0"),
    (["--tie-margin", "inf"], "--tie-margin: inf is not a finite number"),
    (["--table-max-batch-size", "0"], "--table-max-batch-size: 0 is not an integer >= 1"),
    (["--max-k", "0"], "--max-k: 0 is not an integer >= 1"),
    (["--max-num-seqs", "0"], "--max-num-seqs: 0 is not an integer >= 1"),
    (["--repeats", "0"], "--repeats: 0 is not an integer >= 1"),
    (["--output-tokens", "1"], "--output-tokens: 1 is not an integer >= 2"),
    (["--max-spread", "0"], "--max-spread: 0.0 is not a positive number"),
    (["--startup-timeout", "-5"], "--startup-timeout: -5.0 is not a positive number"),
    (["--num-prompts", "0"], "--num-prompts: 0 is not an integer >= 1"),
    (["--max-tokens", "0"], "--max-tokens: 0 is not an integer >= 1"),
    (["--temperature=-0.5"], "--temperature: -0.5 is not a number >= 0"),
    (["--batch-sizes", "32,64", "--max-batch-size", "16"],
     "--batch-sizes: '32,64' has no batch size <= --max-batch-size 16"),
    (["--batch-sizes", "0-4"], "batch_sizes: '0-4' must name batch sizes >= 1"),
    (["--prompts", "/no/such/prompts.jsonl"], "--prompts: /no/such/prompts.jsonl is not a file"),
    (["--workload-output-tokens", "1"], "--workload-output-tokens: 1 is not an integer >= 2"),
    (["--workload-output-tokens", "400"],
     "--workload-output-tokens: 400: the serving windows' longest requests (600 tokens) do not "
     "fit --max-model-len 512"),
    (["--serving-rounds", "0"], "--serving-rounds: 0 is not an integer >= 1"),
    (["--block-steps=-1"], "--block-steps: -1 is not an integer >= 0"),
    (["--output-tokens", "200"],
     "--output-tokens: 200: a repeat's requests (200 tokens x 4 lengths sharing a batch + 64 "
     "for the prompt) do not fit --max-model-len 512; lower --output-tokens, or --block-steps 0 "
     "(a batch per length)"),
    (["--output-tokens", "500", "--block-steps", "0"],
     "--output-tokens: 500: a repeat's requests (500 tokens + 64 for the prompt) do not fit "
     "--max-model-len 512; lower --output-tokens, or --block-steps 0 (a batch per length)"),
])
def test_tune_refuses_bad_arguments_before_any_work(tmp_path, capsys, no_engine, args, message):
    out = tmp_path / "out"
    assert main(["tune", "--out-dir", str(out), *args]) == 2
    assert capsys.readouterr().err == f"tabletune tune: error: {message}\n"
    assert not out.exists()


def test_tune_refuses_an_acceptance_file_short_of_max_k_and_an_out_dir_that_is_a_file(
        docs, capsys, no_engine):
    save_json(docs / "acc2.json", make_acceptance((0.8, 0.6)))
    out = docs / "out"
    assert main(["tune", "--out-dir", str(out), "--acceptance", str(docs / "acc2.json")]) == 2
    assert "--acceptance: " in capsys.readouterr().err
    assert not out.exists()
    deep = docs / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    assert main(["tune", "--out-dir", str(out), "--acceptance", str(deep)]) == 2
    assert "nested too deeply" in capsys.readouterr().err
    (docs / "file").write_text("x")
    assert main(["tune", "--out-dir", str(docs / "file")]) == 2
    assert f"--out-dir: {docs / 'file'} is not a directory" in capsys.readouterr().err


def test_tune_with_good_arguments_gets_past_validation(docs, no_engine):
    # The defaults, and a full set of valid options, reach the engine (the tripwire).
    for extra in ([], ["--lengths", "0,1,3", "--tie-margin", "0", "--max-batch-size", "4",
                       "--table-max-batch-size", "8", "--acceptance",
                       str(docs / "acceptance.json")]):
        with pytest.raises(AssertionError, match="engine work started"):
            main(["tune", "--out-dir", str(docs / "out"), *extra])


def test_a_denormal_step_time_is_blamed_on_the_cell_not_the_output_file(docs, capsys):
    doc = json.loads((docs / "profile.json").read_text())
    doc["cells"][2]["step_ms"] = 1e-320
    (docs / "tiny.json").write_text(json.dumps(doc))
    out = docs / "table.json"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy overflow warning on the way
        rc = main(["build", "--profile", str(docs / "tiny.json"),
                   "--acceptance", str(docs / "acceptance.json"), "--out", str(out)])
    assert rc == 2
    assert capsys.readouterr().err == (
        f"tabletune build: error: {docs / 'tiny.json'}: profile.cells[2].step_ms: 1e-320 is "
        "implausibly small for a step time (below 1e-06 ms)\n")
    assert not out.exists()


def test_build_and_show_label_in_sample_figures_and_name_untrustworthy_cells(docs, capsys):
    from dataclasses import replace

    from tabletune.core.contracts import Profile

    profile = make_profile()
    b = profile.batch_sizes[1]
    cells = [replace(c, flagged=True, flags=("inconsistent",)) if (c.batch_size, c.k) == (b, 2)
             else c for c in profile.cells]
    meta = {"inconsistent": [{"text": f"B={b} k=2 is 9.0% cheaper than B={b} k=1"}],
            "drift_guard": {"drift_events": [{"moved": 0.3}]}}
    save_json(docs / "profile.json", Profile(profile.fingerprint, profile.max_k,
                                             tuple(cells), meta))
    assert build(docs, "--out", str(docs / "table.json")) == 0
    capsys.readouterr()
    assert main(["show", str(docs / "table.json")]) == 0
    out = capsys.readouterr().out
    in_sample = re.search(r"this table \(modelled, in-sample\): ([0-9.]+%)", out).group(1)
    # Repeats that agree exactly: out of sample the table is as good as in sample.
    assert ("out-of-sample (built from all repeats but one, scored on the one left out; 3 "
            f"folds): worst loss {in_sample} on average") in out
    assert f"warning: 1 profile cells are flagged: B={b} k=2 (inconsistent)" in out
    assert f"inconsistent after a re-measure: B={b} k=2 is 9.0% cheaper" in out
    assert "reference cell moved 1 times" in out
    doc = json.loads((docs / "table.json").read_text())
    assert doc["provenance"]["worst_loss_kind"].startswith("modelled, in-sample")
    assert doc["goodput"]["edges"], "the document says by how much each new length won"


def test_version_and_a_help_without_markup(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"tabletune \S+\n", capsys.readouterr().out)
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "tabletune tune --out-dir out" in text
    with pytest.raises(SystemExit):
        main(["acceptance", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the serving temperature (default: 0.0)" in text
    assert "prompt sampling seed (default: 0)" in text


def test_show_takes_the_folder_tune_wrote_and_names_one_without_a_table(docs, capsys):
    assert build(docs, "--out", str(docs / "table.json")) == 0
    capsys.readouterr()
    assert main(["show", str(docs / "table.json")]) == 0
    direct = capsys.readouterr().out
    assert main(["show", str(docs)]) == 0
    assert capsys.readouterr().out == direct
    empty = docs / "empty"
    empty.mkdir()
    assert main(["show", str(empty)]) == 2
    assert capsys.readouterr().err == (
        f"tabletune show: error: {empty}: is a folder without a table.json (give a table "
        "document, or the --out-dir of `tabletune tune`)\n")
