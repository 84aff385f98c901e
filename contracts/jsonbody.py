"""One bounded JSON reader for every request body the servers parse.

The standard library's decoder recurses once per nesting level (a 100k-deep
array raises ``RecursionError`` from deep inside it) and turns every digit
string into an ``int`` (Python refuses more than 4300 digits with a
``ValueError``, and a few thousand digits already cost quadratic time). Neither
is a clean answer to a client, so :func:`parse_json` checks both limits before
the decoder sees them and raises :class:`JsonBodyError`, whose ``problem`` each
server turns into its own HTTP 400:

- **Depth.** Escapes and every byte but quotes and brackets are dropped, strings
  are cut out, and a running sum over the brackets left gives the depth: one
  pass of C-speed byte and iterator operations, no recursion.
- **Numbers.** Integers with more than ``max_int_digits`` digits, number
  literals longer than ``max_number_chars``, and anything that decodes to NaN
  or an infinity (``NaN``, ``Infinity``, ``1e999``) are refused: no value a
  tandem server reads needs them, and Go's decoder on the scheduler side refuses
  them too.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import sub
from typing import Any

MAX_DEPTH = 64
"""Nesting levels of arrays and objects; a pod is about ten, a rank-8 tensor nine."""
MAX_INT_DIGITS = 30
"""Digits of one integer literal (a signed 64-bit integer has 19)."""
MAX_NUMBER_CHARS = 64
"""Characters of one number literal (a float64 round-trips in 24)."""

_STEP = bytes.maketrans(b"[{]}", b"\x02\x02\x00\x00")
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


class JsonBodyError(ValueError):
    """The body is not JSON, or exceeds a limit; ``problem`` says which, for a 400."""

    def __init__(self, problem: str):
        super().__init__(problem)
        self.problem = problem


@dataclass(frozen=True)
class JsonLimits:
    """Limits of :func:`parse_json`."""

    max_depth: int = MAX_DEPTH
    max_int_digits: int = MAX_INT_DIGITS
    max_number_chars: int = MAX_NUMBER_CHARS


DEFAULT_LIMITS = JsonLimits()


def nesting_depth(body: bytes) -> int:
    """Greatest nesting depth of arrays and objects in the JSON text ``body``."""
    # Escaped backslashes go first, then escaped quotes (a run of backslashes pairs from
    # the left); every quote left delimits a string, so every other piece between quotes
    # is string content and the rest holds the brackets.
    unescaped = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(unescaped.translate(None, _NOT_STRUCTURE).split(b'"')[0::2])
    steps = outside.translate(_STEP)  # an opening bracket is 2, a closing one 0
    return max(accumulate(map(sub, steps, repeat(1))), default=0)


def parse_json(body: bytes | bytearray | str, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """The decoded document; JsonBodyError when it is not JSON or breaks a limit."""
    raw = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else bytes(body)
    # No document nests deeper than it has opening brackets: most bodies (a pod and its
    # candidate nodes) have fewer than the limit, and two counts are cheaper than the pass.
    if raw.count(b"[") + raw.count(b"{") > limits.max_depth \
            and nesting_depth(raw) > limits.max_depth:
        raise JsonBodyError(f"nested deeper than {limits.max_depth} levels")

    def parse_int(text: str) -> int:
        if len(text) - text.startswith("-") > limits.max_int_digits:
            raise JsonBodyError(f"an integer has more than {limits.max_int_digits} digits")
        return int(text)

    def parse_float(text: str) -> float:
        if len(text) > limits.max_number_chars:
            raise JsonBodyError(f"a number is longer than {limits.max_number_chars} characters")
        value = float(text)
        if not math.isfinite(value):
            raise JsonBodyError(f"number {text[:20]} is out of range")
        return value

    def parse_constant(text: str) -> Any:
        raise JsonBodyError(f"{text} is not a JSON number")

    try:
        return json.loads(raw, parse_int=parse_int, parse_float=parse_float,
                          parse_constant=parse_constant)
    except JsonBodyError:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JsonBodyError(f"not valid JSON: {exc}") from None
    except RecursionError:  # a lower interpreter limit than max_depth; never a traceback
        raise JsonBodyError("nested too deeply") from None
    except ValueError as exc:  # e.g. an integer past the interpreter's digit limit
        raise JsonBodyError(f"not valid JSON: {exc}") from None


__all__ = ["DEFAULT_LIMITS", "JsonBodyError", "JsonLimits", "parse_json"]
