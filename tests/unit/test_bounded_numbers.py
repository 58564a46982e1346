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


# ---- every reader of a number in a file a capture holds (issue 43 items 3 and 4) -----------


def test_port_directories_that_are_no_ascii_number_are_not_ports(tmp_path):
    from gdrprobe.doctor.facts.pci import rdma_ports
    from gdrprobe.sysroot import SysRoot

    for name in ("1", "\u00b2", "\uff13", "9" * 200, "1_0"):       # a name is at most 255 bytes
        (tmp_path / "sys/class/infiniband/mlx5_0/ports" / name).mkdir(parents=True)
    ports = rdma_ports(SysRoot(str(tmp_path)), "mlx5_0")
    assert sorted(port.number for port in ports) == [1, INT64_MAX]


@pytest.mark.parametrize("width", [HUGE, "\u00b2", "33", "-1", ""])
def test_a_link_width_no_pcie_link_has_is_no_rate(width):
    from gdrprobe.doctor.facts.rails import Link

    assert Link("16.0 GT/s PCIe", width).gbps is None


@pytest.mark.parametrize("limits, expected", [
    (f"Max locked memory         {HUGE}      {HUGE}      bytes", (HUGE, HUGE)),
    ("Max locked memory         \u00b2      \u00b2      bytes", None),
    ("Max locked memory         unlimited  8388608  bytes", ("unlimited", "8388608")),
])
def test_the_memlock_limits_are_numbers_or_unlimited(tmp_path, limits, expected):
    from gdrprobe.doctor.checks import memlock
    from gdrprobe.sysroot import SysRoot

    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/limits").write_text(limits + "\n")
    assert memlock.memlock_limits(SysRoot(str(tmp_path))) == expected
    if expected:
        assert memlock.limit_bytes(expected[1]) in (INT64_MAX, 8388608)


@pytest.mark.parametrize("status, cap, pinned", [
    ("CapEff:\tzz\nVmPin:\t\u00b2 kB\n", None, 0),
    (f"CapEff:\t{'f' * 5000}\nVmPin:\t{HUGE} kB\n", None, INT64_MAX * 1024),
    ("CapEff:\nVmPin:\n", None, 0),
    ("CapEff:\t000001ffffffffff\nVmPin:\t4 kB\n", 0x1FFFFFFFFFF, 4096),
])
def test_the_process_status_fields_are_read_within_bounds(tmp_path, status, cap, pinned):
    from gdrprobe.doctor.checks import memlock
    from gdrprobe.sysroot import SysRoot

    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/status").write_text(status)
    root = SysRoot(str(tmp_path))
    assert memlock.effective_capabilities(root) == cap
    assert memlock.pinned_bytes_now(root) == pinned


@pytest.mark.parametrize("text, value", [(HUGE, INT64_MAX * 1024), ("\u00b2", None), ("64", 65536)])
def test_limits_conf_and_systemd_values(text, value):
    from gdrprobe.doctor.checks import memlock

    assert memlock.pam_value(text) == value
    assert memlock.systemd_value(f"{text}K") == value


@pytest.mark.parametrize("resource", ["x\nzz yy ww\n", f"x\n0x{'f' * 5000} 0x1 0x0\n", "x\n\u00b2 1 2\n"])
def test_a_bar_resource_line_of_no_hex_is_no_size(resource):
    from gdrprobe.doctor.checks.gpu import bar1_bytes

    assert bar1_bytes(resource) is None


def test_versions_and_kfd_properties_of_any_length():
    from gdrprobe.doctor.facts.memory_path import kernel_version
    from gdrprobe.nccl.versions import parse_version

    assert parse_version(f"{HUGE}.1.2 2.21.5") == (2, 21, 5)
    assert kernel_version(f"{HUGE}.1") is None and kernel_version("6.8.0-45") == (6, 8)
