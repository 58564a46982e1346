"""C's number parsing, as NCCL's calls do it: NCCL reads its variables and sysfs with
``strtoll``/``strtol`` base 0 and ``atoi``, and stores some results in a C ``int``, so a
value means to NCCL what these functions make of it, not what Python's ``int`` would.

Like C, these read any number of digits in time linear in the text and saturate past the
type's range (Python's ``int()`` refuses more than 4,300 decimal digits with a ValueError):
only the digits that can matter are converted (:data:`gdrprobe.numbers.MAX_DIGITS`)."""

from __future__ import annotations

import re

from gdrprobe.numbers import INT64_MAX, MAX_DIGITS

C_SPACE = " \t\n\r\f\v"          # isspace() in the C locale
_DIGIT_RUN = {8: re.compile("[01234567]*"), 10: re.compile("[0-9]*"), 16: re.compile("[0-9a-fA-F]*")}
_HEX_PREFIX = re.compile(r"0[xX][0-9a-fA-F]")
# More significant digits than this overflow an int64 in any of the three bases.
_OVERFLOW_DIGITS = MAX_DIGITS + 2


def _saturating(text: str, base: int | None) -> tuple[int, bool]:
    """(the value ``strtol(text, NULL, base)`` reads, saturated at the int64 range; whether
    it overflowed). base None: C's base 0 (``0x`` hex, a leading ``0`` octal, else decimal)."""
    rest = text.lstrip(C_SPACE)
    sign = -1 if rest[:1] == "-" else 1
    rest = rest[1:] if rest[:1] in "+-" else rest
    if base is None:
        base = 16 if _HEX_PREFIX.match(rest) else 8 if rest[:1] == "0" else 10
    if base == 16 and _HEX_PREFIX.match(rest):
        rest = rest[2:]
    digits = _DIGIT_RUN[base].match(rest).group(0).lstrip("0")
    value = sign * int(digits, base) if digits and len(digits) <= _OVERFLOW_DIGITS else 0
    overflow = len(digits) > _OVERFLOW_DIGITS or not -INT64_MAX - 1 <= value <= INT64_MAX
    if overflow:
        return (INT64_MAX if sign > 0 else -INT64_MAX - 1), True
    return value, False


def strtoll(text: str) -> int | None:
    """C's ``strtoll(text, NULL, 0)``: leading blanks and sign, ``0x`` hex, a leading ``0``
    octal, else decimal, up to the first character that is no digit of the base; 0 when
    there is no digit at all; None where C sets ERANGE (NCCL then keeps the default)."""
    value, overflow = _saturating(text, None)
    return None if overflow else value


def c_int(value: int) -> int:
    """A C ``long`` stored in an ``int``: the low 32 bits, two's complement (gcc, x86-64/aarch64)."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def atoi(text: str) -> int:
    """C's ``atoi`` as glibc defines it, ``(int) strtol(text, NULL, 10)``: optional blanks and
    sign, then decimal digits up to the first other character, saturated at LONG_MAX or
    LONG_MIN and then cut to an int (so 2^63 and more reads as -1)."""
    return c_int(_saturating(text, 10)[0])
