"""Draft tables: parsing, lookup, vLLM form, diffs."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_schedule import vllm_schedule_utils
from tabletune.core import DOCS_TABLE, ContractError, DraftTable

DOCS_RANGES = [[1, 64, 3], [65, 128, 1], [129, 512, 0]]


VLLM = vllm_schedule_utils()


def vllm_dense(table: DraftTable, max_batch_size: int) -> list[int]:
    """vLLM's dense lookup for B = 1..max_batch_size (it leaves index 0 unused)."""
    dense = VLLM.build_dynamic_sd_schedule_lookup(table.to_vllm(), max_batch_size, table.max_k or 1)
    return dense[1:]


def test_docs_example_round_trips_to_vllm():
    table = DraftTable.from_ranges(DOCS_RANGES)
    assert table == DOCS_TABLE
    assert table.to_vllm() == DOCS_RANGES
    assert DraftTable.from_ranges(table.to_vllm()) == table
    assert VLLM.validate_and_normalize_dynamic_sd_schedule(table.to_vllm()) == [
        tuple(r) for r in DOCS_RANGES
    ]
    assert vllm_dense(table, 600) == table.lookup(600)


def test_docs_table_properties():
    t = DOCS_TABLE
    assert t.ranges == ((1, 64, 3), (65, 128, 1), (129, 512, 0))
    assert (t.max_k, t.lengths, t.max_batch_size) == (3, frozenset({0, 1, 3}), 512)
    assert [t.k_for(b) for b in (1, 64, 65, 128, 129, 512, 10_000)] == [3, 3, 1, 1, 0, 0, 0]
    lookup = t.lookup(130)
    assert len(lookup) == 130 and lookup[0] == 3 and lookup[63] == 3 and lookup[64] == 1
    assert lookup[128:] == [0, 0]
    assert t.lookup(3) == [3, 3, 3]
    assert t.describe() == "B 1–64: k=3\nB 65–128: k=1\nB 129–512: k=0"


def test_tuples_and_direct_construction_are_normalized():
    assert DraftTable(((1, 64, 3), (65, 128, 1), (129, 512, 0))) == DOCS_TABLE
    assert DraftTable([[1, 64, 3], [65, 128, 1], [129, 512, 0]]) == DOCS_TABLE
    with pytest.raises(ContractError, match=r"^table\.ranges\[0\]\.start: 2 is not 1"):
        DraftTable([[2, 5, 1]])


def test_adjacent_ranges_with_the_same_k_merge():
    t = DraftTable.from_ranges([[1, 10, 3], [11, 20, 3], [21, 30, 1], [31, 31, 1]])
    assert t.to_vllm() == [[1, 20, 3], [21, 31, 1]]
    assert hash(t) == hash(DraftTable.from_ranges([[1, 20, 3], [21, 31, 1]]))


def test_speculative_config_installs_the_table_and_leaves_base_alone():
    base = {"method": "eagle3", "model": "drafter", "num_speculative_tokens": 7, "extra": {"a": 1}}
    config = DOCS_TABLE.speculative_config(base)
    assert config["num_speculative_tokens"] == 3
    assert config["num_speculative_tokens_per_batch_size"] == DOCS_RANGES
    assert config["method"] == "eagle3"
    assert base["num_speculative_tokens"] == 7
    assert "num_speculative_tokens_per_batch_size" not in base
    config["extra"]["a"] = 2
    assert base["extra"] == {"a": 1}
    # vLLM refuses num_speculative_tokens = 0, so an all-zero table still says 1.
    off = DraftTable.from_ranges([[1, 8, 0]]).speculative_config({})
    assert off["num_speculative_tokens"] == 1


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([[1, 64, 3], [60, 128, 1]], r"^table\.ranges\[1\]: \[60, 128, 1\] overlaps the previous"),
        ([[1, 64, 3], [1, 128, 1]], r"^table\.ranges\[1\]: \[1, 128, 1\] overlaps the previous"),
        ([[1, 64, 3], [129, 512, 0], [65, 128, 1]],
         r"^table\.ranges\[2\]: \[65, 128, 1\] starts before the previous range"),
        ([[1, 64, 3], [70, 128, 1]],
         r"^table\.ranges\[1\]: \[70, 128, 1\] leaves a gap .*65-69"),
        ([[2, 64, 3]], r"^table\.ranges\[0\]\.start: 2 is not 1"),
        ([[0, 64, 3]], r"^table\.ranges\[0\]\.start: 0 is not an integer >= 1"),
        ([[1, 64, 3], [65, 60, 1]], r"^table\.ranges\[1\]\.end: 60 is below its start 65"),
        ([[1, 64, -1]], r"^table\.ranges\[0\]\.k: -1 is not an integer >= 0"),
        ([[1, 64.0, 3]], r"^table\.ranges\[0\]\.end: 64\.0 is not an integer"),
        ([[1, 64, "3"]], r"^table\.ranges\[0\]\.k: '3' is not an integer"),
        ([[1, 64, True]], r"^table\.ranges\[0\]\.k: True is not an integer"),
        ([[1, 64]], r"^table\.ranges\[0\]: \[1, 64\] is not a 3-item"),
        (["1-64"], r"^table\.ranges\[0\]: '1-64' is not a 3-item"),
        ([], r"^table\.ranges: \[\] is empty"),
        ("[[1, 64, 3]]", r"^table\.ranges: '\[\[1, 64, 3\]\]' is not a list"),
        ({"1": 3}, r"^table\.ranges: \{'1': 3\} is not a list"),
    ],
)
def test_bad_ranges_name_the_field_and_value(ranges, message):
    with pytest.raises(ContractError, match=message):
        DraftTable.from_ranges(ranges)


def test_errors_use_the_callers_field_name():
    with pytest.raises(ContractError, match=r"^doc\.schedule\[1\]: \[60, 128, 1\] overlaps"):
        DraftTable.from_ranges([[1, 64, 3], [60, 128, 1]], field="doc.schedule")


def test_lookup_and_k_for_reject_bad_batch_sizes():
    with pytest.raises(ContractError, match=r"^batch_size: 0 "):
        DOCS_TABLE.k_for(0)
    with pytest.raises(ContractError, match=r"^max_batch_size: 0 "):
        DOCS_TABLE.lookup(0)
    with pytest.raises(ContractError, match=r"^lookup\[1\]: -2 "):
        DraftTable.from_lookup([1, -2])
    with pytest.raises(ContractError, match=r"^lookup: \[\] is empty"):
        DraftTable.from_lookup([])


lookups = st.lists(st.integers(0, 8), min_size=1, max_size=300)


@settings(max_examples=200, deadline=None)
@given(lookups)
def test_from_lookup_round_trips_and_matches_vllm(ks):
    table = DraftTable.from_lookup(ks)
    assert table.lookup(len(ks)) == ks
    assert [table.k_for(b) for b in range(1, len(ks) + 1)] == ks
    assert table.max_batch_size == len(ks)
    # Canonical: contiguous from 1 and no two neighbours share a k.
    assert table.ranges[0][0] == 1
    for (_, end, k), (start, _, k2) in zip(table.ranges, table.ranges[1:]):
        assert start == end + 1 and k != k2
    VLLM.validate_and_normalize_dynamic_sd_schedule(table.to_vllm())
    assert vllm_dense(table, len(ks)) == ks
    assert DraftTable.from_lookup(table.lookup(len(ks))) == table
    assert DraftTable.from_ranges(json.loads(json.dumps(table.to_vllm()))) == table


@settings(max_examples=100, deadline=None)
@given(lookups, st.integers(1, 400))
def test_lookup_past_the_last_range_matches_vllm(ks, max_batch_size):
    table = DraftTable.from_lookup(ks)
    assert table.lookup(max_batch_size) == vllm_dense(table, max_batch_size)


def test_diff_reports_edge_shifts_per_length():
    moved = DraftTable.from_ranges([[1, 80, 3], [81, 96, 1], [97, 512, 0]])
    diff = DOCS_TABLE.diff(moved)
    assert diff.max_batch_size == 512
    k3, k1, k0 = diff.for_length(3), diff.for_length(1), diff.for_length(0)
    assert (k3.old_start, k3.old_end, k3.new_start, k3.new_end) == (1, 64, 1, 80)
    assert (k3.start_shift, k3.end_shift, k3.end_shift_rel) == (0, 16, 0.25)
    assert (k1.start_shift, k1.end_shift) == (16, -32)
    assert k1.start_shift_rel == pytest.approx(16 / 65) and k1.end_shift_rel == -0.25
    assert (k0.start_shift, k0.end_shift) == (-32, 0)
    assert diff.max_edge_shift == 32
    changed = dict((b, (o, n)) for b, o, n in diff.changed)
    assert sorted(changed) == list(range(65, 81)) + list(range(97, 129))
    assert changed[65] == (1, 3) and changed[100] == (1, 0)
    assert diff.changed_batch_sizes[0] == 65 and not diff.identical
    assert "k=3: B 1–64 -> B 1–80" in diff.describe()
    json.dumps(diff.to_dict())


def test_diff_with_lengths_in_only_one_table():
    other = DraftTable.from_ranges([[1, 32, 2], [33, 512, 0]])
    diff = DOCS_TABLE.diff(other)
    assert [s.k for s in diff.lengths] == [0, 1, 2, 3]
    k2, k3 = diff.for_length(2), diff.for_length(3)
    assert (k2.old_start, k2.new_start, k2.new_end, k2.start_shift) == (None, 1, 32, None)
    assert (k3.old_end, k3.new_start, k3.end_shift_rel) == (64, None, None)
    assert diff.for_length(0).start_shift == 33 - 129
    with pytest.raises(ContractError, match=r"^k: 5 is in neither table"):
        diff.for_length(5)


def test_diff_of_equal_tables_and_explicit_max_batch_size():
    assert DOCS_TABLE.diff(DOCS_TABLE).identical
    assert DOCS_TABLE.diff(DOCS_TABLE).max_edge_shift == 0
    short = DraftTable.from_ranges([[1, 64, 3], [65, 100, 1]])
    # Past its last end the short table keeps k=1, so they differ from B=129 on.
    assert DOCS_TABLE.diff(short).changed_batch_sizes == tuple(range(129, 513))
    assert DOCS_TABLE.diff(short, max_batch_size=128).identical
