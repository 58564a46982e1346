"""C's number parsing, as NCCL's calls do it: NCCL reads its variables and sysfs with
``strtoll``/``strtol`` base 0 and ``atoi``, and stores some results in a C ``int``, so a
value means to NCCL what these functions make of it, not what Python's ``int`` would."""

from __future__ import annotations

_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
INT64_MAX = (1 << 63) - 1


def strtoll(text: str) -> int | None:
    """C's ``strtoll(text, NULL, 0)``: leading blanks and sign, ``0x`` hex, a leading ``0``
    octal, else decimal, up to the first character that is no digit of the base; 0 when
    there is no digit at all; None where C sets ERANGE (NCCL then keeps the default)."""
    rest = text.lstrip(" \t\n\r\f\v")
    sign = -1 if rest[:1] == "-" else 1
    rest = rest[1:] if rest[:1] in "+-" else rest
    base = 10
    if rest[:2].lower() == "0x" and rest[2:3].lower() in _DIGITS[:16] and rest[2:3]:
        base, rest = 16, rest[2:]
    elif rest[:1] == "0":
        base = 8
    digits = ""
    for char in rest.lower():
        if char not in _DIGITS[:base]:
            break
        digits += char
    value = sign * int(digits, base) if digits else 0
    return value if -INT64_MAX - 1 <= value <= INT64_MAX else None


def c_int(value: int) -> int:
    """A C ``long`` stored in an ``int``: the low 32 bits, two's complement (gcc, x86-64/aarch64)."""
    return (value + (1 << 31)) % (1 << 32) - (1 << 31)


def atoi(text: str) -> int:
    """C's ``atoi``: optional blanks and sign, then decimal digits up to the first other character."""
    rest = text.lstrip(" \t\n\r\f\v")
    sign = -1 if rest[:1] == "-" else 1
    rest = rest[1:] if rest[:1] in "+-" else rest
    digits = rest[:len(rest) - len(rest.lstrip("0123456789"))]
    return c_int(sign * int(digits)) if digits else 0
