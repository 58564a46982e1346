"""Where each GPU sits against the NIC NCCL uses for it, whether this is a virtual machine,
NCCL's topology file, and the GPU/NIC matrix in ``nvidia-smi topo -m`` vocabulary
(:mod:`gdrprobe.nccl.topo`), over the topology read once (:mod:`gdrprobe.doctor.facts.topology`).
"""

from __future__ import annotations

from gdrprobe.doctor.facts import nvml, pci
from gdrprobe.doctor.facts.rails import Rail, SharedElement, read_links, shared_element
from gdrprobe.doctor.facts.topology import (ABSENT, CPUINFO, DMI_FILES, HANGS, LOADED, MALFORMED, NO_FILE,
                                            NcclTopologyFile, PcieDevice, Topology)
from gdrprobe.nccl import params
from gdrprobe.nccl.env import GdrLevel
from gdrprobe.nccl.topo import pcie_distance
from gdrprobe.nccl.topo_file import OPEN_FAILURE_INFO_SINCE, VIRTUAL_TOPOLOGY_FILE
from gdrprobe.nccl.versions import NcclRules, dotted
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status

GROUP = ids.TOPOLOGY

LEGEND = (
    ("X", "the device itself"),
    ("SYS", "path crosses PCIe and the SMP link between NUMA nodes (QPI/UPI, Infinity Fabric)"),
    ("NODE", "path crosses PCIe and the link between host bridges inside one NUMA node"),
    ("PHB", "path crosses PCIe and a PCIe host bridge (usually the CPU)"),
    ("PXB", "path crosses several PCIe switches, but no host bridge"),
    ("PIX", "path crosses at most one PCIe switch"),
)


# ---- nvidia-smi topo -m style matrix -----------------------------------------


def render_matrix(topology: Topology, shared: SharedElement | None = None) -> str:
    """The GPU/NIC matrix laid out like ``nvidia-smi topo -m`` (PCIe distances only), and
    under it the element the node's rails share (``shared``), where there is one."""
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
    if shared is not None:
        lines += ["", f"Rails together ({', '.join(shared.rails)}) share: {shared.describe()}"]
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
                                     or "none (vendor 0x10de, class 0x0300/0x0302, or listed by amdkfd)")),
                Evidence(pci.INFINIBAND_CLASS_DIR,
                         "PCI NICs: " + (", ".join(f"{n.name}={n.bdf}" for n in topology.nics)
                                         or "none")))
    if topology.gpus and topology.nics:
        findings.append(Finding(ids.TOPOLOGY_DEVICES, GROUP, Status.OK,
                                f"{len(topology.gpus)} GPU(s) and {len(topology.nics)} "
                                "RDMA NIC(s) on PCIe", evidence))
    else:
        missing = " and ".join(kind for kind, have in (("NVIDIA GPU", topology.gpus),
                                                      ("PCI RDMA NIC", topology.nics)) if not have)
        findings.append(Finding(
            ids.TOPOLOGY_DEVICES, GROUP, Status.WARN,
            f"no {missing} found: GPUDirect RDMA cannot happen on this machine, "
            "GPU-NIC checks are skipped", evidence,
            "Run the doctor on a node with an NVIDIA GPU and an RDMA NIC (ConnectX or similar); "
            "if they are installed, check that /sys is the host's sysfs and the drivers are loaded."))
    for ibdev in topology.software_nics:
        findings.append(Finding(
            ids.TOPOLOGY_SOFTWARE_NIC, GROUP, Status.INFO,
            f"{ibdev} is a software RDMA device (no PCI function): fine for testing verbs, "
            "but it can never do GPUDirect RDMA",
            (Evidence(f"realpath {pci.INFINIBAND_CLASS_DIR}/{ibdev}", "no PCI device behind it"),)))
    return findings


def virtualization_finding(topology: Topology, topology_file: NcclTopologyFile) -> Finding:
    virt = topology.virtualization
    placed = len(topology_file.placements)
    if virt.flat and placed:
        return Finding(
            ids.TOPOLOGY_VM, GROUP, Status.INFO,
            f"flat virtual PCI topology: every GPU and NIC sits directly on a root bus, but NCCL's topology file "
            f"{topology_file.named} places {placed} of them under the switches it describes (topology.nccl_file)",
            virt.evidence)
    if virt.flat:
        return Finding(
            ids.TOPOLOGY_VM, GROUP, Status.WARN,
            "flat virtual PCI topology: every GPU and NIC sits directly on a root bus, so NCCL "
            "sees each pair as PHB and its default GDR level turns GPUDirect RDMA off",
            virt.evidence,
            "Give NCCL the real topology with NCCL_TOPO_FILE (the hypervisor's topology XML, e.g. "
            "/var/run/nvidia-topologyd/virtualTopology.xml) or have the VM built with a PCIe "
            "switch hierarchy that places each GPU next to its NIC; enable ATS on the NICs.")
    if virt.hypervisor:
        return Finding(
            ids.TOPOLOGY_VM, GROUP, Status.INFO,
            "virtual machine: the PCIe hierarchy seen here is the hypervisor's, ACS cannot be "
            "disabled from the guest (enable ATS instead)", virt.evidence)
    return Finding(ids.TOPOLOGY_VM, GROUP, Status.OK, "no sign of virtualization (bare metal)",
                   (Evidence(CPUINFO, "no 'hypervisor' flag"),
                    Evidence(DMI_FILES[0], "no hypervisor vendor")))


def level_finding(level: GdrLevel, where: str = "environment") -> Finding:
    source = Evidence(f"{where} NCCL_NET_GDR_LEVEL",
                      "unset" if level.raw is None else repr(level.raw))
    if level.ignored:
        return Finding(
            ids.TOPOLOGY_NCCL_LEVEL, GROUP, Status.WARN,
            f"NCCL_NET_GDR_LEVEL={level.raw!r} is not a value NCCL parses; NCCL ignores it "
            f"silently and uses its default ({level.name})", (source,),
            "Use an exact upper-case name (LOC, PIX, PXB, PHB, SYS, P2C...) or an integer 0-4, "
            "or unset the variable.")
    origin = ("NCCL's default" if level.raw is None else
              "NCCL_NET_GDR_LEVEL is undefined in NCCL, its default assumed" if level.undefined
              else "set by NCCL_NET_GDR_LEVEL")
    # P2C only differs from PXB for NICs reached through a C2C-attached CPU (Grace).
    meaning = ": PIX and PXB on PCIe" if level.name == "P2C" else ""
    return Finding(ids.TOPOLOGY_NCCL_LEVEL, GROUP, Status.INFO,
                   f"NCCL uses GPUDirect RDMA for GPU-NIC paths up to {level.name}{meaning} ({origin})",
                   (source,))


def distance_finding(gpu: PcieDevice, nic: PcieDevice, decision, nccl_class: str,
                     gdr_possible: bool = True, placed_by: str = "") -> Finding:
    """Where the NIC NCCL uses for this GPU sits, in nvidia-smi's words (sysfs) and NCCL's
    (which flattens Broadcom switches that show one switch as two levels, and follows its
    topology file, ``placed_by``, where that places either device); a PXN or C2C path that
    NCCL runs with GPUDirect RDMA is healthy whatever the PCIe distance (see nccl.gpu.<bdf>)."""
    distance = pcie_distance(gpu, nic)
    source = f", as NCCL's topology file {placed_by} places them" if placed_by else ""
    summary = (f"{gpu.name} ({gpu.bdf}, NUMA {gpu.numa_node}) and the NIC NCCL uses, {nic.name} "
               f"({nic.bdf}, NUMA {nic.numa_node}): {distance} (NCCL class {nccl_class}{source})")
    evidence = _placement_evidence(gpu) + _placement_evidence(nic)
    if distance in ("PIX", "PXB") or nccl_class in ("PIX", "PXB"):
        return Finding(ids.TOPOLOGY_DISTANCE, GROUP, Status.OK, summary, evidence)
    if not gdr_possible:
        return Finding(ids.TOPOLOGY_DISTANCE, GROUP, Status.INFO,
                       f"{summary}; GPUDirect RDMA is impossible on this NIC for another reason (see stack.path "
                       "and nccl.gpu), so NCCL routes every path through the CPU and picks among its NICs by "
                       "bandwidth: the placement matters once that is fixed", evidence)
    if decision.path in ("pxn", "c2c") and decision.gdr_write:
        route = "through an NVLink peer (PXN)" if decision.path == "pxn" else "over C2C (P2C)"
        return Finding(ids.TOPOLOGY_DISTANCE, GROUP, Status.OK,
                       f"{summary}; NCCL reaches it {route} with GPUDirect RDMA", evidence)
    if decision.unread:
        return Finding(ids.TOPOLOGY_DISTANCE, GROUP, Status.WARN,
                       f"{summary}; whether NCCL reaches it over C2C (P2C) or an NVLink peer (PXN) is unknown: "
                       "NVLink and C2C could not be read (see nccl.gpu and gpu.nvml)", evidence, nvml.NVML_FIX)
    if distance == "PHB":
        return Finding(ids.TOPOLOGY_DISTANCE, GROUP, Status.WARN,
                       summary + "; peer traffic crosses the root complex (works, but degraded)",
                       evidence,
                       "Put the NIC under the same PCIe switch as the GPU for full bandwidth.")
    return Finding(ids.TOPOLOGY_DISTANCE, GROUP, Status.FAIL,
                   summary + "; GPU and NIC do not share a PCIe root complex", evidence,
                   "Move the NIC to a slot under the GPU's root complex (same socket, ideally the "
                   "same PCIe switch), or pair this GPU with a NIC that is there.")


def nvml_crosscheck_finding(topology: Topology, facts) -> Finding | None:
    """NVML's common ancestor of each GPU pair (nvidia-smi topo -m) against the sysfs tree."""
    matrix = facts.get("common_ancestor") if nvml.usable(facts) else None
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
        return Finding(ids.TOPOLOGY_NVML, GROUP, Status.WARN,
                       f"NVML and the sysfs tree disagree on {len(differing)} of {compared} GPU pair(s): the "
                       "doctor judges by sysfs, as NCCL does, but something hides or fakes part of the tree",
                       tuple(differing),
                       "Compare `nvidia-smi topo -m` with `lspci -tv`; in a VM give NCCL the host's topology "
                       "(NCCL_TOPO_FILE).")
    return Finding(ids.TOPOLOGY_NVML, GROUP, Status.OK,
                   f"NVML's common ancestors agree with the sysfs tree for {compared} GPU pair(s)",
                   (Evidence("nvmlDeviceGetTopologyCommonAncestor", f"{compared} pair(s) compared"),))


# ---- NCCL's topology file ---------------------------------------------------------------


def file_evidence(topology_file: NcclTopologyFile) -> tuple[Evidence, ...]:
    setting = topology_file.setting
    source = f"{setting.origin} NCCL_TOPO_FILE" if setting.named else "NCCL's default path (NCCL_TOPO_FILE unset)"
    found = [Evidence(source, repr(setting.path))]
    if topology_file.path and topology_file.path != setting.path:
        found.append(Evidence(f"realpath {setting.path}", topology_file.path))
    return tuple(found)


def placement_evidence(topology_file: NcclTopologyFile, devices: tuple[PcieDevice, ...]) -> tuple[Evidence, ...]:
    return tuple(Evidence(f"{device.name} {device.bdf}", topology_file.placements[device.bdf].describe())
                 for device in devices if device.bdf in topology_file.placements)


def kept_gpu_attributes(topology_file: NcclTopologyFile, gpus: tuple[PcieDevice, ...]) -> list[str]:
    """<gpu> attributes the file fixes and NCCL keeps over what it detects (xml.cc
    ncclTopoGetXmlFromGpu sets dev and sm only where unset; topo.cc ncclTopoGetSystem
    xmlInitAttrInt keeps gdr): the doctor does not model them."""
    return [f"{gpu.name} {key}={value}" for gpu in gpus if gpu.bdf in topology_file.placements
            for key, value in topology_file.placements[gpu.bdf].gpu.items() if key in ("dev", "sm", "gdr")]


def loaded_file_finding(topology_file: NcclTopologyFile, topology: Topology) -> Finding:
    devices = topology.gpus + topology.nics
    evidence = file_evidence(topology_file) + placement_evidence(topology_file, devices)
    placed = [device.name for device in devices if device.bdf in topology_file.placements]
    if not placed:
        why = topology_file.detail or ("it names none of this node's GPUs and NICs by bus id or net name, "
                                       "nor a switch above them")
        return Finding(ids.TOPOLOGY_NCCL_FILE, GROUP, Status.WARN,
                       f"NCCL reads its topology file {topology_file.named}, but {why}: NCCL places every "
                       "device from sysfs", evidence,
                       "Give NCCL the topology file written for this machine (its VM size), whose <pci busid> "
                       "are the bus ids in /sys/bus/pci/devices, or unset NCCL_TOPO_FILE.")
    kept = kept_gpu_attributes(topology_file, topology.gpus)
    rest = len(devices) - len(placed)
    summary = (f"NCCL places {', '.join(placed)} as its topology file {topology_file.named} says, "
               f"not from sysfs" + (f"; {rest} other device(s) from sysfs" if rest else ""))
    if kept:
        return Finding(ids.TOPOLOGY_NCCL_FILE, GROUP, Status.WARN,
                       f"{summary}; the file also fixes {', '.join(kept)}, which NCCL keeps over what it detects "
                       "and the doctor does not model", evidence,
                       "Remove the <gpu> elements' dev, sm and gdr attributes unless they are meant to override "
                       "what NCCL detects.")
    return Finding(ids.TOPOLOGY_NCCL_FILE, GROUP, Status.OK, summary, evidence)


def unloaded_file_finding(topology_file: NcclTopologyFile, rules: NcclRules) -> Finding:
    """A file NCCL_TOPO_FILE names that NCCL does not load, or one at the default path that
    fails; NCCL logs a file it cannot open only when NCCL_TOPO_FILE names it."""
    evidence = file_evidence(topology_file)
    summary = f"NCCL's topology file {topology_file.named}: {topology_file.consequence()}"
    if topology_file.state in (MALFORMED, HANGS):
        return Finding(ids.TOPOLOGY_NCCL_FILE, GROUP, Status.FAIL, summary, evidence,
                       "Point NCCL_TOPO_FILE at a regular file, or unset it." if topology_file.state == HANGS else
                       "Repair the file (NCCL's own parser: double-quoted values, blanks between attributes, "
                       "no <?xml?> line, <system version=\"1\">) or reinstall it from the image, or unset "
                       "NCCL_TOPO_FILE.")
    level = "INFO" if rules.since(OPEN_FAILURE_INFO_SINCE) else "WARN"
    logged = (f"; {rules.name} says so only at NCCL_DEBUG={level} (\"Could not open XML topology file\", "
              f"{level} from {dotted(OPEN_FAILURE_INFO_SINCE)} on)") if topology_file.state == ABSENT else ""
    return Finding(ids.TOPOLOGY_NCCL_FILE, GROUP, Status.WARN, summary + logged, evidence,
                   "Point NCCL_TOPO_FILE at the topology file of this machine that the job's user may read, "
                   "or unset it.")


def topology_file_finding(topology_file: NcclTopologyFile, topology: Topology, rules: NcclRules) -> Finding:
    """Which topology source NCCL uses: sysfs, or the file it reads first (topo.cc
    ncclTopoGetSystem)."""
    if topology_file.state == LOADED:
        return loaded_file_finding(topology_file, topology)
    if topology_file.said:
        return unloaded_file_finding(topology_file, rules)
    default = (f"nor {VIRTUAL_TOPOLOGY_FILE}" if topology_file.state != NO_FILE
               else f"and {rules.name} reads no default file")
    return Finding(ids.TOPOLOGY_NCCL_FILE, GROUP, Status.INFO,
                   f"NCCL detects the topology from sysfs: no NCCL_TOPO_FILE {default}",
                   (Evidence("environment and NCCL's configuration files", "NCCL_TOPO_FILE unset"),))


# ---- the rails together -------------------------------------------------------------------


def node_rails(topology: Topology, decisions) -> list[Rail]:
    """Each GPU with the NIC NCCL uses for it (GPUs without one are no rail)."""
    nics = {nic.name: nic for nic in topology.nics}
    return [Rail(gpu, nics[decision.nic]) for gpu, decision in zip(topology.gpus, decisions)
            if decision.nic in nics]


def rails_element(ctx) -> SharedElement | None:
    """The element every rail of the node shares (:mod:`gdrprobe.doctor.facts.rails`)."""
    rails = node_rails(ctx.topology, ctx.nccl_decisions)
    rates = {rail.nic.name: pci.line_rate_gbps(ctx.ports.get(rail.nic.name, ())) for rail in rails}
    return shared_element(rails, read_links(ctx.root, rails), rates)


def rails_finding(element: SharedElement) -> Finding:
    """Where rails that run at once (an all-reduce over every NIC) meet, and whether the
    link there carries them all."""
    evidence = (Evidence("rails (GPU-NIC NCCL uses)", ", ".join(element.rails)),)
    if element.link is not None:
        evidence += (Evidence(f"{pci.device_dir(element.name)}/current_link_width, current_link_speed",
                              element.link.describe()),)
    summary = f"the {len(element.rails)} rails share the {element.describe()}"
    if element.oversubscribed:
        return Finding(ids.TOPOLOGY_RAILS, GROUP, Status.WARN,
                       summary + ": narrower than the rails' NICs together, so rails that run at once "
                       "(every NCCL collective over all NICs) contend there", evidence,
                       "Measure it on an idle node with `gdrprobe check --node --all-rails`; have the link "
                       "retrained to its full width and speed (reseat the card or riser), or move a NIC to "
                       "a slot with an uplink of its own.")
    return Finding(ids.TOPOLOGY_RAILS, GROUP, Status.INFO, summary, evidence)


def check(ctx) -> list[Finding]:
    topology = ctx.topology
    findings = inventory_findings(topology)
    findings.append(virtualization_finding(topology, ctx.nccl_topology_file))
    if not (topology.gpus and topology.nics):
        return findings
    findings.append(topology_file_finding(ctx.nccl_topology_file, topology, ctx.nccl_rules))
    shared = rails_element(ctx)
    findings.append(Finding(ids.TOPOLOGY_MATRIX, GROUP, Status.INFO,
                            "GPU/NIC matrix in nvidia-smi topo -m vocabulary",
                            (Evidence("sysfs PCI tree", render_matrix(topology, shared)),)))
    crosscheck = nvml_crosscheck_finding(topology, ctx.nvml_facts)
    findings += [crosscheck] if crosscheck else []
    level = ctx.nccl_rules.gdr_level(ctx.environ)
    findings.append(level_finding(level, ctx.environ_source(params.NET_GDR_LEVEL.name)))
    nics = {nic.name: nic for nic in topology.nics}
    node = ctx.nccl_node
    placed = {device.bdf: device for device in node.gpus + node.nics + tuple(node.data_direct.values())}
    for gpu, decision in zip(topology.gpus, ctx.nccl_decisions):
        if decision.nic is not None:
            # A data-direct device (<dev>_dma) is where NCCL places the traffic, not the RDMA device.
            nic = node.data_direct[decision.nic] if decision.data_direct else nics[decision.nic]
            possible = ctx.memory_paths.nic_gdr(decision.nic, gpu.bdf)
            nccl_class = ctx.nccl_tree.path_type(placed[gpu.bdf], placed[nic.bdf])
            by_file = {gpu.bdf, nic.bdf} & set(ctx.nccl_topology_file.placements)
            findings.append(distance_finding(gpu, nic, decision, nccl_class, possible,
                                             ctx.nccl_topology_file.named if by_file else ""))
    return findings + ([rails_finding(shared)] if shared else [])
