"""The one mapping from an error to an exit status and a line (tabletune.core.exits)."""

import errno
import socket

import pytest

from tabletune.core.errors import ContractError
from tabletune.core.exits import FAILED, INPUT_ERROR, exit_status
from tabletune.core.pipeline_errors import PromotionConflict


class EngineWouldNotStart(RuntimeError):
    pass


@pytest.mark.parametrize("exc, status, text", [
    (ContractError("profile.cells[0].step_ms: nan is not a positive number"), INPUT_ERROR,
     "error: profile.cells[0].step_ms: nan is not a positive number"),
    (ValueError("--grid: 'x' is not a list"), INPUT_ERROR, "error: --grid: 'x' is not a list"),
    (OSError(errno.EROFS, "Read-only file system", "/out/table.json"), INPUT_ERROR,
     "error: /out/table.json: Read-only file system"),
    (OSError(errno.ENOSPC, "No space left on device"), INPUT_ERROR, "error: "),
    (PromotionConflict("m: production moved to 3 meanwhile"), FAILED,
     "m: production moved to 3 meanwhile"),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), FAILED,
     "error: ConnectionRefusedError: [Errno 111] Connection refused"),
    (TimeoutError("timed out"), FAILED, "error: TimeoutError: timed out"),
    (socket.gaierror(-2, "Name or service not known"), FAILED, "error: gaierror: "),
    (RuntimeError("Exceeded 30 redirects.\nmore detail"), FAILED,
     "error: RuntimeError: Exceeded 30 redirects."),
])
def test_each_kind_of_error_has_one_status_and_one_line(exc, status, text):
    code, line = exit_status(exc)
    assert code == status
    assert line.startswith(text) and "\n" not in line, line


def test_an_entry_point_names_its_own_input_errors():
    exc = EngineWouldNotStart("the engine exited with status 1 before it was ready")
    assert exit_status(exc)[0] == FAILED
    assert exit_status(exc, input_errors=(EngineWouldNotStart,)) == (
        INPUT_ERROR, "error: the engine exited with status 1 before it was ready")


def test_a_long_client_message_is_cut_to_its_first_line():
    code, line = exit_status(RuntimeError("<html>" + "x" * 5000))
    assert code == FAILED and len(line) < 400


def test_a_failure_names_what_the_command_talked_to():
    assert exit_status(RuntimeError("Exceeded 30 redirects."), peer="registry http://h:5000") == (
        FAILED, "error: registry http://h:5000: RuntimeError: Exceeded 30 redirects.")
    # Input errors and the pipeline's own refusals are already worded: no peer added.
    assert exit_status(ValueError("--x: 1 bad"), peer="registry r")[1] == "error: --x: 1 bad"
    assert exit_status(PromotionConflict("m: moved"), peer="registry r") == (FAILED, "m: moved")
