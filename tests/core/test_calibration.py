"""Serving calibration of a reject-all profile (core.calibration) and where it is measured."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tabletune.core.calibration import (calibrate_profile, off_graphs, serving_factors,
                                        uncalibrated)
from tabletune.core.contracts import Profile, ProfileCell
from tabletune.core.errors import ContractError
from tabletune.core.step_times import StepTimes
from tabletune.tuner.serving import serving_batch_sizes


def _profile(bs=(1, 2, 4, 8, 16), ks=(0, 1, 2)) -> Profile:
    cells = [ProfileCell(b, k, 10.0 + b + k, (9.5 + b + k, 10.0 + b + k, 10.5 + b + k))
             for b in bs for k in ks]
    return Profile(fingerprint={"engine": "test"}, max_k=max(ks), cells=tuple(cells))


def test_factors_are_measured_where_measured_and_interpolated_in_log_b_between():
    p = _profile()
    measured = {(1, k): (p.step_ms(1, k) * 1.05, 0.01) for k in p.lengths}
    measured |= {(16, k): (p.step_ms(16, k) * (1.25 + 0.05 * k), 0.02) for k in p.lengths}
    f = serving_factors(p, measured)
    assert f[(1, 0)] == pytest.approx((1.05, 0.01))
    assert f[(16, 2)] == pytest.approx((1.35, 0.02))
    # B = 4 is halfway between 1 and 16 in log B.
    assert f[(4, 1)][0] == pytest.approx((1.05 + 1.30) / 2)
    assert f[(4, 1)][1] == 0.02  # as uncertain as the less certain end


def test_beyond_the_measured_batch_sizes_the_nearest_factor_holds():
    p = _profile()
    f = serving_factors(p, {(2, k): (p.step_ms(2, k) * 1.1, 0.0) for k in p.lengths}
                        | {(4, k): (p.step_ms(4, k) * 1.2, 0.0) for k in p.lengths})
    assert f[(1, 1)][0] == pytest.approx(1.1)
    assert f[(16, 1)][0] == pytest.approx(1.2)


def test_a_calibrated_profile_scales_step_times_and_repeats_and_keeps_the_reject_all_value():
    p = _profile()
    measured = {(b, k): (p.step_ms(b, k) * (1.0 + 0.1 * k), 0.03) for b in (1, 16)
                for k in p.lengths}
    c = calibrate_profile(p, measured, meta={"plan": "test"})
    cell = c.cell(8, 2)
    assert cell.reject_all_ms == p.step_ms(8, 2)
    assert cell.serving_factor == pytest.approx(1.2)
    assert cell.step_ms == pytest.approx(p.step_ms(8, 2) * 1.2)
    assert cell.samples_ms == pytest.approx(tuple(s * 1.2 for s in p.cell(8, 2).samples_ms))
    # The factor's uncertainty adds to the repeats' (relative) one.
    assert cell.uncertainty == pytest.approx((p.cell(8, 2).uncertainty ** 2 + 0.03 ** 2) ** 0.5)
    assert c.meta["serving_calibration"]["plan"] == "test"
    assert len(c.meta["serving_calibration"]["factors"]) == len(p.cells)
    # Round trip through the document form; the builder sees serving step times.
    again = Profile.from_dict(c.to_dict())
    assert again.cell(8, 2) == cell
    assert StepTimes(again).grid([8], [2])[0, 0] == pytest.approx(cell.step_ms)
    with pytest.raises(ContractError, match="calibrated already"):
        calibrate_profile(c, measured)


def test_uncalibrated_gives_back_the_reject_all_profile_a_calibration_was_made_from():
    p = _profile()
    p = Profile(fingerprint=p.fingerprint, max_k=p.max_k, meta={"steps": {"total": 9}},
                cells=tuple(replace(c, interval_ms=(c.step_ms - 0.2, c.step_ms + 0.2))
                            for c in p.cells))
    measured = {(b, k): (p.step_ms(b, k) * (1.0 + 0.1 * k), 0.03) for b in (1, 16)
                for k in p.lengths}
    back = uncalibrated(calibrate_profile(p, measured, meta={"plan": "test"}))
    assert back.meta == p.meta  # the calibration's record is gone, the rest kept
    for c in back.cells:
        was = p.cell(c.batch_size, c.k)
        assert c.step_ms == pytest.approx(was.step_ms)
        assert c.samples_ms == pytest.approx(was.samples_ms)
        assert c.interval_ms == was.interval_ms  # calibration never scaled it
        assert c.serving_factor is None and c.reject_all_ms is None
    # It can be calibrated again, and an uncalibrated profile comes back as it is.
    calibrate_profile(back, measured)
    assert uncalibrated(p) == p


def test_calibration_input_is_checked_and_named():
    p = _profile()
    with pytest.raises(ContractError, match=r"serving\[B=3, k=0\]"):
        serving_factors(p, {(3, 0): (10.0, 0.0)})
    with pytest.raises(ContractError, match=r"serving\[k=2\]"):
        serving_factors(p, {(1, 0): (10.0, 0.0), (1, 1): (10.0, 0.0)})
    with pytest.raises(ContractError, match=r"serving\[B=1, k=0\].step_ms"):
        serving_factors(p, {(1, k): (float("nan"), 0.0) for k in p.lengths})


def test_serving_batch_sizes_spread_in_log_b_with_both_ends():
    grid = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
    assert serving_batch_sizes(grid, 4) == (1, 8, 32, 256) or serving_batch_sizes(grid, 4)[0] == 1
    picked = serving_batch_sizes(grid, 4)
    assert picked[0] == 1 and picked[-1] == 256 and len(picked) == 4
    assert serving_batch_sizes((1, 2, 4), 4) == (1, 2, 4)
    assert serving_batch_sizes((1, 2, 4, 8, 16), 3) == (1, 4, 16)


def _h200_like(measured_bs=(1, 16, 64, 128, 256)):
    """k = 3 at B = 256 passes 1 024 tokens with any prefill (the H200's graph line), and its
    serving steps there ran 2x; everywhere else 1.2x."""
    p = _profile(bs=(1, 16, 64, 128, 192, 256), ks=(0, 1, 2, 3))
    measured = {}
    for b in measured_bs:
        for k in p.lengths:
            factor = 2.0 if b * (1 + k) + 30 > 1024 else 1.2
            measured[(b, k)] = (p.step_ms(b, k) * factor, 0.02)
    return p, measured


def test_a_factor_never_comes_from_across_the_graph_line():
    p, measured = _h200_like()
    smeared = serving_factors(p, measured)
    assert 1.2 < smeared[(192, 3)][0] < 2.0  # interpolated across the jump
    untimed: set = set()
    f = serving_factors(p, measured, graph_tokens=1024, prefill_tokens=30, untimed=untimed)
    assert f[(192, 3)] == pytest.approx((1.2, 0.02))   # 768 + 30 tokens: on the graphs
    assert f[(256, 3)] == pytest.approx((2.0, 0.02))   # measured beyond the line
    assert f[(256, 2)] == pytest.approx((1.2, 0.02))
    assert untimed == set()


def test_a_cell_beyond_the_line_that_nothing_timed_there_is_marked_and_uncertain():
    p, measured = _h200_like(measured_bs=(1, 16, 64, 128))
    calibrated = calibrate_profile(p, measured, graph_tokens=1024, prefill_tokens=30)
    cell = next(c for c in calibrated.cells if (c.batch_size, c.k) == (256, 3))
    assert cell.serving_factor == pytest.approx(1.2)  # the nearest, held
    assert cell.serving_uncertainty == 0.5
    graphs = calibrated.meta["serving_calibration"]["graphs"]
    assert graphs["untimed"] == [[256, 3]] and graphs["off_graphs"] == [[256, 3]]
    assert graphs["graph_tokens"] == 1024


def test_without_graphs_nothing_is_off_them():
    p, measured = _h200_like()
    calibrated = calibrate_profile(p, measured)
    assert calibrated.meta["serving_calibration"]["graphs"]["off_graphs"] == []


def test_contested_batch_sizes_send_their_bracketing_serving_sizes_back_with_the_two_lengths():
    from tabletune.core.calibration import contested_serving

    # Goodput for B = 1..256 at k = 0..3: k = 3 best up to B = 150, k = 2 beyond by 10 %;
    # the table kept k = 3 up to B = 200 (held within the noise).
    lengths = [0, 1, 2, 3]
    g = np.ones((256, 4))
    g[:, 3] = 2.0
    g[150:, 2] = 2.2
    chosen = [3] * 200 + [2] * 56
    grid = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256]
    got = contested_serving(g, lengths, chosen, [1, 16, 64, 128, 256], grid)
    # B = 151..200 lose 9 %: their factors come from 128 and 256; 192 (profiled, inside the
    # stretch, not a serving size) is added as one.
    assert got == {128: (2, 3), 192: (2, 3), 256: (2, 3)}
    # Within the target, or a table at the point estimates: nothing contested, but the edge
    # at B = 151 lies between the serving sizes 128 and 256, so 192 is timed at its lengths.
    assert contested_serving(g, lengths, chosen, [1, 16, 64, 128, 256], grid, loss=0.1) == {
        192: (2, 3)}
    best = [3] * 150 + [2] * 106
    assert contested_serving(g, lengths, best, [1, 16, 64, 128, 256], grid) == {192: (2, 3)}
    # A contested batch size that is a serving size is re-measured itself only.
    assert contested_serving(g, lengths, [3] * 151 + [2] * 105, [1, 16, 64, 151, 256],
                             [1, 151, 256]) == {151: (2, 3)}


def test_a_contested_batch_size_also_retimes_every_length_near_the_best():
    from tabletune.core.calibration import contested_serving

    # As above, and k = 1 within 10 % of k = 2 beyond B = 150: the pass times it as well, or
    # the final build could move there on the first loops' cells alone (the H200's cold tune).
    lengths = [0, 1, 2, 3]
    g = np.ones((256, 4))
    g[:, 3] = 2.0
    g[150:, 2] = 2.2
    g[150:, 1] = 2.0
    chosen = [3] * 200 + [2] * 56
    grid = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256]
    sizes = [1, 16, 64, 128, 256]
    assert contested_serving(g, lengths, chosen, sizes, grid) == {
        128: (1, 2, 3), 192: (1, 2, 3), 256: (1, 2, 3)}
    # A band of 5 % leaves k = 1 (9 % below k = 2) out; k = 3 stays as the table's length.
    assert contested_serving(g, lengths, chosen, sizes, grid, band=0.05) == {
        128: (2, 3), 192: (2, 3), 256: (2, 3)}


def test_an_edge_between_two_serving_sizes_times_the_profiled_size_nearest_it():
    from tabletune.core.calibration import contested_serving

    # k = 3 best up to B = 180, k = 2 beyond; the table is the point estimates' (nothing
    # contested), but its edge lies between the serving sizes 128 and 256, placed there by
    # interpolated factors: 192, profiled and nearest the edge, is timed at k = 2 and 3.
    lengths = [0, 1, 2, 3]
    g = np.ones((256, 4))
    g[:, 3] = 2.0
    g[180:, 2] = 2.5
    chosen = [3] * 180 + [2] * 76
    grid = [1, 2, 4, 8, 16, 32, 64, 96, 128, 160, 192, 256]
    sizes = [1, 16, 64, 128, 256]
    assert contested_serving(g, lengths, chosen, sizes, grid) == {192: (2, 3)}
    # The nearest of two inner sizes: an edge at B = 150 takes 160.
    g[150:, 2] = 2.5
    assert contested_serving(g, lengths, [3] * 150 + [2] * 106, sizes, grid) == {160: (2, 3)}
    # An edge at a serving size, or with no profiled size between its serving sizes, is
    # measured as well as it can be: nothing added.
    g[128:, 2] = 2.5
    assert contested_serving(g, lengths, [3] * 128 + [2] * 128, [1, 16, 64, 129, 256],
                             grid) == {}
    assert contested_serving(g, lengths, [3] * 128 + [2] * 128, sizes, [1, 16, 64, 128, 256]) \
        == {}


def test_the_last_profiled_size_before_a_length_s_graph_line_is_timed():
    from tabletune.core.calibration import contested_serving

    # The H200's deployment: 1 024 captured tokens, 29-token prompts. k = 3 leaves the graphs
    # past B = 248, so 192 (profiled, not a serving size) carries k = 3's factor up to the
    # line: it is timed at k = 3 and the lengths near the best there (k = 2). k = 1 and 2 stay
    # on the graphs to B = 256. The table is k = 3 throughout and the best length: nothing
    # contested, no edge.
    lengths = [0, 1, 2, 3]
    g = np.ones((256, 4))
    g[:, 3] = 2.0
    g[:, 2] = 1.9
    chosen = [3] * 256
    grid = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256]
    sizes = [1, 16, 64, 128, 256]
    assert contested_serving(g, lengths, chosen, sizes, grid) == {}
    assert contested_serving(g, lengths, chosen, sizes, grid, graph_tokens=1024,
                             prefill_tokens=29) == {192: (2, 3)}
    # Already a serving size, or no captured graphs: nothing added.
    assert contested_serving(g, lengths, chosen, sizes + [192], sorted(grid), graph_tokens=1024,
                             prefill_tokens=29) == {}
    assert contested_serving(g, lengths, chosen, sizes, grid, graph_tokens=None) == {}


def test_the_line_for_a_step_crowded_with_prefills_falls_below_the_one_prefill_line():
    from tabletune.core.calibration import crowded_line_sizes, graph_line_sizes
    from tabletune.core.workload import prefill_mix

    grid = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
    rates = (0.749, 0.549, 0.408)  # h200-s13's acceptance, 256-token requests

    def mean_prefills(b, k):
        return prefill_mix(b, 256, 1 + sum(rates[:k]))[1]

    # k = 3 at B = 248 fits with one 29.8-token prompt but carries ~2.8 prefills a step (the
    # tunes measured 2.8-3.3): with the mean number it fits up to 235.
    assert graph_line_sizes(grid, (0, 1, 2, 3), 1024, 29.8) == {3: 248}
    assert crowded_line_sizes(grid, (0, 1, 2, 3), 1024, 29.8, mean_prefills) == {3: 235}
    assert 2.6 < mean_prefills(235, 3) < 2.8
    # One prefill a step: the one-prefill line; already profiled or beyond the grid: nothing.
    assert crowded_line_sizes(grid, (3,), 1024, 29.8, lambda b, k: 1.0) == {3: 248}
    assert crowded_line_sizes(grid + (235,), (3,), 1024, 29.8, mean_prefills) == {}
    assert crowded_line_sizes(grid, (0, 1, 2), 1024, 29.8, mean_prefills) == {}
    assert crowded_line_sizes(grid, (3,), None, 29.8, mean_prefills) == {}


def test_the_knee_is_where_a_tenth_of_the_steps_would_leave_the_graphs():
    from tabletune.core.calibration import _share_past, crowded_line_sizes, knee_line_sizes
    from tabletune.core.workload import prefill_mix

    grid = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
    rates = (0.749, 0.549, 0.408)  # h200-s15's acceptance, 256-token requests, 29.8-token prompts

    def arrivals(b, k):
        q, n = prefill_mix(b, 256, 1 + sum(rates[:k]))
        return q * n

    def mean_prefills(b, k):
        return prefill_mix(b, 256, 1 + sum(rates[:k]))[1]

    knee = knee_line_sizes(grid, (0, 1, 2, 3), 1024, 29.8, arrivals)
    # Below the crowded line (235), where a step with the mean number of prefills fits.
    assert knee == {3: 226}
    assert knee[3] < crowded_line_sizes(grid, (3,), 1024, 29.8, mean_prefills)[3]
    # At the knee at most a tenth of the steps passes 1 024 tokens; one size up, more.
    assert _share_past(1024 - 4 * 226, 29.8, arrivals(226, 3)) <= 0.1
    assert _share_past(1024 - 4 * 227, 29.8, arrivals(227, 3)) > 0.1
    # A stricter share moves it down; no arrivals at all puts it at the bare line G / 4.
    assert knee_line_sizes(grid, (3,), 1024, 29.8, arrivals, off_share=0.02)[3] < 226
    assert knee_line_sizes(grid, (3,), 1024, 29.8, lambda b, k: 0.0) == {}  # 256 is in the grid
    assert knee_line_sizes(grid, (3,), 1000, 29.8, lambda b, k: 0.0) == {3: 250}
    # Already profiled, no graphs, or a share out of (0, 1): nothing.
    assert knee_line_sizes(grid + (226,), (3,), 1024, 29.8, arrivals) == {}
    assert knee_line_sizes(grid, (3,), None, 29.8, arrivals) == {}
    assert knee_line_sizes(grid, (3,), 1024, 29.8, arrivals, off_share=1.0) == {}
    # Poisson tail: P(N > 1) for mean 1 is 1 - 2/e; a negative room is always past.
    assert abs(_share_past(59, 29.8, 1.0) - (1 - 2 / 2.718281828459045)) < 1e-9
    assert _share_past(-1, 29.8, 0.0) == 1.0 and _share_past(10, 29.8, 0.0) == 0.0


def test_a_size_the_tune_names_is_timed_at_the_lengths_in_question_there():
    from tabletune.core.calibration import contested_serving

    g = np.ones((256, 4))
    g[:, 3] = 2.0
    g[:, 2] = 1.9
    grid = [1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 235, 256]
    sizes = [1, 16, 64, 128, 256]
    assert contested_serving(g, [0, 1, 2, 3], [3] * 256, sizes, grid) == {}
    assert contested_serving(g, [0, 1, 2, 3], [3] * 256, sizes, grid,
                             lines=[(3, 235)]) == {235: (2, 3)}
    # Not profiled, or a serving size: nothing added.
    assert contested_serving(g, [0, 1, 2, 3], [3] * 256, sizes, grid,
                             lines=[(3, 240), (2, 256)]) == {}
    # The line's own length is timed there even where the band leaves it out (h200-s14's
    # cold tune: k = 3 at its crowded line 235 was not in question when the round began).
    g[:, 3] = 1.0
    assert contested_serving(g, [0, 1, 2, 3], [2] * 256, sizes, grid) == {}
    assert contested_serving(g, [0, 1, 2, 3], [2] * 256, sizes, grid,
                             lines=[(3, 235)]) == {235: (2, 3)}


def test_the_last_batch_size_on_the_graphs_is_added_where_a_length_s_line_falls_between_two():
    from tabletune.core.calibration import graph_line_sizes

    grid = (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256)
    # The H200 of benchmarks/results/h200-s12: k = 3 with a 29-token prefill fits up to 248.
    assert graph_line_sizes(grid, (0, 1, 2, 3), 1024, 28.6) == {3: 248}
    assert not off_graphs(248, 3, 1024, 28.6) and off_graphs(249, 3, 1024, 28.6)
    # Profiled already, or the line beyond the grid's last size: nothing to add.
    assert graph_line_sizes(grid + (248,), (0, 1, 2, 3), 1024, 28.6) == {}
    assert graph_line_sizes(grid, (0, 1, 2), 1024, 28.6) == {}
    # A line below the grid's first size has no profiled size on the graphs' side.
    assert graph_line_sizes((64, 128), (3,), 100, 0.0) == {}
    # A longer prefill moves the line down; every length whose line falls inside gets its own.
    assert graph_line_sizes(grid, (0, 1, 2, 3), 1024, 100.0) == {3: 231}
    assert graph_line_sizes((1, 8, 64), (0, 1, 2, 3), 64, 3.0) == {0: 61, 1: 30, 2: 20, 3: 15}
    assert graph_line_sizes(grid, (0, 1, 2, 3), None, 28.6) == {}
