"""Versioned JSON documents: validation, round trips and atomic files."""

import json
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletune.core import (
    ACCEPTANCE_SCHEMA,
    DOCS_TABLE,
    PROFILE_SCHEMA,
    TABLE_SCHEMA,
    Acceptance,
    ContractError,
    DraftTable,
    GoodputBlock,
    Profile,
    ProfileCell,
    TableDocument,
    check_compatible,
    load_json,
    save_json,
)

FINGERPRINT = {"gpu": "H100", "model": "Qwen3-4B", "drafter": "eagle3", "vllm": "0.32.0"}


def make_profile(batch_sizes=(1, 2, 4, 8), max_k=3, step=lambda b, k: 4.0 + 0.05 * b * (1 + k)):
    cells = tuple(
        ProfileCell(batch_size=b, k=k, step_ms=step(b, k), samples_ms=(step(b, k),) * 3)
        for b in batch_sizes
        for k in range(max_k + 1)
    )
    return Profile(fingerprint=dict(FINGERPRINT), max_k=max_k, cells=cells, meta={"note": "t"})


def make_acceptance(rates=(0.7, 0.5, 0.3)):
    drafts = 10_000
    return Acceptance(
        rates=tuple(rates),
        num_drafts=drafts,
        accepted_per_position=tuple(round(r * drafts) for r in rates),
        num_prompts=160,
        temperature=0.0,
    )


def profile_dict(**changes):
    d = make_profile().to_dict()
    d.update(changes)
    return d


# ---------------------------------------------------------------------------- round trips


def test_profile_round_trips_through_dict_and_json(tmp_path):
    profile = make_profile()
    d = profile.to_dict()
    assert d["schema"] == PROFILE_SCHEMA and len(d["cells"]) == 16
    assert Profile.from_dict(d) == profile
    assert Profile.from_dict(json.loads(json.dumps(d))) == profile
    save_json(tmp_path / "profile.json", profile)
    assert load_json(tmp_path / "profile.json", "profile") == profile


def test_profile_accessors():
    profile = make_profile(batch_sizes=(8, 1, 4), max_k=2)
    assert profile.batch_sizes == (1, 4, 8)
    assert profile.lengths == (0, 1, 2)
    assert profile.step_ms(4, 2) == pytest.approx(4.0 + 0.05 * 4 * 3)
    assert [(c.batch_size, c.k) for c in profile.cells][:3] == [(1, 0), (1, 1), (1, 2)]
    with pytest.raises(ContractError, match=r"B=3, k=1.* is not a profiled cell"):
        profile.step_ms(3, 1)


def test_profile_cell_optional_fields_round_trip():
    cell = ProfileCell(2, 1, 5.5, (5.4, 5.5, 5.7), spread=0.3, source="engine", flagged=True,
                       engine_step_ms=5.5, client_step_ms=5.9)
    profile = Profile({}, 1, (cell, ProfileCell(2, 0, 4.0, ())))
    again = Profile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert again == profile and again.cell(2, 1).flagged and again.cell(2, 1).source == "engine"


def test_acceptance_round_trips(tmp_path):
    acceptance = make_acceptance()
    d = acceptance.to_dict()
    assert d["schema"] == ACCEPTANCE_SCHEMA and acceptance.max_k == 3
    assert Acceptance.from_dict(json.loads(json.dumps(d))) == acceptance
    save_json(tmp_path / "a.json", acceptance)
    assert load_json(tmp_path / "a.json", "acceptance") == acceptance


def test_docs_table_round_trips_through_table_document(tmp_path):
    table = DraftTable.from_ranges([[1, 64, 3], [65, 128, 1], [129, 512, 0]])
    doc = TableDocument(table=table, num_speculative_tokens=3, provenance={"source": "docs"})
    d = doc.to_dict()
    assert d == {
        "schema": TABLE_SCHEMA,
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 64, 3], [65, 128, 1], [129, 512, 0]],
        "provenance": {"source": "docs"},
        "goodput": {},
        "meta": {},
    }
    assert TableDocument.from_dict(d) == doc
    assert TableDocument.from_dict(json.loads(json.dumps(d))).table == DOCS_TABLE
    save_json(tmp_path / "table.json", doc)
    loaded = load_json(tmp_path / "table.json", "table")
    assert loaded == doc and loaded.table.to_vllm() == d["num_speculative_tokens_per_batch_size"]


@settings(max_examples=60, deadline=None)
@given(
    batch_sizes=st.lists(st.integers(1, 512), min_size=1, max_size=6, unique=True),
    max_k=st.integers(0, 4),
    steps=st.lists(st.floats(0.01, 1e4, allow_nan=False), min_size=30, max_size=30),
)
def test_random_profiles_round_trip_through_json(batch_sizes, max_k, steps):
    it = iter(steps)
    cells = tuple(
        ProfileCell(b, k, next(it), ()) for b in batch_sizes for k in range(max_k + 1)
    )
    profile = Profile({"seed": 1}, max_k, cells)
    assert Profile.from_dict(json.loads(json.dumps(profile.to_dict()))) == profile


# ---------------------------------------------------------------------------- bad profiles


def test_nan_step_time_message_matches_the_style_guide():
    d = profile_dict()
    d["cells"][12]["step_ms"] = math.nan
    with pytest.raises(ContractError) as err:
        Profile.from_dict(d)
    assert str(err.value) == "profile.cells[12].step_ms: nan is not a positive number"


@pytest.mark.parametrize("value", [math.nan, -1.0, 0.0, 0, math.inf, "5.0", None, True])
def test_bad_step_times(value):
    d = profile_dict()
    d["cells"][3]["step_ms"] = value
    with pytest.raises(ContractError, match=rf"^profile\.cells\[3\]\.step_ms: {value!r} is not"):
        Profile.from_dict(d)


@pytest.mark.parametrize("field", ["step_ms", "engine_step_ms", "client_step_ms"])
@pytest.mark.parametrize("value, problem", [
    (1e-320, "is implausibly small for a step time (below 1e-06 ms)"),
    (5e-7, "is implausibly small for a step time (below 1e-06 ms)"),
    (1e300, "is implausibly large for a step time (above 1e+09 ms)"),
])
def test_implausible_step_times_are_refused_naming_the_cell(tmp_path, field, value, problem):
    d = profile_dict()
    d["cells"][5][field] = value
    with pytest.raises(ContractError) as err:
        Profile.from_dict(d)
    assert str(err.value) == f"profile.cells[5].{field}: {value!r} {problem}"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(d))
    with pytest.raises(ContractError, match=rf"^{path}: profile\.cells\[5\]\.{field}: "):
        load_json(path, "profile")


def test_step_times_at_the_plausible_limits_are_accepted():
    from tabletune.core.errors import MAX_STEP_MS, MIN_STEP_MS

    d = profile_dict()
    d["cells"][0]["step_ms"] = MIN_STEP_MS
    d["cells"][1]["step_ms"] = MAX_STEP_MS
    profile = Profile.from_dict(d)
    assert profile.step_ms(1, 0) == MIN_STEP_MS and profile.step_ms(1, 1) == MAX_STEP_MS


def test_missing_cell_names_the_cell():
    d = profile_dict()
    del d["cells"][6]  # B=2, k=2
    with pytest.raises(ContractError, match=r"^profile\.cells\[B=2, k=2\]: None is missing"):
        Profile.from_dict(d)


def test_duplicate_cell():
    d = profile_dict()
    d["cells"].append(dict(d["cells"][5]))
    with pytest.raises(ContractError, match=r"^profile\.cells\[16\]: 'B=2, k=1' duplicates "
                                            r"profile\.cells\[5\]"):
        Profile.from_dict(d)


def test_extra_cell_above_max_k():
    d = profile_dict()
    d["cells"].append({"batch_size": 1, "k": 4, "step_ms": 9.0, "samples_ms": []})
    with pytest.raises(ContractError, match=r"^profile\.cells\[16\]\.k: 4 is above profile\.max_k"):
        Profile.from_dict(d)


def test_empty_cells():
    with pytest.raises(ContractError, match=r"^profile\.cells: \[\] is empty"):
        Profile.from_dict(profile_dict(cells=[]))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema": "tabletune.profile/v2"},
         r"^profile\.schema: 'tabletune\.profile/v2' is not 'tabletune\.profile/v1'"),
        ({"schema": ACCEPTANCE_SCHEMA}, r"^profile\.schema: 'tabletune\.acceptance/v1' is not"),
        ({"max_k": "3"}, r"^profile\.max_k: '3' is not an integer"),
        ({"max_k": -1}, r"^profile\.max_k: -1 is not an integer >= 0"),
        ({"fingerprint": ["H100"]}, r"^profile\.fingerprint: \['H100'\] is not an object"),
        ({"meta": "x"}, r"^profile\.meta: 'x' is not an object"),
        ({"cells": "none"}, r"^profile\.cells: 'none' is not a list"),
        ({"extra": 1}, r"^profile\.extra: 1 is not a known field"),
    ],
)
def test_bad_profile_fields(changes, message):
    with pytest.raises(ContractError, match=message):
        Profile.from_dict(profile_dict(**changes))


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("batch_size", 1.5, r"batch_size: 1\.5 is not an integer"),
        ("batch_size", 0, r"batch_size: 0 is not an integer >= 1"),
        ("k", "1", r"k: '1' is not an integer"),
        ("samples_ms", "5.0", r"samples_ms: '5\.0' is not a list"),
        ("samples_ms", [5.0, math.nan], r"samples_ms\[1\]: nan is not a finite number"),
        ("spread", -0.1, r"spread: -0\.1 is not a non-negative number"),
        ("source", 3, r"source: 3 is not a string"),
        ("flagged", "yes", r"flagged: 'yes' is not a boolean"),
        ("engine_step_ms", 0.0, r"engine_step_ms: 0\.0 is not a positive number"),
        ("client_step_ms", "x", r"client_step_ms: 'x' is not a positive number"),
        ("step_m", 5.0, r"step_m: 5\.0 is not a known field"),
    ],
)
def test_bad_cell_fields(key, value, message):
    d = profile_dict()
    d["cells"][2][key] = value
    with pytest.raises(ContractError, match=r"^profile\.cells\[2\]\." + message):
        Profile.from_dict(d)


def test_missing_keys():
    d = profile_dict()
    del d["max_k"]
    with pytest.raises(ContractError, match=r"^profile\.max_k: None is missing"):
        Profile.from_dict(d)
    d = profile_dict()
    del d["cells"][0]["step_ms"]
    with pytest.raises(ContractError, match=r"^profile\.cells\[0\]\.step_ms: None is missing"):
        Profile.from_dict(d)
    with pytest.raises(ContractError, match=r"^profile\.schema: None is missing"):
        Profile.from_dict({"max_k": 1})
    with pytest.raises(ContractError, match=r"^profile: \[\] is not an object"):
        Profile.from_dict([])


def test_direct_construction_is_validated_too():
    with pytest.raises(ContractError, match=r"^profile\.cells\[0\]\.step_ms: -2\.0 is not a pos"):
        Profile({}, 0, (ProfileCell(1, 0, -2.0, ()),))
    with pytest.raises(ContractError, match=r"^profile\.cells\[0\]: 'cell' is not a ProfileCell"):
        Profile({}, 0, ("cell",))


# ---------------------------------------------------------------------------- bad acceptance


def acceptance_dict(**changes):
    d = make_acceptance().to_dict()
    d.update(changes)
    return d


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rates": [0.7, 1.2, 0.3]}, r"^acceptance\.rates\[1\]: 1\.2 is not a number in \[0, 1\]"),
        ({"rates": [0.7, -0.5, 0.3]}, r"^acceptance\.rates\[1\]: -0\.5 is not a number in"),
        ({"rates": [0.5, 0.7, 0.3]}, r"^acceptance\.rates\[1\]: 0\.7 is above acceptance\.rates"),
        ({"rates": [0.7, 0.5, math.nan]}, r"^acceptance\.rates\[2\]: nan is not a number"),
        ({"rates": "0.7"}, r"^acceptance\.rates: '0\.7' is not a list"),
        ({"accepted_per_position": [1, 2]},
         r"^acceptance\.accepted_per_position: \[1, 2\] has 2 entries but acceptance\.rates has 3"),
        ({"accepted_per_position": [7000, 5000.5, 3000]},
         r"^acceptance\.accepted_per_position\[1\]: 5000\.5 is not an integer"),
        ({"num_drafts": -1}, r"^acceptance\.num_drafts: -1 is not an integer >= 0"),
        ({"num_prompts": "160"}, r"^acceptance\.num_prompts: '160' is not an integer"),
        ({"temperature": math.nan}, r"^acceptance\.temperature: nan is not a non-negative"),
        ({"schema": "tabletune.acceptance/v0"}, r"^acceptance\.schema: 'tabletune\.acceptance/v0'"),
        ({"rate": [0.5]}, r"^acceptance\.rate: \[0\.5\] is not a known field"),
    ],
)
def test_bad_acceptance(changes, message):
    with pytest.raises(ContractError, match=message):
        Acceptance.from_dict(acceptance_dict(**changes))


def test_k_mismatch_between_profile_and_acceptance():
    profile = make_profile(max_k=3)
    check_compatible(profile, make_acceptance((0.7, 0.5, 0.3)))
    check_compatible(profile, make_acceptance((0.7, 0.5, 0.3, 0.2)))
    with pytest.raises(ContractError, match=r"^acceptance\.rates: \[0\.7, 0\.5\] has 2 rates but "
                                            r"profile\.max_k is 3 \(K mismatch\)"):
        check_compatible(profile, make_acceptance((0.7, 0.5)))


# ---------------------------------------------------------------------------- bad tables


def table_dict(**changes):
    d = TableDocument(DOCS_TABLE, 3, {"by": "test"}).to_dict()
    d.update(changes)
    return d


FIELD = r"table\.num_speculative_tokens_per_batch_size"


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([[1, 64, 3], [60, 128, 1]], rf"^{FIELD}\[1\]: \[60, 128, 1\] overlaps"),
        ([[65, 128, 1], [1, 64, 3]], rf"^{FIELD}\[1\]: \[1, 64, 3\] starts before"),
        ([[1, 64, 3], [66, 128, 1]], rf"^{FIELD}\[1\]: \[66, 128, 1\] leaves a gap"),
        ([[2, 64, 3]], rf"^{FIELD}\[0\]\.start: 2 is not 1"),
        ([[1, 64, 3.5]], rf"^{FIELD}\[0\]\.k: 3\.5 is not an integer"),
    ],
)
def test_bad_table_ranges(ranges, message):
    with pytest.raises(ContractError, match=message):
        TableDocument.from_dict(table_dict(num_speculative_tokens_per_batch_size=ranges))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"schema": "tabletune.table/v9"}, r"^table\.schema: 'tabletune\.table/v9' is not"),
        ({"num_speculative_tokens": 2},
         r"^table\.num_speculative_tokens: 2 is below the table's largest k = 3"),
        ({"num_speculative_tokens": 0},
         r"^table\.num_speculative_tokens: 0 is not an integer >= 1"),
        ({"num_speculative_tokens": "3"}, r"^table\.num_speculative_tokens: '3' is not an integer"),
        ({"provenance": None}, r"^table\.provenance: None is not an object"),
        ({"goodput": [1.0]}, r"^table\.goodput: \[1\.0\] is not an object"),
    ],
)
def test_bad_table_documents(changes, message):
    with pytest.raises(ContractError, match=message):
        TableDocument.from_dict(table_dict(**changes))


# ---------------------------------------------------------------------------- files


@pytest.mark.parametrize("error", [OverflowError("int too large to convert to C long"),
                                   ValueError("cannot convert float infinity to integer"),
                                   TypeError("'<' not supported between 'str' and 'int'")])
def test_a_conversion_the_checks_let_through_is_still_named_with_its_file(tmp_path, monkeypatch,
                                                                          error):
    """A value deep in a file that a later conversion refuses is the file's fault: one line
    naming the file, not an exception without one."""
    from tabletune.core import contracts

    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_dict()))

    def refuse(data):
        raise error

    monkeypatch.setattr(contracts.Profile, "from_dict", staticmethod(refuse))
    with pytest.raises(ContractError) as err:
        load_json(path, "profile")
    assert str(err.value) == f"{path}: profile: {error}"


def test_load_json_errors_name_the_file(tmp_path):
    path = tmp_path / "profile.json"
    d = profile_dict()
    d["cells"][12]["step_ms"] = -3.0
    path.write_text(json.dumps(d))
    with pytest.raises(ContractError) as err:
        load_json(path, "profile")
    assert str(err.value) == f"{path}: profile.cells[12].step_ms: -3.0 is not a positive number"

    # json.loads accepts a bare NaN; the strict reader refuses it, naming where it is.
    path.write_text(json.dumps(profile_dict()).replace('"step_ms": 4.05', '"step_ms": NaN', 1))
    with pytest.raises(ContractError, match=rf"^{path}: cannot read profile JSON: "
                                            r"cells\[\d+\]\.step_ms: NaN is not JSON"):
        load_json(path, "profile")

    path.write_text("{not json")
    with pytest.raises(ContractError, match=rf"^{path}: cannot read profile JSON"):
        load_json(path, "profile")
    with pytest.raises(ContractError, match=r"missing\.json: cannot read table JSON"):
        load_json(tmp_path / "missing.json", "table")
    path.write_text(json.dumps(profile_dict()))
    with pytest.raises(ContractError, match=rf"^{path}: acceptance\.schema: 'tabletune\.profile"):
        load_json(path, "acceptance")
    with pytest.raises(ContractError, match=r"^kind: 'tables' is not one of"):
        load_json(path, "tables")


def test_save_json_never_leaves_a_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "table.json"
    good = TableDocument(DOCS_TABLE, 3, {"by": "test"})
    save_json(path, good)
    before = path.read_bytes()

    for bad in (
        TableDocument(DOCS_TABLE, 3, {"by": object()}),  # not JSON at all
        TableDocument(DOCS_TABLE, 3, {"by": "test"},
                      goodput=GoodputBlock.from_dict({"x": math.nan})),  # not strict JSON
    ):
        with pytest.raises(ContractError, match=rf"^{path}: cannot encode"):
            save_json(path, bad)
        assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["table.json"]

    # A failure after the temp file is written (disk full, killed) keeps the old file too.
    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        save_json(path, TableDocument(DOCS_TABLE, 4, {"by": "other"}))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["table.json"]
    assert load_json(path, "table") == good


def test_save_json_replaces_and_accepts_plain_dicts(tmp_path):
    path = tmp_path / "doc.json"
    save_json(path, {"a": 1})
    save_json(path, make_acceptance())
    assert json.loads(path.read_text())["schema"] == ACCEPTANCE_SCHEMA
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


# ---------------------------------------------------------------------------- hostile files


def test_acceptance_counts_above_the_number_of_drafts_are_refused(tmp_path):
    with pytest.raises(ContractError, match=r"^acceptance\.accepted_per_position\[0\]: 10001 is "
                                            r"above acceptance\.num_drafts = 10000"):
        Acceptance.from_dict(acceptance_dict(accepted_per_position=[10_001, 5000, 3000]))
    with pytest.raises(ContractError, match=r"accepted_per_position\[2\]: 5 is above "
                                            r"acceptance\.num_drafts = 0"):
        Acceptance((0.0, 0.0, 0.0), 0, (0, 0, 5), 1, 0.0)
    path = tmp_path / "acc.json"
    path.write_text(json.dumps(acceptance_dict(num_drafts=100)))
    with pytest.raises(ContractError, match=rf"^{path}: acceptance\.accepted_per_position\[0\]: "
                                            r"7000 is above acceptance\.num_drafts = 100"):
        load_json(path, "acceptance")
    # Equal counts (every draft accepted at that position) are fine.
    assert Acceptance((1.0,), 5, (5,), 1, 0.0).accepted_per_position == (5,)


def test_deeply_nested_json_is_a_contract_error_naming_the_file(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 5000 + "]" * 5000)
    for kind in ("profile", "acceptance", "table"):
        with pytest.raises(ContractError, match=rf"^{path}: cannot read {kind} JSON: nested too "
                                                "deeply"):
            load_json(path, kind)
    # Shallow enough to parse, too deep to validate and quote in a message.
    d = profile_dict()
    d["fingerprint"] = json.loads("[" * 900 + "]" * 900)
    path.write_text(json.dumps(d))
    with pytest.raises(ContractError, match=rf"^{path}: profile"):
        load_json(path, "profile")


def test_json_files_above_the_size_limit_are_refused_unread(tmp_path):
    from tabletune.core.contracts import MAX_JSON_BYTES

    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(MAX_JSON_BYTES + 1)  # sparse: nothing is written or read
    with pytest.raises(ContractError, match=rf"^{path}: cannot read table JSON: the file is "
                                            r"larger than 64 MiB"):
        load_json(path, "table")


def test_integer_literals_beyond_pythons_digit_limit_name_the_file(tmp_path):
    path = tmp_path / "digits.json"
    d = acceptance_dict()
    path.write_text(json.dumps(d).replace('"num_drafts": 10000', '"num_drafts": ' + "9" * 5000))
    with pytest.raises(ContractError, match=rf"^{path}: cannot read acceptance JSON: Exceeds"):
        load_json(path, "acceptance")


def test_numbers_beyond_the_float_range_are_refused_by_name():
    from tabletune.core.errors import check_nonnegative, check_number, check_positive

    for check in (check_number, check_positive, check_nonnegative):
        with pytest.raises(ContractError, match=r"^x: 1000.* is too large \(beyond the range of "
                                                r"a float\)"):
            check(10**400, "x")
    with pytest.raises(ContractError, match=r"^acceptance\.rates\[0\]: 1000.* is not a number in"):
        Acceptance.from_dict(acceptance_dict(rates=[10**400, 0.5, 0.3]))
    with pytest.raises(ContractError, match=r"profile\.cells\[0\]\.step_ms: 1000.* is too large"):
        ProfileCell(1, 0, 10**400, ()).validated("profile.cells[0]")
