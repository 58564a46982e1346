"""GPU and NIC placement on the PCIe tree, and what NCCL's GDR gate makes of it.

Distances use the ``nvidia-smi topo -m`` vocabulary because that is what people read:
X (self), PIX (at most one PCIe switch between), PXB (several switches, no host bridge),
PHB (through the host bridge / root complex), NODE (between host bridges of one NUMA
node), SYS (across the inter-socket link). NCCL has no NODE: two host bridges of one
NUMA node hang off one CPU node in its graph, so NODE is PHB to NCCL.
"""

from __future__ import annotations

import dataclasses

from gdrprobe.doctor import pci
from gdrprobe.nccl.env import NCCL_CLASS_OF_DISTANCE, GdrLevel, gdr_level
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.sysroot import SysRoot

GROUP = "topology"

DISTANCES = ("X", "PIX", "PXB", "PHB", "NODE", "SYS")   # nearest first

LEGEND = (
    ("X", "the device itself"),
    ("SYS", "path crosses PCIe and the SMP link between NUMA nodes (QPI/UPI, Infinity Fabric)"),
    ("NODE", "path crosses PCIe and the link between host bridges inside one NUMA node"),
    ("PHB", "path crosses PCIe and a PCIe host bridge (usually the CPU)"),
    ("PXB", "path crosses several PCIe switches, but no host bridge"),
    ("PIX", "path crosses at most one PCIe switch"),
)

# sys_vendor / product_name substrings that only virtual machines report.
HYPERVISOR_DMI_MARKERS = ("qemu", "kvm", "vmware", "virtualbox", "xen", "virtual machine",
                          "bhyve", "openstack", "google compute engine", "cloud hypervisor")
# PCI vendors whose devices only exist inside virtual machines (emulated or paravirtual).
HYPERVISOR_PCI_VENDORS = {0x1AF4: "Red Hat virtio", 0x1B36: "Red Hat/QEMU",
                          0x15AD: "VMware", 0x1414: "Microsoft Hyper-V", 0x5853: "XenSource"}
DMI_FILES = ("/sys/devices/virtual/dmi/id/sys_vendor", "/sys/devices/virtual/dmi/id/product_name")
CPUINFO = "/proc/cpuinfo"
XEN_HYPERVISOR_TYPE = "/sys/hypervisor/type"


@dataclasses.dataclass(frozen=True)
class PcieDevice:
    """A GPU or an RDMA NIC and where it sits on the PCIe tree."""

    kind: str                      # "GPU" or "NIC"
    name: str                      # "GPU0" by bus order; the ibdev name (mlx5_0) for NICs
    bdf: str
    numa_node: int                 # -1 when sysfs does not say
    sysfs_path: str                # resolved /sys/devices/pci.../<bdf>
    host_bridge: str | None        # pci0000:00
    local_cpus: str | None         # local_cpulist, the "CPU Affinity" column of nvidia-smi
    bridges: tuple[str, ...]       # from the root port down to the direct parent


@dataclasses.dataclass(frozen=True)
class Virtualization:
    hypervisor: bool               # some file says this is a guest
    flat: bool                     # every GPU and NIC sits directly on a root bus
    evidence: tuple[Evidence, ...]

    @property
    def is_vm(self) -> bool:
        return self.hypervisor or self.flat


@dataclasses.dataclass(frozen=True)
class Topology:
    gpus: tuple[PcieDevice, ...]
    nics: tuple[PcieDevice, ...]
    software_nics: tuple[str, ...]     # RDMA devices with no PCI function (rxe, siw)
    virtualization: Virtualization

    def distance(self, a: PcieDevice, b: PcieDevice) -> str:
        return pcie_distance(a, b)

    def nccl_class(self, a: PcieDevice, b: PcieDevice) -> str:
        return NCCL_CLASS_OF_DISTANCE[pcie_distance(a, b)]

    def bridges_between(self, a: PcieDevice, b: PcieDevice) -> tuple[str, ...]:
        """Bridges a peer transaction from a to b crosses (all of both chains across host bridges)."""
        common = 0
        if a.host_bridge == b.host_bridge:
            common = _common_prefix(a.bridges, b.bridges)
        # The deepest shared bridge is where the switch turns the packet around, so it counts.
        start = max(common - 1, 0)
        return tuple(dict.fromkeys(a.bridges[start:] + b.bridges[start:]))


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    count = 0
    for left, right in zip(a, b):
        if left != right:
            break
        count += 1
    return count


def pcie_distance(a: PcieDevice, b: PcieDevice) -> str:
    if a.bdf == b.bdf:
        return "X"
    if a.host_bridge != b.host_bridge:
        # Unknown NUMA (-1 on both) happens on single-node machines, so it counts as one node.
        return "NODE" if a.numa_node == b.numa_node else "SYS"
    common = _common_prefix(a.bridges, b.bridges)
    if common == 0:
        return "PHB"
    # Below the shared switch each side crosses one downstream port when no other switch is in between.
    below = max(len(a.bridges), len(b.bridges)) - common
    return "PIX" if below <= 1 else "PXB"


# ---- building --------------------------------------------------------------


def _endpoint(root: SysRoot, kind: str, name: str, bdf: str) -> PcieDevice:
    path = pci.resolved_path(root, bdf)
    return PcieDevice(kind=kind, name=name, bdf=bdf, numa_node=pci.numa_node(root, bdf),
                    sysfs_path=path, host_bridge=pci.host_bridge(path),
                    local_cpus=pci.local_cpulist(root, bdf),
                    bridges=pci.parent_bridges(path))


def find_gpus(root: SysRoot, bdfs: list[str]) -> tuple[PcieDevice, ...]:
    gpu_bdfs = [bdf for bdf in bdfs if pci.is_nvidia_gpu(root, bdf)]
    return tuple(_endpoint(root, "GPU", f"GPU{i}", bdf) for i, bdf in enumerate(gpu_bdfs))


def find_nics(root: SysRoot) -> tuple[tuple[PcieDevice, ...], tuple[str, ...]]:
    """RDMA devices split into PCI NICs and software devices."""
    nics, software = [], []
    for ibdev in pci.rdma_devices(root):
        bdf = pci.rdma_device_bdf(root, ibdev)
        if bdf is None:
            software.append(ibdev)
        else:
            nics.append(_endpoint(root, "NIC", ibdev, bdf))
    nics.sort(key=lambda nic: (nic.bdf, nic.name))
    return tuple(nics), tuple(software)


def hypervisor_evidence(root: SysRoot, bdfs: list[str]) -> list[Evidence]:
    """Every file that says this machine is a guest; empty on bare metal."""
    found = []
    cpuinfo = root.read(CPUINFO) or ""
    flags = next((line for line in cpuinfo.splitlines() if line.startswith("flags")), "")
    if "hypervisor" in flags.split():
        found.append(Evidence(CPUINFO, "flags include 'hypervisor'"))
    for path in DMI_FILES:
        text = root.read(path)
        if text and any(marker in text.lower() for marker in HYPERVISOR_DMI_MARKERS):
            found.append(Evidence(path, text))
    xen = root.read(XEN_HYPERVISOR_TYPE)
    if xen:
        found.append(Evidence(XEN_HYPERVISOR_TYPE, xen))
    by_vendor: dict[int, list[str]] = {}
    for bdf in bdfs:
        vendor = pci.vendor_id(root, bdf)
        if vendor in HYPERVISOR_PCI_VENDORS:
            by_vendor.setdefault(vendor, []).append(bdf)
    for vendor, devices in by_vendor.items():
        found.append(Evidence(f"{pci.device_dir(devices[0])}/vendor",
                              f"0x{vendor:04x} ({HYPERVISOR_PCI_VENDORS[vendor]}), "
                              f"also on {len(devices) - 1} other device(s)"))
    return found


def detect_virtualization(root: SysRoot, bdfs: list[str],
                          endpoints: tuple[PcieDevice, ...]) -> Virtualization:
    hints = hypervisor_evidence(root, bdfs)
    flat = bool(endpoints) and all(not e.bridges for e in endpoints)
    placement = [Evidence("resolved /sys/bus/pci/devices links",
                          "; ".join(f"{e.name} -> {e.sysfs_path}" for e in endpoints))]
    return Virtualization(hypervisor=bool(hints), flat=flat,
                          evidence=tuple(hints + (placement if flat else [])))


def build_topology(root: SysRoot) -> Topology:
    bdfs = pci.list_devices(root)
    gpus = find_gpus(root, bdfs)
    nics, software = find_nics(root)
    # Flatness only means something when GPUs and NICs would share a tree.
    endpoints = gpus + nics if gpus and nics else ()
    return Topology(gpus=gpus, nics=nics, software_nics=software,
                    virtualization=detect_virtualization(root, bdfs, endpoints))


# ---- NCCL's GDR gate ---------------------------------------------------------


# ---- nvidia-smi topo -m style matrix -----------------------------------------


def render_matrix(topology: Topology) -> str:
    """The GPU/NIC matrix laid out like ``nvidia-smi topo -m`` (PCIe distances only)."""
    devices = topology.gpus + topology.nics
    labels = [g.name for g in topology.gpus] + [f"NIC{i}" for i in range(len(topology.nics))]
    width = max([len(label) for label in labels] + [4]) + 2
    lines = [" " * width + "".join(label.ljust(width) for label in labels)
             + "CPU Affinity".ljust(16) + "NUMA Affinity"]
    for label, row in zip(labels, devices):
        cells = "".join(pcie_distance(row, col).ljust(width) for col in devices)
        numa = str(row.numa_node) if row.numa_node >= 0 else "N/A"
        # nvidia-smi gives affinities for GPU rows only.
        affinity = (row.local_cpus or "N/A").ljust(16) + numa if row.kind == "GPU" else ""
        lines.append((label.ljust(width) + cells + affinity).rstrip())
    lines += ["", "Legend:", ""]
    lines += [f"  {code:<4} = {meaning}" for code, meaning in LEGEND]
    lines += ["  (GPU to GPU cells give the PCIe distance; NVLink is not visible in sysfs)"]
    if topology.nics:
        lines += ["", "NIC Legend:", ""]
        lines += [f"  NIC{i}: {nic.name}" for i, nic in enumerate(topology.nics)]
    return "\n".join(lines)


# ---- findings ------------------------------------------------------------------


def _placement_evidence(endpoint: PcieDevice) -> tuple[Evidence, ...]:
    link = (f"{pci.INFINIBAND_CLASS_DIR}/{endpoint.name}/device" if endpoint.kind == "NIC"
            else pci.device_dir(endpoint.bdf))
    return (Evidence(f"realpath {link}", endpoint.sysfs_path),
            Evidence(f"{pci.device_dir(endpoint.bdf)}/numa_node", str(endpoint.numa_node)))


def inventory_findings(topology: Topology) -> list[Finding]:
    findings = []
    evidence = (Evidence(pci.PCI_DEVICES_DIR,
                         "GPUs: " + (", ".join(f"{g.name}={g.bdf}" for g in topology.gpus)
                                     or "none (vendor 0x10de, class 0x0300/0x0302)")),
                Evidence(pci.INFINIBAND_CLASS_DIR,
                         "PCI NICs: " + (", ".join(f"{n.name}={n.bdf}" for n in topology.nics)
                                         or "none")))
    if topology.gpus and topology.nics:
        findings.append(Finding("topology.devices", GROUP, Status.OK,
                                f"{len(topology.gpus)} NVIDIA GPU(s) and {len(topology.nics)} "
                                "RDMA NIC(s) on PCIe", evidence))
    else:
        missing = " and ".join(kind for kind, have in (("NVIDIA GPU", topology.gpus),
                                                      ("PCI RDMA NIC", topology.nics)) if not have)
        findings.append(Finding(
            "topology.devices", GROUP, Status.WARN,
            f"no {missing} found: GPUDirect RDMA cannot happen on this machine, "
            "GPU-NIC checks are skipped", evidence,
            "Run the doctor on a node with an NVIDIA GPU and an RDMA NIC (ConnectX or similar); "
            "if they are installed, check that /sys is the host's sysfs and the drivers are loaded."))
    for ibdev in topology.software_nics:
        findings.append(Finding(
            "topology.software_nic", GROUP, Status.INFO,
            f"{ibdev} is a software RDMA device (no PCI function): fine for testing verbs, "
            "but it can never do GPUDirect RDMA",
            (Evidence(f"realpath {pci.INFINIBAND_CLASS_DIR}/{ibdev}", "no PCI device behind it"),)))
    return findings


def virtualization_finding(topology: Topology) -> Finding:
    virt = topology.virtualization
    if virt.flat:
        return Finding(
            "topology.vm", GROUP, Status.WARN,
            "flat virtual PCI topology: every GPU and NIC sits directly on a root bus, so NCCL "
            "sees each pair as PHB and its default GDR level turns GPUDirect RDMA off",
            virt.evidence,
            "Give NCCL the real topology with NCCL_TOPO_FILE (the hypervisor's topology XML, e.g. "
            "/var/run/nvidia-topologyd/virtualTopology.xml) or have the VM built with a PCIe "
            "switch hierarchy that places each GPU next to its NIC; enable ATS on the NICs.")
    if virt.hypervisor:
        return Finding(
            "topology.vm", GROUP, Status.INFO,
            "virtual machine: the PCIe hierarchy seen here is the hypervisor's, ACS cannot be "
            "disabled from the guest (enable ATS instead)", virt.evidence)
    return Finding("topology.vm", GROUP, Status.OK, "no sign of virtualization (bare metal)",
                   (Evidence(CPUINFO, "no 'hypervisor' flag"),
                    Evidence(DMI_FILES[0], "no hypervisor vendor")))


def level_finding(level: GdrLevel, where: str = "environment") -> Finding:
    source = Evidence(f"{where} NCCL_NET_GDR_LEVEL",
                      "unset" if level.raw is None else repr(level.raw))
    if level.ignored:
        return Finding(
            "topology.nccl_level", GROUP, Status.WARN,
            f"NCCL_NET_GDR_LEVEL={level.raw!r} is not a value NCCL parses; NCCL ignores it "
            f"silently and uses its default ({level.name})", (source,),
            "Use an exact upper-case name (LOC, PIX, PXB, PHB, SYS, P2C...) or an integer 0-4, "
            "or unset the variable.")
    origin = ("NCCL's default" if level.raw is None else
              "NCCL_NET_GDR_LEVEL is undefined in NCCL, its default assumed" if level.undefined
              else "set by NCCL_NET_GDR_LEVEL")
    # P2C only differs from PXB for NICs reached through a C2C-attached CPU (Grace).
    meaning = ": PIX and PXB on PCIe" if level.name == "P2C" else ""
    return Finding("topology.nccl_level", GROUP, Status.INFO,
                   f"NCCL uses GPUDirect RDMA for GPU-NIC paths up to {level.name}{meaning} ({origin})",
                   (source,))


def distance_finding(gpu: PcieDevice, nic: PcieDevice, decision) -> Finding:
    """Where the NIC NCCL uses for this GPU sits; a PXN or C2C path that NCCL runs with
    GPUDirect RDMA is healthy whatever the PCIe distance (see nccl.gpu.<bdf>)."""
    distance = pcie_distance(gpu, nic)
    nccl_class = NCCL_CLASS_OF_DISTANCE[distance]
    summary = (f"{gpu.name} ({gpu.bdf}, NUMA {gpu.numa_node}) and the NIC NCCL uses, {nic.name} "
               f"({nic.bdf}, NUMA {nic.numa_node}): {distance} (NCCL class {nccl_class})")
    evidence = _placement_evidence(gpu) + _placement_evidence(nic)
    if distance in ("PIX", "PXB"):
        return Finding("topology.distance", GROUP, Status.OK, summary, evidence)
    if decision.path in ("pxn", "c2c") and decision.gdr_write:
        route = "through an NVLink peer (PXN)" if decision.path == "pxn" else "over C2C (P2C)"
        return Finding("topology.distance", GROUP, Status.OK,
                       f"{summary}; NCCL reaches it {route} with GPUDirect RDMA", evidence)
    if distance == "PHB":
        return Finding("topology.distance", GROUP, Status.WARN,
                       summary + "; peer traffic crosses the root complex (works, but degraded)",
                       evidence,
                       "Put the NIC under the same PCIe switch as the GPU for full bandwidth.")
    return Finding("topology.distance", GROUP, Status.FAIL,
                   summary + "; GPU and NIC do not share a PCIe root complex", evidence,
                   "Move the NIC to a slot under the GPU's root complex (same socket, ideally the "
                   "same PCIe switch), or pair this GPU with a NIC that is there.")


def nvml_crosscheck_finding(topology: Topology, facts) -> Finding | None:
    """NVML's common ancestor of each GPU pair (nvidia-smi topo -m) against the sysfs tree."""
    matrix = (facts or {}).get("common_ancestor") if facts and "error" not in facts else None
    if not matrix:
        return None
    gpus = {gpu.bdf: gpu for gpu in topology.gpus}
    compared, differing = 0, []
    for first, row in sorted(matrix.items()):
        for second, level in sorted(row.items()):
            if first in gpus and second in gpus:
                compared += 1
                ours = pcie_distance(gpus[first], gpus[second])
                if ours != level:
                    differing.append(Evidence(f"{first} - {second}", f"NVML {level}, sysfs {ours}"))
    if differing:
        return Finding("topology.nvml", GROUP, Status.WARN,
                       f"NVML and the sysfs tree disagree on {len(differing)} of {compared} GPU pair(s): the "
                       "doctor judges by sysfs, as NCCL does, but something hides or fakes part of the tree",
                       tuple(differing),
                       "Compare `nvidia-smi topo -m` with `lspci -tv`; in a VM give NCCL the host's topology "
                       "(NCCL_TOPO_FILE).")
    return Finding("topology.nvml", GROUP, Status.OK,
                   f"NVML's common ancestors agree with the sysfs tree for {compared} GPU pair(s)",
                   (Evidence("nvmlDeviceGetTopologyCommonAncestor", f"{compared} pair(s) compared"),))


def check(ctx) -> list[Finding]:
    topology = ctx.topology
    findings = inventory_findings(topology)
    findings.append(virtualization_finding(topology))
    if not (topology.gpus and topology.nics):
        return findings
    findings.append(Finding("topology.matrix", GROUP, Status.INFO,
                            "GPU/NIC matrix in nvidia-smi topo -m vocabulary",
                            (Evidence("sysfs PCI tree", render_matrix(topology)),)))
    crosscheck = nvml_crosscheck_finding(topology, ctx.nvml_facts)
    findings += [crosscheck] if crosscheck else []
    findings.append(level_finding(gdr_level(ctx.environ), ctx.environ_source("NCCL_NET_GDR_LEVEL")))
    nics = {nic.name: nic for nic in topology.nics}
    for gpu, decision in zip(topology.gpus, ctx.nccl_decisions):
        if decision.nic is not None:
            findings.append(distance_finding(gpu, nics[decision.nic], decision))
    return findings
