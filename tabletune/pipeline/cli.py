"""``tabletune registry ...``: seed, inspect, promote and roll back registered tables.

    python -m tabletune.pipeline registry seed --model-name NAME \
        --profile P.json --acceptance A.json
    python -m tabletune.pipeline registry show --model-name NAME
    python -m tabletune.pipeline registry promote --model-name NAME --version 3
    python -m tabletune.pipeline registry rollback --model-name NAME

The tracking server comes from ``--tracking-uri`` or ``MLFLOW_TRACKING_URI``. ``--model-name``
may be replaced by ``--engine-default`` to use the built-in CPU deployment's key.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from tabletune.core.builder import MAX_BATCH_SIZE
from tabletune.core.options import check_options, integer

__all__ = ["add_registry_parser", "build_registry_parser", "registry_main", "run_registry", "main"]


def format_json(value: Any, *, indent: str = "  ", _level: int = 0) -> str:
    """JSON, indented like ``json.dumps(indent=2)`` except that a list of plain values stays on
    one line: a table prints one range ``[start, end, k]`` per line, not one number per line."""
    pad = indent * (_level + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(str(key))}: "
                 f"{format_json(item, indent=indent, _level=_level + 1)}"
                 for key, item in value.items()]
    elif isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        items = [pad + format_json(item, indent=indent, _level=_level + 1) for item in value]
    else:
        return json.dumps(value)
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    return opening + "\n" + ",\n".join(items) + "\n" + indent * _level + closing


def _model_name(args: argparse.Namespace) -> str:
    from tabletune.pipeline.deployment import deployment_key, registered_model_name

    if args.model_name:
        return registered_model_name(args.model_name)
    from tabletune.engine.spec import EngineSpec

    return registered_model_name(deployment_key(EngineSpec.embedded_default()))


# Where MLflow keeps a registry; anything else (ftp://, a typo'd scheme) is refused up front
# instead of failing deep inside the MLflow client with a traceback.
TRACKING_SCHEMES = ("http", "https", "file", "databricks", "sqlite", "postgresql", "mysql",
                    "mssql")


def _check_arguments(args: argparse.Namespace) -> None:
    """Every argument, before any MLflow call (bad ones exit 2 naming the option)."""
    import re
    from urllib.parse import urlparse

    from tabletune.core.errors import ContractError

    scheme = urlparse(args.tracking_uri).scheme.split("+")[0]
    if scheme and scheme not in TRACKING_SCHEMES and not re.fullmatch(r"[A-Za-z]", scheme):
        raise ContractError(f"--tracking-uri: {args.tracking_uri!r} has the scheme {scheme!r}; "
                            f"a tracking server is one of {', '.join(TRACKING_SCHEMES)}")
    for option in ("version", "expected_production"):
        value = getattr(args, option, None)
        if value is not None and not re.fullmatch(r"[1-9][0-9]{0,17}", value):
            raise ContractError(f"--{option.replace('_', '-')}: {value!r} is not a model "
                                "version number (1, 2, ...)")


def _cli_owner() -> str:
    """Who the promotion history names for a CLI move."""
    import getpass

    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no passwd entry (some containers)
        return "cli"


REGISTRY_DESCRIPTION = "Registered draft-length tables in MLflow."
REGISTRY_HELP = ("seed, show, promote or roll back registered tables in MLflow "
                 "(tabletune registry --help)")


def add_registry_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``tabletune registry``: one of ``tabletune``'s commands (``tabletune.cli.COMMANDS``)."""
    parser = sub.add_parser("registry", help=REGISTRY_HELP, description=REGISTRY_DESCRIPTION)
    _add_registry_arguments(parser)
    parser.set_defaults(func=lambda args: run_registry(args, parser))
    return parser


def build_registry_parser() -> argparse.ArgumentParser:
    """The registry's parser on its own (``python -m tabletune.pipeline registry``)."""
    parser = argparse.ArgumentParser(prog="tabletune registry",
                                     description=REGISTRY_DESCRIPTION)
    _add_registry_arguments(parser)
    return parser


def _add_registry_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI"),
                        help="MLflow tracking server, e.g. http://127.0.0.1:15000 "
                             "(default: $MLFLOW_TRACKING_URI)")
    # Not "command": under ``tabletune`` that names the top-level command (``registry``). Not
    # required here: run_registry asks for it, in the words it always used ("command").
    sub = parser.add_subparsers(dest="registry_command")

    def common(p: argparse.ArgumentParser) -> None:
        group = p.add_mutually_exclusive_group(required=True)
        group.add_argument("--model-name", help="registered model (or deployment key)")
        group.add_argument("--engine-default", action="store_true",
                           help="the built-in CPU deployment's registered model")

    seed = sub.add_parser("seed", help="first production version from a profile + acceptance")
    common(seed)
    seed.set_defaults(command_path="registry seed")
    seed.add_argument("--profile", required=True, help="profile file (tabletune profile)")
    seed.add_argument("--acceptance", required=True,
                      help="acceptance file (tabletune acceptance)")
    seed.add_argument("--max-batch-size", type=integer(1, MAX_BATCH_SIZE),
                      help="build the table up to this B (default: the largest profiled B)")
    show = sub.add_parser("show", help="aliases and the production table")
    common(show)
    show.set_defaults(command_path="registry show")
    promote = sub.add_parser("promote", help="make a version production")
    common(promote)
    promote.set_defaults(command_path="registry promote")
    promote.add_argument("--version", required=True, help="the version to make production")
    promote.add_argument("--expected-production",
                         help="refuse unless production is still this version (default: no "
                              "check)")
    rollback = sub.add_parser("rollback", help="put back the version that was production "
                                               "before the current one")
    common(rollback)
    rollback.set_defaults(command_path="registry rollback")


def registry_main(argv: Sequence[str] | None = None) -> int:
    parser = build_registry_parser()
    return run_registry(parser.parse_args(argv), parser)


def run_registry(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run a parsed ``registry`` command; ``parser`` is the registry's (its usage errors)."""
    if args.registry_command is None:
        parser.error("the following arguments are required: command")
    if not args.tracking_uri:
        parser.error("--tracking-uri or MLFLOW_TRACKING_URI is required")
    if args.model_name is not None:
        try:
            _model_name(args)
        except ValueError:
            parser.error(f"--model-name: {args.model_name!r} is not a registered model name or "
                         f"deployment key (letters, digits, '.', '_' and '-', starting with a "
                         f"letter or digit)")

    from tabletune.core.contracts import load_json
    from tabletune.core.exits import exit_status

    where = f"tabletune registry {args.registry_command}"
    try:
        check_options(parser, args)
        _check_arguments(args)
        if args.registry_command == "seed":  # the documents are read before any registry call
            profile = load_json(args.profile, "profile")
            acceptance = load_json(args.acceptance, "acceptance")
    except (ValueError, OSError) as exc:
        code, text = exit_status(exc)
        print(f"{where}: {text}", file=sys.stderr)
        return code

    from tabletune.adapters.mlflow_registry import MlflowRegistry, apply_mlflow_http_defaults
    from tabletune.pipeline import registry_admin

    # A process entry point: bound MLflow's HTTP calls unless the user set MLflow's variables.
    apply_mlflow_http_defaults()
    registry = MlflowRegistry(args.tracking_uri)
    model_name = _model_name(args)
    try:
        if args.registry_command == "seed":
            out = registry_admin.seed_registry(
                registry, model_name=model_name,
                profile=profile, acceptance=acceptance,
                max_batch_size=args.max_batch_size,
            )
        elif args.registry_command == "show":
            # Reports drift between aliases, history and version tags, and repairs it (a move
            # made in the MLflow UI is recorded as "external").
            out = registry_admin.registry_report(registry, model_name=model_name,
                                                 owner=_cli_owner())
            for line in out["drift"]:
                print(f"warning: {model_name}: {line}", file=sys.stderr)
            if out["production"]:
                docs = registry.read_version(model_name, out["production"])
                out["table"] = docs.table.table.to_vllm()
        elif args.registry_command == "promote":
            out = registry_admin.promote_version(
                registry, model_name=model_name, action="promote", version=args.version,
                expected_production=(args.expected_production
                                     if args.expected_production is not None else False),
                owner=_cli_owner(), via="cli",
            )
        else:
            out = registry_admin.promote_version(registry, model_name=model_name, action="rollback",
                                                 version=None, owner=_cli_owner(), via="cli")
    except BrokenPipeError:
        raise
    except Exception as exc:
        # A document that is not valid, a registry whose state refuses the move, the MLflow
        # client's own failures: one line, the status every entry point gives it.
        code, text = exit_status(exc, peer=f"registry {args.tracking_uri}")
        print(f"{where}: {text}", file=sys.stderr)
        return code
    print(format_json({"model_name": model_name, **out}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "registry":
        print("usage: python -m tabletune.pipeline registry {seed,show,promote,rollback} ...",
              file=sys.stderr)
        return 2
    return registry_main(argv[1:])
