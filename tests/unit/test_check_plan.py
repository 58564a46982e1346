"""The check plan (campaign/plan.py): what a check call asks, checked and frozen below the
door before the machine is read; what NCCL decides joins it once the machine is read; the
extra answers are named in one place; the job's GPUs cross the door once and are matched to
the node's once."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest

import gdrprobe
from gdrprobe.campaign import job_gpus, machine, memlock
from gdrprobe.campaign.gate import GpuFacts, MachineFacts
from gdrprobe.campaign.plan import Buffer, CheckPlan, Criteria, on_machine
from gdrprobe.campaign.prelaunch import EXTRA_ANSWERS
from gdrprobe.errors import UsageError
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.report.check import CheckReport
from tests.unit.doctor import nccl_machines as nm

PLAN = CheckPlan(ProbeOptions(), send=Buffer("gpu"), receive=Buffer("gpu"))


@pytest.fixture
def never_read(monkeypatch):
    """Reading the machine fails the test: a bad keyword must be refused before it."""
    def read(**kwargs):
        raise AssertionError("the machine was read before the keywords were checked")

    monkeypatch.setattr(machine, "machine_facts", read)


@pytest.mark.parametrize("call, said", [
    (lambda: gdrprobe.check(mem="gpus"), "--mem 'gpus'"),
    (lambda: gdrprobe.check(remote_mem="hosts"), "--mem 'hosts'"),
    (lambda: gdrprobe.check(gpu_mem_type="vram"), "unknown GPU memory type 'vram'"),
    (lambda: gdrprobe.check(gpu_alloc="cudaMalloc"), "unknown GPU allocation"),
    (lambda: gdrprobe.check_node(mem="dmabuf", gpu_mem_type="managed"), "DMA-BUF export"),
    (lambda: gdrprobe.check(time_budget_s=0), "time budget 0 s"),
    (lambda: gdrprobe.check(qps=0), "QPs must be 1 to"),
    (lambda: gdrprobe.check_node(ib_port=0), "--ib-port 0"),
])
def test_every_part_of_the_plan_is_refused_before_the_machine_is_read(never_read, call, said):
    """The memory at each end was made only when a GPU's runs were planned, after the
    doctor had run: a typo in --mem cost a node check its whole doctor first."""
    with pytest.raises(UsageError, match=said.replace("(", r"\(")):
        call()


def test_a_plan_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLAN.staged = True      # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PLAN.criteria.threshold = 0.5     # type: ignore[misc]


def test_the_extra_answers_are_named_once():
    """Each extra answer is a row of EXTRA_ANSWERS: its name is the door's keyword (check
    and check_node), the report's field, and what the criteria ask for."""
    for door in (gdrprobe.check, gdrprobe.check_node):
        assert set(EXTRA_ANSWERS) <= set(inspect.signature(door).parameters)
    assert set(EXTRA_ANSWERS) <= {field.name for field in dataclasses.fields(CheckReport)}
    criteria = Criteria.asked(threshold=0.8, floor=0.5, repeats=3, latency=True, read=False,
                              bidir=True)
    assert criteria.answers == ("latency", "bidir") and criteria.asks("bidir")
    assert not criteria.asks("read")


def test_a_latency_bound_given_says_so():
    given = Criteria.asked(threshold=0.8, floor=0.5, repeats=3, latency_factor=3.0, latency=True)
    assert given.latency_factor == 3.0 and given.latency_factor_source.startswith("as given")
    assert Criteria().latency_factor == gdrprobe.defaults.LATENCY_FACTOR


def test_nccl_settings_join_the_plan_where_the_machine_is_read_unless_given():
    """NCCL_CUMEM_ENABLE=0 (cudaMalloc) and NCCL_IB_PCI_RELAXED_ORDERING=0, as NCCL reads
    them on this node, shape the GPU memory and the registrations; what was given stays."""
    facts = MachineFacts(GpuFacts(None, ()), {}, nccl_environ={
        "NCCL_CUMEM_ENABLE": "0", "NCCL_IB_PCI_RELAXED_ORDERING": "0"})
    there = on_machine(PLAN, facts)
    assert (there.send.allocation, there.receive.allocation) == ("malloc", "malloc")
    assert there.options.relaxed_ordering is False
    asked = dataclasses.replace(PLAN, send=Buffer("gpu", allocation="vmm"),
                                options=ProbeOptions(relaxed_ordering=True),
                                given=frozenset({"relaxed_ordering"}))
    kept = on_machine(asked, facts)
    assert kept.send.allocation == "vmm" and kept.receive.allocation == "malloc"
    assert kept.options.relaxed_ordering is True


def test_the_jobs_gpus_are_matched_to_the_node_once(tmp_path, monkeypatch, runs):
    """SLURM_JOB_GPUS crossed the door three times and was matched to the node's GPUs twice
    (for NCCL's communicator, then for the node check's GPUs): now once, and the node check
    measures exactly the GPUs NCCL's decision was made for."""
    nm.hgx_8gpu_4nic(tmp_path)
    for name in ("SLURM_STEP_GPUS", "NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_GPUS", "0,2")
    monkeypatch.setenv("GDRPROBE_LOCK_DIR", str(tmp_path / "locks"))
    real_facts, real_resolve = machine.machine_facts, job_gpus.resolve
    resolved = []

    def resolve(name, source, facts):
        resolved.append(name.text)
        return real_resolve(name, source, facts)

    monkeypatch.setattr(machine, "machine_facts",
                        lambda **asked: real_facts(str(tmp_path), {}, **asked))
    monkeypatch.setattr(job_gpus, "resolve", resolve)
    monkeypatch.setattr(memlock, "locked_memory",
                        lambda: memlock.LockedMemory(math.inf, math.inf))
    report = gdrprobe.check_node(time_budget_s=None, repeats=2)
    assert resolved == ["0", "2"]                        # one match, one name at a time
    assert [check.gpu for check in report.gpus] == ["0000:1b:00.0", "0000:3d:00.0"]
    assert report.job_gpus == "SLURM_JOB_GPUS=0,2: 0000:1b:00.0, 0000:3d:00.0"
