"""A closed stdout ends a command the way SIGPIPE ends a Unix tool: exit 141, nothing printed.

``tabletune show t.json | head`` closes the pipe after ten lines; Python then raises
BrokenPipeError at the next write, and again when it flushes stdout at exit ("Exception
ignored ..."). Every entry point (``tabletune``, ``python -m tabletune.simulator.cli``,
``python -m tabletune.pipeline``) runs its main through ``run_with_pipe_closed_quietly``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

__all__ = ["run_with_pipe_closed_quietly"]


def run_with_pipe_closed_quietly(main: Callable[[], int],
                                 on_close: Callable[[], None] | None = None) -> int:
    """``main()``'s exit code; on a closed stdout ``on_close()`` (stop what the command
    started), stdout pointed at /dev/null so the exit flush is silent, and 128 + SIGPIPE."""
    try:
        rc = main()
        sys.stdout.flush()  # inside the handler: a pipe closed early fails here, not at exit
        return rc
    except BrokenPipeError:
        if on_close is not None:
            on_close()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
