"""The check measures the registration NCCL will use (issue 28, item 2): NCCL's decision names
the mechanism (DMA-BUF or peer memory) with the rule and the release that chose it
(src/transport/net.cc useDmaBuf, src/init.cc dmaBufSupported), and the GPU arm of ``check``,
``check --node``, ``require`` and ``run`` registers its memory that way where ``--mem gpu``
leaves it open; ``--mem dmabuf`` and ``--mem peermem`` stay as asked. Before, the GPU arm took
DMA-BUF wherever the GPU and the NIC allowed it, whatever NCCL would do."""

from __future__ import annotations

import pytest

import gdrprobe
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.campaign.plan import Buffer, CheckPlan
from gdrprobe.memory.buffers import mechanism_for
from gdrprobe.memory.nic_probe import NicDmaBufSupport
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.measure.options import ProbeOptions
from tests.unit.doctor import nccl_machines as nm
from tests.unit.doctor.nccl_libraries import built_library
from tests.unit.fakes.runs import fake_probe
from tests.unit.fakes.prelaunch import check

GPU = "0000:1b:00.0"


def gpu_mechanisms(made) -> set[str]:
    return {spec.mechanism for _, _, local, remote in made for spec in (local, remote) if spec.kind == "gpu"}


def node(tmp_path, version: str | None = None, nic_dmabuf: bool = True):
    tree = nm.dmabuf_and_peermem(tmp_path)
    if not nic_dmabuf:
        nm.nic_probe(tree, {"mlx5_0": nm.EOPNOTSUPP, "mlx5_1": nm.EOPNOTSUPP})
    if version:
        built_library(tree, "/usr/lib64", version)
    return tree


@pytest.mark.parametrize("version, environ, mechanism, rule", [
    (None, {"NCCL_DMABUF_ENABLE": "0"}, "peermem", "NCCL_DMABUF_ENABLE=0 switches it off"),
    ("2.12.12", {}, "peermem", "NCCL 2.12.12 predates DMA-BUF registration"),
    ("2.21.5", {}, "dmabuf", "NCCL 2.21.5 registers GPU memory through DMA-BUF"),
    (None, {}, "dmabuf", "NCCL (version unknown: 2.31.0's rules) registers GPU memory through DMA-BUF"),
])
def test_the_check_registers_as_nccl_does(tmp_path, runs, locks, version, environ, mechanism, rule):  # noqa: F811
    node(tmp_path, version)
    facts = machine_facts(str(tmp_path), environ)
    use = facts.nccl[GPU]
    assert use.uses_gdr and use.mechanism == mechanism and rule in use.mechanism_reason
    # The other mechanism is said, as information only.
    other = "peer memory is there too" if mechanism == "dmabuf" else "information only: not measured"
    assert other in use.mechanism_reason
    report = check(facts, GPU, locks)
    assert gpu_mechanisms(runs) == {mechanism}
    assert {spec.reason for _, _, local, _ in runs for spec in (local,) if spec.kind == "gpu"} == \
        {use.mechanism_reason}
    assert report.verdict.nccl.mechanism == mechanism


@pytest.mark.parametrize("version, mechanism", [("2.13.4", "dmabuf"), ("2.14.3", "peermem")])
def test_nccl_2_13_registers_through_dmabuf_without_asking_the_nic(tmp_path, version, mechanism):
    """2.13.x net.cc: ``type == NCCL_PTR_CUDA && comm->dmaBufSupport`` (the GPU side only);
    2.14.3 added ``props.ptrSupport & NCCL_PTR_DMABUF``. A NIC that cannot register DMA-BUF
    then fails NCCL 2.13's registrations, and the check measures that failure."""
    node(tmp_path, version, nic_dmabuf=False)
    facts = machine_facts(str(tmp_path), {})
    use = facts.nccl[GPU]
    assert use.uses_gdr and use.mechanism == mechanism
    path = next(f for f in facts.findings if f.id == "stack.path")
    assert (path.status.value, "registrations will fail" in path.summary) == \
        (("fail", True) if mechanism == "dmabuf" else ("ok", False))


@pytest.mark.parametrize("choice", ["dmabuf", "peermem"])
def test_an_explicit_mechanism_stays_as_asked(tmp_path, runs, locks, choice):  # noqa: F811
    node(tmp_path)
    facts = machine_facts(str(tmp_path), {"NCCL_DMABUF_ENABLE": "0"})
    gate = CheckPlan(options=ProbeOptions(sizes=(1 << 20,), qps=2), send=Buffer(choice),
                     receive=Buffer(choice))
    check(facts, GPU, locks, gate=gate)
    assert gpu_mechanisms(runs) == {choice}


def test_run_with_mem_gpu_follows_nccl(tmp_path, monkeypatch):
    from gdrprobe.campaign import machine
    from gdrprobe.measure import loopback
    from gdrprobe.memory import cuda_driver
    from gdrprobe.rdma import verbs

    node(tmp_path)
    facts = machine_facts(str(tmp_path), {"NCCL_DMABUF_ENABLE": "0"})
    run_once, _ = fake_probe(gpu_gbps=97.0)
    made = []

    def runner(options, endpoint, host=None, port=None, token=None, connect_wait_s=0.0,
               on_result=None, notice=None):
        def probe(local, remote):
            made.append((endpoint, options, local, remote))
            return run_once(local, remote)
        return probe

    monkeypatch.setattr(loopback, "runner", runner)
    monkeypatch.setattr(verbs, "devices", lambda: {"mlx5_0": None})
    monkeypatch.setattr(cuda_driver, "require_driver_library", lambda: None)
    monkeypatch.setattr(machine, "run_facts", lambda local, loopback: facts)
    gdrprobe.run(loopback=True, mem="gpu", gpu=GPU, remote_mem="gpu")
    assert gpu_mechanisms(made) == {"peermem"}
    made.clear()
    gdrprobe.run(loopback=True, mem="dmabuf", gpu=GPU)
    assert gpu_mechanisms(made) == {"dmabuf"}


def test_the_buffer_says_nccls_rule_as_its_reason():
    spec = MemorySpec(kind="gpu", mechanism="peermem", reason="NCCL 2.12.12 registers GPU memory through peer memory")
    assert mechanism_for(spec, None, NicDmaBufSupport(True, 9, "ok")) == ("peermem", spec.reason)
    assert MemorySpec.from_message(spec.to_message()) == spec
