"""The node check (campaign/node.py): every GPU with its NCCL NIC in one process, one A/B per
NIC at a time, NICs in parallel, the worst exit code; one GPU's check is replaced by a
recorder, so nothing here opens a device."""

from __future__ import annotations

import math
import threading

import pytest

from gdrprobe.campaign import node
from gdrprobe.campaign.gate import Budget, GpuFacts, MachineFacts, NicChoice
from gdrprobe.campaign.memlock import LockedMemory
from gdrprobe.errors import CudaError, ExitCode
from gdrprobe.report.check import CheckReport, Verdict
from gdrprobe.report.check_text import render_node_check
from tests.unit.test_ab import SETTINGS
from tests.unit.test_prelaunch import GATE

UNLIMITED = LockedMemory(soft=math.inf, hard=math.inf)

BUS = ("0000:1b:00.0", "0000:1d:00.0", "0000:3d:00.0", "0000:3f:00.0")
# Two GPUs per NIC, as on an 8-GPU, 4-NIC node.
FACTS = MachineFacts(GpuFacts(BUS, BUS),
                     {bus: NicChoice(f"mlx5_{i // 2}", "NCCL's choice") for i, bus in enumerate(BUS)})


def report_with(classification: str, pair) -> CheckReport:
    return CheckReport(Verdict(classification), (), SETTINGS, 1, placement=pair)


class Recorder:
    """A check of one GPU that records who runs at once; GPUs of different NICs meet at a
    barrier, which only threads running at the same time can pass."""

    def __init__(self, outcomes: dict | None = None):
        self.outcomes = outcomes or {}
        self.lock = threading.Lock()
        self.active: dict[str, int] = {}
        self.most_at_once: dict[str, int] = {}
        self.budgets: dict[str, float | None] = {}
        self.barrier = threading.Barrier(2, timeout=10)

    def __call__(self, pair, facts, gate, budget, environ):
        with self.lock:
            self.active[pair.nic] = self.active.get(pair.nic, 0) + 1
            self.most_at_once[pair.nic] = max(self.most_at_once.get(pair.nic, 0),
                                              self.active[pair.nic])
            self.budgets[pair.gpu] = budget.seconds
        try:
            if pair.gpu in (BUS[0], BUS[2]):        # the first GPU of each NIC
                self.barrier.wait()
            outcome = self.outcomes.get(pair.gpu, "engaged")
            if isinstance(outcome, Exception):
                raise outcome
            return report_with(outcome, pair)
        finally:
            with self.lock:
                self.active[pair.nic] -= 1


def test_nics_run_in_parallel_and_each_nic_one_check_at_a_time():
    recorder = Recorder()
    report = node.check_node(FACTS, GATE, Budget(None), {}, recorder, UNLIMITED)
    assert recorder.most_at_once == {"mlx5_0": 1, "mlx5_1": 1}
    assert [(check.gpu, check.nic, check.exit_code) for check in report.gpus] == [
        (BUS[0], "mlx5_0", 0), (BUS[1], "mlx5_0", 0), (BUS[2], "mlx5_1", 0),
        (BUS[3], "mlx5_1", 0)]
    assert report.exit_code == 0


def test_the_gpus_of_one_nic_share_what_the_budget_has_left():
    recorder = Recorder()
    node.check_node(FACTS, GATE, Budget(60.0), {}, recorder, UNLIMITED)
    assert recorder.budgets[BUS[0]] == pytest.approx(30.0, abs=1.0)   # half of it, first


def test_the_node_exits_with_the_worst_gpu_and_an_error_is_one_gpus_answer():
    recorder = Recorder({BUS[1]: "not testable",
                         BUS[2]: CudaError("cuMemAlloc failed", "see dmesg"),
                         BUS[3]: ValueError("a bug")})
    report = node.check_node(FACTS, GATE, Budget(None), {}, recorder, UNLIMITED)
    codes = [check.exit_code for check in report.gpus]
    assert codes == [0, 9, int(CudaError.exit_code), int(ExitCode.INTERNAL)]
    assert report.exit_code == int(CudaError.exit_code)          # a drain before a warn
    assert report.gpus[2].error == "cuMemAlloc failed"
    assert report.gpus[3].error.startswith("internal error: ValueError: a bug")
    text = render_node_check(report)
    assert f"GPU {BUS[1]} via mlx5_0: not testable (exit 9: warn)" in text
    assert text.splitlines()[-1].startswith("node: 4 GPU(s) in ")
    assert text.splitlines()[-1].endswith(f"exit {report.exit_code}: drain")


@pytest.mark.parametrize("codes, worst", [((0, 9, 10), 10), ((0, 9, 1, 70), 1), ((), 0),
                                          ((2, 11, 6), 11)])
def test_worst_is_a_drain_before_a_warn_then_the_larger_code(codes, worst):
    assert node.worst_exit_code(codes) == worst


def test_a_node_without_a_gpu_checks_ordinal_0_so_its_answer_says_why():
    empty = MachineFacts(GpuFacts(None, (), "no CUDA driver"), {})
    recorder = Recorder({"0": "not testable"})
    recorder.barrier = threading.Barrier(1)
    report = node.check_node(empty, GATE, Budget(None), {}, recorder, UNLIMITED)
    assert [(check.gpu, check.exit_code) for check in report.gpus] == [("0", 9)]
