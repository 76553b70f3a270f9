"""tabletune: measure the draft-length table vLLM's dynamic speculative decoding takes
(num_speculative_tokens_per_batch_size) and keep it right.

Start with `tabletune tune --out-dir out` (the embedded CPU model pair), then
`tabletune show out`. `tabletune <command> --help` says more."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Sequence

from tabletune.core.exits import exit_status
from tabletune.core.options import check_options
from tabletune.engine_args import apply_serve_args, check_model_folders


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends an option's default to its help, unless it has none or the help already says."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (action.option_strings and "default" not in text
                and action.default not in (None, False, [], argparse.SUPPRESS)):
            text += " (default: %(default)s)"
        return text


class HelpfulParser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults; its subcommands' parsers are the same kind."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)


class CommandUnavailable(ImportError):
    """A command's module cannot be imported: an installation problem, reported as one."""


# Every ``tabletune`` command, in ``tabletune --help``'s order: the module it lives in and the
# function there that adds its parser (and its ``func``). One place to find a command; a module
# that cannot be imported stops the parser with its name instead of the command going missing.
COMMANDS = (
    ("tune, profile, acceptance", "tabletune.commands.measure", "add_measure_parsers"),
    ("build, show, plot", "tabletune.commands.tables", "add_table_parsers"),
    ("registry", "tabletune.pipeline.cli", "add_registry_parser"),
    ("simulate", "tabletune.simulator.cli", "add_simulate_parser"),
    ("evaluate", "tabletune.evaluate", "add_evaluate_parsers"),
    ("doctor", "tabletune.doctor", "add_doctor_parser"),
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = HelpfulParser(prog="tabletune", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"tabletune {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for names, module, function in COMMANDS:
        try:
            home = importlib.import_module(module)
        except ImportError as exc:
            raise CommandUnavailable(f"tabletune {names}: cannot import {module}: {exc}") from exc
        getattr(home, function)(sub)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tabletune")
    except PackageNotFoundError:  # a source tree run without installing
        return "unknown (not installed)"


class Terminated(BaseException):
    """The process got SIGTERM or SIGHUP (a timeout, an Airflow task kill, a closed terminal).

    A BaseException, like KeyboardInterrupt, so no `except Exception` on the way swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum, frame):
    raise Terminated(signum)


# What an interrupted command leaves behind, beyond its engines being stopped.
_INTERRUPTED_KEEPS = {
    "tune": "finished profile cells are kept in the checkpoint (rerun the same command to "
            "resume)",
    "profile": "finished profile cells are kept in the checkpoint (rerun the same command to "
               "resume)",
    "evaluate": "the levels measured so far are in --out-dir's evaluate.json (complete: false)",
}
_ENGINE_COMMANDS = ("tune", "profile", "acceptance", "evaluate", "doctor")


# Commands whose long phases (a server starting, acceptance prompts answered, serving windows)
# report through the tuner's loggers; the user sees those lines on stderr.
PHASE_LOGGING_COMMANDS = ("tune", "profile", "acceptance")
PHASE_LOGGERS = ("tabletune.profile", "tabletune.acceptance", "tabletune.serving")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is when a line is logged (a test's capture, a redirect),
    not to the stream of the moment the handler was made."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def _show_phase_logs() -> None:
    for name in PHASE_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
            handler = _StderrHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logger.addHandler(handler)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``tabletune`` command. A closed stdout (``tabletune show t.json | head``) ends it
    quietly, as SIGPIPE ends a Unix tool: exit 141, no traceback, engines stopped."""
    from tabletune.core.stdout import run_with_pipe_closed_quietly

    def stop_servers() -> None:
        from tabletune.engine.server import stop_all_servers

        stop_all_servers()

    return run_with_pipe_closed_quietly(lambda: _main(argv), on_close=stop_servers)


def _main(argv: Sequence[str] | None) -> int:
    from tabletune.engine.server import EngineError, stop_all_servers

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
    except CommandUnavailable as e:
        print(f"tabletune: error: {e} (reinstall TableTune with its dependencies)",
              file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    # "registry seed" for a registry command, so its errors name the subcommand.
    where = getattr(args, "command_path", args.command)
    # SIGTERM and SIGHUP unwind like Ctrl-C: every `with server` and `finally` runs, so no
    # engine (API server, engine core, workers) outlives the command.
    previous = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        try:
            previous[signum] = signal.signal(signum, _raise_terminated)
        except ValueError:  # not the main thread (e.g. called from a worker thread)
            pass
    try:
        if args.command in _ENGINE_COMMANDS:
            apply_serve_args(args)  # a deployment's own flags set the engine options
        check_options(parser, args)  # every option's range, before any engine or file
        if args.command in _ENGINE_COMMANDS:
            check_model_folders(args)
        if args.command in PHASE_LOGGING_COMMANDS:
            _show_phase_logs()
        return int(args.func(args) or 0)
    except BrokenPipeError:
        raise
    except (ValueError, EngineError, OSError) as e:
        # One line, the exit status every entry point gives it (tabletune.core.exits); other
        # exceptions are bugs and keep their traceback.
        code, text = exit_status(e, input_errors=(EngineError,))
        print(f"tabletune {where}: {text}", file=sys.stderr)
        return code
    except (KeyboardInterrupt, Terminated) as e:
        stop_all_servers()
        why = e.args[0] if isinstance(e, Terminated) else "SIGINT"
        parts = [f"tabletune {where}: interrupted ({why})"]
        if args.command in _ENGINE_COMMANDS:
            parts.append("engines stopped")
        if args.command in _INTERRUPTED_KEEPS:
            parts.append(_INTERRUPTED_KEEPS[args.command])
        print("; ".join(parts), file=sys.stderr)
        return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
