"""The one error type of the core, plus the small checks that build its messages.

Every message has the shape ``<field path>: <bad value> <what is wrong>``, e.g.
``profile.cells[12].step_ms: nan is not a positive number``, so a failed task or a rejected
file says exactly what to fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, NoReturn

__all__ = ["ContractError"]


class ContractError(ValueError):
    """A value broke the data contract; the message names the field and the value."""


def show(value: Any, limit: int = 80) -> str:
    """Short repr for messages: long lists would bury the field path."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        # An int past Python's digit limit for str(), or a structure nested too deeply.
        text = f"<{type(value).__name__} too large to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def fail(field: str, value: Any, problem: str) -> NoReturn:
    raise ContractError(f"{field}: {show(value)} {problem}")


def check_int(
    value: Any, field: str, minimum: int | None = None, maximum: int | None = None
) -> int:
    # bool is an Integral, but True as a batch size is a bug, not a 1.
    if isinstance(value, bool) or not isinstance(value, Integral):
        fail(field, value, "is not an integer")
    if minimum is not None and value < minimum:
        fail(field, value, f"is not an integer >= {minimum}")
    if maximum is not None and value > maximum:
        fail(field, value, f"is above {maximum}, the largest value allowed here")
    return int(value)


def as_finite(value: Any) -> float | None:
    """``value`` as a finite float, or None for a non-number, nan, inf or an int too big for a
    float (``math.isfinite(10**400)`` raises OverflowError instead of saying False)."""
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    try:
        out = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return out if math.isfinite(out) else None


def _fail_number(field: str, value: Any, problem: str) -> NoReturn:
    if isinstance(value, Integral) and not isinstance(value, bool) and as_finite(value) is None:
        fail(field, value, "is too large (beyond the range of a float)")
    fail(field, value, problem)


def check_number(value: Any, field: str) -> float:
    out = as_finite(value)
    if out is None:
        _fail_number(field, value, "is not a finite number")
    return out


def check_positive(value: Any, field: str) -> float:
    out = as_finite(value)
    if out is None or out <= 0:
        _fail_number(field, value, "is not a positive number")
    return out


# A decode step takes microseconds at the very least and never days: a step time outside this
# range is a unit mix-up or a corrupt value, and dividing by 1e-320 overflows to inf goodput.
# Within it every goodput and every extrapolated step time the builder computes is a finite float.
MIN_STEP_MS = 1e-6
MAX_STEP_MS = 1e9


def check_step_ms(value: Any, field: str) -> float:
    """A step time in ms: positive, finite and in [MIN_STEP_MS, MAX_STEP_MS]."""
    out = check_positive(value, field)
    if out < MIN_STEP_MS:
        fail(field, value, f"is implausibly small for a step time (below {MIN_STEP_MS:g} ms)")
    if out > MAX_STEP_MS:
        fail(field, value, f"is implausibly large for a step time (above {MAX_STEP_MS:g} ms)")
    return out


def check_nonnegative(value: Any, field: str) -> float:
    out = as_finite(value)
    if out is None or out < 0:
        _fail_number(field, value, "is not a non-negative number")
    return out


def check_sequence(value: Any, field: str) -> Sequence[Any]:
    """A list-like value; a 1-D numpy array comes back as a list of Python scalars."""
    # A str is a Sequence too; accepting it would turn "123" into three items.
    if isinstance(value, (str, bytes)):
        fail(field, value, "is not a list")
    if isinstance(value, Sequence):
        return value
    # numpy arrays are not registered as Sequence; duck-typed so errors.py needs no numpy.
    if getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None)):
        return value.tolist()
    fail(field, value, "is not a list")


def check_dict(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        fail(field, value, "is not an object (dict)")
    return value


def check_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        fail(field, value, "is not a string")
    return value


def check_bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        fail(field, value, "is not a boolean")
    return value
