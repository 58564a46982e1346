"""A GPU node whose RDMA NIC is on the PCI bus without an RDMA device (its RDMA driver not
loaded) is the node NCCL makes slow (it falls back to sockets): the check drains it (exit 4)
with the fix, where a node with no RDMA NIC at all stays "not testable" (9)."""

from __future__ import annotations

import pytest

from gdrprobe.campaign.ab import no_device_not_testable
from gdrprobe.doctor.facts.pci import rdma_nics_without_device
from gdrprobe.errors import DRAIN_CODES, ExitCode, NoRdmaDevice
from gdrprobe.sysroot import SysRoot

NO_DEVICE = NoRdmaDevice("no RDMA device found", "load the RDMA driver", evidence="empty list")
GPU = ("0000:3b:00.0", "0x10de", "0x030200")


def pci(tmp_path, *functions: tuple[str, str, str]) -> SysRoot:
    """A sysfs with these PCI functions (BDF, vendor, class) and no RDMA device."""
    for bdf, vendor, code in functions:
        directory = tmp_path / "sys/bus/pci/devices" / bdf
        directory.mkdir(parents=True)
        (directory / "vendor").write_text(vendor + "\n")
        (directory / "class").write_text(code + "\n")
    return SysRoot(str(tmp_path))


@pytest.mark.parametrize("nic", [("0000:5e:00.0", "0x15b3", "0x020700"),   # ConnectX, IB
                                 ("0000:5e:00.1", "0x15b3", "0x020000"),   # ConnectX, Ethernet
                                 ("0000:5e:00.0", "0x1077", "0x020700")],  # another IB HCA
                         ids=["connectx-ib", "connectx-ethernet", "infiniband-class"])
def test_an_rdma_nic_without_its_rdma_driver_drains_with_the_fix(tmp_path, nic):
    error = no_device_not_testable(NO_DEVICE, pci(tmp_path, GPU, nic))
    assert error.exit_code == ExitCode.NO_DEVICE and error.exit_code in DRAIN_CODES
    assert error.cause == (f"no RDMA device, but 1 RDMA NIC(s) on the PCI bus ({nic[0]}): the "
                           "NIC's RDMA driver is not loaded, and NCCL would fall back to TCP "
                           "sockets")
    assert error.fix.startswith("load the NIC's RDMA driver (ConnectX: modprobe mlx5_ib")


def test_no_rdma_nic_at_all_is_still_not_testable(tmp_path):
    other_ethernet = ("0000:01:00.0", "0x8086", "0x020000")
    error = no_device_not_testable(NO_DEVICE, pci(tmp_path, GPU, other_ethernet))
    assert error.exit_code == ExitCode.NOT_TESTABLE
    assert error.cause == "not testable: no RDMA device found"


def test_a_listed_rdma_device_means_the_driver_is_loaded(tmp_path):
    root = pci(tmp_path, GPU, ("0000:5e:00.0", "0x15b3", "0x020700"))
    (tmp_path / "sys/class/infiniband/mlx5_0").mkdir(parents=True)
    assert rdma_nics_without_device(root) == []
