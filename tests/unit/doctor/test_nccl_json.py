"""What the JSON says of NCCL's decision beyond channel 0 (src/graph/topo.cc
ncclTopoGetLocalNetType per channel) and the GDR mode of src/graph/paths.cc ncclTopoCheckGdr:
PCI (a PCIe mapping forced) for a GPU on C2C whose NIC is not reached over C2C. Was: the NIC
of channel 0 only, and no mode."""

from __future__ import annotations

from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report.model import to_dict
from gdrprobe.report.text import render_doctor
from tests.unit.doctor import nccl_machines


def test_gdr_mode_is_pci_for_a_c2c_gpu_with_a_nic_on_its_pcie_switch(tmp_path):
    nccl_machines.gh200_nic_beside_gpu(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    (decision,) = to_dict(report)["nccl"]
    assert (decision["path_type"], decision["gdr_write"], decision["gdr_mode"]) == ("PIX", True, "pci")
    assert "GPU0 GDR mode: PCI" in render_doctor(report)


def test_gdr_mode_is_default_over_c2c(tmp_path):
    nccl_machines.gh200(tmp_path)
    (decision,) = to_dict(run_doctor(str(tmp_path), environ={}))["nccl"]
    assert (decision["path_type"], decision["gdr_mode"], decision["mechanism"]) == ("P2C", "default", "dmabuf")


def test_each_channel_names_its_nic(tmp_path):
    """HGX: GPU1 is local to no NIC, so its channels spread over all four through PXN."""
    nccl_machines.hgx_8gpu_4nic(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    gpu1 = to_dict(report)["nccl"][1]
    assert [(c["channel"], c["net"], c["path_type"]) for c in gpu1["channels"]] == [
        (k, f"mlx5_{k}", "PXN") for k in range(4)]
    gpu0 = to_dict(report)["nccl"][0]
    assert [c["net"] for c in gpu0["channels"]] == ["mlx5_0"]
    assert "GPU1 channels: 0 mlx5_0, 1 mlx5_1, 2 mlx5_2, 3 mlx5_3, then again" in render_doctor(report)
