"""The loops' clock: when the cycle counter is trusted, its calibration, and the per-run
cross-check that sends a round back to CLOCK_MONOTONIC."""

import ctypes
import platform
import time

import pytest

from gdrprobe import _native as native
from gdrprobe.errors import UsageError
from gdrprobe.measure import clock
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.client import ProbeClient
from gdrprobe.rdma.endpoint import EndpointOptions

X86_FLAGS = "fpu tsc msr constant_tsc rep_good nopl nonstop_tsc cpuid tsc_known_freq"


def cpuinfo(flags: str, key: str = "flags") -> str:
    return (f"processor\t: 0\nvendor_id\t: GenuineIntel\n{key}\t\t: {flags}\n\n"
            f"processor\t: 1\n{key}\t\t: something else\n")


class Root:
    """A SysRoot with one /proc/cpuinfo."""

    def __init__(self, text: str | None):
        self.text = text

    def read(self, path: str):
        assert path == "/proc/cpuinfo"
        return self.text


def test_cpu_flags_are_the_first_processors():
    assert "nonstop_tsc" in clock.cpu_flags(cpuinfo(X86_FLAGS))
    assert clock.cpu_flags(cpuinfo("fp asimd evtstrm", "Features")) == {"fp", "asimd", "evtstrm"}
    assert clock.cpu_flags("") == frozenset()


def test_the_tsc_is_trusted_only_when_constant_and_non_stop():
    assert clock.counter_distrust("x86_64", clock.cpu_flags(cpuinfo(X86_FLAGS))) is None
    # The lab's TCG guest: "tsc" and "rdtscp" but neither invariant-TSC flag.
    reason = clock.counter_distrust("x86_64", frozenset({"tsc", "rdtscp"}))
    assert reason == "the kernel does not report the TSC constant_tsc and nonstop_tsc"
    assert "nonstop_tsc" in clock.counter_distrust("x86_64", frozenset({"constant_tsc"}))


def test_arm64_generic_timer_is_always_trusted():
    assert clock.counter_distrust("aarch64", frozenset()) is None


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the TSC rules need an x86-64 build")
def test_auto_picks_the_counter_where_trusted_and_says_why_not_elsewhere():
    trusted = clock.loop_clock("auto", Root(cpuinfo(X86_FLAGS)))
    assert trusted.counter and trusted.ns_per_tick > 0
    assert trusted.description.startswith("TSC at ")
    assert trusted.loop_args() == {"counter": True, "ns_per_tick": trusted.ns_per_tick}
    guest = clock.loop_clock("auto", Root(cpuinfo("fpu tsc rdtscp")))
    assert not guest.counter and guest.ns_per_tick == 1.0
    assert guest.description == ("CLOCK_MONOTONIC (the kernel does not report the TSC "
                                 "constant_tsc and nonstop_tsc)")
    assert not clock.loop_clock("auto", Root(None)).counter


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the TSC rules need an x86-64 build")
def test_counter_when_asked_for_names_what_the_kernel_did_not_promise():
    forced = clock.loop_clock("counter", Root(cpuinfo("fpu tsc")))
    assert forced.counter
    assert "(asked for, though the kernel does not report the TSC" in forced.description


def test_monotonic_when_asked_for_or_without_a_counter():
    assert clock.loop_clock("monotonic").description == "CLOCK_MONOTONIC (asked for)"
    other = clock.loop_clock("counter", Root(cpuinfo(X86_FLAGS)), machine="riscv64")
    assert other == clock.monotonic("no cycle counter is read on riscv64")


@pytest.mark.skipif(not native.HAVE_COUNTER, reason="this build reads no cycle counter")
def test_calibration_matches_a_second_one():
    first = native.calibrate_counter(5_000_000)
    second = native.calibrate_counter(5_000_000)
    assert first > 0
    assert second == pytest.approx(first, rel=0.01)


def check(agreement: float, span_ns: int = 50_000_000) -> native.ClockCheck:
    return native.ClockCheck(agreement, span_ns)


def test_a_run_is_doubted_only_when_the_counter_strays_over_a_checkable_span():
    counter = clock.LoopClock(True, 0.4, "TSC")
    assert counter.doubt(check(1.0)) is None
    assert counter.doubt(check(1.009)) is None
    assert counter.doubt(check(1.02)) == ("the cycle counter measured 1.0200 times "
                                         "CLOCK_MONOTONIC's 50.0 ms over a run")
    assert counter.doubt(check(-3.0)) is not None           # went backwards
    assert counter.doubt(check(2.0, span_ns=10_000)) is None   # too short to judge
    assert clock.monotonic("").doubt(check(5.0)) is None


class Mark(ctypes.Structure):   # struct gdr_clock_mark (csrc/gdr_clock.h)
    _fields_ = [("ns", ctypes.c_uint64), ("ticks", ctypes.c_uint64)]


class Clock(ctypes.Structure):  # struct gdr_clock
    _fields_ = [("source", ctypes.c_int), ("ns_per_tick", ctypes.c_double)]


def agreement(ns_per_tick, start, end):
    library = ctypes.CDLL(native.__file__)
    library.gdr_clock_agreement.restype = ctypes.c_double
    return library.gdr_clock_agreement(ctypes.byref(Clock(1, ns_per_tick)),
                                       ctypes.byref(Mark(*start)), ctypes.byref(Mark(*end)))


def test_agreement_is_the_counters_span_over_the_monotonic_span():
    assert agreement(0.5, (1000, 10_000), (3000, 14_000)) == 1.0
    assert agreement(0.5, (1000, 10_000), (3000, 14_400)) == pytest.approx(1.1)
    assert agreement(0.5, (1000, 10_000), (3000, 6_000)) == -1.0   # backwards: never huge
    assert agreement(0.5, (1000, 10_000), (1000, 99_999)) == 1.0   # no span: nothing to say


def read_ticks(source: int) -> tuple[int, int]:
    """gdr_clock_read_ticks for a clock of this source, and CLOCK_MONOTONIC's ns around it."""
    library = ctypes.CDLL(native.__file__)
    library.gdr_clock_read_ticks.restype = ctypes.c_uint64
    ns_per_tick = native.calibrate_counter(1_000_000) if source else 1.0
    before = time.monotonic_ns()
    ticks = library.gdr_clock_read_ticks(ctypes.byref(Clock(source, ns_per_tick)))
    return ticks * ns_per_tick, time.monotonic_ns() - before


@pytest.mark.parametrize("source", [0, 1] if native.HAVE_COUNTER else [0])
def test_a_reads_cost_is_the_least_of_its_back_to_back_reads(source):
    # The least of 32 back-to-back differences is at most their mean, so within the span
    # around the call over 32 (plus the counter's calibration rounding), whatever the load.
    cost_ns, span_ns = read_ticks(source)
    assert 0 <= cost_ns <= span_ns / 32 * 1.01 + 1


def span_ns(ns_per_tick: float, ticks: int, read: int) -> int:
    """gdr_clock_span_ns: an interval between two reads, less the one read it holds."""
    library = ctypes.CDLL(native.__file__)
    library.gdr_clock_span_ns.restype = ctypes.c_uint64
    library.gdr_clock_span_ns.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64]
    source = 0 if ns_per_tick == 1.0 else 1
    return library.gdr_clock_span_ns(ctypes.byref(Clock(source, ns_per_tick)), ticks, read)


def test_an_interval_between_two_reads_is_given_less_the_one_read_it_holds():
    # The latency samples and the NCCL pattern's step phases are such intervals.
    assert span_ns(1.0, 30_700, 700) == 30_000          # CLOCK_MONOTONIC: ticks are ns
    assert span_ns(0.4, 1_000, 65) == 374               # the counter: (1000 - 65) x 0.4
    assert span_ns(1.0, 5_000, 0) == 5_000              # no read measured: as it was


def test_an_interval_shorter_than_a_read_is_zero_never_negative_or_wrapped():
    assert span_ns(1.0, 700, 700) == 0
    assert span_ns(1.0, 650, 700) == 0                  # a read that came out quicker
    assert span_ns(0.4, 0, 65) == 0


def test_the_clock_choice_is_checked_and_travels_in_the_handshake():
    options = ProbeOptions(clock="counter")
    assert ProbeOptions.from_message(options.to_message()).clock == "counter"
    with pytest.raises(UsageError, match="clock must be one of auto, counter, monotonic"):
        ProbeOptions(clock="tsc")


class RoundsOnAStrayingCounter(ProbeClient):
    """A client whose rounds report what the loop's clock check would: the counter strays
    over the first round and agrees afterwards."""

    def __init__(self):
        self.notices, self.clocks = [], []
        super().__init__("127.0.0.1", 18750, "t" * 20, ProbeOptions(sizes=(64,)),
                         EndpointOptions(), notice=self.notices.append)

    def _bandwidth_round(self, channel, handles, memory, remote, size):
        self.clocks.append(self.clock)
        agreement = 1.5 if len(self.clocks) == 1 else 1.0
        return f"row {len(self.clocks)}", check(agreement)


def test_a_round_the_counter_strayed_over_is_measured_again_with_monotonic():
    client = RoundsOnAStrayingCounter()
    client.clock = clock.LoopClock(True, 0.4, "TSC")
    assert client._measured_round(None, None, None, None, 64) == "row 2"
    assert [c.counter for c in client.clocks] == [True, False]
    doubt = "the cycle counter measured 1.5000 times CLOCK_MONOTONIC's 50.0 ms over a run"
    assert client.clock.description == f"CLOCK_MONOTONIC ({doubt})"
    assert client.notices == [f"{doubt}: measuring the 64-byte round again with CLOCK_MONOTONIC"]
    assert client.round == 2   # each measurement is a round of its own (its own pattern seed)
    # The run keeps CLOCK_MONOTONIC: the next size is measured once.
    assert client._measured_round(None, None, None, None, 64) == "row 3"
