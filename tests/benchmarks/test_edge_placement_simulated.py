"""benchmarks/gpu/edge_placement_simulated.py: noisy redraws of a tune's cells, both placements."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmark_scripts import load_script

simulated = load_script("edge_placement_simulated.py")

RATES = (0.75, 0.55, 0.40)


def _profile(u):
    # k = 3 best at small B, k = 2 from about B = 48 on (its step grows more slowly).
    cells = []
    for b, t2, t3 in ((1, 5.0, 5.4), (32, 6.0, 6.5), (64, 7.0, 8.4), (128, 9.0, 12.0)):
        cells += [SimpleNamespace(batch_size=b, k=2, step_ms=t2, uncertainty=u),
                  SimpleNamespace(batch_size=b, k=3, step_ms=t3, uncertainty=u)]
    return SimpleNamespace(cells=cells)


def test_without_noise_both_placements_give_the_truths_table():
    drawn = simulated.draws(_profile(0.0), RATES, 3, 1.0, True, np.random.default_rng(1))
    for _, clears, crossing in drawn:
        assert clears == crossing
        assert clears[0] == 3 and clears[-1] == 2


def test_stated_noise_holds_the_edge_back_and_the_crossing_puts_it_back():
    # A generator that draws only zeros leaves the true cells; their stated 5 % holds the
    # builder's edge back, and the crossing puts it where the noiseless truth has it.
    zeros = SimpleNamespace(standard_normal=lambda: 0.0)
    profile = _profile(0.05)
    (_, clears, crossing), = simulated.draws(profile, RATES, 1, 1.0, True, zeros)
    first_k2 = lambda chosen: chosen.index(2) + 1  # noqa: E731
    assert first_k2(crossing) < first_k2(clears)
    (_, exact, _), = simulated.draws(_profile(0.0), RATES, 1, 1.0, True, zeros)
    assert first_k2(crossing) == first_k2(exact)


def test_the_mean_loss_averages_over_batch_sizes():
    goodput = np.array([[90.0, 100.0], [100.0, 100.0]])
    assert simulated.mean_loss(goodput, (2, 3), (2, 2)) == pytest.approx(0.05)


@pytest.mark.parametrize("argv", [[], ["5"], ["x", "dir"], ["1", "dir"]])
def test_bad_arguments_print_the_usage_and_exit_2(argv, capsys):
    assert simulated.main(argv) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith(
        "usage: python benchmarks/gpu/edge_placement_simulated.py DRAWS TUNE_DIR")


def test_a_tune_without_its_files_is_named_with_exit_2(tmp_path, capsys):
    assert simulated.main(["3", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'profile.json'}: not found (a TUNE_DIR holds profile.json and "
        "acceptance.json)\n")
