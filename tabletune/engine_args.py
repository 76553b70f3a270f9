"""Engine options of every command that starts vLLM, and the :class:`EngineSpec` they make.

``tune``, ``profile``, ``acceptance``, ``evaluate`` and ``doctor`` all take the same options
(``--model``, ``--drafter``, ``--runner``, ``--engine-arg``, ...); this module declares them and
turns them into an ``EngineSpec``, which ``tabletune.engine.server`` turns into vLLM's command
line. Nothing else assembles engine settings from the command line.
"""

from __future__ import annotations

import argparse


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (default: the embedded CPU model pair)")
    g.add_argument("--model", help="target model path; omit for the embedded pair")
    g.add_argument("--drafter", help="drafter model path (method draft_model / eagle / eagle3)")
    g.add_argument("--method", default="draft_model",
                   help="speculative method with --drafter: draft_model, eagle, eagle3, ...")
    g.add_argument("--max-k", type=int, default=3, help="longest draft length K")
    g.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cpu for the embedded pair, cuda for a given model")
    g.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per server")
    g.add_argument("--max-num-seqs", type=int, default=None,
                   help="vLLM's largest batch (default: the largest batch size the command uses)")
    g.add_argument("--max-model-len", type=int, default=512,
                   help="vLLM's context length per request")
    g.add_argument("--dtype", default=None,
                   help="weights' dtype (default: float32 for the embedded pair, else vLLM's auto)")
    g.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="extra vLLM server argument (repeat; e.g. --engine-arg=--gpu-memory-utilization=0.8)")
    g.add_argument("--runner", choices=("v1", "v2"), default=None,
                   help="vLLM's GPU model runner (default on cuda: v2 for eagle/eagle3/mtp, "
                        "which keeps full CUDA graphs with a table; v1 otherwise)")
    g.add_argument("--cache-root", default=None, metavar="DIR",
                   help="keep vLLM's compile caches under DIR (one folder per server role) so "
                        "a later run of the same deployment starts faster")
    g.add_argument("--synthetic-acceptance", type=float_list, default=None,
                   help="GPU only: emulate acceptance with vLLM's synthetic rates a_1,..,a_K")


def float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")


def engine_spec_from_args(args: argparse.Namespace, *, max_batch_size: int | None = None):
    """The deployment the options describe; ``max_batch_size`` (the largest batch the command
    sends) raises ``max_num_seqs`` to it."""
    from tabletune.engine.spec import EngineSpec

    common = dict(max_k=args.max_k, tensor_parallel_size=args.tensor_parallel_size,
                  max_model_len=args.max_model_len, extra_args=tuple(args.engine_arg),
                  synthetic_acceptance=args.synthetic_acceptance,
                  runner=getattr(args, "runner", None),
                  cache_root=getattr(args, "cache_root", None))
    if args.max_num_seqs or max_batch_size:
        common["max_num_seqs"] = max(args.max_num_seqs or 0, max_batch_size or 0)
    if args.model is None:
        spec = EngineSpec.embedded_default(**common)
        if args.device == "cuda":
            spec = spec.with_(device="cuda")
    else:
        spec = EngineSpec(model=args.model, drafter=args.drafter, method=args.method,
                          device=args.device or "cuda", dtype=args.dtype or "auto", **common)
    if args.dtype and args.model is None:
        spec = spec.with_(dtype=args.dtype)
    return spec
