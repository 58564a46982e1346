"""The doctor's ACS and IOMMU checks against a real kernel: one guest on QEMU's q35 machine
with an emulated Intel IOMMU and two PCIe root ports, one with the ACS capability and one
built with ``disable-acs=on`` (QEMU 7.2, hw/pci-bridge/pcie_root_port.c), a device behind
each. The guest kernel boots with ``intel_iommu=on``: its IOMMU driver asks for ACS
(pci_request_acs), so the kernel itself turns on SrcValid, ReqRedir, CmpltRedir and
UpstreamFwd on the port that has the capability (drivers/pci/pci.c, pci_std_enable_acs), and
every device gets a translated (DMA-FQ) default domain.

There is no GPU and no PCI RDMA NIC in the guest: the two devices behind the ports stand in
for them (a GPU and the NIC NCCL would use for it), so the checks' own code reads the live
config space, ``/sys/kernel/iommu_groups`` and ``/proc/cmdline``. Behind two root ports the
pair meets only in the root complex, so the kernel's ACS bits are read and reported as no
fault, whatever they say (the rule of gdrprobe/doctor/checks/acs.py); QEMU 7.2's switch ports
(xio3130) have no ACS capability, so a switch's ports are proven by fixtures only. Emulated
hardware, not hardware proof.

  python -m lab.acs_iommu findings     (in the guest) the checks' findings as JSON
"""

from __future__ import annotations

import json
import sys
import types

from gdrprobe.doctor.checks import acs, iommu
from gdrprobe.doctor.facts import pci, topology
from gdrprobe.report.model import to_dict
from gdrprobe.sysroot import SysRoot

# Fixed slots on the root bus, so that the guest's BDFs are known here: the root ports sit at
# 00:10.0 and 00:11.0, the kernel numbers their secondary buses 01 and 02 in that order.
ACS_PORT, NO_ACS_PORT = "0000:00:10.0", "0000:00:11.0"
GPU_STANDIN, NIC_STANDIN = "0000:01:00.0", "0000:02:00.0"
QEMU_OPTS = ("-device intel-iommu,intremap=off "
             "-device pcie-root-port,id=acsport,bus=pcie.0,addr=0x10,chassis=16,slot=16 "
             "-device pcie-root-port,id=plainport,bus=pcie.0,addr=0x11,chassis=17,slot=17,disable-acs=on "
             "-device virtio-rng-pci,bus=acsport -device virtio-rng-pci,bus=plainport")
KERNEL_ARGS = ("intel_iommu=on",)
# Set in the guest's environment by the demo; the lab test skips without it.
GUEST_MARK = "GDRPROBE_LAB_ACS_IOMMU"
BARE_METAL = topology.Virtualization(hypervisor=False, flat=False, evidence=())


def standin_context(virtualization: topology.Virtualization | None = None):
    """What the ACS and IOMMU checks read, with the two devices in the GPU's and the NIC's
    places: the live root, a topology built from the live sysfs, and NCCL's decision pairing
    them. ``virtualization``: the guest's own (None) or the bare-metal stand-in."""
    root = SysRoot("/")
    gpu = topology.pcie_endpoint(root, "GPU", "GPU0", GPU_STANDIN)
    nic = topology.pcie_endpoint(root, "NIC", "nic0", NIC_STANDIN)
    found = virtualization or topology.detect_virtualization(root, pci.list_devices(root), (gpu, nic))
    tree = topology.Topology(gpus=(gpu,), nics=(nic,), software_nics=(), virtualization=found)
    decision = types.SimpleNamespace(gpu_bdf=GPU_STANDIN, via_gpu=None, nic="nic0")
    return types.SimpleNamespace(root=root, topology=tree, nccl_decisions=(decision,))


def live_findings(virtualization: topology.Virtualization | None = None) -> list:
    ctx = standin_context(virtualization)
    return acs.check(ctx) + iommu.check(ctx)


def main(argv: list[str]) -> int:
    if argv != ["findings"]:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps({"guest": [to_dict(f) for f in live_findings()],
                      "as_bare_metal": [to_dict(f) for f in live_findings(BARE_METAL)]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
