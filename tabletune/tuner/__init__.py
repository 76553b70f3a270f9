"""The offline tuner: step times and acceptance on a real vLLM server."""

from tabletune.tuner.acceptance import load_prompts, measure_acceptance
from tabletune.tuner.profiler import default_grid, parse_grid, profile_step_times

__all__ = ["default_grid", "load_prompts", "measure_acceptance", "parse_grid",
           "profile_step_times"]
