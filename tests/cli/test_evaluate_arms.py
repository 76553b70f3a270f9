"""Arms of `tabletune evaluate` keep a name each: results, losses and plots are keyed by it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tabletune.core.errors import ContractError
from tabletune.evaluation.arms import distinct_arms, parse_arm

CPU_TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cpu" / "table.json"


def _two_tunes(tmp_path):
    paths = []
    for tune in ("tune-cold", "tune-warm"):
        (tmp_path / tune).mkdir()
        paths.append(tmp_path / tune / "table.json")
        shutil.copy(CPU_TABLE, paths[-1])
    return paths


def test_two_tables_of_one_file_name_are_named_by_their_paths(tmp_path):
    cold, warm = _two_tunes(tmp_path)
    arms = distinct_arms([parse_arm("fixed:2", 3), parse_arm(f"table:{cold}", 3),
                          parse_arm(f"table:{warm}", 3), parse_arm("docs", 3)])
    assert [a.name for a in arms] == ["fixed k=2", f"table {cold}", f"table {warm}",
                                      "vLLM docs table"]
    # A table.json alone keeps its short name.
    assert distinct_arms([parse_arm(f"table:{cold}", 3)])[0].name == "table table.json"


@pytest.mark.parametrize("texts, name", [
    (["fixed:2", "fixed:2"], "fixed k=2"),
    (["docs", "fixed:1", "docs"], "vLLM docs table"),
])
def test_an_arm_given_twice_is_refused(texts, name):
    with pytest.raises(ContractError, match=f"--arms: '{name}': given twice"):
        distinct_arms([parse_arm(t, 3) for t in texts])


def test_one_table_file_given_twice_is_refused(tmp_path):
    cold, _ = _two_tunes(tmp_path)
    with pytest.raises(ContractError, match="given twice"):
        distinct_arms([parse_arm(f"table:{cold}", 3), parse_arm(f"table:{cold}", 3)])
