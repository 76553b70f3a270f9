"""Engine options of every command that starts vLLM, and the :class:`EngineSpec` they make.

``tune``, ``profile``, ``acceptance``, ``evaluate`` and ``doctor`` all take the same options
(``--model``, ``--drafter``, ``--runner``, ``--engine-arg``, ...); this module declares them and
turns them into an ``EngineSpec``, which ``tabletune.engine.vllm_args`` turns into vLLM's command
line. Nothing else assembles engine settings from the command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tabletune.core import envs
from tabletune.core.errors import ContractError
from tabletune.core.files import check_output_dir
from tabletune.core.builder import MAX_BATCH_SIZE
from tabletune.core.options import integer


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (default: the embedded CPU model pair)")
    g.add_argument("--model", help="target model path; omit for the embedded pair")
    g.add_argument("--drafter", help="drafter model path (method draft_model / eagle / eagle3)")
    g.add_argument("--method", default=None,
                   help="speculative method with --drafter: draft_model (default), eagle, "
                        "eagle3, ...")
    g.add_argument("--max-k", type=integer(1, 64), default=None,
                   help=f"longest draft length K (default: {DEFAULT_MAX_K})")
    g.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cpu for the embedded pair, cuda for a given model")
    g.add_argument("--tensor-parallel-size", type=integer(1, 1024), default=1,
                   help="GPUs per server")
    g.add_argument("--max-num-seqs", type=integer(1, MAX_BATCH_SIZE), default=None,
                   help="vLLM's largest batch (default: the largest batch size the command uses)")
    g.add_argument("--max-model-len", type=integer(1), default=None,
                   help=f"vLLM's context length per request (default: {DEFAULT_MAX_MODEL_LEN})")
    g.add_argument("--dtype", default=None,
                   help="weights' dtype (default: float32 for the embedded pair, else vLLM's auto)")
    g.add_argument("--serve-args", default=None, metavar="FLAGS",
                   help="the flags of your 'vllm serve' line, or @FILE holding them: every "
                        "server this command starts runs with them (graph mode, capture "
                        "sizes, KV cache, ...), and table.json records them; --max-num-seqs, "
                        "--max-model-len, --dtype, -tp and --speculative-config's drafter, "
                        "method and K set TableTune's options of those names")
    g.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                   help="extra vLLM server argument (repeat; e.g. --engine-arg=--gpu-memory-utilization=0.8)")
    g.add_argument("--runner", choices=("v1", "v2"), default=None,
                   help="vLLM's GPU model runner (default on cuda: v2 for eagle/eagle3/mtp, "
                        "which keeps full CUDA graphs with a table; v1 otherwise; vLLM 0.34 "
                        "and later have only v2)")
    g.add_argument("--cache-root", default=None, metavar="DIR",
                   help="keep vLLM's compile caches under DIR (one folder per server role) so "
                        "a later run of the same deployment starts faster")
    g.add_argument("--synthetic-acceptance", type=float_list, default=None,
                   help="GPU only: emulate acceptance with vLLM's synthetic rates a_1,..,a_K")


DEFAULT_METHOD = "draft_model"
DEFAULT_MAX_K = 3
DEFAULT_MAX_MODEL_LEN = 512
# TableTune option (its dest) -> the option's name, for the serve line's settings.
_SERVE_OPTIONS = {"max_num_seqs": "--max-num-seqs", "max_model_len": "--max-model-len",
                  "dtype": "--dtype", "tensor_parallel_size": "--tensor-parallel-size",
                  "drafter": "--drafter", "method": "--method", "max_k": "--max-k"}


def apply_serve_args(args: argparse.Namespace) -> None:
    """Fold ``--serve-args`` into the engine options (once), then fill the defaults the
    serve line may set. A setting the serve line and a TableTune option both give must agree;
    what the line leaves out is said on stderr, each with its reason."""
    if getattr(args, "_serve_args_applied", False):
        return
    text = getattr(args, "serve_args", None)
    if text:
        from tabletune.engine.serve_line import parse_serve_line

        line = parse_serve_line(serve_args_text(text))
        if line.model is not None:
            if args.model is None:
                args.model = line.model
            elif Path(args.model).expanduser() != Path(line.model).expanduser():
                raise ContractError(f"--serve-args: model {line.model} is not --model "
                                    f"{args.model}")
        for dest, value in line.settings.items():
            given = getattr(args, dest, None)
            if given is None:
                setattr(args, dest, value)
            elif given != value:
                raise ContractError(f"--serve-args: {_SERVE_OPTIONS[dest]} {value} is not "
                                    f"{_SERVE_OPTIONS[dest]} {given} given to TableTune")
        args.engine_arg = list(line.extra_args) + list(args.engine_arg)
        for shown, why in line.left_out:
            print(f"note: --serve-args: {shown} left out: {why}", file=sys.stderr)
    if args.method is None:
        args.method = DEFAULT_METHOD
    if args.max_k is None:
        args.max_k = DEFAULT_MAX_K
    if args.max_model_len is None:
        args.max_model_len = DEFAULT_MAX_MODEL_LEN
    args._serve_args_applied = True


def serve_args_text(text: str) -> str:
    """``--serve-args``' flags: the text itself, or @FILE's content."""
    if not text.startswith("@"):
        return text
    path = Path(text[1:]).expanduser()
    if not path.is_file():
        raise ContractError(f"--serve-args: {text}: no such file")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"--serve-args: {text}: cannot be read ({exc})") from None


def float_list(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers")


# Flags TableTune sets on every vLLM server it starts (``tabletune.engine.vllm_args``); an
# --engine-arg giving one again would silently change what is measured (a second --port, a
# --max-num-seqs below the profiled batch sizes), so it is refused with the option to use.
MANAGED_FLAGS = {
    "--model": "--model", "--served-model-name": None, "--host": None, "--port": None,
    "--max-num-seqs": "--max-num-seqs", "--max-model-len": "--max-model-len",
    "--dtype": "--dtype", "--tensor-parallel-size": "--tensor-parallel-size",
    "-tp": "--tensor-parallel-size",
    "--seed": None, "--speculative-config": "--max-k / --drafter / --method",
    "--scheduler-cls": None,
}


def check_engine_args(extra: list[str]) -> None:
    """Refuse an --engine-arg that repeats a flag TableTune sets itself."""
    for item in extra:
        flag = item.split("=", 1)[0].strip()
        if flag.startswith("--"):
            flag = "--" + flag[2:].replace("_", "-")
        if flag in MANAGED_FLAGS:
            use = MANAGED_FLAGS[flag]
            hint = f"use TableTune's {use}" if use else "TableTune sets it for every server"
            raise ContractError(f"--engine-arg: {item!r} sets {flag}, which TableTune sets "
                                f"itself ({hint})")


def check_engine_options(args: argparse.Namespace) -> None:
    """The engine options' checks that no range can express: --engine-arg flags TableTune
    sets itself, and the cache folders vLLM or the embedded pair will write into (checked
    before minutes of work, not after)."""
    check_engine_args(list(args.engine_arg))
    check_runner(getattr(args, "runner", None))
    cache_root = getattr(args, "cache_root", None)
    if cache_root:
        check_output_dir(cache_root, "--cache-root")
    if args.model is None:
        from tabletune.engine.model_pair import default_cache_dir

        where = envs.CACHE.name if envs.CACHE.get() else "the model cache"
        check_output_dir(default_cache_dir(), where)


def check_runner(runner: str | None) -> None:
    """Refuse ``--runner v1`` where the installed vLLM has no V1 GPU runner (0.34 on)."""
    if runner != "v1":
        return
    from tabletune.engine.spec import installed_engine_version, v2_only

    version = installed_engine_version()
    if v2_only(version):
        raise ContractError(f"--runner: v1: vLLM {version} has only the V2 GPU model runner "
                            f"(V1 was removed in 0.34); leave --runner out or pass v2")


def check_model_folders(args: argparse.Namespace) -> None:
    """--model and --drafter given as local paths name model folders (``check_model_folder``);
    the command line's check, before a command starts any engine."""
    for option, value in (("--model", args.model), ("--drafter", getattr(args, "drafter", None))):
        check_model_folder(option, value)


def check_model_folder(option: str, value: str | None) -> None:
    """A model given as a local path must be a folder with a config.json: vLLM would take a
    missing path for a Hub repository id and fail minutes later, after every server started.
    A name that is not path-shaped (``org/name``) is left to vLLM."""
    if not value or not value.startswith(("/", "./", "../", "~")):
        return
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise ContractError(f"{option}: {value}: no such folder")
    if not (folder / "config.json").is_file():
        raise ContractError(f"{option}: {value}: the folder has no config.json")


def engine_spec_from_args(args: argparse.Namespace, *, max_batch_size: int | None = None):
    """The deployment the options describe; ``max_batch_size`` (the largest batch the command
    sends) raises ``max_num_seqs`` to it. Engine arguments and cache folders are checked first."""
    from tabletune.engine.spec import EngineSpec

    apply_serve_args(args)
    check_engine_options(args)

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
