"""Keep credentials out of anything logged (MLflow params and tags, task logs).

Applied at the boundary where settings become params, so no call site has to remember it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["redact_params", "redact_text", "is_secret_key"]

# Matched against the words of a key ("aws_secret_access_key" -> aws, secret, access, key), so
# "max_tokens" is not taken for a token.
_SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "secret", "token", "credential", "credentials",
    "authorization", "auth", "apikey", "accesskey",
})
_SECRET_PAIRS = frozenset({("access", "key"), ("api", "key"), ("private", "key"),
                           ("secret", "key"), ("session", "key")})
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")
REDACTED = "***"


def is_secret_key(key: str) -> bool:
    words = [w for w in re.split(r"[^a-z0-9]+", key.lower()) if w]
    return any(w in _SECRET_WORDS for w in words) or any(
        pair in _SECRET_PAIRS for pair in zip(words, words[1:])
    )


def redact_text(text: str) -> str:
    """``text`` with the userinfo of any URL replaced (``s3://user:pw@host`` -> ``s3://***@host``)."""
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: (REDACTED if is_secret_key(str(k)) else _redact_value(v)) for k, v in
                value.items()}
    if isinstance(value, (list, tuple)):
        return _redact_args([_redact_value(v) for v in value])
    return value


def _redact_args(items: list[Any]) -> list[Any]:
    """Argument lists: hide the value of a secret flag (``--api-key X``, ``--token=X``)."""
    out: list[Any] = []
    hide_next = False
    for item in items:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag = item.lstrip("-").split("=")[0] if isinstance(item, str) else ""
        if isinstance(item, str) and item.startswith("-") and is_secret_key(flag):
            if "=" in item:
                out.append(item.split("=", 1)[0] + "=" + REDACTED)
            else:
                out.append(item)
                hide_next = True
            continue
        out.append(item)
    return out


def redact_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Drop keys that name a secret, and strip credentials embedded in URL values."""
    return {
        str(k): _redact_value(v) for k, v in params.items() if not is_secret_key(str(k))
    }
