"""A cloud VM whose PCI tree NCCL only knows from a topology file (issue 28).

In an Azure ND H100 v5 VM (NDv5) every GPU and every InfiniBand NIC is a Hyper-V virtual PCI
device on a root bus of its own (``/sys/devices/.../VMBUS:00/<channel>/pciDDDD:00/DDDD:00:00.0``):
no bridge anywhere, so from sysfs alone every GPU-NIC pair is PHB to NCCL. The image ships
the topology NCCL should see instead: Azure/azhpc-images ``topology/ndv5-topo.xml`` has two
``<cpu>`` (numaid 0 and 1), each with four ``<pci class="0x060400">`` switches (bus ids
``ffff:ff:0N.0``, Gen5 x16, vendor and device ids 0x0000) holding one GPU and one NIC, and
the image's ``/etc/nccl.conf`` sets ``NCCL_TOPO_FILE=/opt/microsoft/ndv5/topo.xml``, a link to
``/opt/microsoft/ndv5-topo.xml``. The bus ids below are that file's (GPUs in PCI domains 0001
to 000c, NICs 0101 to 0108, named mlx5_ib0 to mlx5_ib7 as the image names them); the XML is
written here from those facts in the layout that file uses.
"""

from __future__ import annotations

import os

from tests.unit.doctor import machines, nccl_machines

# (GPU domain, NIC domain) per switch, switches 1-4 on CPU 0 and 5-8 on CPU 1.
NDV5_PAIRS = ((0x0001, 0x0101), (0x0002, 0x0102), (0x0003, 0x0103), (0x0008, 0x0104),
              (0x0009, 0x0105), (0x000A, 0x0106), (0x000B, 0x0107), (0x000C, 0x0108))
VMBUS = "/sys/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI0004:00/VMBUS:00"
NDV5_FILE = "/opt/microsoft/ndv5-topo.xml"
NDV5_LINK = "/opt/microsoft/ndv5/topo.xml"
NDV5_CPUS = ("0-47", "48-95")
GPU_SWITCH_LINK = ('link_speed="32.0 GT/s PCIe"', 'link_width="16"')


def bus_id(domain: int) -> str:
    return f"{domain:04x}:00:00.0"


def gpus() -> list[str]:
    return [bus_id(gpu) for gpu, _ in NDV5_PAIRS]


def nics() -> list[str]:
    return [f"mlx5_ib{index}" for index in range(len(NDV5_PAIRS))]


def vpci_device(tree: machines.SysfsTree, domain: int, numa: int) -> str:
    """A Hyper-V virtual PCI root bus (its own domain, no host bridge function) under a
    VMBus channel; returns the host bridge's name for the device to hang on."""
    channel = f"{VMBUS}/{domain:08x}-0000-0000-0000-000000000000"
    return tree.host_bridge(0x00, numa=numa, cpus=NDV5_CPUS[numa], domain=domain, under=channel, function=False)


def ndv5_vm(root) -> machines.SysfsTree:
    """The VM without its topology file: 8 H100 and 8 ConnectX-7 at 400 Gb/s, a DMA-BUF stack,
    NVSwitch links."""
    tree = machines.SysfsTree(root)
    tree.cmdline("BOOT_IMAGE=/boot/vmlinuz-6.8.0-1021-azure root=PARTUUID=0000 ro console=ttyS0")
    tree.cpuinfo(hypervisor=True)
    tree.dmi("Microsoft Corporation", "Virtual Machine")
    for index, (gpu, nic) in enumerate(NDV5_PAIRS):
        numa = 0 if index < len(NDV5_PAIRS) // 2 else 1
        tree.gpu(vpci_device(tree, gpu, numa), bus_id(gpu))
        tree.nic(vpci_device(tree, nic, numa), bus_id(nic), f"mlx5_ib{index}")
    nccl_machines.links_everywhere(tree)
    for nic in nics():
        nccl_machines.port_rate(tree, nic, 400)
    nccl_machines.healthy_stack(tree, gpus(), nics())
    nccl_machines.nvml_facts(tree, gpus(), nvlink={bdf: ["0000:05:00.0"] * 18 for bdf in gpus()})
    return tree


def ndv5_topology(pairs=NDV5_PAIRS, link=GPU_SWITCH_LINK) -> str:
    """The topology XML in the layout of azhpc-images' ndv5-topo.xml."""
    lines = ['<system version="1">']
    for cpu, numa_pairs in enumerate((pairs[:4], pairs[4:])):
        lines.append(f'  <cpu numaid="{cpu}" affinity="0000ffff" arch="x86_64" vendor="GenuineIntel" '
                     'familyid="6" modelid="143">')
        for switch, (gpu, nic) in enumerate(numa_pairs, start=1 + 4 * cpu):
            lines.append(f'    <pci busid="ffff:ff:{switch:02x}.0" class="0x060400" {" ".join(link)} '
                         'vendor="0x0000" device="0x0000" subsystem_vendor="0x0000" subsystem_device="0x0000">')
            lines.append(f'      <pci busid="{bus_id(gpu)}" class="0x030200" {" ".join(link)}/>')
            lines.append(f'      <pci busid="{bus_id(nic)}" class="0x020700" {" ".join(link)}/>')
            lines.append('    </pci>')
        lines.append('  </cpu>')
    return "\n".join(lines + ['</system>', ''])


def install_image_files(tree: machines.SysfsTree, xml: str | None = None, conf: bool = True) -> None:
    """What the image installs: the XML, the absolute link to it, and /etc/nccl.conf naming the link."""
    tree.write(NDV5_FILE, ndv5_topology() if xml is None else xml)
    link = tree.path(NDV5_LINK)
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(NDV5_FILE, link)
    if conf:
        tree.write("/etc/nccl.conf", f"NCCL_IB_PCI_RELAXED_ORDERING=1\nNCCL_TOPO_FILE={NDV5_LINK}\n"
                                     "NCCL_IGNORE_CPU_AFFINITY=1\n")
