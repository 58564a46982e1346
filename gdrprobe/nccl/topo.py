"""NCCL's view of the node's links: the path types its gates compare, how it classes the PCIe
distance between a GPU and a NIC, and the bandwidth it gives each link (a PCIe link, a NIC
port, the inter-CPU link, NVLink). Pure rules over facts the doctor reads from sysfs, /proc
and NVML and hands over as data (NCCL 2.30.7, NVIDIA/nccl: src/include/graph.h,
src/graph/topo.h, src/graph/topo.cc, src/graph/xml.cc).

Distances use the ``nvidia-smi topo -m`` vocabulary because that is what people read:
X (self), PIX (at most one PCIe switch between), PXB (several switches, no host bridge),
PHB (through the host bridge / root complex), NODE (between host bridges of one NUMA
node), SYS (across the inter-socket link). NCCL has no NODE: two host bridges of one
NUMA node hang off one CPU node in its graph, so NODE is PHB to NCCL.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Protocol

from gdrprobe.nccl.cparse import strtoll
from gdrprobe.numbers import decimal

# The far end of an NVLink this machine does not show (src/graph/xml.cc): NCCL takes it for an NVSwitch.
NOT_VISIBLE = "fffffff:ffff:ff"
# NCCL's path types, nearest first, with the rank its gates compare (src/include/graph.h).
PATH_RANK = {"LOC": 0, "NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6,
             "PXN": 7, "PHB": 8, "SYS": 9}


class PcieEndpoint(Protocol):
    """What NCCL's rules need of a GPU or a NIC: its name, bus id and place on the PCIe tree
    (the doctor's :class:`gdrprobe.doctor.facts.topology.PcieDevice` is one)."""

    name: str                      # "GPU0"; the ibdev name (mlx5_0) for NICs
    bdf: str                       # 0000:1b:00.0
    numa_node: int                 # -1 when the platform does not say
    host_bridge: str | None        # pci0000:00
    bridges: tuple[str, ...]       # bus ids from the root port down to the direct parent
    # Optional, read by nccl_parents(): ``nccl_parents``, the PCI nodes NCCL puts above it,
    # nearest first, where NCCL's topology file places it (topo_file.place_device).


def common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    count = 0
    for left, right in zip(a, b):
        if left != right:
            break
        count += 1
    return count


def pcie_distance(a: PcieEndpoint, b: PcieEndpoint) -> str:
    """The distance between two devices in nvidia-smi's vocabulary."""
    if a.bdf == b.bdf:
        return "X"
    if a.host_bridge != b.host_bridge:
        # Unknown NUMA (-1 on both) happens on single-node machines, so it counts as one node.
        return "NODE" if a.numa_node == b.numa_node else "SYS"
    common = common_prefix(a.bridges, b.bridges)
    if common == 0:
        return "PHB"
    # Below the shared switch each side crosses one downstream port when no other switch is in between.
    below = max(len(a.bridges), len(b.bridges)) - common
    return "PIX" if below <= 1 else "PXB"


def same_cpu(a: PcieEndpoint, b: PcieEndpoint) -> bool:
    """Whether NCCL hangs both devices off one CPU node: one host bridge, or one NUMA node
    (xml.cc ncclTopoGetXmlFromSys makes one "cpu" per numaid)."""
    return a.host_bridge == b.host_bridge or a.numa_node == b.numa_node


# ---- NCCL's PCI tree ----------------------------------------------------------------------


def pci_parents(bridges: tuple[str, ...]) -> tuple[str, ...]:
    """The PCI nodes NCCL puts above a device, nearest first (src/graph/xml.cc
    ncclTopoGetXmlFromSys): from a device's sysfs path NCCL goes up two directories at a
    time, skipping the port right above, and stops at the root complex. So a device under a
    switch's downstream port hangs off the switch's upstream port, and a device under a root
    port hangs off the CPU."""
    return tuple(bridges[index] for index in range(len(bridges) - 2, -1, -2))


def nccl_parents(endpoint: PcieEndpoint) -> tuple[str, ...]:
    """The PCI nodes NCCL puts above a device, nearest first: the topology file's where it
    places the device (the endpoint's ``nccl_parents``), else those of its sysfs path."""
    placed = getattr(endpoint, "nccl_parents", None)
    return pci_parents(endpoint.bridges) if placed is None else placed


def pci_device_id(vendor: str, device: str, subsystem_vendor: str, subsystem_device: str) -> int:
    """src/graph/topo.cc ncclTopoGetIntDevice: the four sysfs attributes, each
    ``strtol(str, NULL, 0)``, packed 16 bits apiece (a missing one counts 0)."""
    value = 0
    for shift, text in ((48, vendor), (32, device), (16, subsystem_vendor), (0, subsystem_device)):
        value += (strtoll(text) or 0) << shift
    return value & (1 << 64) - 1


BCM_GEN4 = 0x1000C0101000A000       # topo.cc getBcmGen: Broadcom PEX Gen4, both levels
BCM_GEN5 = 0x1000C03010000000       # Gen5; the sub-switch level adds 0x1000
BCM_MASK = 0xFFFFFFFFFFFFF000
BCM_MERGED = 0xFFFF                 # ORed into a fused switch's id so it is not fused again


def bcm_gen(device_id: int, level: int) -> int:
    """src/graph/topo.cc getBcmGen (NCCL 2.20.3 on): 4 or 5 for a Broadcom PEX switch of
    that generation at ``level`` (0: the top, 1: a sub-switch), else 0."""
    if device_id & BCM_MASK == BCM_GEN4:
        return 4
    if device_id & BCM_MASK == BCM_GEN5 | level * 0x1000:
        return 5
    return 0


def bcm_exact(device_id: int, sub_id: int) -> bool:
    """NCCL 2.9.6 to 2.19: only Gen4, and a sub-switch with exactly the same device id."""
    return device_id & BCM_MASK == BCM_GEN4 and sub_id == device_id


class NcclPciTree:
    """The PCI switches NCCL sees above the GPUs and NICs, after it flattens Broadcom
    switches that present one switch as two levels (src/graph/topo.cc
    ncclTopoFlattenBcmSwitches): a sub-switch's devices move up to the top switch, so a GPU
    and a NIC under two sub-switches of one such switch are PIX, not PXB.

    ``ids`` maps a bridge's bus id to its :func:`pci_device_id`; ``flatten`` is how the
    NCCL in use flattens: "masked" (2.20.3 on, Gen4 and Gen5), "exact" (2.9.6 to 2.19,
    Gen4 with identical ids) or None."""

    def __init__(self, endpoints, ids: dict[str, int], flatten: str | None = "masked"):
        self.parent: dict[str, str | None] = {}
        for endpoint in endpoints:
            chain = nccl_parents(endpoint)
            for node, above in zip(chain, chain[1:] + (None,)):
                self.parent.setdefault(node, above)
        self.alias: dict[str, str] = {}
        if flatten:
            self._flatten(dict(ids), flatten)

    def children(self, node: str) -> list[str]:
        return [child for child, above in self.parent.items() if above == node]

    def _fuses(self, top: int, sub: int, flatten: str) -> bool:
        if flatten == "exact":
            return bcm_exact(top, sub)
        gen = bcm_gen(top, 0)
        return bool(gen) and bcm_gen(sub, 1) == gen

    def _flatten(self, ids: dict[str, int], flatten: str) -> None:
        """NCCL's loop: the first switch (in bus order) that is a top-level Broadcom switch
        absorbs every neighbour switch (its parent or a child) of the sub-switch kind, is
        marked so it is not fused again, and the search restarts."""
        changed = True
        while changed:
            changed = False
            for node in sorted(self.parent):
                top = ids.get(node, 0)
                if not (bcm_gen(top, 0) if flatten == "masked" else bcm_exact(top, top)):
                    continue
                neighbours = [self.parent[node]] + self.children(node)
                subs = [n for n in neighbours if n is not None and self._fuses(top, ids.get(n, 0), flatten)]
                for sub in subs:
                    self._absorb(node, sub)
                ids[node] = top | BCM_MERGED
                changed = True
                break

    def _absorb(self, node: str, sub: str) -> None:
        if self.parent[node] == sub:
            self.parent[node] = self.parent[sub]
        for child in self.children(sub):
            if child != node:
                self.parent[child] = node
        del self.parent[sub]
        self.alias[sub] = node
        for old, new in list(self.alias.items()):
            if new == sub:
                self.alias[old] = node

    def chain(self, endpoint: PcieEndpoint) -> tuple[str, ...]:
        """The switches above the device as NCCL sees them, nearest first."""
        first = next(iter(nccl_parents(endpoint)), None)
        node = self.alias.get(first, first)
        found = []
        while node is not None:
            found.append(node)
            node = self.parent.get(node)
        return tuple(found)

    def path_type(self, a: PcieEndpoint, b: PcieEndpoint) -> str:
        """NCCL's path type between two devices (src/graph/paths.cc ncclTopoSetPaths: the
        worst hop): one switch between them PIX, a switch-to-switch hop PXB, through the
        CPU PHB, across CPUs SYS."""
        if a.bdf == b.bdf:
            return "LOC"
        first, second = self.chain(a), self.chain(b)
        common = [node for node in first if node in second]
        if common:
            return "PIX" if first[0] == second[0] else "PXB"
        return "PHB" if same_cpu(a, b) else "SYS"


def nccl_path_type(a: PcieEndpoint, b: PcieEndpoint) -> str:
    """NCCL's path type between two devices on a tree without switches to flatten."""
    return NcclPciTree((a, b), {}, None).path_type(a, b)


# ---- a PCIe link --------------------------------------------------------------------------

# PCIe generation -> NCCL's per-lane figure in 100 Mb/s units (src/graph/topo.cc
# kvDictPciGen, both sysfs spellings, matched in this order as prefixes by kvConvertToInt);
# anything else is NCCL's fallback, 60 (Gen3).
PCI_GEN_PER_LANE = (("2.5 GT/s", 15), ("5 GT/s", 30), ("8 GT/s", 60), ("16 GT/s", 120), ("32 GT/s", 240),
                    ("2.5 GT/s PCIe", 15), ("5.0 GT/s PCIe", 30), ("8.0 GT/s PCIe", 60),
                    ("16.0 GT/s PCIe", 120), ("32.0 GT/s PCIe", 240), ("64.0 GT/s PCIe", 480))
PCI_GEN_FALLBACK = 60
FLT_MAX = float("inf")          # what a speed sscanf cannot read stays: larger than any speed
_LEADING_FLOAT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


@dataclasses.dataclass(frozen=True)
class PcieLink:
    """A device's PCIe link as sysfs states it: the text of the device's and of its upstream
    port's max_link_speed and max_link_width, "" where a file cannot be read."""

    device_speed: str = ""
    port_speed: str = ""
    device_width: str = ""
    port_width: str = ""


def gt_per_s(text: str) -> float:
    """``sscanf(str, "%f GT/s", &speed)`` with speed preset to FLT_MAX (src/graph/xml.cc)."""
    match = _LEADING_FLOAT.match(text)
    return float(match.group(0)) if match else FLT_MAX


def per_lane(text: str) -> int:
    """kvConvertToInt(str, kvDictPciGen): the first entry the text starts with, else 60."""
    return next((value for prefix, value in PCI_GEN_PER_LANE if text.startswith(prefix)), PCI_GEN_FALLBACK)


def link_bandwidth_gbs(link: PcieLink) -> float:
    """The link as NCCL rates it (GB/s): width x per-lane speed / 80 (src/graph/topo.cc
    ncclTopoAddPci, width 0 counted as 16). src/graph/xml.cc ncclTopoGetPciNode's sysfs
    branch reads max_link_speed and ../max_link_speed and keeps the text of the slower one,
    a speed it cannot parse counting as FLT_MAX, so the other side's wins and the Gen3
    fallback applies only when neither is readable; the width is
    min(strtol(max_link_width), strtol(../max_link_width)), 0 where a file is missing."""
    slower_port = gt_per_s(link.port_speed) < gt_per_s(link.device_speed)
    speed = link.port_speed if slower_port else link.device_speed
    width = min(strtoll(text) or 0 for text in (link.device_width, link.port_width))
    return (width or 16) * per_lane(speed) / 80.0


# ---- a NIC port ---------------------------------------------------------------------------

NET_FALLBACK_GBPS = 10.0        # ncclTopoAddNet: "Some NICs define speed = -1": <= 0 counts as 10 Gb/s
ACTIVE = "4: ACTIVE"            # a port's state as sysfs spells it


@dataclasses.dataclass(frozen=True)
class Port:
    """One port of an RDMA device as sysfs shows it: NCCL makes each its own network device
    (src/transport/net_ib/init.cc)."""

    number: int
    state: str | None              # "4: ACTIVE"; None where it cannot be read (a capture may lack it)
    rate_gbps: float | None        # the line rate the kernel states; None where it states none
    link_layer: str | None = None  # "InfiniBand" or "Ethernet"; fused NICs must share it

    @property
    def nccl_gbps(self) -> float:
        """NCCL's speed for the port (topo.cc ncclTopoAddNet): its rate, or the fallback."""
        return self.rate_gbps if self.rate_gbps and self.rate_gbps > 0 else NET_FALLBACK_GBPS


def nccl_ports(device: str, ports: tuple[Port, ...], hca=None) -> list[Port]:
    """The device's ports NCCL opens (src/transport/net_ib/init.cc ncclIbInitDevices): ACTIVE
    ones (a port without a readable state counts) that ``hca``
    (:class:`gdrprobe.nccl.env.HcaFilter`, None: all) keeps."""
    return [port for port in ports if port.state in (None, ACTIVE)
            and (hca is None or hca.selects(device, (port.number,)))]


# ---- the inter-CPU link -------------------------------------------------------------------

# src/graph/topo.h: the inter-socket link per CPU (GB/s), chosen by topo.cc ncclTopoGetInterCpuBw.
LOC_BW, P9_BW, ARM_BW, AMD_BW = 5000.0, 32.0, 6.0, 16.0
# From 2.31 (topo.h AMD_ZEN12_BW, AMD_ZEN34_BW, AMD_ZEN5_BW; topo.cc ncclTopoAddCpu): AMD by
# CPUID family (0x17 Zen 1/2, 0x19 Zen 3/4, 0x1A Zen 5), and Intel's Granite Rapids (models
# 0xAD, 0xAE) and Sierra Forest (0xAF), whose model numbers are below Emerald Rapids', as it.
AMD_BW_BY_FAMILY = {25: 24.0, 26: 32.0}
INTEL_ERP_MODELS = (0xAD, 0xAE, 0xAF)
BDW_QPI_BW, SKL_QPI_BW, SRP_QPI_BW, ERP_QPI_BW = 6.0, 10.0, 22.0, 40.0
ZPI_BW, YONGFENG_ZPI_BW = 6.0, 9.0
ASSUMED_INTER_CPU_GBS = ARM_BW
# topo.cc kvDictCpuVendor, matched as prefixes by kvConvertToInt, in this order.
X86_VENDORS = (("GenuineIntel", "Intel"), ("AuthenticAMD", "AMD"), ("CentaurHauls", "Zhaoxin"),
               ("  Shanghai  ", "Zhaoxin"))


@dataclasses.dataclass(frozen=True)
class InterCpu:
    gbs: float
    source: str                    # how the figure was found, for the decision's why
    assumed: bool = False


def cpuinfo_fields(cpuinfo: str) -> dict[str, str]:
    """The first processor's fields; values keep their blanks (Zhaoxin's "  Shanghai  ")."""
    fields: dict[str, str] = {}
    for line in cpuinfo.split("\n\n", 1)[0].splitlines():
        name, colon, value = line.partition(":")
        if colon:
            fields.setdefault(name.strip(), value[1:] if value.startswith(" ") else value)
    return fields


def decimal_or_none(text: str) -> int | None:
    return decimal(text.strip())


def x86_inter_cpu(fields: dict[str, str], by_generation: bool = False) -> InterCpu:
    """topo.cc ncclTopoAddCpu (Intel family 6: model >= 0xCF Emerald Rapids, >= 0x8F
    Sapphire Rapids, >= 0x55 Skylake, else Broadwell; Zhaoxin family 7 model 0x5B
    Yongfeng; ``by_generation``, 2.31 on: AMD by family and Intel's Granite Rapids and Sierra
    Forest as Emerald Rapids). An x86 vendor NCCL does not know gets LOC_BW: no limit."""
    vendor_id = fields["vendor_id"]
    vendor = next((name for prefix, name in X86_VENDORS if vendor_id.startswith(prefix)), None)
    family, model = (decimal_or_none(fields.get(key, "")) for key in ("cpu family", "model"))
    what = f"{vendor_id.strip()} family {family} model {model:#x}" if model is not None else vendor_id.strip()
    if vendor == "Intel" and by_generation and family == 6 and model in INTEL_ERP_MODELS:
        gbs = ERP_QPI_BW
    elif vendor == "Intel":
        gbs = next((bw for floor, bw in ((0xCF, ERP_QPI_BW), (0x8F, SRP_QPI_BW), (0x55, SKL_QPI_BW))
                    if family == 6 and model is not None and model >= floor), BDW_QPI_BW)
    elif vendor == "AMD":
        gbs = AMD_BW_BY_FAMILY.get(family, AMD_BW) if by_generation else AMD_BW
    elif vendor == "Zhaoxin":
        gbs = YONGFENG_ZPI_BW if (family, model) == (7, 0x5B) else ZPI_BW
    else:
        return InterCpu(LOC_BW, f"{what}: a vendor NCCL does not know, so no inter-CPU limit (LOC_BW)")
    return InterCpu(gbs, f"{what} (/proc/cpuinfo)")


def inter_cpu_bandwidth(cpuinfo: str, by_generation: bool = False) -> InterCpu:
    """topo.cc ncclTopoGetInterCpuBw with the CPU NCCL describes in xml.cc
    ncclTopoGetXmlFromCpu (cpuid vendor, family and model, which /proc/cpuinfo shows for
    these families: 2.31 computes them as the kernel does, extended family and model where
    the base family is 15, extended model for 6); ``by_generation``: 2.31's table."""
    fields = cpuinfo_fields(cpuinfo)
    if "vendor_id" in fields:
        return x86_inter_cpu(fields, by_generation)
    if "CPU implementer" in fields:
        return InterCpu(ARM_BW, "an Arm CPU (/proc/cpuinfo)")
    if fields.get("cpu", "").strip().startswith("POWER"):
        return InterCpu(P9_BW, f"{fields['cpu'].strip()} (/proc/cpuinfo)")
    return InterCpu(ASSUMED_INTER_CPU_GBS, "the CPU is unknown (no /proc/cpuinfo NCCL's table can place): "
                                           f"{ASSUMED_INTER_CPU_GBS:g} GB/s assumed", assumed=True)


# ---- NVLink -------------------------------------------------------------------------------

# GB/s per NVLink by the lowest compute capability it applies from (src/graph/topo.h).
NVLINK_GBS_PER_LINK = ((100, 40.1), (90, 20.6), (87, 20.0), (86, 12.0), (80, 20.0), (70, 20.0), (60, 18.0))
NVLINK_FALLBACK_GBS = 20.0
ASSUMED_CAPABILITY = 90         # without CUDA facts


def nvlink_gbs_per_link(capability: int | None) -> float:
    cc = capability or ASSUMED_CAPABILITY
    return next((bw for floor, bw in NVLINK_GBS_PER_LINK if cc >= floor), NVLINK_FALLBACK_GBS)
