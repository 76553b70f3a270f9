"""The offline tuner: step times and acceptance on a real vLLM server."""

from tabletune.tuner.acceptance import load_prompts
from tabletune.tuner.grid import default_grid, parse_grid
from tabletune.tuner.profiler import profile_step_times
# The tune's acceptance (its own kind of server, K pinned): the one way acceptance is measured.
from tabletune.tuner.tune import measure_acceptance

__all__ = ["default_grid", "load_prompts", "measure_acceptance", "parse_grid",
           "profile_step_times"]
