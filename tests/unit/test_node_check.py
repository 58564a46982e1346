"""The node check (campaign/node.py): every GPU with its NCCL NIC in one process, one A/B per
NIC at a time, NICs in parallel, the worst exit code; one GPU's check is replaced by a
recorder, so nothing here opens a device."""

from __future__ import annotations

import dataclasses
import math
import threading

import pytest

from gdrprobe.campaign import node
from gdrprobe.campaign.gate import Budget, GpuFacts, MachineFacts, NicChoice
from gdrprobe.campaign.job_gpus import job_gpus, match
from gdrprobe.campaign.memlock import LockedMemory
from gdrprobe.campaign.plan import Buffer, CheckPlan
from gdrprobe.errors import DRAIN_CODES, CudaError, ExitCode
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.report.check import CheckReport, Verdict
from gdrprobe.report.check_text import render_node_check
from tests.unit.fakes.runs import SETTINGS
UNLIMITED = LockedMemory(soft=math.inf, hard=math.inf)

BUS = ("0000:1b:00.0", "0000:1d:00.0", "0000:3d:00.0", "0000:3f:00.0")
# Two GPUs per NIC, as on an 8-GPU, 4-NIC node.
FACTS = MachineFacts(GpuFacts(BUS, BUS),
                     {bus: NicChoice(f"mlx5_{i // 2}", "NCCL's choice") for i, bus in enumerate(BUS)})


GATE = CheckPlan(ProbeOptions(), send=Buffer(), receive=Buffer())


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
        self.job_gpus: dict[str, tuple | None] = {}
        self.barrier = threading.Barrier(2, timeout=10)

    def __call__(self, pair, facts, gate, budget, environ):
        with self.lock:
            self.active[pair.nic] = self.active.get(pair.nic, 0) + 1
            self.most_at_once[pair.nic] = max(self.most_at_once.get(pair.nic, 0),
                                              self.active[pair.nic])
            self.budgets[pair.gpu] = budget.seconds
            self.job_gpus[pair.gpu] = gate.job_gpus
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
    report = node.check_node(FACTS, gate=GATE, budget=Budget(None), environ={},
                             check=recorder, memory=UNLIMITED)
    assert recorder.most_at_once == {"mlx5_0": 1, "mlx5_1": 1}
    assert [(check.gpu, check.nic, check.exit_code) for check in report.gpus] == [
        (BUS[0], "mlx5_0", 0), (BUS[1], "mlx5_0", 0), (BUS[2], "mlx5_1", 0),
        (BUS[3], "mlx5_1", 0)]
    assert report.exit_code == 0


def test_the_gpus_of_one_nic_share_what_the_budget_has_left():
    recorder = Recorder()
    node.check_node(FACTS, gate=GATE, budget=Budget(60.0), environ={}, check=recorder, memory=UNLIMITED)
    assert recorder.budgets[BUS[0]] == pytest.approx(30.0, abs=1.0)   # half of it, first


def test_the_node_exits_with_the_worst_gpu_and_an_error_is_one_gpus_answer():
    recorder = Recorder({BUS[1]: "not testable",
                         BUS[2]: CudaError("cuMemAlloc failed", "see dmesg"),
                         BUS[3]: ValueError("a bug")})
    report = node.check_node(FACTS, gate=GATE, budget=Budget(None), environ={},
                             check=recorder, memory=UNLIMITED)
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
    report = node.check_node(empty, gate=GATE, budget=Budget(None), environ={},
                             check=recorder, memory=UNLIMITED)
    assert [(check.gpu, check.exit_code) for check in report.gpus] == [("0", 9)]
    # Issue 29: the answer does not name a "GPU 0" the node does not have.
    first = render_node_check(report).splitlines()[1]
    assert first.startswith("no GPU found via -: ") and "GPU 0" not in first


# ---- the job's GPUs (issue 28) ---------------------------------------------------------


def node_check(environ, gpus=None, facts=FACTS, outcomes=None, parties=2):
    recorder = Recorder(outcomes)
    recorder.barrier = threading.Barrier(parties, timeout=10)
    job = match(job_gpus(environ, gpus), facts.gpus)      # as machine_facts matches it
    report = node.check_node(dataclasses.replace(facts, job=job), gate=GATE,
                             budget=Budget(None), environ=environ, check=recorder,
                             memory=UNLIMITED)
    return report, recorder


def test_a_slurm_prolog_checks_the_jobs_gpus_only():
    report, recorder = node_check({"SLURM_JOB_GPUS": "0,2", "SLURM_JOB_ID": "42"})
    assert [check.gpu for check in report.gpus] == [BUS[0], BUS[2]]
    assert set(recorder.budgets) == {BUS[0], BUS[2]}        # GPUs 1 and 3 are another job's
    assert report.job_gpus == f"SLURM_JOB_GPUS=0,2: {BUS[0]}, {BUS[2]}"
    assert recorder.job_gpus[BUS[0]] == (BUS[0], BUS[2])    # whose GPUs a hold is a fault of
    text = render_node_check(report)
    assert text.splitlines()[0] == f"the job's GPUs: SLURM_JOB_GPUS=0,2: {BUS[0]}, {BUS[2]}"


def test_the_step_before_the_job_and_gpu_before_both():
    environ = {"SLURM_JOB_GPUS": "0,1,2,3", "SLURM_STEP_GPUS": "2",
               "CUDA_VISIBLE_DEVICES": "0"}
    step, _ = node_check(environ, parties=1)
    assert [check.gpu for check in step.gpus] == [BUS[2]]
    given, _ = node_check(environ, gpus=f"{BUS[0]},1", parties=1)
    assert [check.gpu for check in given.gpus] == [BUS[0], BUS[1]]
    assert given.job_gpus.startswith("--gpu=")


def test_with_no_job_gpus_named_every_gpu_of_the_node_is_checked_and_the_report_says_so():
    report, recorder = node_check({})
    assert [check.gpu for check in report.gpus] == list(BUS)
    assert report.job_gpus.startswith("every GPU of the node: no job's GPUs were named")
    assert recorder.job_gpus[BUS[0]] == BUS                 # the whole node is the job's


@pytest.mark.parametrize("environ", [{"NVIDIA_VISIBLE_DEVICES": "void"},
                                     {"NVIDIA_VISIBLE_DEVICES": "none"},
                                     {"CUDA_VISIBLE_DEVICES": ""},
                                     {"CUDA_VISIBLE_DEVICES": "-1"}])
def test_a_job_without_a_gpu_has_nothing_to_measure_and_never_drains(environ):
    facts = MachineFacts(GpuFacts(None, BUS, "no CUDA driver"), FACTS.nics)
    report, recorder = node_check(environ, facts=facts)
    assert report.gpus == () and recorder.budgets == {}
    assert report.exit_code == ExitCode.NOT_TESTABLE and report.exit_code not in DRAIN_CODES
    assert "the job has no GPU on this node" in render_node_check(report)


def test_a_named_gpu_the_node_lacks_or_cuda_hides_is_that_gpus_not_testable_answer():
    visible = MachineFacts(GpuFacts(BUS[:2], BUS), FACTS.nics)   # CUDA shows GPUs 0 and 1
    report, _ = node_check({"SLURM_JOB_GPUS": "1,2,7"}, facts=visible, parties=1)
    answers = {check.gpu: (check.exit_code, check.error) for check in report.gpus}
    assert answers[BUS[1]][0] == 0
    assert answers[BUS[2]] == (9, "not testable: CUDA does not show this GPU to this process "
                                  "(CUDA_VISIBLE_DEVICES)")
    assert answers["7"][0] == 9 and "none of index 7" in answers["7"][1]
    assert "Slurm counts MIG devices one by one" in answers["7"][1]
    assert report.exit_code == 9
