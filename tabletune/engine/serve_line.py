"""A deployment's own ``vllm serve`` flags, read so a tune measures the server it will feed.

A table holds only for the engine arguments it was measured under (graph mode, capture sizes,
KV cache, scheduling): a table tuned under vLLM's default graph mode lost 19 % on the H200 when
served with ``cudagraph_mode`` FULL. ``--serve-args`` takes the flags of the user's serve line
as written (``vllm serve MODEL`` in front is allowed). Pure: text in, a :class:`ServeLine` out.

What a flag becomes:
- the settings TableTune sets itself take the line's value (``--max-num-seqs``,
  ``--max-model-len``, ``--dtype``, ``--tensor-parallel-size``; the drafter, method and K from
  ``--speculative-config``);
- what only names one server (address, port, served name, seed, scheduler class) and the
  speculative config's table (what the tune measures) are left out, each with its reason;
- everything else goes to every server the command starts, as written.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field

from tabletune.core.errors import ContractError

OPTION = "--serve-args"

# Flags whose value becomes a TableTune setting: flag -> (setting, parser).
ADOPTED = {
    "--max-num-seqs": ("max_num_seqs", int),
    "--max-model-len": ("max_model_len", int),
    "--dtype": ("dtype", str),
    "--tensor-parallel-size": ("tensor_parallel_size", int),
    "-tp": ("tensor_parallel_size", int),
}
# Flags that name one server, not the deployment's step time: left out, with why.
LEFT_OUT = {
    "--host": "TableTune's servers listen on 127.0.0.1",
    "--port": "TableTune's servers pick their own ports",
    "--served-model-name": "TableTune names its servers' model itself",
    "--seed": "TableTune seeds its servers (0) so two tunes send the same requests",
    "--scheduler-cls": "the tune runs TableTune's scheduler, which pins each length",
    "--api-key": "TableTune's servers answer on 127.0.0.1 only",
}
# --speculative-config keys that become TableTune settings.
SPECULATIVE_KEYS = {"model": "drafter", "method": "method", "num_speculative_tokens": "max_k"}
_NUMBER = re.compile(r"-?\d+(\.\d+)?$")


@dataclass(frozen=True)
class ServeLine:
    """A serve line read: the model it serves, TableTune settings it fixes, the flags every
    server gets, and what was left out (flag, why)."""

    model: str | None = None
    settings: dict = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()
    left_out: tuple[tuple[str, str], ...] = ()


def _fail(value: str, why: str) -> ContractError:
    return ContractError(f"{OPTION}: {value}: {why}")


def split_flags(tokens: list[str]) -> list[tuple[str, str | None]]:
    """``["--a", "1", "--b", "--c=x"]`` -> ``[("--a", "1"), ("--b", None), ("--c", "x")]``:
    a flag takes the next token as its value unless that is a flag itself (a negative number
    is a value)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("-") or token == "-":
            raise _fail(token, "is not a flag (a serve line's flags start with - or --; the "
                               "model goes first, after 'vllm serve')")
        if token.startswith("--") and "=" in token:
            flag, _, value = token.partition("=")
            out.append((flag, value))
            i += 1
            continue
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        if following is not None and (not following.startswith("-")
                                      or _NUMBER.match(following)):
            out.append((token, following))
            i += 2
        else:
            out.append((token, None))
            i += 1
    return out


def _canonical(flag: str) -> str:
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def parse_serve_line(text: str) -> ServeLine:
    """Read the flags of a ``vllm serve`` line (``vllm serve MODEL`` in front allowed)."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:  # unbalanced quotes
        raise _fail(repr(text), f"cannot be split into arguments ({exc})") from None
    model = None
    if tokens[:2] == ["vllm", "serve"]:
        tokens = tokens[2:]
    elif tokens[:1] == ["serve"]:
        tokens = tokens[1:]
    if tokens and not tokens[0].startswith("-"):
        model, tokens = tokens[0], tokens[1:]
    settings: dict = {}
    extra: list[str] = []
    left_out: list[tuple[str, str]] = []
    for flag, value in split_flags(tokens):
        name = _canonical(flag)
        shown = flag if value is None else f"{flag} {value}"
        if name == "--model":
            if value is None:
                raise _fail(flag, "needs a value")
            model = value
        elif name in ADOPTED:
            setting, parse = ADOPTED[name]
            if value is None:
                raise _fail(flag, "needs a value")
            try:
                settings[setting] = parse(value)
            except ValueError:
                raise _fail(shown, f"is not {'a whole number' if parse is int else 'valid'}"
                            ) from None
        elif name in ("--speculative-config", "-sc"):
            if value is None:
                raise _fail(flag, "needs a JSON value")
            settings.update(_speculative_settings(value, left_out))
        elif name in LEFT_OUT:
            left_out.append((shown, LEFT_OUT[name]))
        else:
            extra.append(name if value is None else f"{name}={value}")
    return ServeLine(model=model, settings=settings, extra_args=tuple(extra),
                     left_out=tuple(left_out))


def _speculative_settings(value: str, left_out: list[tuple[str, str]]) -> dict:
    try:
        config = json.loads(value)
    except json.JSONDecodeError as exc:
        raise _fail(f"--speculative-config {value}", f"is not JSON ({exc.msg})") from None
    if not isinstance(config, dict):
        raise _fail(f"--speculative-config {value}", "is not a JSON object")
    settings = {}
    for key, item in config.items():
        if key in SPECULATIVE_KEYS:
            settings[SPECULATIVE_KEYS[key]] = item
        elif key == "num_speculative_tokens_per_batch_size":
            left_out.append((f"speculative_config.{key}", "the table is what TableTune measures"))
        else:
            left_out.append((f"speculative_config.{key}",
                             "TableTune's servers build their speculative config from the "
                             "drafter, method and K alone"))
    k = settings.get("max_k")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise _fail(f"--speculative-config {value}",
                    f"num_speculative_tokens {k!r} is not a whole number >= 1")
    for key in ("drafter", "method"):
        if key in settings and not isinstance(settings[key], str):
            raise _fail(f"--speculative-config {value}", f"{key} {settings[key]!r} is not text")
    return settings
