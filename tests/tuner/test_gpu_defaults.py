"""What `tabletune tune --model M --drafter D --method eagle3` measures on a GPU with no other
option: the settings of the H100 tunes whose tables held (docs/tuner.md)."""

from __future__ import annotations

import argparse

from tabletune.commands.measure import _grid, _serving_sizes, add_measure_parsers
from tabletune.engine.spec import EngineSpec
from tabletune.engine_args import apply_serve_args
from tabletune.tuner.grid import GPU_GRID, gpu_grid
from tabletune.tuner.tune import tune_plan


def _tune_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_measure_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tune", *argv])
    apply_serve_args(args)
    return args


def test_a_gpu_tune_profiles_the_validated_grid_and_serves_at_its_five_sizes():
    args = _tune_args("--model", "/m", "--drafter", "/d", "--method", "eagle3")
    grid = _grid(args)
    assert grid == GPU_GRID == (1, 2, 4, 8, 16, 32, 64, 80, 96, 128, 160, 192, 224, 256)
    assert _serving_sizes(args, grid) == (1, 16, 64, 128, 256)
    plan = tune_plan(EngineSpec(model="/m", drafter="/d", method="eagle3", device="cuda"), grid,
                     serving_batch_sizes=_serving_sizes(args, grid))
    assert (plan.serving.warm_up_s, plan.serving.window_s, plan.serving.resolve_s) == (
        1.0, 2.0, 45.0)
    assert (plan.max_tokens, plan.profile_settings.repeats) == (128, 5)
    assert plan.serving.output_tokens == 256


def test_the_deployments_widest_batch_bounds_the_grid():
    args = _tune_args("--model", "/m", "--serve-args", "--max-num-seqs 100")
    assert _grid(args) == (1, 2, 4, 8, 16, 32, 64, 80, 96, 100)
    assert _serving_sizes(args, _grid(args)) == (1, 16, 64, 100)
    assert gpu_grid(3) == (1, 2, 3)


def test_the_cpu_build_keeps_its_own_defaults():
    args = _tune_args()
    assert _grid(args) == (1, 2, 4, 8, 16)
    plan = tune_plan(EngineSpec(model="/m", drafter="/d"), _grid(args))
    assert (plan.serving.warm_up_s, plan.serving.window_s, plan.max_tokens) == (2.0, 3.0, 64)
