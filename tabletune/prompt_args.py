"""The prompts a command sends to vLLM: its options and the prompt list they give.

``tune``, ``acceptance``, ``evaluate`` and ``doctor`` take the same options (``--prompts``,
``--num-prompts``, ``--temperature``, ``--max-tokens``, ``--seed``); the defaults are the
acceptance measurement's (``tabletune.tuner.acceptance``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tabletune.core.errors import ContractError
from tabletune.core.options import integer, number
from tabletune.core.defaults import DEFAULT_MAX_TOKENS, DEFAULT_NUM_PROMPTS, DEFAULT_TEMPERATURE
from tabletune.tuner.acceptance import load_prompts


def add_prompt_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompts", type=Path, help="JSONL file with a 'prompt' field per line "
                   "(default: built-in synthetic prompts)")
    p.add_argument("--num-prompts", type=integer(1, 10**6), default=DEFAULT_NUM_PROMPTS,
                   help="prompts to measure acceptance on (a sample if the file has more)")
    p.add_argument("--temperature", type=number(0, 100), default=DEFAULT_TEMPERATURE,
                   help="the serving temperature (default: %(default)s)")
    p.add_argument("--max-tokens", type=integer(1), default=None,
                   help="tokens generated per prompt (default: 128 on cuda, "
                        f"{DEFAULT_MAX_TOKENS} on cpu)")
    p.add_argument("--seed", type=integer(0), default=0, help="prompt sampling seed (default: %(default)s)")


# Where prompts_from_args keeps what it read on the namespace: the file is read once, up front
# (a command checks it before any engine starts), and a file that is changed or removed while
# the command runs does not change what it measures.
_READ = "_tabletune_prompts"


def _kind(path) -> str | None:
    import os

    from tabletune.core.files import file_kind

    try:
        return file_kind(os.stat(path).st_mode)
    except OSError:
        return None


def prompts_from_args(args: argparse.Namespace) -> list[str]:
    """``--num-prompts`` prompts: sampled (``--seed``) from ``--prompts``, or synthetic.

    The first call reads and checks the file; later calls on the same ``args`` return the same
    list."""
    import random

    from tabletune.engine.model_pair import synthetic_prompts

    read = getattr(args, _READ, None)
    if read is not None:
        return list(read)
    if args.num_prompts < 1:
        raise ContractError(f"--num-prompts: {args.num_prompts!r} must be >= 1")
    if args.prompts is None:
        prompts = synthetic_prompts(args.num_prompts, seed=1000 + args.seed)
    else:
        if not Path(args.prompts).is_file():  # stat only: a FIFO is never opened
            kind = _kind(args.prompts)
            raise ContractError(f"--prompts: {args.prompts} is not a file"
                                + (f" ({kind})" if kind else ""))
        prompts = load_prompts(args.prompts)
        if len(prompts) > args.num_prompts:
            prompts = random.Random(args.seed).sample(prompts, args.num_prompts)
    setattr(args, _READ, list(prompts))
    return prompts
