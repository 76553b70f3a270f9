"""The table builder: the choice per batch size, its options, its document and float safety."""

import json
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_schedule import vllm_schedule_utils
from tabletune.core import (
    DOCS_TABLE,
    ContractError,
    DraftTable,
    GoodputBlock,
    Profile,
    ProfileCell,
    StepTimes,
    TableDocument,
    build_table,
    fixed_length_goodput,
    load_json,
    save_json,
    table_loss,
)
from tabletune.core.goodput import goodput

from factories import PAPER_RATES, linear_step_times


VLLM = vllm_schedule_utils()


# ---------------------------------------------------------------------------- paper example


def test_paper_example_5ms_vs_8ms_picks_k1():
    result = build_table(StepTimes({(16, 1): 5.0, (16, 3): 8.0}), PAPER_RATES)
    assert result.lengths == (1, 3)
    assert result.table.k_for(16) == 1
    assert result.table.to_vllm() == [[1, 16, 1]]


def test_paper_example_4_5ms_vs_6ms_picks_k3():
    result = build_table(StepTimes({(16, 1): 4.5, (16, 3): 6.0}), PAPER_RATES)
    assert result.table.k_for(16) == 3
    assert result.table.to_vllm() == [[1, 16, 3]]


def test_paper_example_both_batch_sizes_in_one_table():
    step_times = StepTimes({(8, 1): 4.5, (8, 3): 6.0, (32, 1): 5.0, (32, 3): 8.0})
    result = build_table(step_times, PAPER_RATES)
    assert result.chosen[8 - 1] == 3 and result.chosen[32 - 1] == 1
    (s1, e1, k1), (s2, e2, k2) = result.table.ranges
    assert (s1, k1, e2, k2) == (1, 3, 32, 1) and 8 <= e1 < 32 and s2 == e1 + 1
    assert result.interpolated[7] is False and result.interpolated[8] is True


# ---------------------------------------------------------------------------- tie margin


def tie_step_times(advantage: float) -> StepTimes:
    """k=1 clearly wins at B=1; at B=2, k=3 has ``advantage`` (relative) more goodput than k=1."""
    t1 = 10.0
    g1 = goodput(2, t1, PAPER_RATES, 1)
    t3 = 2 * 2.5 * 1000 / (g1 * (1 + advantage))
    return StepTimes({(1, 1): 5.0, (1, 3): 8.0, (2, 1): t1, (2, 3): t3})


def test_tie_margin_keeps_previous_k_when_other_is_0_4_percent_better():
    result = build_table(tie_step_times(0.004), PAPER_RATES, tie_margin=0.005)
    g = result.goodput[1]
    assert g[1] / g[0] == pytest.approx(1.004)
    assert result.chosen == (1, 1)
    assert result.table.to_vllm() == [[1, 2, 1]]


def test_tie_margin_switches_when_other_is_0_6_percent_better():
    result = build_table(tie_step_times(0.006), PAPER_RATES, tie_margin=0.005)
    assert result.goodput[1, 1] / result.goodput[1, 0] == pytest.approx(1.006)
    assert result.chosen == (1, 3)
    assert result.table.to_vllm() == [[1, 1, 1], [2, 2, 3]]


def test_zero_tie_margin_always_takes_the_best():
    assert build_table(tie_step_times(0.004), PAPER_RATES, tie_margin=0.0).chosen == (1, 3)
    # The default margin is the paper's 0.5 %.
    assert build_table(tie_step_times(0.004), PAPER_RATES).chosen == (1, 1)
    assert build_table(tie_step_times(0.006), PAPER_RATES).chosen == (1, 3)


def test_exact_ties_go_to_the_shorter_length():
    # tau(1) / tau(0) = 1.5, so k=1 at 1.5x the step time is an exact tie.
    result = build_table(StepTimes({(1, 0): 4.0, (1, 1): 6.0}), [0.5], tie_margin=0.0)
    assert result.chosen == (0,)


# ---------------------------------------------------------------------------- build options


def test_lengths_default_to_profiled_lengths_the_rates_cover():
    assert build_table(linear_step_times(), PAPER_RATES).lengths == (0, 1, 2, 3)
    assert build_table(linear_step_times(), PAPER_RATES[:2]).lengths == (0, 1, 2)
    assert build_table(linear_step_times(), ()).chosen == (0,) * 128


def test_explicit_lengths_and_max_batch_size():
    result = build_table(linear_step_times(), PAPER_RATES, lengths=[3, 0, 1, 1], max_batch_size=300)
    assert result.lengths == (0, 1, 3)
    assert set(result.chosen) <= {0, 1, 3}
    assert result.batch_sizes == tuple(range(1, 301))
    assert result.goodput.shape == (300, 3)
    assert result.interpolated[127] is False and all(result.interpolated[128:])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": [1, 5]}, r"^lengths\[1\]: 5 is not a profiled draft length \[0, 1, 2, 3\]"),
        ({"lengths": []}, r"^lengths: \[\] is empty"),
        ({"rates": (0.7,), "lengths": [0, 2]}, r"^lengths\[1\]: 2 is above the number of"),
        ({"rates": (0.5, 0.7)}, r"^rates\[1\]: 0\.7 is above rates\[0\]"),
        ({"rates": (0.5, 1.5)}, r"^rates\[1\]: 1\.5 is not a number in \[0, 1\]"),
        ({"tie_margin": -0.01}, r"^tie_margin: -0\.01 is not a non-negative number"),
        ({"tie_margin": math.nan}, r"^tie_margin: nan is not a non-negative number"),
        ({"max_batch_size": 0}, r"^max_batch_size: 0 is not an integer >= 1"),
    ],
)
def test_bad_build_arguments(kwargs, message):
    kwargs = {"rates": PAPER_RATES, **kwargs}
    rates = kwargs.pop("rates")
    with pytest.raises(ContractError, match=message):
        build_table(linear_step_times(), rates, **kwargs)


def test_rates_that_cover_no_profiled_length():
    with pytest.raises(ContractError, match=r"^rates: \[\] cover none of the profiled lengths"):
        build_table(StepTimes({(1, 1): 5.0, (1, 3): 6.0}), [])


def test_goodput_matrix_matches_goodput_function_on_profiled_cells():
    step_times = linear_step_times()
    result = build_table(step_times, PAPER_RATES)
    for b in step_times.batch_sizes:
        for j, k in enumerate(result.lengths):
            assert result.goodput[b - 1, j] == goodput(b, step_times.step_ms(b, k), PAPER_RATES, k)
    matrix = fixed_length_goodput(step_times, PAPER_RATES, [3, 100], [0, 3])
    assert matrix.shape == (2, 2)
    assert matrix[1, 1] == pytest.approx(goodput(100, step_times.step_ms(100, 3), PAPER_RATES, 3))


def test_to_document_round_trips_through_json(tmp_path):
    result = build_table(linear_step_times(), PAPER_RATES)
    doc = result.to_document({"profile": "p.json", "acceptance": "a.json"}, meta={"run": "r1"})
    assert isinstance(doc, TableDocument)
    assert doc.num_speculative_tokens == max(result.table.max_k, 1)
    assert doc.goodput.chosen == result.chosen
    assert doc.goodput.rates == tuple(PAPER_RATES)
    save_json(tmp_path / "t.json", doc)
    again = load_json(tmp_path / "t.json", "table")
    assert again == doc
    assert json.loads((tmp_path / "t.json").read_text())["num_speculative_tokens_per_batch_size"] \
        == result.table.to_vllm()
    all_zero = build_table(linear_step_times(extra=5.0), PAPER_RATES).to_document({})
    assert all_zero.table.max_k == 0 and all_zero.num_speculative_tokens == 1


# ---------------------------------------------------------------------------- properties


@st.composite
def build_inputs(draw):
    batch_sizes = draw(st.lists(st.integers(1, 512), min_size=1, max_size=10, unique=True))
    max_k = draw(st.integers(0, 4))
    cells = {
        (b, k): draw(st.floats(0.5, 100.0)) for b in batch_sizes for k in range(max_k + 1)
    }
    rates = sorted(
        draw(st.lists(st.floats(0.0, 1.0), min_size=0, max_size=max_k + 1)), reverse=True
    )
    tie_margin = draw(st.one_of(st.just(0.0), st.just(0.005), st.floats(0.0, 0.1)))
    max_batch_size = draw(st.one_of(st.none(), st.integers(1, 600)))
    return StepTimes(cells), tuple(rates), tie_margin, max_batch_size


@settings(max_examples=200, deadline=None)
@given(build_inputs())
def test_every_built_table_is_valid_for_vllm_and_matches_its_lookup(inputs):
    step_times, rates, tie_margin, max_batch_size = inputs
    result = build_table(step_times, rates, max_batch_size=max_batch_size, tie_margin=tie_margin)
    n = max_batch_size or step_times.max_batch_size
    table = result.table
    assert len(result.chosen) == n and result.batch_sizes == tuple(range(1, n + 1))

    schedule = VLLM.validate_and_normalize_dynamic_sd_schedule(table.to_vllm())
    assert schedule == [tuple(r) for r in table.ranges]
    dense = VLLM.build_dynamic_sd_schedule_lookup(table.to_vllm(), n, table.max_k or 1)
    assert dense[1:] == list(result.chosen)
    assert table.lookup(n) == list(result.chosen)
    assert table.max_batch_size == n

    assert result.lengths == tuple(k for k in step_times.lengths if k <= len(rates))
    assert set(result.chosen) <= set(result.lengths)
    # The hysteresis never gives up more than the tie margin at any batch size.
    chosen_g, best_g = result.chosen_goodput, result.best_goodput
    assert np.all(chosen_g * (1 + tie_margin) >= best_g)
    if tie_margin == 0.0:
        assert np.all(chosen_g == best_g)
    report = table_loss(table, step_times, rates, result.batch_sizes)
    assert report.worst_loss <= tie_margin / (1 + tie_margin) + 1e-12


def test_numpy_inputs_and_a_tables_lengths_are_accepted():
    # The controller holds live rates in numpy and restricts to the starting table's lengths.
    step_times = linear_step_times()
    by_list = build_table(step_times, list(PAPER_RATES), lengths=[0, 1, 3])
    by_numpy = build_table(step_times, np.array(PAPER_RATES), lengths=DOCS_TABLE.lengths)
    assert by_numpy.chosen == by_list.chosen and by_numpy.rates == PAPER_RATES
    report = table_loss(DOCS_TABLE, step_times, np.array(PAPER_RATES), np.arange(1, 129))
    assert [r.batch_size for r in report.rows] == list(range(1, 129))
    with pytest.raises(ContractError, match=r"^rates: .* is not a list"):
        build_table(step_times, np.array([PAPER_RATES]))


# ---------------------------------------------------------------------------- float safety


def test_implausibly_small_or_large_step_times_are_refused_by_name():
    for value, word in ((1e-320, "small"), (1e300, "large")):
        with pytest.raises(ContractError) as err:
            StepTimes({(4, 0): 5.0, (4, 1): value})
        assert str(err.value).startswith(
            f"step_times[(4, 1)]: {value!r} is implausibly {word} for a step time")
        with pytest.raises(ContractError) as err:
            goodput(4, value, PAPER_RATES, 1)
        assert str(err.value).startswith(f"step_ms: {value!r} is implausibly {word}")


EXTREME_SHAPES = {
    "all at the minimum": lambda i, k, lo, hi: lo,
    "all at the maximum": lambda i, k, lo, hi: hi,
    "steepest rise into extrapolation": lambda i, k, lo, hi: lo if i < 2 else hi,
    "rise then fall (held flat)": lambda i, k, lo, hi: (lo, hi, lo)[i],
    "min and max across lengths": lambda i, k, lo, hi: lo if k % 2 else hi,
}


@pytest.mark.parametrize("name", list(EXTREME_SHAPES))
def test_valid_profiles_at_the_extremes_build_without_float_warnings(name):
    from tabletune.core.builder import MAX_BATCH_SIZE
    from tabletune.core.errors import MAX_STEP_MS, MIN_STEP_MS

    shape = EXTREME_SHAPES[name]
    step_times = StepTimes({(b, k): shape(i, k, MIN_STEP_MS, MAX_STEP_MS)
                            for i, b in enumerate((1, 2, 64)) for k in range(4)})
    rates = (1.0, 1.0, 1.0)  # the largest goodputs
    with warnings.catch_warnings(), np.errstate(over="raise", divide="raise", invalid="raise"):
        warnings.simplefilter("error")
        result = build_table(step_times, rates, max_batch_size=2048)
        loss = table_loss(result.table, step_times, rates, result.batch_sizes)
        far = fixed_length_goodput(step_times, (0.0, 0.0, 0.0), [1, MAX_BATCH_SIZE], [0, 3])
        far_ms = step_times.grid([MAX_BATCH_SIZE])
    assert np.isfinite(result.goodput).all() and (result.goodput > 0).all(), name
    assert np.isfinite(far).all() and (far > 0).all(), name
    assert np.isfinite(far_ms).all(), name
    assert math.isfinite(loss.worst_loss), name
    json.dumps(result.to_document({}).to_dict(), allow_nan=False)  # what save_json needs


# ---------------------------------------------------------------------------- noise-aware edges


def _two_lengths(t1_b2: float, unc: float):
    """B=1 picks k=1; at B=2 k=3 is ~3 % better. ``unc``: every cell's relative uncertainty."""
    cells = {(1, 1): 5.0, (1, 3): 8.0, (2, 1): 5.0, (2, 3): t1_b2}
    return StepTimes(cells, uncertainty={key: unc for key in cells})


def test_an_edge_moves_only_when_the_gain_beats_the_combined_noise():
    # k=3 at B=2 with T=6.0: goodput ratio vs k=1 is (2.5/6.0)/(1.7/5.0) - 1 = 22.5 %.
    quiet = build_table(_two_lengths(6.0, 0.0), PAPER_RATES)
    assert quiet.chosen[1] == 3
    (edge,) = quiet.edges
    assert edge["batch_size"] == 2 and (edge["from_k"], edge["to_k"]) == (1, 3)
    assert edge["gain"] == pytest.approx((2.5 / 6.0) / (1.7 / 5.0) - 1)
    assert edge["uncertainty"] == 0.0
    # Cells each uncertain by 10 %: combined 14.1 %, still below the 22.5 % gain.
    assert build_table(_two_lengths(6.0, 0.10), PAPER_RATES).chosen[1] == 3
    # Each uncertain by 20 %: combined 28 % exceeds the gain, so B=2 keeps B=1's length.
    held = build_table(_two_lengths(6.0, 0.20), PAPER_RATES)
    assert held.chosen[1] == 1 and held.edges == () and held.held_by_noise == (2,)
    doc = held.to_document({}).to_dict()
    assert doc["goodput"]["held_by_noise_batch_sizes"] == [2]


def _crossing_k2_k3(unc: float):
    """k = 3 best at B = 1, k = 2 ahead from B = 7 by the point estimates (the two lengths'
    steps interpolated between B = 1 and 16), by more each batch size on. ``unc``: every cell's
    relative uncertainty."""
    cells = {(1, 2): 5.0, (1, 3): 5.2, (16, 2): 6.0, (16, 3): 8.0}
    return StepTimes(cells, uncertainty={key: unc for key in cells})


def test_the_noise_decides_whether_the_table_moves_and_the_point_estimates_where():
    exact = build_table(_crossing_k2_k3(0.0), PAPER_RATES, lengths=[2, 3])
    crossing = exact.chosen.index(2) + 1
    (edge,) = exact.edges
    assert edge["batch_size"] == edge["cleared_at"] == crossing
    # Cells uncertain by 5 % each (7.1 % combined): k = 2's lead passes that a few batch sizes
    # later; the move is decided there and the edge still sits at the crossing.
    noisy = build_table(_crossing_k2_k3(0.05), PAPER_RATES, lengths=[2, 3])
    (edge,) = noisy.edges
    assert noisy.chosen == exact.chosen
    assert edge["batch_size"] == crossing < edge["cleared_at"]
    assert edge["gain"] > edge["uncertainty"] == pytest.approx(0.05 * math.sqrt(2))
    g = noisy.goodput
    at = edge["cleared_at"] - 1
    assert g[at, 0] / g[at, 1] - 1 == pytest.approx(edge["gain"])
    assert g[at - 1, 0] / g[at - 1, 1] - 1 <= edge["uncertainty"]
    # The batch sizes in between were not held: the table moved there.
    assert noisy.held_by_noise == ()
    doc = noisy.to_document({}).to_dict()["goodput"]
    assert doc["edges"][0]["cleared_at"] == edge["cleared_at"]


def test_a_lead_that_never_clears_the_noise_moves_nothing():
    held = build_table(_crossing_k2_k3(0.5), PAPER_RATES, lengths=[2, 3])
    assert set(held.chosen) == {3} and held.edges == ()
    assert held.held_by_noise[0] == build_table(_crossing_k2_k3(0.0), PAPER_RATES,
                                                lengths=[2, 3]).chosen.index(2) + 1


def test_identical_repeats_give_todays_rule_exactly():
    # A profile whose repeats agree exactly has zero uncertainty: the same table and goodput as
    # the bare step times, for a grid with many near-ties.
    cells = [ProfileCell(b, k, 4.0 + 0.2 * b + 0.9 * k + 0.01 * (b % 3), (4.0 + 0.2 * b + 0.9 * k
                         + 0.01 * (b % 3),) * 3) for b in (1, 2, 4, 8, 16) for k in range(4)]
    profile = Profile({"x": 1}, 3, tuple(cells))
    bare = {(c.batch_size, c.k): c.step_ms for c in cells}
    a = build_table(StepTimes(profile), PAPER_RATES)
    b = build_table(StepTimes(bare), PAPER_RATES)
    assert a.chosen == b.chosen and np.array_equal(a.goodput, b.goodput)
    assert a.held_by_noise == ()


def test_profile_cell_uncertainty_is_the_relative_standard_error():
    cell = ProfileCell(1, 0, 10.0, (9.0, 10.0, 11.0))
    assert cell.uncertainty == pytest.approx(1.0 / math.sqrt(3) / 10.0)
    assert ProfileCell(1, 0, 10.0, (10.0,)).uncertainty == 0.0
    assert ProfileCell(1, 0, 10.0, (10.0, 10.0)).uncertainty == 0.0


def test_the_document_records_the_build_settings_and_they_read_back():
    from tabletune.core import recorded_build_settings

    st_ = StepTimes({(1, 0): 4.0, (1, 1): 5.0, (1, 2): 6.0})
    doc = build_table(st_, PAPER_RATES, lengths=(0, 2), tie_margin=0.02).to_document({})
    again = TableDocument.from_dict(json.loads(json.dumps(doc.to_dict())))
    assert recorded_build_settings(again) == {"tie_margin": 0.02, "allowed_lengths": (0, 2)}
    unrestricted = build_table(st_, PAPER_RATES).to_document({})
    assert recorded_build_settings(unrestricted) == {"tie_margin": 0.005,
                                                     "allowed_lengths": None}
    # A document from before these were recorded gives the defaults.
    old = TableDocument(DraftTable.from_ranges([[1, 4, 1]]), 1, {})
    assert recorded_build_settings(old) == {"tie_margin": 0.005, "allowed_lengths": None}
    with pytest.raises(ContractError, match=r"table.goodput.tie_margin: -1 is not a "):
        GoodputBlock.from_dict({"tie_margin": -1})
