"""The per-GPU NCCL decision on fixture machines, each built for one of NCCL's rules (NCCL
2.30.7: src/graph/paths.cc, src/graph/topo.cc, src/transport/net_ib/gdr.cc); the docstrings
say what the doctor answered before it decided as NCCL does."""

from __future__ import annotations

import json

import pytest

from gdrprobe.doctor.facts import nvml
from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.doctor.facts.topology import build_topology
from gdrprobe.nccl.decision import mirror_bits
from gdrprobe.nccl.topo import pcie_distance
from gdrprobe.report.model import Status, to_dict
from gdrprobe.report.text import render_doctor
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines


def decisions(tmp_path, **environ):
    return DoctorContext(SysRoot(str(tmp_path)), environ).nccl_decisions


def failures(report):
    return [(f.id, f.summary) for f in report.findings if f.status is Status.FAIL]


def test_hgx_board_with_fewer_nics_than_gpus_uses_pxn(tmp_path):
    """Was: GPU1, 3, 5, 7 judged by their own PHB/NODE distance to the nearest NIC: FAIL."""
    nccl_machines.hgx_8gpu_4nic(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    assert failures(report) == []
    odd = [d for d in report.nccl if int(d.gpu[3:]) % 2]
    assert {(d.path, d.path_type, d.gdr_write, d.gdr_read) for d in odd} == {("pxn", "PXN", True, True)}
    gpu1 = report.nccl[1]
    assert (gpu1.nic, gpu1.via_gpu) == ("mlx5_0", "0000:1b:00.0")
    assert gpu1.candidates == ("mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3")
    assert "PXN: GPU1 sends through GPU0 over NVLink, PIX from there to mlx5_0" in gpu1.why
    finding = next(f for f in report.findings if f.id == "nccl.gpu.0000:1d:00.0")
    assert finding.status is Status.OK and "through GPU0 over NVLink (PXN)" in finding.summary
    distance = [f for f in report.findings if f.id == "topology.distance"][1]
    assert distance.status is Status.OK and "through an NVLink peer (PXN)" in distance.summary


def test_pxn_disabled_leaves_the_odd_gpus_at_phb(tmp_path):
    nccl_machines.hgx_8gpu_4nic(tmp_path)
    found = decisions(tmp_path, NCCL_PXN_DISABLE="1")
    assert [(d.path_type, d.gdr_write) for d in found[1::2]] == [("PHB", False)] * 4
    assert [(d.path_type, d.gdr_write) for d in found[0::2]] == [("PIX", True)] * 4


def test_gh200_cpu_attached_nic_is_p2c_with_gdr(tmp_path):
    """Was: NODE, a FAIL with "move the card"."""
    nccl_machines.gh200(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    assert failures(report) == []
    (gh,) = report.nccl
    assert (gh.nic, gh.path, gh.path_type, gh.gdr_write, gh.gdr_read) == ("mlx5_0", "c2c", "P2C", True, True)
    distance = next(f for f in report.findings if f.id == "topology.distance")
    assert "NCCL reaches it over C2C (P2C)" in distance.summary and distance.status is Status.OK


def test_gh200_with_gdr_c2c_off_falls_back_to_pxb_and_loses_gdr(tmp_path):
    nccl_machines.gh200(tmp_path)
    (gh,) = decisions(tmp_path, NCCL_NET_GDR_C2C="0")
    assert not gh.gdr_write and gh.why[1].startswith("receive: path P2C is beyond the GDR level PXB (NCCL's default)")


def test_v100_without_nvlink_gets_gdr_for_receives_only(tmp_path):
    """Was: "NCCL admits GDR". NCCL_NET_GDR_READ's default is off before sm80 without NVLink."""
    nccl_machines.v100_no_nvlink(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    assert [(d.gdr_write, d.gdr_read) for d in report.nccl] == [(True, False), (True, False)]
    finding = next(f for f in report.findings if f.id == "nccl.gpu.0000:1b:00.0")
    assert finding.status is Status.WARN and "receives only" in finding.summary
    assert "NCCL_NET_GDR_READ=1" in finding.fix
    assert [(d.gdr_write, d.gdr_read) for d in decisions(tmp_path, NCCL_NET_GDR_READ="1")] == [(True, True)] * 2


def test_a_slow_nic_nearer_than_a_fast_one_is_not_nccls_choice(tmp_path):
    """Was: the nearest NIC (mlx5_0, PIX) and "NCCL admits GDR". NCCL takes bandwidth first."""
    nccl_machines.slow_nic_nearer(tmp_path)
    (choice,) = decisions(tmp_path)
    assert (choice.nic, choice.path_type, choice.bandwidth_gbs, choice.gdr_write) == ("mlx5_1", "PHB", 48.0, False)
    (restricted,) = decisions(tmp_path, NCCL_IB_HCA="=mlx5_0")
    assert (restricted.nic, restricted.path_type, restricted.gdr_write) == ("mlx5_0", "PIX", True)
    report = run_doctor(str(tmp_path), environ={})
    (failure,) = failures(report)
    assert failure[0] == "nccl.gpu.0000:1b:00.0" and "NCCL uses mlx5_1 direct PHB path WITHOUT" in failure[1]


def test_dmabuf_only_node_with_dmabuf_disabled_fails_every_gpu(tmp_path):
    """Was: a warning and exit code 0 while NCCL logs "GPU Direct RDMA Disabled" for every HCA."""
    nccl_machines.dmabuf_only(tmp_path)
    (tmp_path / "gdrprobe-capture/environ.json").write_text(json.dumps({"NCCL_DMABUF_ENABLE": "0"}))
    report = run_doctor(str(tmp_path))
    assert {finding_id for finding_id, _ in failures(report)} == {
        "stack.path", "nccl.dmabuf_enable", "nccl.gpu.0000:1b:00.0", "nccl.gpu.0000:2d:00.0"}
    assert not any(d.gdr_write or d.gdr_read for d in report.nccl)


def test_report_json_and_text_carry_the_decision_per_gpu(tmp_path):
    nccl_machines.hgx_8gpu_4nic(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    document = to_dict(report)
    assert document["nccl"][1] == {
        "gpu": "GPU1", "gpu_bdf": "0000:1d:00.0", "nic": "mlx5_0", "path": "pxn", "via_gpu": "0000:1b:00.0",
        "path_type": "PXN", "bandwidth_gbs": 48.0, "gdr_write": True, "gdr_read": True,
        "why": list(report.nccl[1].why), "candidates": ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"],
        "net": "mlx5_0", "gdr_mode": "default", "mechanism": "dmabuf",
        # netsPerGpu = DIVUP(4 NICs, 1 GPU local to mlx5_0): GPU1's channels spread over all four,
        # each through the GPU beside that NIC.
        "channels": [{"channel": k, "nic": f"mlx5_{k}", "net": f"mlx5_{k}", "path_type": "PXN",
                      "via_gpu": via, "gdr_write": True, "gdr_read": True}
                     for k, via in enumerate(("0000:1b:00.0", "0000:3d:00.0", "0000:9d:00.0", "0000:bd:00.0"))],
        "detour_from": None, "mechanism_reason": report.nccl[1].mechanism_reason, "nccl_version": None,
        "data_direct": None, "unread": ""}
    text = render_doctor(report)
    assert "== what NCCL will do, per GPU ==" in text
    row = next(line for line in text.splitlines() if line.startswith("GPU1 "))
    assert row.split() == ["GPU1", "0000:1d:00.0", "mlx5_0", "PXN", "via", "GPU0", "yes", "yes"]


def test_without_nvml_there_is_no_pxn_and_the_doctor_says_so(tmp_path):
    nccl_machines.hgx_8gpu_4nic(tmp_path)
    (tmp_path / "gdrprobe-capture/nvml.json").unlink()
    report = run_doctor(str(tmp_path), environ={})
    assert ("NVLink and C2C unknown (no NVML facts were captured with this tree): PXN and P2C are not considered"
            in report.nccl[1].why)
    assert report.nccl[1].unread.startswith("not decided")
    nvml_finding = next(f for f in report.findings if f.id == "gpu.nvml")
    assert nvml_finding.status is Status.SKIP and "libnvidia-ml.so.1" in nvml_finding.fix


@pytest.mark.parametrize("value, pow2, mirrored", [(0, 4, 0), (1, 4, 2), (2, 4, 1), (3, 4, 3), (1, 8, 4), (6, 8, 3)])
def test_mirror_bits(value, pow2, mirrored):
    assert mirror_bits(value, pow2) == mirrored


# ---- NVML: NCCL's facts from the driver's library, nvidia-ml-py's extras, captured, replayed --


def test_nvml_facts_are_collected_and_replayed_with_nvidia_ml_pys_extras(tmp_path):
    tree = nccl_machines.hgx_8gpu_4nic(tmp_path / "node")
    gpus = nccl_machines.gpu_bdfs(tree)
    topology = build_topology(SysRoot(str(tmp_path / "node")))
    ancestors = {a.bdf: {b.bdf: pcie_distance(a, b) for b in topology.gpus[i + 1:]}
                 for i, a in enumerate(topology.gpus[:-1])}
    ancestors[gpus[0]][gpus[1]] = "PIX"          # sysfs says PHB: NVML sees another tree
    expected = nccl_machines.nvml_facts(tree, gpus, nvlink={gpus[0]: [gpus[1]] * 2}, c2c=False,
                                        ancestors=ancestors)
    assert [len(gpu["nvlinks"]) for gpu in expected["gpus"]] == [2] + [0] * 7
    capture(str(tmp_path / "copy"), root=str(tmp_path / "node"), environ={})
    assert json.loads((tmp_path / "copy/gdrprobe-capture/nvml.json").read_text()) == expected
    replay = run_doctor(str(tmp_path / "copy"))
    crosscheck = next(f for f in replay.findings if f.id == "topology.nvml")
    assert crosscheck.status is Status.WARN
    assert [(e.source, e.value) for e in crosscheck.evidence] == [
        (f"{gpus[0]} - {gpus[1]}", "NVML PIX, sysfs PHB")]
    bar1 = next(f for f in replay.findings if f.id == f"gpu.{gpus[0]}.bar1")
    assert bar1.evidence[0].source == "nvmlDeviceGetBAR1MemoryInfo" and "(64 MiB in use)" in bar1.summary


def test_nvidia_ml_pys_extras_are_extras_their_absence_is_said(monkeypatch):
    def missing():
        raise ImportError("nvidia-ml-py is not installed (No module named 'pynvml')")

    monkeypatch.setattr(nvml, "import_nvml", missing)
    facts = nvml.with_extras({"library": "libnvidia-ml.so.1", "gpus": [{"pci_bus_id": "0000:1b:00.0"}]})
    assert nvml.usable(facts) and "nvidia-ml-py is not installed" in facts["extras_error"]
