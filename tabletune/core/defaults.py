"""Defaults that the CLI, the library and the DAGs' params all show, in a module that imports
nothing: the DAG files read them at parse time, which must not load numpy, aiohttp or an engine
client just for a number. Each owning module re-exports its own (``tuner.acceptance``,
``tuner.profile_settings``, ``pipeline.gate``, ``adapters.s3_prompts``), so code keeps reading them
where the concept lives.
"""

__all__ = ["DEFAULT_NUM_PROMPTS", "DEFAULT_TEMPERATURE", "DEFAULT_MAX_TOKENS", "DEFAULT_REPEATS",
           "DEFAULT_EDGE_TOLERANCE", "DEFAULT_PARTITION"]

# What an acceptance measurement uses unless told otherwise (the CLI's and the weekly DAG's
# defaults): prompts measured on, serving temperature, tokens per prompt.
DEFAULT_NUM_PROMPTS = 160
DEFAULT_TEMPERATURE = 0.0
DEFAULT_MAX_TOKENS = 64
# Timing windows per (B, k) cell unless told otherwise (the CLI's and the profile DAG's default).
DEFAULT_REPEATS = 3
# The gate's largest relative move of any table edge against production's table.
DEFAULT_EDGE_TOLERANCE = 0.25
# The S3 prompt partitions under the prefix: one folder per day.
DEFAULT_PARTITION = "dt={date:%Y-%m-%d}/"
