"""Every rail at once (campaign/rails.py, check --node --all-rails): each NIC's A/B alone,
then every rail's loops in real threads behind one barrier. A rail's A/B and its loop are
replaced by doubles (no device is opened); the windows are real monotonic times."""

from __future__ import annotations

import itertools
import math
import threading
import time

import pytest

from gdrprobe.campaign import node, rails
from gdrprobe.campaign.gate import Budget, GpuFacts, MachineFacts, NicChoice, PortFacts
from gdrprobe.campaign.memlock import LockedMemory
from gdrprobe.campaign.plan import Buffer, CheckPlan
from gdrprobe.cli import main
from gdrprobe.doctor.facts.rails import Rail, read_links
from gdrprobe.doctor.facts.topology import build_topology
from gdrprobe.errors import DRAIN_CODES, ExitCode, RdmaError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.report.check import ArmReport, CheckReport, LoopWindow, NodeGpuCheck, Verdict
from gdrprobe.report.check_text import render_node_check
from gdrprobe.report.model import to_json
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines
from tests.unit.fakes.runs import SETTINGS
UNLIMITED = LockedMemory(soft=math.inf, hard=math.inf)
GATE = CheckPlan(ProbeOptions(), send=Buffer(), receive=Buffer())
BUS = ("0000:05:00.0", "0000:06:00.0")      # the GPUs of machines.narrow_uplink_node
PORTS = {(f"mlx5_{i}", 1): PortFacts(400.0, "InfiniBand") for i in range(2)}
FACTS = MachineFacts(GpuFacts(BUS, BUS), {bus: NicChoice(f"mlx5_{i}", "NCCL's choice")
                                          for i, bus in enumerate(BUS)}, ports=PORTS)
SOLO_GBPS, HOST_GBPS = 380.0, 390.0
# Long against a thread's wake-up on a loaded machine: the windows must overlap by
# defaults.RAILS_MIN_OVERLAP (0.8), so a loop woken a fifth of a window late reads as rails
# that did not run together. 0.2 s failed twice on 2 cores under pytest-xdist's workers and
# other jobs; 0.5 s allows 100 ms.
WINDOW_S = 0.5


def arm(name: str, gbps: float, role: str) -> ArmReport:
    return ArmReport(name, "measured", 1 << 20, (gbps, gbps), {}, {}, "", "", "", role=role)


class Solo:
    """A GPU's A/B alone: engaged at SOLO_GBPS; records how many NICs ran at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.active = self.most_at_once = 0

    def __call__(self, pair, facts, gate, budget, environ):
        with self.lock:
            self.active += 1
            self.most_at_once = max(self.most_at_once, self.active)
        time.sleep(0.01)
        with self.lock:
            self.active -= 1
        arms = (arm("host", HOST_GBPS, ""), arm("dmabuf", SOLO_GBPS, "decides"))
        return CheckReport(Verdict("engaged"), arms, SETTINGS, 2, placement=pair)


class Together:
    """One rail's loop run with the others: set-up of a different length per rail, then the
    barrier, then a window; ``gbps`` by NIC (GPU arm), ``late`` delays a rail's window
    after the barrier, ``fail`` raises for a NIC before it is ready."""

    def __init__(self, gbps: dict[str, float] | None = None, late: dict[str, float] | None = None,
                 fail: str | None = None):
        self.gbps, self.late, self.fail = gbps or {}, late or {}, fail
        self.lock = threading.Lock()
        self.active = self.most_at_once = 0
        self.seconds: list[float] = []

    def make(self, facts, gate, seconds, environ):
        self.seconds.append(seconds)
        return self.loop

    def loop(self, pair, host, ready):
        time.sleep(0.02 * int(pair.nic[-1]))      # the rails set up at different speeds
        if pair.nic == self.fail:
            raise RdmaError("ibv_reg_mr failed")
        ready()
        with self.lock:
            self.active += 1
            self.most_at_once = max(self.most_at_once, self.active)
        time.sleep(self.late.get(pair.nic, 0.0))
        start = time.monotonic()
        time.sleep(WINDOW_S)
        with self.lock:
            self.active -= 1
        gbps = HOST_GBPS if host else self.gbps.get(pair.nic, SOLO_GBPS)
        return LoopWindow(gbps, start, time.monotonic())


def check_all(together: Together, facts=FACTS, budget=None):
    return node.check_node(facts, GATE, Budget(budget), {}, check=Solo(), memory=UNLIMITED,
                           every_rail=True, make_loop=together.make)


def test_rails_that_keep_their_solo_bandwidth_together_pass():
    together = Together()
    report = check_all(together)
    result = report.rails
    assert together.most_at_once == 2           # the barrier let both loops run at once
    assert result.verdict == "together" and result.exit_code == 0 and report.exit_code == 0
    assert [(r.nic, r.solo_gbps, r.concurrent_gbps, r.ratio, r.host_ratio) for r in result.rails] == [
        ("mlx5_0", SOLO_GBPS, SOLO_GBPS, 1.0, 1.0), ("mlx5_1", SOLO_GBPS, SOLO_GBPS, 1.0, 1.0)]
    assert (result.aggregate_gbps, result.solo_sum_gbps, result.line_rate_sum_gbps) == (760.0, 760.0, 800.0)
    # the second rail set up 20 ms later, yet its window started with the first one's
    assert result.overlap.skew_s < WINDOW_S / 2 and result.overlap.fraction >= 0.8
    assert result.host_overlap is not None


def test_rails_that_fall_only_together_contend_and_warn_without_draining():
    report = check_all(Together({"mlx5_0": 190.0, "mlx5_1": 185.0}))
    result = report.rails
    assert result.verdict == "contention" and result.exit_code == ExitCode.PERFORMANCE_WARNING == 13
    assert [r.contending for r in result.rails] == [True, True]
    assert [check.exit_code for check in report.gpus] == [0, 0]     # each engaged alone
    assert report.exit_code == 13 and 13 not in DRAIN_CODES
    assert "2 of 2 rails keep less than 0.90 of their solo bandwidth together" in result.detail
    text = render_node_check(report)
    assert "contends" in text and "aggregate 375.0 Gb/s; alone summed 760.0, line rates 800.0" in text
    assert '"verdict": "contention"' in to_json(report)


def test_contention_names_the_narrow_uplink_the_rails_share(tmp_path):
    machines.narrow_uplink_node(tmp_path)
    topology = build_topology(SysRoot(str(tmp_path)))
    links = read_links(SysRoot(str(tmp_path)), [Rail(g, n) for g in topology.gpus for n in topology.nics])
    facts = MachineFacts(FACTS.gpus, FACTS.nics, ports=PORTS, topology=topology, pcie_links=links)
    result = check_all(Together({"mlx5_0": 63.0, "mlx5_1": 63.0}), facts).rails
    assert result.shared["kind"] == "switch port" and result.shared["name"] == "0000:01:00.0"
    assert result.shared["oversubscribed"] is True and result.shared["link_width"] == "8"
    assert "they share the switch port 0000:01:00.0, x8 at 16.0 GT/s PCIe (126 Gb/s)" in result.detail


def test_one_rail_that_falls_together_still_names_what_every_rail_shares(tmp_path):
    machines.two_root_ports_node(tmp_path)
    topology = build_topology(SysRoot(str(tmp_path)))
    bus = tuple(gpu.bdf for gpu in topology.gpus)
    facts = MachineFacts(GpuFacts(bus, bus), {b: NicChoice(f"mlx5_{i}", "") for i, b in enumerate(bus)},
                         ports=PORTS, topology=topology)
    result = check_all(Together({"mlx5_1": 100.0}), facts).rails
    assert [r.contending for r in result.rails] == [False, True]
    assert (result.shared["kind"], result.shared["name"]) == ("root complex", "pci0000:00")


def test_windows_that_do_not_overlap_are_inconclusive_never_a_verdict():
    report = check_all(Together({"mlx5_0": 100.0}, late={"mlx5_1": 4 * WINDOW_S}))
    assert report.rails.verdict == "inconclusive" and report.exit_code == ExitCode.INCONCLUSIVE
    assert report.rails.overlap.fraction == 0.0 and "did not run together" in report.rails.detail
    assert ExitCode.INCONCLUSIVE not in DRAIN_CODES


def test_a_rail_failing_together_releases_the_others_and_is_inconclusive():
    report = check_all(Together(fail="mlx5_1"))
    result = report.rails
    assert result.verdict == "inconclusive" and report.exit_code == 12
    assert result.rails[1].error == "RdmaError: ibv_reg_mr failed"
    assert result.rails[0].error.startswith("did not start: another rail failed")


class GpuPassFails(Together):
    """A rail whose GPU arm fails together, while every host arm runs together."""

    def loop(self, pair, host, ready):
        self.fail = None if host else "mlx5_1"
        return super().loop(pair, host, ready)


def test_a_gpu_pass_that_failed_has_no_overlap_and_the_host_pass_keeps_its_own():
    result = check_all(GpuPassFails()).rails
    assert result.verdict == "inconclusive" and result.rails[1].error == "RdmaError: ibv_reg_mr failed"
    assert result.overlap is None                   # the GPU pass's: it did not run together
    assert result.host_overlap is not None and result.host_overlap.fraction >= 0.8


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_a_rails_solo_figures_are_its_deciding_and_host_arms_in_any_order(order):
    arms = (arm("host", HOST_GBPS, ""), arm("dmabuf", SOLO_GBPS, "decides"),
            arm("staged", 100.0, "reference"), arm("dmabuf", 50.0, "diagnoses"))
    report = CheckReport(Verdict("engaged"), tuple(arms[i] for i in order), SETTINGS, 2)
    check = NodeGpuCheck(BUS[0], "mlx5_0", 0, report)
    assert (rails.solo_gbps(check), rails.solo_gbps(check, host=True)) == (SOLO_GBPS, HOST_GBPS)


def test_the_solos_run_one_nic_at_a_time_and_leave_budget_for_the_rails():
    solo, together = Solo(), Together()
    node.check_node(FACTS, GATE, Budget(60.0), {}, check=solo, memory=UNLIMITED,
                    every_rail=True, make_loop=together.make)
    assert solo.most_at_once == 1
    assert together.seconds and 20.0 < together.seconds[0] <= 30.0


def test_a_budget_spent_by_the_solos_is_inconclusive():
    clock = itertools.chain([0.0], itertools.repeat(100.0)).__next__
    report = node.check_node(FACTS, GATE, Budget(10.0, clock=clock), {}, check=Solo(),
                             memory=UNLIMITED, every_rail=True, make_loop=Together().make)
    assert report.rails.verdict == "inconclusive" and "larger --time-budget" in report.rails.detail


def test_a_locked_memory_limit_that_holds_fewer_nics_than_rails_is_inconclusive():
    together = Together()
    tight = LockedMemory(soft=8 << 20, hard=8 << 20)     # one NIC's loopback runs at a time
    report = node.check_node(FACTS, GATE, Budget(None), {}, check=Solo(), memory=tight,
                             every_rail=True, make_loop=together.make)
    assert report.rails.verdict == "inconclusive" and "locked-memory limit holds 1" in report.rails.detail
    assert together.seconds == []                    # nothing ran together


def test_one_nic_has_nothing_to_run_together():
    facts = MachineFacts(FACTS.gpus, {bus: NicChoice("mlx5_0", "") for bus in BUS}, ports=PORTS)
    report = check_all(Together(), facts)
    assert report.rails.verdict == "one rail" and report.exit_code == 0


def test_without_all_rails_there_is_no_rails_report():
    report = node.check_node(FACTS, GATE, Budget(None), {}, check=Solo(), memory=UNLIMITED)
    assert report.rails is None


@pytest.mark.parametrize("rails_in_flight, timeout_s, expected", [(2, 60.0, 10.0), (8, 60.0, 30.0),
                                                                 (1, 4.0, 2.0)])
def test_the_barrier_waits_longer_with_more_rails_in_flight_never_past_half_the_timeout(
        rails_in_flight, timeout_s, expected):
    assert rails.barrier_timeout_s(rails_in_flight, timeout_s) == expected


def test_all_rails_without_node_is_refused_before_anything_runs(capsys):
    assert main(["check", "--all-rails"]) == 2
    assert "add --node" in capsys.readouterr().err


def test_the_cli_asks_for_all_rails_and_a_quiet_prolog_says_why_it_warns(monkeypatch, capsys):
    import gdrprobe

    asked = {}
    contended = check_all(Together({"mlx5_0": 190.0, "mlx5_1": 185.0}))
    monkeypatch.setattr(gdrprobe, "check_node", lambda **kwargs: asked.update(kwargs) or contended)
    assert main(["check", "--node", "--all-rails", "--quiet"]) == 13
    assert asked["all_rails"] is True
    assert "all rails: contention, aggregate 375.0 of 760.0 Gb/s alone (exit 13: warn)" in (
        capsys.readouterr().err)


def test_the_runs_together_wait_no_longer_than_their_pass():
    together = Together()
    gates = []

    def make(facts, gate, seconds, environ):
        gates.append(gate)
        return together.loop

    node.check_node(FACTS, GATE, Budget(30.0), {}, check=Solo(), memory=UNLIMITED,
                    every_rail=True, make_loop=make)
    assert gates[0].options.timeout_s <= 15.0 < GATE.options.timeout_s
