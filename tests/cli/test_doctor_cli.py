"""`tabletune doctor` refuses bad input before starting anything."""

from __future__ import annotations

import pytest

from tabletune.cli import main


@pytest.mark.parametrize("args, message", [
    (["--tolerance", "1.5"], "error: --tolerance: 1.5 is not a number below 1"),
    (["--max-batch-size", "0"], "error: --max-batch-size: 0 is not an integer >= 1"),
    (["--repeats", "0"], "error: --repeats: 0 is not an integer >= 1"),
    (["--startup-timeout", "0"], "error: --startup-timeout: 0.0 is not a positive number"),
    (["--startup-timeout", "nan"], "error: --startup-timeout: nan is not a positive number"),
])
def test_bad_options_exit_2_with_the_option_named(args, message, capsys, tmp_path):
    assert main(["doctor", "--out-dir", str(tmp_path / "d")] + args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "d").exists()


def test_a_candidate_that_is_not_a_table_is_refused(capsys, tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text("[[1, 4, 2], [3, 8, 1]]")   # overlapping ranges
    assert main(["doctor", "--table", str(bad), "--out-dir", str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    assert f"error: {bad}[1]: [3, 8, 1] overlaps" in err and "Traceback" not in err
    garbage = tmp_path / "g.json"
    garbage.write_text("{not json")
    assert main(["doctor", "--table", str(garbage), "--out-dir", str(tmp_path / "d")]) == 2
    assert f"error: {garbage}: cannot read table JSON: " in capsys.readouterr().err
