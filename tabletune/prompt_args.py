"""The prompts a command sends to vLLM: its options and the prompt list they give.

``tune``, ``acceptance``, ``evaluate`` and ``doctor`` take the same options (``--prompts``,
``--num-prompts``, ``--temperature``, ``--max-tokens``, ``--seed``); the defaults are the
acceptance measurement's (``tabletune.tuner.acceptance``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tabletune.core.errors import ContractError
from tabletune.tuner.acceptance import (DEFAULT_MAX_TOKENS, DEFAULT_NUM_PROMPTS,
                                        DEFAULT_TEMPERATURE, load_prompts)


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=Path, help="JSONL file with a 'prompt' field per line "
                   "(default: built-in synthetic prompts)")
    p.add_argument("--num-prompts", type=int, default=DEFAULT_NUM_PROMPTS,
                   help="prompts to measure acceptance on (a sample if the file has more)")
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                   help="the serving temperature")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help="tokens generated per prompt")
    p.add_argument("--seed", type=int, default=0, help="prompt sampling seed")


def prompts_from_args(args: argparse.Namespace) -> list[str]:
    """``--num-prompts`` prompts: sampled (``--seed``) from ``--prompts``, or synthetic."""
    import random

    from tabletune.engine.model_pair import synthetic_prompts

    if args.num_prompts < 1:
        raise ContractError(f"--num-prompts: {args.num_prompts!r} must be >= 1")
    if args.prompts is None:
        return synthetic_prompts(args.num_prompts, seed=1000 + args.seed)
    prompts = load_prompts(args.prompts)
    if len(prompts) > args.num_prompts:
        prompts = random.Random(args.seed).sample(prompts, args.num_prompts)
    return prompts
