"""Numbers in text from outside gdrprobe (the command line, the environment, a captured file),
read strictly and within bounds.

Python's ``int()`` and ``float()`` are generous where the programs whose input this is are
not: they take ``1_000``, fullwidth and other scripts' digits (``"１０"``), blanks around the
number, ``nan`` and ``inf``, and ``int()`` refuses a number of more than 4,300 digits with a
ValueError (CPython's limit on decimal conversion, ``sys.get_int_max_str_digits``). C's
``strtol``, CUDA and the launchers read ASCII digits only, and saturate (or fail) past their
type's range, whatever the length. So every number gdrprobe reads from such text goes
through here: ASCII only, at most :data:`MAX_DIGITS` significant digits converted, a larger
value saturated at the caller's bound; text that is no number is None, never an exception.
(C's own base-0 parsing, as NCCL calls it, is :mod:`gdrprobe.nccl.cparse`, on the same
bound.)
"""

from __future__ import annotations

import math
import re

INT64_MAX = (1 << 63) - 1
# Digits past these can only saturate: no int64 has more than 19, no double's exponent
# needs more than a few, and a person's number fits in both.
MAX_DIGITS = 20
MAX_REAL_CHARS = 64
_REAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,4})?")
_INTEGER = re.compile(r"[+-]?[0-9]+")


def is_decimal(text: str) -> bool:
    """Whether text is one or more ASCII digits 0-9 and nothing else (``str.isdigit`` also
    takes superscripts and other scripts' digits, which ``int()`` then refuses or reads)."""
    return bool(text) and text.isascii() and text.isdigit()


def decimal(text: str, limit: int = INT64_MAX) -> int | None:
    """ASCII digits as a whole number, saturated at ``limit``; None when text is anything
    else (a sign, blanks, ``_``, another script's digits, nothing)."""
    if not is_decimal(text):
        return None
    significant = text.lstrip("0")
    if len(significant) > max(MAX_DIGITS, len(str(limit))):
        return limit
    return min(int(significant or "0"), limit)


def integer(text: str, low: int = -INT64_MAX - 1, high: int = INT64_MAX) -> int | None:
    """A signed ASCII decimal (``-3``, ``+7``), saturated at [low, high]; None for anything
    else: no blanks, ``_``, base prefix or other script's digits."""
    if not _INTEGER.fullmatch(text):
        return None
    sign = -1 if text[0] == "-" else 1
    magnitude = decimal(text.lstrip("+-"), max(abs(low), abs(high)))
    return max(low, min(high, sign * magnitude))


def real(text: str) -> float | None:
    """A finite decimal number as a person writes it (``0.9``, ``30``, ``1e-3``, ``.5``):
    ASCII digits, one point, an exponent of at most four digits, at most
    :data:`MAX_REAL_CHARS` characters; None for anything else (``1_000``, ``nan``, ``inf``,
    ``0x10``, fullwidth digits, blanks)."""
    if len(text) > MAX_REAL_CHARS or not _REAL.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None
