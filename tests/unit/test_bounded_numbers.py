"""Numbers from the environment, the command line and captured files are read as C reads
them, within bounds (issue 43 item 3): a number of 4,301 digits or more in any variable the
gate reads, or in --gpu, was Python's ValueError and exit 70 ("a bug in gdrprobe");
`--connect-wait 1_000` and fullwidth digits were taken as numbers."""

from __future__ import annotations

import pytest

from gdrprobe.nccl.cparse import atoi, strtoll
from gdrprobe.numbers import INT64_MAX, decimal, integer, is_decimal, real

HUGE = "9" * 5000


@pytest.mark.parametrize("text, value", [
    (HUGE, None), ("-" + HUGE, None), ("0x" + "f" * 5000, None), ("0" + "7" * 5000, None),
    ("0" * 5000 + "12", 10), ("9223372036854775807", INT64_MAX),
    ("-9223372036854775808", -INT64_MAX - 1), ("9223372036854775808", None),
    ("0x7fffffffffffffff", INT64_MAX), ("0x8000000000000000", None), ("１２", 0), ("1_000", 1),
    ("\u0663", 0), ("  +0x1f", 31), ("0x", 0), ("-", 0), ("", 0),
])
def test_strtoll_saturates_as_c_does_whatever_the_length(text, value):
    assert strtoll(text) == value


@pytest.mark.parametrize("text, value", [
    (HUGE, -1),                         # (int) LONG_MAX, as glibc's atoi gives it
    ("-" + HUGE, 0),                    # (int) LONG_MIN
    ("4294967297", 1), ("2147483648", -2147483648), ("12abc", 12), (" -3", -3), ("x", 0),
    ("１", 0),
])
def test_atoi_is_glibcs_int_cast_of_strtol(text, value):
    assert atoi(text) == value


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("007", 7), (HUGE, INT64_MAX), ("0" * 5000, 0),
    ("１２", None), ("\u00b2", None), ("\u0663", None), ("1_000", None), (" 1", None),
    ("+1", None), ("-1", None), ("", None), ("0x10", None),
])
def test_a_decimal_is_ascii_digits_saturated(text, value):
    assert decimal(text) == value
    assert is_decimal(text) == (value is not None)


def test_a_decimal_saturates_at_the_callers_bound():
    assert decimal("4294967296", limit=1 << 31) == 1 << 31
    assert decimal(HUGE, limit=100) == 100


@pytest.mark.parametrize("text, value", [
    ("-1", -1), ("+5", 5), (HUGE, 1000), ("-" + HUGE, -1000), ("1_0", None), ("--1", None),
    ("１", None),
])
def test_an_integer_is_signed_ascii_and_bounded(text, value):
    assert integer(text, -1000, 1000) == value


@pytest.mark.parametrize("text, value", [
    ("0.9", 0.9), ("30", 30.0), ("1e-3", 1e-3), (".5", 0.5), ("5.", 5.0), ("-2.5", -2.5),
    ("1_000", None), ("１０", None), ("nan", None), ("inf", None), ("Infinity", None),
    (" 1", None), ("0x10", None), ("1e99999", None), ("1e400", None), ("9" * 100, None),
    ("", None), ("1e", None),
])
def test_a_real_is_what_a_person_writes_and_finite(text, value):
    assert real(text) == value
