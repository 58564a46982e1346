"""What NCCL's rules (:mod:`gdrprobe.nccl.decision`) read of this machine, gathered from the
doctor's facts: the GPUs and NICs on the PCIe tree, where NCCL's topology file puts them
instead (its CPU and switches, the link it gives a device, the ids it gives a switch), each
NIC's ports, each device's PCIe link, the ids of the switches above them (NCCL flattens
Broadcom ones), the CUDA driver's and NVML's word on each GPU, /proc/cpuinfo, and whether
NCCL can register GPU memory with each NIC."""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Mapping
from typing import Any

from gdrprobe.doctor.facts import nvml, pci
from gdrprobe.doctor.facts.nvml_library import REMOTE_GPU, REMOTE_IBMNPU, REMOTE_SWITCH
from gdrprobe.doctor.facts.topology import CPUINFO, LOADED, NcclTopologyFile, PcieDevice, pcie_endpoint
from gdrprobe.nccl.data_direct import SUFFIX
from gdrprobe.nccl.decision import GpuFacts, NodeFacts, mlo_partition
from gdrprobe.nccl.topo import NOT_VISIBLE, nccl_parents
from gdrprobe.nccl.topo_file import Placement
from gdrprobe.nccl.versions import NcclRules


def cuda_gpus(cuda_facts: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The CUDA driver's facts per GPU bus id; none when the driver could not be asked."""
    if not cuda_facts or "error" in cuda_facts:
        return {}
    return {gpu["pci_bus_id"]: gpu for gpu in cuda_facts.get("gpus", [])}


def capability(cuda_gpu: dict[str, Any]) -> int | None:
    major, minor = cuda_gpu.get("compute_capability_major"), cuda_gpu.get("compute_capability_minor")
    return None if major is None else major * 10 + (minor or 0)


def nvlink_ends(nvml_gpu: dict[str, Any], by_type: bool) -> tuple[str, ...]:
    """The far end of each NVLink NCCL counts, as the release reads NVML's answers
    (:mod:`gdrprobe.doctor.facts.nvml_library`): by nvmlDeviceGetNvLinkRemoteDeviceType from
    2.31 (a switch is NOT_VISIBLE, a GPU or NPU its bus id, anything unread skipped); by the
    remote bus id alone before (an empty one NOT_VISIBLE). A capture of an earlier gdrprobe
    holds the bus ids as 2.30.7 read them."""
    if "nvlinks" not in nvml_gpu:
        return tuple(nvml_gpu.get("nvlink_remote_bus_ids", ()))
    ends = []
    for link in nvml_gpu["nvlinks"]:
        kind, bus = link.get("remote_type"), link.get("remote_bus_id")
        if not by_type and bus is not None:
            ends.append(bus or NOT_VISIBLE)
        elif by_type and kind == REMOTE_SWITCH:
            ends.append(NOT_VISIBLE)
        elif by_type and kind in (REMOTE_GPU, REMOTE_IBMNPU) and bus:
            ends.append(bus)
    return tuple(ends)


def gpu_facts(cuda_gpu: dict[str, Any], nvml_gpu: dict[str, Any] | None, rules: NcclRules,
              unread: str = "") -> GpuFacts:
    """One GPU's facts: the CUDA driver's, NVML's as the release reads them, and why NVML's
    could not be read ("" where they were)."""
    supported = cuda_gpu.get("gpu_direct_rdma_supported")
    nvml_gpu = nvml_gpu or {}
    nvml_sm = nvml_gpu.get("compute_capability")
    return GpuFacts(capability=capability(cuda_gpu) or (nvml_sm[0] * 10 + nvml_sm[1] if nvml_sm else None),
                    gdr_supported=None if supported is None else bool(supported),
                    c2c_links=nvml_gpu.get("c2c_link_count") or 0,
                    nvlinks=nvlink_ends(nvml_gpu, rules.nvlink_remote_type),
                    mlo_part=mlo_partition(cuda_gpu.get("name")), links_unread=unread)


def nvml_order(nvml_facts: dict[str, Any] | None) -> tuple[str | None, ...] | None:
    """NVML's GPUs by index (PCI bus order of every GPU of the node; None for one sysfs does
    not show); None without NVML."""
    if not nvml.usable(nvml_facts):
        return None
    return tuple(entry.get("pci_bus_id") for entry in nvml_facts.get("gpus", []))


def placed(device: PcieDevice, placement: Placement | None) -> PcieDevice:
    """The device where NCCL puts it: on the topology file's CPU (NCCL tells its CPUs apart
    by numaid alone) below the file's switches, where the file has a say."""
    if placement is None:
        return device
    return dataclasses.replace(device, numa_node=placement.numa_node, host_bridge=f"<cpu numaid={placement.numaid}>",
                               nccl_parents=placement.parents)


def switch_ids(root, devices: tuple[PcieDevice, ...], placements: Mapping[str, Placement]) -> dict[str, int]:
    """The id NCCL gives each switch above the devices, the file's attributes first."""
    ids = {}
    for device in devices:
        placement = placements.get(device.bdf)
        in_file = placement.from_file if placement else {}
        for bridge in nccl_parents(device) if placement else device.bridges:
            ids[bridge] = pci.nccl_device_id(root, bridge, in_file.get(bridge))
    return dict(sorted(ids.items()))


def placement_notes(topology_file: NcclTopologyFile, devices: tuple[PcieDevice, ...]) -> dict[str, str]:
    """What each decision says of the file: where it put the device, or, for every GPU, that
    NCCL does not read it (named but missing, unreadable, or failing NCCL's init)."""
    file = topology_file.named
    if topology_file.state == LOADED:
        return {device.bdf: f"{device.name} ({device.bdf}) is where NCCL's topology file {file} puts it: "
                            f"{topology_file.placements[device.bdf].describe()}"
                for device in devices if device.bdf in topology_file.placements}
    if not topology_file.said:
        return {}
    return {device.bdf: f"NCCL's topology file {file}: {topology_file.consequence()}"
            for device in devices if device.kind == "GPU"}


def data_direct_devices(ctx, nics: tuple[PcieDevice, ...]) -> dict[str, PcieDevice]:
    """Each NIC's data-direct device, named ``<dev>_dma``, where libmlx5 gives a path to a PCI
    function sysfs has (NCCL places it there, on NCCL's PCI tree: xml.cc reads its sysfs)."""
    found = {}
    for nic in nics:
        probe = ctx.data_direct_probes.get(nic.name)
        bdf = posixpath.basename(probe.path.rstrip("/")) if probe and probe.path else None
        if bdf and ctx.root.exists(pci.device_dir(bdf)):
            found[nic.name] = pcie_endpoint(ctx.root, "NIC", nic.name + SUFFIX, bdf)
    return found


def links_unread(ctx, bdf: str) -> str:
    """Why NCCL's NVLink and C2C facts of a GPU are unknown ("": read, or an AMD node, where
    RCCL reads no NVML)."""
    return "" if ctx.nccl_rules.library == "RCCL" else nvml.unread_reason(ctx.nvml_facts, bdf)


def collect_node_facts(ctx) -> NodeFacts:
    topology = ctx.topology
    cuda = cuda_gpus(ctx.cuda_facts)
    placements = ctx.nccl_topology_file.placements
    gpus = tuple(placed(gpu, placements.get(gpu.bdf)) for gpu in topology.gpus)
    # NCCL chooses among the NICs it can open (ctx.unopenable_nics says why one is not).
    nics = tuple(placed(nic, placements.get(nic.bdf)) for nic in topology.nics if nic.name not in ctx.unopenable_nics)
    data_direct = data_direct_devices(ctx, nics)
    devices = gpus + nics + tuple(data_direct.values())
    return NodeFacts(
        gpus=gpus, nics=nics,
        ports={nic.name: ctx.ports.get(nic.name, ()) for nic in nics},
        links={device.bdf: pci.pcie_link(ctx.root, device.bdf, placements[device.bdf].own
                                          if device.bdf in placements else None) for device in devices},
        gpu_facts={gpu.bdf: gpu_facts(cuda.get(gpu.bdf, {}), nvml.gpu_entry(ctx.nvml_facts, gpu.bdf),
                                      ctx.nccl_rules, links_unread(ctx, gpu.bdf)) for gpu in topology.gpus},
        nvml_order=nvml_order(ctx.nvml_facts),
        cpuinfo=ctx.root.read(CPUINFO) or "",
        gdr_support=ctx.memory_paths,
        switch_ids=switch_ids(ctx.root, devices, placements),
        placement=placement_notes(ctx.nccl_topology_file, devices),
        data_direct=data_direct,
        data_direct_errors={nic.name: probe.reason for nic in nics
                            if (probe := ctx.data_direct_probes.get(nic.name)) and probe.breaks_init})
