"""A run sized to the locked-memory limit: at the stock 8 MiB a non-root user still runs the
default `run --loopback` (fewer integrity slots, the same measurement), and a run that cannot
fit is refused before anything starts with the number it needs and how to raise the limit."""

from __future__ import annotations

import dataclasses
import math
import resource
import threading
import time

import pytest

import gdrprobe
from gdrprobe import defaults
from gdrprobe.campaign import memlock
from gdrprobe.campaign.memlock import LockedMemory, fit_to_memlock, locked_memory, pinned_bytes
from gdrprobe.errors import ExitCode, ResourceLimit
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.report.check_text import render_node_check
from gdrprobe.sysroot import SysRoot

MiB = 1 << 20
STOCK = LockedMemory(soft=8 * MiB, hard=8 * MiB)     # Linux >= 5.16's default, no capability


def test_the_default_loopback_run_does_not_fit_8_mib_as_it_is():
    """What the issue saw: both ends' buffers (64 slots of 64 KiB and one past them, each)
    and the queues pass 8 MiB."""
    assert pinned_bytes(ProbeOptions(), ends=2) > 8 * MiB


def test_the_default_loopback_run_is_sized_to_the_stock_limit():
    notices = []
    options = ProbeOptions()
    fitted = fit_to_memlock(options, 2, STOCK, notices.append)
    assert pinned_bytes(fitted, 2) <= 8 * MiB
    size = defaults.SIZE
    assert 1 < fitted.slots(size) < options.slots(size) == 64
    # Only the integrity ring changed: the run measures what it would have measured.
    assert (fitted.sizes, fitted.iterations, fitted.qps, fitted.tx_depth) == \
        (options.sizes, options.iterations, options.qps, options.tx_depth)
    # The most slots that fit: one more would not.
    more = ProbeOptions(integrity_bytes=(fitted.slots(size) + 1) * size)
    assert pinned_bytes(more, 2) > 8 * MiB
    (notice,) = notices
    assert f"holds {fitted.slots(size)} integrity slots of {size} B per end instead of 64" \
        in notice


def test_the_gpu_a_b_fits_with_one_slot_and_a_server_run_needs_one_end():
    a_b = ProbeOptions(sizes=(defaults.A_B_SIZE,))
    assert fit_to_memlock(a_b, 2, STOCK).slots(defaults.A_B_SIZE) == 1
    one_end, two_ends = (fit_to_memlock(ProbeOptions(), ends, STOCK) for ends in (1, 2))
    assert one_end.slots(defaults.SIZE) > two_ends.slots(defaults.SIZE)


@pytest.mark.parametrize("memory", [
    LockedMemory(soft=math.inf, hard=math.inf),
    LockedMemory(soft=64 << 10, hard=64 << 10, exempt=True),       # CAP_IPC_LOCK: no limit
    LockedMemory(soft=64 * MiB, hard=64 * MiB)])
def test_a_run_that_fits_is_left_as_it_is(memory):
    assert fit_to_memlock(ProbeOptions(), 2, memory) == ProbeOptions()


def test_what_is_already_pinned_counts():
    pinned = LockedMemory(soft=8 * MiB, hard=8 * MiB, pinned=2 * MiB)
    fitted = fit_to_memlock(ProbeOptions(), 2, pinned)
    assert pinned_bytes(fitted, 2) <= 6 * MiB < pinned_bytes(fit_to_memlock(ProbeOptions(), 2,
                                                                             STOCK), 2)


def test_a_run_that_cannot_fit_says_the_number_and_how_to_raise_the_limit():
    big = ProbeOptions(sizes=(8 * MiB,))
    with pytest.raises(ResourceLimit) as raised:
        fit_to_memlock(big, 2, LockedMemory(soft=8 * MiB, hard=64 * MiB))
    error = raised.value
    need = 2 * (16 * MiB) + pinned_bytes(big, 0)          # two 8 MiB slots each, the queues
    assert error.exit_code == ExitCode.RESOURCE_LIMIT
    assert f"this run pins {need / MiB:.1f} MiB of host memory" in error.cause
    assert "locked-memory limit of 8.0 MiB" in error.cause
    assert f"at least {need >> 10} KiB: 'ulimit -l {need >> 10}'" in error.fix
    assert "soft 8.0 MiB, hard 64.0 MiB; CAP_IPC_LOCK not held" in error.evidence


def test_without_room_in_the_hard_limit_the_fix_is_where_the_limit_is_set():
    with pytest.raises(ResourceLimit) as raised:
        fit_to_memlock(ProbeOptions(sizes=(8 * MiB,)), 2, STOCK)
    assert "ulimit -l" not in raised.value.fix.split(":")[1]
    assert "memlock" in raised.value.fix        # limits.conf, --ulimit memlock or IPC_LOCK


def test_the_limit_is_read_from_getrlimit_and_proc_status(tmp_path, monkeypatch):
    status = tmp_path / "proc" / "self" / "status"
    status.parent.mkdir(parents=True)
    status.write_text("Name:\tpython\nVmPin:\t    1024 kB\nCapEff:\t00000000a80425fb\n")
    monkeypatch.setattr(resource, "getrlimit", lambda which: (8 * MiB, resource.RLIM_INFINITY))
    assert locked_memory(SysRoot(str(tmp_path))) == LockedMemory(8 * MiB, math.inf, MiB, False)
    status.write_text("VmPin:\t0 kB\nCapEff:\t000001ffffffffff\n")       # root: CAP_IPC_LOCK
    assert locked_memory(SysRoot(str(tmp_path))).room == math.inf


def test_the_integrity_bytes_travel_to_the_server():
    fitted = fit_to_memlock(ProbeOptions(), 2, STOCK)
    assert ProbeOptions.from_message(fitted.to_message()) == fitted
    assert ProbeOptions.from_message(fitted.to_message()).buffer_bytes == fitted.buffer_bytes


# ---- through the public API ----------------------------------------------------------------


def test_run_loopback_at_the_stock_limit_runs_sized_to_it(monkeypatch):
    """gdrprobe.run(loopback=True) as a non-root user at 8 MiB: the run starts, sized."""
    from gdrprobe.measure import loopback

    asked = []

    def runner(options, *args, **kwargs):
        asked.append(options)
        return lambda local, remote: "measured"

    notices = []
    monkeypatch.setattr(loopback, "runner", runner)
    monkeypatch.setattr(memlock, "locked_memory", lambda: STOCK)
    assert gdrprobe.run(loopback=True, notice=notices.append) == "measured"
    (options,) = asked
    assert pinned_bytes(options, 2) <= 8 * MiB and options.slots(defaults.SIZE) > 1
    assert "integrity slots" in notices[0]


def test_run_that_cannot_fit_is_refused_before_anything_starts(monkeypatch):
    from gdrprobe.measure import loopback

    monkeypatch.setattr(loopback, "runner", lambda *a, **k: pytest.fail("a run started"))
    monkeypatch.setattr(memlock, "locked_memory", lambda: STOCK)
    with pytest.raises(ResourceLimit, match="more than the locked-memory limit"):
        gdrprobe.run(loopback=True, size=8 * MiB)


# ---- the node check: one process, every NIC, one limit ---------------------------------

CHECK = ProbeOptions(sizes=(defaults.A_B_SIZE,), qps=defaults.CHECK_QPS)


def test_eight_nics_checked_at_once_as_they_are_pin_far_more_than_the_stock_limit():
    """What the issue saw: each loopback check pins two 5 MiB buffers and the queues."""
    assert 8 * pinned_bytes(CHECK, 2) == 112 * MiB


@pytest.mark.parametrize("memory", [LockedMemory(soft=math.inf, hard=math.inf),
                                    LockedMemory(soft=MiB, hard=MiB, exempt=True),
                                    LockedMemory(soft=112 * MiB, hard=112 * MiB)])
def test_a_node_check_that_fits_runs_every_nic_at_once_as_asked(memory):
    assert memlock.fit_node_to_memlock(CHECK, 2, 8, memory) == memlock.NodeFit(CHECK, 8)


def test_a_node_check_shares_the_limit_with_fewer_slots_per_nic():
    fit = memlock.fit_node_to_memlock(CHECK, 2, 8, LockedMemory(64 * MiB, 64 * MiB))
    assert fit.at_once == 8 and 8 * pinned_bytes(fit.options, 2) <= 64 * MiB
    assert fit.options.slots(defaults.A_B_SIZE) == 1 < CHECK.slots(defaults.A_B_SIZE) == 4
    assert "holds 1 integrity slots of 1048576 B per end instead of 4 in each NIC's check" \
        in fit.note
    assert "NICs' checks at a time" not in fit.note


def test_at_the_stock_limit_the_nics_take_turns_and_the_node_never_pins_more():
    fit = memlock.fit_node_to_memlock(CHECK, 2, 8, STOCK)
    assert fit.at_once == 1 and pinned_bytes(fit.options, 2) <= 8 * MiB
    assert "1 of the 8 NICs' checks at a time (the others take their turn)" in fit.note
    assert "the node check at most 8.0 MiB of the 8.0 MiB this process may pin" in fit.note
    two = memlock.fit_node_to_memlock(CHECK, 2, 8, LockedMemory(20 * MiB, 20 * MiB))
    assert two.at_once == 2 and 2 * pinned_bytes(two.options, 2) <= 20 * MiB


def test_against_a_server_a_node_check_pins_one_end_per_nic():
    fit = memlock.fit_node_to_memlock(CHECK, 1, 8, LockedMemory(48 * MiB, 48 * MiB))
    assert fit.at_once == 8 and 8 * pinned_bytes(fit.options, 1) <= 48 * MiB


def test_a_limit_that_holds_not_even_one_check_is_refused_with_the_number():
    with pytest.raises(ResourceLimit, match="this run pins 8.0 MiB of host memory"):
        memlock.fit_node_to_memlock(CHECK, 2, 8, LockedMemory(6 * MiB, 6 * MiB))


def test_lanes_keep_each_nics_gpus_together_and_balance_the_rest():
    from gdrprobe.campaign.node import in_lanes

    groups = [["a0", "a1"], ["b0"], ["c0", "c1", "c2"], ["d0"]]
    assert in_lanes(groups, 2) == [["c0", "c1", "c2", "d0"], ["a0", "a1", "b0"]]
    assert in_lanes(groups, 1) == [["c0", "c1", "c2", "a0", "a1", "b0", "d0"]]
    assert sorted(map(tuple, in_lanes(groups, 8))) == sorted(map(tuple, groups))


class Concurrency:
    """A node check's GPU check that records the options it got and how many ran at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running = self.most = 0
        self.options, self.budgets = [], []

    def __call__(self, pair, facts, gate, budget, environ):
        from gdrprobe.report.check import CheckReport, Verdict
        from tests.unit.fakes.runs import SETTINGS
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
            self.options.append(gate.options)
            self.budgets.append(budget.seconds)
        time.sleep(0.01)         # long enough for another NIC's thread to start, if it may
        with self.lock:
            self.running -= 1
        return CheckReport(Verdict("engaged"), (), SETTINGS, 1, placement=pair)


def eight_nic_node():
    from gdrprobe.campaign.gate import GpuFacts, MachineFacts, NicChoice

    buses = tuple(f"0000:{bus:02x}:00.0" for bus in range(0x10, 0x18))
    return MachineFacts(GpuFacts(buses, buses),
                        {bus: NicChoice(f"mlx5_{i}", "NCCL's choice") for i, bus in enumerate(buses)})


def test_check_node_at_the_stock_limit_checks_every_gpu_one_nic_at_a_time():
    from gdrprobe.campaign import node
    from gdrprobe.campaign.gate import Budget
    from tests.unit.fakes.prelaunch import GATE
    recorder = Concurrency()
    report = node.check_node(eight_nic_node(), GATE, Budget(80.0), {}, recorder, STOCK)
    assert [check.exit_code for check in report.gpus] == [0] * 8
    assert recorder.most == 1
    assert {pinned_bytes(options, 2) for options in recorder.options} == {8 * MiB}
    assert recorder.budgets[0] == pytest.approx(10.0, abs=1.0)     # an eighth of 80 s, first
    assert "1 of the 8 NICs' checks at a time" in report.memlock
    assert report.memlock in render_node_check(report)


def test_check_node_with_room_runs_the_nics_at_once_and_says_nothing():
    from gdrprobe.campaign import node
    from gdrprobe.campaign.gate import Budget
    from tests.unit.fakes.prelaunch import GATE
    recorder = Concurrency()
    report = node.check_node(eight_nic_node(), GATE, Budget(None), {}, recorder,
                             LockedMemory(math.inf, math.inf))
    assert set(recorder.options) == {GATE.options} and report.memlock == ""


def test_check_at_the_stock_limit_runs_sized_to_it(monkeypatch):
    """gdrprobe.check() as a non-root user at 8 MiB: its loopback A/B fits, not exit 8."""
    from gdrprobe.campaign import machine, prelaunch
    from gdrprobe.campaign.gate import GpuFacts, MachineFacts

    asked = []
    monkeypatch.setattr(machine, "machine_facts",
                        lambda **_: MachineFacts(GpuFacts(("0000:3b:00.0",), ("0000:3b:00.0",)), {}))
    monkeypatch.setattr(memlock, "locked_memory", lambda: STOCK)
    monkeypatch.setattr(prelaunch, "check_pair",
                        lambda pair, facts, gate, budget, environ: asked.append(gate.options))
    gdrprobe.check(gpu="0", device="mlx5_0")
    (options,) = asked
    assert pinned_bytes(options, 2) <= 8 * MiB < pinned_bytes(dataclasses.replace(
        options, integrity_bytes=defaults.INTEGRITY_CAP_BYTES), 2)
