"""Bearer tokens: the one reader (a file, else an environment variable) and the one check.

Used for the agents' report token (the agent sends it, the extender checks it and
derives its default signing key from it) and the inference servers' admin token
(the servers check it, the agent's session sync and the session process send it).

A token is read from a file (a mounted Secret, re-read on every use so a rotation
takes effect without a restart) or from an environment variable, and is always
stripped: a Secret written with ``echo`` ends in a newline, and a token that keeps
it matches nothing, so every request would be refused for good. Tokens are compared
in constant time and never appear in a message, log or repr.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from pathlib import Path

BEARER = "Bearer "


class TokenError(ValueError):
    """No usable token: the file is missing, unreadable or empty, or the variable is unset."""


def read_token(path: Path | str | None, env: str, environ: Mapping[str, str] | None = None,
               *, label: str = "token", flag: str = "--token-file") -> str:
    """The token from ``path`` when given, else from ``$env``, stripped; TokenError saying
    which source failed (``label`` and ``flag`` name them for the user)."""
    if path is not None:
        try:
            token = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as err:
            why = err.strerror if isinstance(err, OSError) else "not UTF-8"
            raise TokenError(f"{label} file {path}: {why}") from None
        if not token:
            raise TokenError(f"{label} file {path} is empty")
        return token
    token = (os.environ if environ is None else environ).get(env, "").strip()
    if not token:
        raise TokenError(f"no {label}: pass {flag} or set {env}")
    return token


def token_or_none(path: Path | str | None, env: str,
                  environ: Mapping[str, str] | None = None) -> str | None:
    """:func:`read_token`, or None when no usable token is configured."""
    try:
        return read_token(path, env, environ)
    except TokenError:
        return None


def bearer_of(header: str | None) -> str:
    """The token an ``Authorization: Bearer <token>`` header carries, ``""`` when none."""
    return header[len(BEARER):].strip() if header and header.startswith(BEARER) else ""


def same_token(given: str, expected: str) -> bool:
    """Whether ``given`` is ``expected``, in constant time; an empty token matches nothing."""
    return bool(given and expected) and hmac.compare_digest(given.encode(), expected.encode())


class BearerToken:
    """A configured token: ``get`` re-reads it on every call (see :func:`read_token`)."""

    def __init__(self, path: Path | None, env: str, environ: Mapping[str, str] | None = None,
                 *, label: str = "token", flag: str = "--token-file") -> None:
        self._path = path
        self._env = env
        self._environ = os.environ if environ is None else environ
        self._label = label
        self._flag = flag

    def get(self) -> str:
        """The current token; TokenError (without the token) when it cannot be read."""
        return read_token(self._path, self._env, self._environ, label=self._label,
                          flag=self._flag)

    def headers(self) -> dict[str, str]:
        """The ``Authorization`` header a request carrying the token sends."""
        return {"Authorization": f"{BEARER}{self.get()}"}

    def __repr__(self) -> str:
        where = f"file={self._path}" if self._path is not None else f"env={self._env}"
        return f"{type(self).__name__}({where})"
