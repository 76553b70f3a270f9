"""How every entry point turns an error into its exit status and its one line on stderr.

The entry points (``tabletune``, with ``tabletune simulate``; ``python -m tabletune.simulator``;
``python -m tabletune.pipeline registry``) catch what their command raised and ask
``exit_status``, so the same mistake exits the same way from each of them:

- 2, the input is wrong: a value, a field or an option (``ContractError`` and any
  ``ValueError``), a path the operating system refused (a folder that is a file, a read-only or
  full file system, permissions), or an error type the entry point names as its own input error
  (``tabletune`` names ``EngineError``: an engine that cannot start from the options given).
- 1, the input was fine and something outside refused: a registry whose state forbids the move
  (``PipelineError``), a server that does not answer (a refused connection, a timeout), any other
  failure of a client library.

SIGINT, SIGTERM and a closed stdout are not errors of the command; each entry point handles
them itself (``tabletune.core.stdout``).
"""

from __future__ import annotations

import socket

from tabletune.core.files import describe_os_error
from tabletune.core.pipeline_errors import PipelineError

__all__ = ["FAILED", "INPUT_ERROR", "exit_status"]

INPUT_ERROR = 2
FAILED = 1

# OSErrors that say a peer did not answer, not that a path or a disk refused.
_NETWORK_ERRORS = (ConnectionError, TimeoutError, socket.gaierror)
# A client library's message can run to pages (a server's HTML error page): the first line, cut.
_MAX_MESSAGE = 300


def exit_status(exc: BaseException, *,
                input_errors: tuple[type[BaseException], ...] = (),
                peer: str | None = None) -> tuple[int, str]:
    """(exit status, the text after ``<command>: ``) for ``exc``; see the module's rules.
    ``peer``: what the command talks to (``registry http://...``), named in the line of a
    failure that is neither the input's nor a refusal the pipeline words itself."""
    if isinstance(exc, (ValueError, *input_errors)):  # ContractError is a ValueError
        return INPUT_ERROR, f"error: {exc}"
    if isinstance(exc, OSError) and not isinstance(exc, _NETWORK_ERRORS):
        return INPUT_ERROR, f"error: {describe_os_error(exc)}"
    if isinstance(exc, PipelineError):
        return FAILED, str(exc)
    first = (str(exc).strip().splitlines() or [""])[0][:_MAX_MESSAGE]
    where = f"{peer}: " if peer else ""
    return FAILED, f"error: {where}{type(exc).__name__}: {first}"
