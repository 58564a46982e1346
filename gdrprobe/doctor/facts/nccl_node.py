"""What NCCL's rules (:mod:`gdrprobe.nccl.decision`) read of this machine, gathered from the
doctor's facts: the GPUs and NICs on the PCIe tree, each NIC's ports, each device's PCIe
link, the ids of the switches above them (NCCL flattens Broadcom ones), the CUDA driver's
and NVML's word on each GPU, /proc/cpuinfo, and whether NCCL can register GPU memory with
each NIC."""

from __future__ import annotations

from typing import Any

from gdrprobe.doctor.facts import nvml, pci
from gdrprobe.doctor.facts.topology import CPUINFO
from gdrprobe.nccl.decision import GpuFacts, NodeFacts, mlo_partition


def cuda_gpus(cuda_facts: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The CUDA driver's facts per GPU bus id; none when the driver could not be asked."""
    if not cuda_facts or "error" in cuda_facts:
        return {}
    return {gpu["pci_bus_id"]: gpu for gpu in cuda_facts.get("gpus", [])}


def capability(cuda_gpu: dict[str, Any]) -> int | None:
    major, minor = cuda_gpu.get("compute_capability_major"), cuda_gpu.get("compute_capability_minor")
    return None if major is None else major * 10 + (minor or 0)


def gpu_facts(cuda_gpu: dict[str, Any], nvml_gpu: dict[str, Any] | None) -> GpuFacts:
    supported = cuda_gpu.get("gpu_direct_rdma_supported")
    nvml_gpu = nvml_gpu or {}
    return GpuFacts(capability=capability(cuda_gpu),
                    gdr_supported=None if supported is None else bool(supported),
                    c2c_links=nvml_gpu.get("c2c_link_count") or 0,
                    nvlinks=tuple(nvml_gpu.get("nvlink_remote_bus_ids", ())),
                    mlo_part=mlo_partition(cuda_gpu.get("name")))


def nvml_order(nvml_facts: dict[str, Any] | None) -> tuple[str, ...] | None:
    """NVML's GPUs by index (PCI bus order of every GPU of the node); None without NVML."""
    if not nvml.usable(nvml_facts):
        return None
    return tuple(entry.get("pci_bus_id") for entry in nvml_facts.get("gpus", []))


def collect_node_facts(ctx) -> NodeFacts:
    topology = ctx.topology
    cuda = cuda_gpus(ctx.cuda_facts)
    # NCCL chooses among the NICs it can open (ctx.unopenable_nics says why one is not).
    nics = tuple(nic for nic in topology.nics if nic.name not in ctx.unopenable_nics)
    devices = topology.gpus + nics
    return NodeFacts(
        gpus=topology.gpus, nics=nics,
        ports={nic.name: ctx.ports.get(nic.name, ()) for nic in nics},
        links={device.bdf: pci.pcie_link(ctx.root, device.bdf) for device in devices},
        gpu_facts={gpu.bdf: gpu_facts(cuda.get(gpu.bdf, {}), nvml.gpu_entry(ctx.nvml_facts, gpu.bdf))
                   for gpu in topology.gpus},
        nvml_order=nvml_order(ctx.nvml_facts),
        cpuinfo=ctx.root.read(CPUINFO) or "",
        gdr_support=ctx.memory_paths,
        switch_ids={bridge: pci.nccl_device_id(ctx.root, bridge)
                    for bridge in sorted({b for device in devices for b in device.bridges})})
