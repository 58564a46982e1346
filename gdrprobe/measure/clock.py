"""The clock the C loops read: the CPU's cycle counter where it can be trusted, else
CLOCK_MONOTONIC, and the check that a run's numbers from the counter can be believed.

Where the kernel's clocksource has no vDSO path (HPET in the lab's guests, acpi_pm) each
clock_gettime is a system call of about a microsecond, a measurable part of a small
message's round trip; reading the cycle counter is one instruction, as perftest does
(get_cycles() in its get_clock.h). The counter is trusted when:

- x86-64: /proc/cpuinfo's flags name both ``constant_tsc`` (its rate does not follow the
  core's frequency) and ``nonstop_tsc`` (it keeps counting in deep C-states), the kernel's
  X86_FEATURE_CONSTANT_TSC and X86_FEATURE_NONSTOP_TSC, both set from CPUID 0x80000007 EDX
  bit 8, the invariant TSC (early_init_intel and early_init_amd, arch/x86/kernel/cpu/);
- aarch64: always; the generic timer's virtual count runs at the fixed frequency of
  CNTFRQ_EL0 by the architecture's definition.

It is calibrated against CLOCK_MONOTONIC once per process, and every run marks both clocks
at its start and end: a run over which the counter's time and CLOCK_MONOTONIC's disagree
by more than AGREEMENT_TOLERANCE is measured again with CLOCK_MONOTONIC, which the process
then keeps, and the report says why.
"""

from __future__ import annotations

import dataclasses
import functools
import platform

from gdrprobe.defaults import CLOCKS
from gdrprobe.sysroot import SysRoot

CLOCK_CHOICES = CLOCKS
COUNTER_FLAGS = ("constant_tsc", "nonstop_tsc")
CALIBRATION_WINDOW_NS = 20_000_000
# The marks of a run are each bracketed by two CLOCK_MONOTONIC reads (about 1.4 us apart
# in the lab's guest), so over a span of MIN_CHECKED_SPAN_NS the agreement is known to
# about 0.3%; a counter whose rate changed (no constant_tsc) or that jumped across CPUs is
# off by far more.
AGREEMENT_TOLERANCE = 0.01
MIN_CHECKED_SPAN_NS = 1_000_000


@dataclasses.dataclass(frozen=True)
class LoopClock:
    """What the loops count in, and what a report says about it."""

    counter: bool
    ns_per_tick: float
    description: str

    def loop_args(self) -> dict:
        """The keyword arguments of _native.BandwidthConfig and LatencyConfig."""
        return {"counter": self.counter, "ns_per_tick": self.ns_per_tick}

    def doubt(self, check) -> str | None:
        """Why a run's numbers cannot be believed, given the loop's clock check (a
        _native.ClockCheck), or None."""
        if not self.counter or check.span_ns < MIN_CHECKED_SPAN_NS:
            return None
        if abs(check.agreement - 1.0) <= AGREEMENT_TOLERANCE:
            return None
        return (f"the cycle counter measured {check.agreement:.4f} times CLOCK_MONOTONIC's "
                f"{check.span_ns / 1e6:.1f} ms over a run")


def monotonic(why: str) -> LoopClock:
    return LoopClock(False, 1.0, f"CLOCK_MONOTONIC ({why})" if why else "CLOCK_MONOTONIC")


def cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The first processor's flags in /proc/cpuinfo (x86: "flags", arm64: "Features")."""
    for line in cpuinfo.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def counter_distrust(machine: str, flags: frozenset[str]) -> str | None:
    """None where the cycle counter keeps time by the rules above, else why it does not."""
    if machine == "aarch64":
        return None
    missing = [flag for flag in COUNTER_FLAGS if flag not in flags]
    if missing:
        return f"the kernel does not report the TSC {' and '.join(missing)}"
    return None


@functools.cache
def counter_ns_per_tick() -> float:
    """The counter's ns per tick, calibrated once per process; 0.0 where it did not advance
    or this build reads none. (The extension is imported here, not with the module, so the
    CLI can name CLOCK_CHOICES without loading it.)"""
    from gdrprobe import _native

    return _native.calibrate_counter(CALIBRATION_WINDOW_NS)


@functools.cache
def this_cpus_flags() -> frozenset[str]:
    return cpu_flags(SysRoot().read("/proc/cpuinfo") or "")


def counter_clock(name: str, note: str = "") -> LoopClock | None:
    """The calibrated counter; None when there is none to read."""
    ns_per_tick = counter_ns_per_tick()
    if ns_per_tick <= 0:
        return None
    return LoopClock(True, ns_per_tick, f"{name} at {1e3 / ns_per_tick:.1f} MHz{note}, "
                                        "calibrated against CLOCK_MONOTONIC")


def loop_clock(choice: str = "auto", root: SysRoot | None = None,
               machine: str | None = None) -> LoopClock:
    """The clock for this process's loops: ``auto`` the counter where it is trusted,
    ``counter`` the counter wherever there is one (the per-run cross-check still applies),
    ``monotonic`` CLOCK_MONOTONIC."""
    if choice == "monotonic":
        return monotonic("asked for")
    machine = machine if machine is not None else platform.machine()
    if machine not in ("x86_64", "aarch64"):
        return monotonic(f"no cycle counter is read on {machine or 'this CPU'}")
    flags = cpu_flags(root.read("/proc/cpuinfo") or "") if root else this_cpus_flags()
    distrust = counter_distrust(machine, flags)
    if distrust and choice == "auto":
        return monotonic(distrust)
    name = "CNTVCT_EL0" if machine == "aarch64" else "TSC"
    note = f" (asked for, though {distrust})" if distrust else ""
    return counter_clock(name, note) or monotonic("the cycle counter did not advance")
