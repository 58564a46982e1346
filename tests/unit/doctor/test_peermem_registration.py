"""nvidia-peermem loaded but not registered with MLNX_OFED's peer-memory API. NCCL checks only
that the module's version file exists (src/transport/net_ib/gdr.cc ncclIbGdrSupport), so it
believes GPUDirect RDMA works; a registered module is listed in /sys/kernel/mm/memory_peers
as nv_mem (open-gpu-kernel-modules nvidia-peermem.c nv_mem_client_init). Was: stack.peermem
OK, and every GPU's decision OK."""

from __future__ import annotations

from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report.model import Status
from tests.unit.doctor import nccl_machines


def findings(report):
    return {f.id: f for f in report.findings}


def test_loaded_but_unregistered_peermem_fails_with_the_rebuild_fix(tmp_path):
    nccl_machines.peermem_not_registered(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    found = findings(report)
    peermem = found["stack.peermem"]
    assert peermem.status is Status.FAIL and "here gdrprobe knows more than NCCL" in peermem.summary
    assert "reinstall the GPU driver (or its DKMS module) after OFED" in peermem.fix
    assert ("/sys/kernel/mm/memory_peers", "no client") in [(e.source, e.value) for e in peermem.evidence]
    # NCCL's own decision: GDR through peer memory, which then fails.
    assert {(d.gdr_write, d.mechanism) for d in report.nccl} == {(True, "peermem")}
    gpu = found["nccl.gpu.0000:1b:00.0"]
    assert gpu.status is Status.FAIL and "not registered" in gpu.summary
    assert report.exit_code == 1


def test_peermem_listed_in_memory_peers_is_registered(tmp_path):
    tree = nccl_machines.peermem_not_registered(tmp_path)
    tree.write("/sys/kernel/mm/memory_peers/nv_mem/version", "570.86.15\n")
    found = findings(run_doctor(str(tmp_path), environ={}))
    assert found["stack.peermem"].status is Status.OK
    assert found["nccl.gpu.0000:1b:00.0"].status is Status.OK


def test_unregistered_peermem_beside_working_dmabuf_warns(tmp_path):
    nccl_machines.peermem_not_registered(tmp_path, dmabuf=True)
    report = run_doctor(str(tmp_path), environ={})
    found = findings(report)
    assert found["stack.peermem"].status is Status.WARN and "not in the way today" in found["stack.peermem"].summary
    assert {d.mechanism for d in report.nccl} == {"dmabuf"}
    assert found["nccl.gpu.0000:1b:00.0"].status is Status.OK
