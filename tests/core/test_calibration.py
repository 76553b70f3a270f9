"""Serving calibration of a reject-all profile (core.calibration) and where it is measured."""

from __future__ import annotations

import pytest

from tabletune.core.calibration import calibrate_profile, serving_factors
from tabletune.core.builder import StepTimes
from tabletune.core.contracts import Profile, ProfileCell
from tabletune.core.errors import ContractError
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
