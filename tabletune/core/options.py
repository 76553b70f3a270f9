"""Checked numeric options: every number a command takes says its range where it is declared.

``p.add_argument("--max-tokens", type=integer(minimum=1), ...)``: argparse converts the text
(``invalid integer value: 'x'`` names the option); ``check_options(parser, args)``, which every
entry point calls right after parsing and before any engine, service or file is touched, then
checks each value against its range and raises a ContractError naming the option and the value
(``--temperature: nan is not a number >= 0``). ``tests/core/test_options.py`` checks that no
option of any command is declared with a bare ``type=int`` or ``type=float``.
"""

from __future__ import annotations

import argparse
import math

from tabletune.core.errors import ContractError

__all__ = ["integer", "number", "int_list", "check_options", "MAX_INT"]

# Larger counts are typing mistakes, and vLLM's own options are C ints.
MAX_INT = 2**31 - 1


class Checked:
    """An argparse ``type`` that converts, plus the range ``check`` enforces after parsing."""

    def __init__(self, kind: type, *, minimum: float | None = None,
                 maximum: float | None = None, positive: bool = False,
                 below: float | None = None) -> None:
        self.kind, self.minimum, self.maximum = kind, minimum, maximum
        self.positive, self.below = positive, below
        self.__name__ = "integer" if kind is int else "number"  # argparse's "invalid ... value"

    def __call__(self, text: str):
        return self.kind(text)

    def check(self, value, option: str) -> None:
        if value is None:
            return
        if isinstance(value, (list, tuple)):
            for item in value:
                self.check(item, option)
            return
        if self.kind is int:
            if self.minimum is not None and value < self.minimum:
                raise ContractError(f"{option}: {value!r} is not an integer >= {self.minimum}")
            if value > (MAX_INT if self.maximum is None else self.maximum):
                limit = MAX_INT if self.maximum is None else self.maximum
                raise ContractError(f"{option}: {value!r} is above {limit}, the largest value "
                                    "allowed here")
            return
        if self.positive and not value > 0:
            raise ContractError(f"{option}: {value!r} is not a positive number")
        if self.minimum is not None and not value >= self.minimum:
            raise ContractError(f"{option}: {value!r} is not a number >= {self.minimum:g}")
        if not math.isfinite(value):
            raise ContractError(f"{option}: {value!r} is not a finite number")
        if self.below is not None and not value < self.below:
            raise ContractError(f"{option}: {value!r} is not a number below {self.below:g}")
        if self.maximum is not None and value > self.maximum:
            raise ContractError(f"{option}: {value!r} is above {self.maximum:g}, the largest "
                                "value allowed here")


def integer(minimum: int | None = None, maximum: int | None = None) -> Checked:
    """An integer option in [minimum, maximum] (maximum: ``MAX_INT`` unless given)."""
    return Checked(int, minimum=minimum, maximum=maximum)


def number(minimum: float | None = None, maximum: float | None = None, *,
           positive: bool = False, below: float | None = None) -> Checked:
    """A finite float option: >= minimum (or > 0 when ``positive``), < below, <= maximum."""
    return Checked(float, minimum=minimum, maximum=maximum, positive=positive, below=below)


class IntList(Checked):
    """``1,2,4``: comma-separated integers, each in range; empty is refused."""

    def __init__(self, minimum: int | None = None, maximum: int | None = None) -> None:
        super().__init__(int, minimum=minimum, maximum=maximum)
        self.__name__ = "list of integers"

    def __call__(self, text: str) -> tuple[int, ...]:
        try:
            return tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of integers") from None

    def check(self, value, option: str) -> None:
        if value is None:
            return
        if not value:
            raise ContractError(f"{option}: {value!r} is empty")
        for item in value:
            Checked.check(self, item, option)


def int_list(minimum: int | None = None, maximum: int | None = None) -> IntList:
    return IntList(minimum, maximum)


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check every parsed value of a Checked option (of the chosen subcommands too)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen in action.choices:
                check_options(action.choices[chosen], args)
        elif isinstance(action.type, Checked) and hasattr(args, action.dest):
            action.type.check(getattr(args, action.dest), action.option_strings[0]
                              if action.option_strings else action.dest)
