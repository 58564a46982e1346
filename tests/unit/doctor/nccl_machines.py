"""Fixture machines for the cases where the doctor must decide as NCCL decides (issue 10).

Each builder lays out a whole node with :class:`machines.SysfsTree` and adds what the NCCL
rules read besides the PCI tree: PCIe link speed and width, the NIC port rate, the
peer-memory files, and the facts a capture stores (CUDA, NVML, the NICs' DMA-BUF probe).
The expected answers, and the NCCL source each comes from, are in the tests that use them.
"""

from __future__ import annotations

import json
import os

from gdrprobe.doctor.facts import nvml
from tests.nvml_standin import build as nvml_standin
from tests.unit.doctor import machines
from tests.unit.doctor.fake_nvml import FakeNvml

CAPTURE = "/gdrprobe-capture"
OPEN_DRIVER = ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build  "
               "(dvs-builder@U16-I3-B03-4-3)")
PROPRIETARY_DRIVER = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.06  Wed Jun 26 06:46:07 UTC 2024"
GEN5, GEN4, GEN3 = "32.0 GT/s PCIe", "16.0 GT/s PCIe", "8.0 GT/s PCIe"
EBADF, EOPNOTSUPP = 9, 95

# Compute capabilities (major, minor) of the GPUs the fixtures impersonate.
HOPPER, VOLTA = (9, 0), (7, 0)


def link(tree: machines.SysfsTree, bdf: str, speed: str = GEN5, width: int = 16) -> None:
    """The PCIe link attributes NCCL reads for the device and its parent port (xml.cc)."""
    directory = tree.devices[bdf]
    tree.write(f"{directory}/max_link_speed", speed + "\n")
    tree.write(f"{directory}/max_link_width", f"{width}\n")


def links_everywhere(tree: machines.SysfsTree, speed: str = GEN5, width: int = 16) -> None:
    for bdf in tree.devices:
        link(tree, bdf, speed, width)


def port_rate(tree: machines.SysfsTree, ibdev: str, gbps: int, port: int = 1) -> None:
    """/sys/class/infiniband/DEV/ports/N/rate as the kernel writes it, and the port ACTIVE."""
    base = f"/sys/class/infiniband/{ibdev}/ports/{port}"
    tree.write(f"{base}/rate", f"{gbps} Gb/sec (4X)\n")
    tree.write(f"{base}/state", "4: ACTIVE\n")
    tree.write(f"{base}/phys_state", "5: LinkUp\n")
    tree.write(f"{base}/link_layer", "InfiniBand\n")


def stack(tree: machines.SysfsTree, driver: str = OPEN_DRIVER, kernel: str = "6.8.0-45-generic") -> None:
    tree.write("/proc/driver/nvidia/version", driver + "\nGCC version:  gcc version 12.3.0\n")
    tree.write("/proc/sys/kernel/osrelease", kernel + "\n")


def nvidia_peermem(tree: machines.SysfsTree, memory_peers: bool = False) -> None:
    """nvidia-peermem loaded; ``memory_peers`` adds the files kernels before 6.6 (with OFED) show."""
    tree.write("/sys/module/nvidia_peermem/version", "570.86.15\n")
    tree.write("/sys/module/mlx_compat/refcnt", "1\n")
    if memory_peers:
        tree.write("/sys/kernel/mm/memory_peers/nv_mem/version", "570.86.15\n")
        tree.write("/sys/kernel/mm/memory_peers/nv_mem_nc/version", "570.86.15\n")


def nv_peer_mem(tree: machines.SysfsTree) -> None:
    """The deprecated Mellanox module: it registers the nv_mem client NCCL also counts."""
    tree.write("/sys/module/nv_peer_mem/version", "1.3-0\n")
    tree.write("/sys/module/mlx_compat/refcnt", "1\n")
    tree.write("/sys/kernel/mm/memory_peers/nv_mem/version", "1.3-0\n")


def cuda_facts(tree: machines.SysfsTree, gpus: list[str], capability=HOPPER, dma_buf: int = 1,
               driver_version: int = 12080, name: str = "NVIDIA H100 80GB HBM3") -> None:
    entries = [{"ordinal": i, "name": name, "pci_bus_id": bdf, "total_memory_bytes": 80 << 30,
                "gpu_direct_rdma_supported": 1, "dma_buf_supported": dma_buf,
                "gpu_direct_rdma_flush_writes_options": 1, "gpu_direct_rdma_writes_ordering": 100,
                "compute_capability_major": capability[0], "compute_capability_minor": capability[1]}
               for i, bdf in enumerate(gpus)]
    tree.write(f"{CAPTURE}/cuda.json", json.dumps({"driver_version": driver_version, "gpus": entries}))


def nic_probe(tree: machines.SysfsTree, results: dict[str, int | None]) -> None:
    """What ibv_reg_dmabuf_mr(fd=-1) gave per NIC: an errno (EBADF: supported) or None."""
    tree.write(f"{CAPTURE}/nics.json", json.dumps({"dmabuf_probe": {
        dev: {"errno": err} for dev, err in results.items()}}))


def standin_settings(gpus: list[str], nvlink: dict[str, list[str]] | None, c2c: bool, sm: int) -> dict:
    """The stand-in libnvidia-ml.so.1's settings for these GPUs: each far end that is one of
    them a GPU, any other an NVSwitch at that bus id."""
    links = [f"{bdf}>{end if end in gpus else 'switch=' + end}*1"
             for bdf, ends in (nvlink or {}).items() for end in ends]
    return nvml_standin.settings(gpus=[(bdf, sm) for bdf in gpus], nvlinks=links,
                                 c2c=[f"{bdf}=10" for bdf in gpus] if c2c else ())


def nvml_facts(tree: machines.SysfsTree, gpus: list[str], nvlink: dict[str, list[str]] | None = None,
               c2c: bool = False, bar1_total: int = 128 << 30, ancestors: dict | None = None,
               sm: int = 90) -> dict:
    """What the doctor reads of NVML, in the shape the capture stores: NCCL's facts read by
    gdrprobe's reader from the stand-in libnvidia-ml.so.1 set up with these links, and
    nvidia-ml-py's extras from a fake (gdrprobe.doctor.facts.nvml)."""
    extras = {"driver_version": "570.86.15", "common_ancestor": ancestors or {},
              "gpus": [{"pci_bus_id": bdf, "bar1_total_bytes": bar1_total, "bar1_used_bytes": 64 << 20,
                        "persistence_mode": True} for bdf in gpus]}
    saved = dict(os.environ)
    os.environ.update(standin_settings(gpus, nvlink, c2c, sm))
    try:
        facts = nvml.collect_nvml_facts(gpus, library=str(nvml_standin.build()), extras=FakeNvml(extras))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    tree.write(f"{CAPTURE}/nvml.json", json.dumps(facts))
    return facts


# ---- machines ---------------------------------------------------------------------------


def healthy_stack(tree: machines.SysfsTree, gpus: list[str], nics: list[str]) -> None:
    """DMA-BUF on a modern host: open module, kernel 6.8, every NIC passes NCCL's probe; NVML
    answers, without NVLink or C2C."""
    stack(tree)
    cuda_facts(tree, gpus)
    nic_probe(tree, {nic: EBADF for nic in nics})
    nvml_facts(tree, gpus)


def hgx_8gpu_4nic(root) -> machines.SysfsTree:
    """HGX-like: 8 NVSwitch-connected GPUs, 4 NICs. Per root complex, GPU 2k shares a switch
    with mlx5_k (PIX) and GPU 2k+1 hangs off another root port (PHB to every NIC of its
    socket): NCCL sends GPU 2k+1's traffic through GPU 2k over NVLink (PXN)."""
    tree = machines.SysfsTree(root)
    gpus, nics = [], []
    for k, bus in enumerate((0x18, 0x3A, 0x9A, 0xBA)):
        numa = 0 if k < 2 else 1
        host = tree.host_bridge(bus, numa=numa, cpus="0-55" if numa == 0 else "56-111")
        root_port = tree.bridge(host, f"0000:{bus:02x}:01.0", vendor=machines.INTEL)
        gpu_port, nic_port = tree.switch(root_port, f"0000:{bus + 1:02x}:00.0",
                                         [f"0000:{bus + 2:02x}:00.0", f"0000:{bus + 2:02x}:01.0"])
        gpus.append(tree.gpu(gpu_port, f"0000:{bus + 3:02x}:00.0"))
        nics.append(f"mlx5_{k}")
        tree.nic(nic_port, f"0000:{bus + 4:02x}:00.0", nics[-1])
        other_port = tree.bridge(host, f"0000:{bus:02x}:02.0", vendor=machines.INTEL)
        gpus.append(tree.gpu(other_port, f"0000:{bus + 5:02x}:00.0"))
    links_everywhere(tree)
    for nic in nics:
        port_rate(tree, nic, 400)
    healthy_stack(tree, gpus, nics)
    # Every GPU's 18 links end on NVSwitches (bus ids that are no GPU of this node).
    nvml_facts(tree, gpus, nvlink={bdf: ["0000:05:00.0"] * 18 for bdf in gpus})
    return tree


def gh200(root) -> machines.SysfsTree:
    """Grace Hopper: the GPU reaches Grace over C2C (NVML), the NIC hangs off a Grace root port:
    PHB on PCIe, P2C to NCCL, GDR on by default."""
    tree = machines.SysfsTree(root)
    tree.cpuinfo(hypervisor=False)
    gpu_host = tree.host_bridge(0x09, numa=0, cpus="0-71", domain=9)
    gpu = tree.gpu(tree.bridge(gpu_host, "0009:00:01.0", vendor=machines.NVIDIA), "0009:01:00.0")
    nic_host = tree.host_bridge(0x00, numa=0, cpus="0-71", domain=0)
    tree.nic(tree.bridge(nic_host, "0000:00:01.0", vendor=machines.NVIDIA), "0000:01:00.0", "mlx5_0")
    links_everywhere(tree)
    port_rate(tree, "mlx5_0", 400)
    stack(tree, driver=OPEN_DRIVER.replace("x86_64", "aarch64"), kernel="6.8.0-1013-nvidia-64k")
    cuda_facts(tree, [gpu], name="NVIDIA GH200 480GB")
    nic_probe(tree, {"mlx5_0": EBADF})
    nvml_facts(tree, [gpu], c2c=True)
    return tree


def pix_pairs(root, pairs: int = 2) -> machines.SysfsTree:
    """The DGX-like PIX node with link attributes and 400 Gb/s ports (no stack files)."""
    tree = machines.pix_node(root, pairs)
    links_everywhere(tree)
    for k in range(pairs):
        port_rate(tree, f"mlx5_{k}", 400)
    return tree


def gpu_bdfs(tree: machines.SysfsTree) -> list[str]:
    return sorted(bdf for bdf, path in tree.devices.items()
                  if (tree.path(path) / "vendor").read_text().strip() == f"0x{machines.NVIDIA:04x}"
                  and (tree.path(path) / "class").read_text().strip() == f"0x{machines.GPU_3D_CLASS:06x}")


def dmabuf_only(root) -> machines.SysfsTree:
    """Open module, kernel 6.8, no nvidia-peermem: DMA-BUF is the only path."""
    tree = pix_pairs(root)
    healthy_stack(tree, gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    return tree


def peermem_kernel_6_8(root) -> machines.SysfsTree:
    """Proprietary driver (no DMA-BUF) on 6.8 with OFED and nvidia-peermem: no memory_peers
    directory exists on 6.6+, only /sys/module/nvidia_peermem/version."""
    tree = pix_pairs(root)
    stack(tree, driver=PROPRIETARY_DRIVER)
    cuda_facts(tree, gpu_bdfs(tree), dma_buf=0)
    nic_probe(tree, {"mlx5_0": EBADF, "mlx5_1": EBADF})
    nvidia_peermem(tree)
    return tree


def nv_peer_mem_only(root) -> machines.SysfsTree:
    """Proprietary driver, kernel 5.4, MLNX_OFED and the old nv_peer_mem module only."""
    tree = pix_pairs(root)
    stack(tree, driver=PROPRIETARY_DRIVER, kernel="5.4.0-200-generic")
    cuda_facts(tree, gpu_bdfs(tree), dma_buf=0, driver_version=12020)
    nic_probe(tree, {"mlx5_0": EOPNOTSUPP, "mlx5_1": EOPNOTSUPP})
    nv_peer_mem(tree)
    return tree


def v100_no_nvlink(root) -> machines.SysfsTree:
    """Two V100s (sm70) on PCIe without NVLink, each beside its NIC: GDR writes yes, reads no."""
    tree = pix_pairs(root)
    healthy_stack(tree, gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    cuda_facts(tree, gpu_bdfs(tree), capability=VOLTA, name="Tesla V100-PCIE-32GB")
    nvml_facts(tree, gpu_bdfs(tree))
    return tree


def slow_nic_nearer(root) -> machines.SysfsTree:
    """One GPU with a 100 Gb/s NIC under its own switch (PIX) and a 400 Gb/s NIC on another
    root port of the same root complex (PHB): NCCL takes the faster one, at PHB."""
    tree = machines.SysfsTree(root)
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    gpu_port, nic_port = tree.switch(root_port, "0000:19:00.0", ["0000:1a:00.0", "0000:1a:01.0"])
    gpu = tree.gpu(gpu_port, "0000:1b:00.0")
    tree.nic(nic_port, "0000:1c:00.0", "mlx5_0")
    tree.nic(tree.bridge(host, "0000:18:02.0", vendor=machines.INTEL), "0000:1d:00.0", "mlx5_1")
    links_everywhere(tree)
    port_rate(tree, "mlx5_0", 100)
    port_rate(tree, "mlx5_1", 400)
    healthy_stack(tree, [gpu], ["mlx5_0", "mlx5_1"])
    return tree


def pix_and_pxb(root) -> machines.SysfsTree:
    """GPU0 shares a switch with mlx5_0 (PIX); GPU1 is two switches from mlx5_1 (PXB)."""
    tree = machines.SysfsTree(root)
    machines.pix_pair(tree, 0x18, numa=0, ibdev="mlx5_0")
    host = tree.host_bridge(0x98, numa=1, cpus="56-111")
    root_port = tree.bridge(host, "0000:98:01.0", vendor=machines.INTEL)
    left, right = tree.switch(root_port, "0000:99:00.0", ["0000:9a:00.0", "0000:9a:01.0"])
    (gpu_port,) = tree.switch(left, "0000:9b:00.0", ["0000:9c:00.0"])
    tree.gpu(gpu_port, "0000:9d:00.0")
    tree.nic(right, "0000:9e:00.0", "mlx5_1")
    links_everywhere(tree)
    for nic in ("mlx5_0", "mlx5_1"):
        port_rate(tree, nic, 400)
    healthy_stack(tree, gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    return tree


def shared_switch(root, gpus: tuple[str, ...] = ("0000:1b:00.0", "0000:1e:00.0"), nics: int = 2,
                  elsewhere: tuple[str, ...] = ()) -> machines.SysfsTree:
    """GPUs ``gpus`` and ``nics`` NICs under one PCIe switch (PIX to each other), GPUs
    ``elsewhere`` on another root port of the same root complex (PHB); every GPU's NVLinks
    end on NVSwitches. GPU bus ids are chosen by the tests: NVML numbers GPUs in bus order."""
    tree = machines.SysfsTree(root)
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    ports = tree.switch(root_port, "0000:19:00.0", [f"0000:1a:{k:02x}.0" for k in range(len(gpus) + nics)])
    for port, bdf in zip(ports, gpus):
        tree.gpu(port, bdf)
    names = [f"mlx5_{k}" for k in range(nics)]
    for k, (port, name) in enumerate(zip(ports[len(gpus):], names)):
        tree.nic(port, f"0000:1c:{k:02x}.0", name)
    for k, bdf in enumerate(elsewhere):
        tree.gpu(tree.bridge(host, f"0000:18:{k + 2:02x}.0", vendor=machines.INTEL), bdf)
    links_everywhere(tree)
    for name in names:
        port_rate(tree, name, 400)
    every_gpu = sorted(gpus + elsewhere)
    healthy_stack(tree, every_gpu, names)
    nvml_facts(tree, every_gpu, nvlink={bdf: ["0000:05:00.0"] * 18 for bdf in every_gpu})
    return tree


def cpu(tree: machines.SysfsTree, vendor: str, family: int | None = None, model: int | None = None) -> None:
    """/proc/cpuinfo's first processor as the kernel prints it on x86."""
    lines = ["processor\t: 0", f"vendor_id\t: {vendor}"]
    lines += [f"cpu family\t: {family}"] if family is not None else []
    lines += [f"model\t\t: {model}"] if model is not None else []
    tree.write("/proc/cpuinfo", "\n".join(lines) + "\nflags\t\t: fpu\n\n")


# ---- issue 20: NCCL's PCI tree, the detour of GDR-less paths, NIC fusion, peermem ---------------

PLX = 0x10B5
# Broadcom PEX switches as ncclTopoGetIntDevice packs them (vendor, device, subsystem vendor,
# subsystem device; src/graph/topo.cc getBcmGen): Gen5's top level has subsystem device 0x0xxx,
# its sub-switches 0x1xxx; Gen4 (PEX88000) both 0xa0xx.
BCM_GEN5_TOP, BCM_GEN5_SUB = (0x1000, 0xC030, 0x1000, 0x0100), (0x1000, 0xC030, 0x1000, 0x1100)
BCM_GEN4 = (0x1000, 0xC010, 0x1000, 0xA064)
PLX_SWITCH = (PLX, 0x8796, PLX, 0x8796)


def switch_port(tree: machines.SysfsTree, parent: str, bdf: str, ids: tuple[int, int, int, int]) -> str:
    """A bridge with the four ids NCCL reads of a switch (xml.cc ncclTopoGetXmlFromSys)."""
    vendor, device, sub_vendor, sub_device = ids
    tree.function(parent, bdf, vendor, device, machines.PCI_BRIDGE_CLASS)
    tree.write(f"{tree.devices[bdf]}/subsystem_vendor", f"0x{sub_vendor:04x}\n")
    tree.write(f"{tree.devices[bdf]}/subsystem_device", f"0x{sub_device:04x}\n")
    return bdf


def finish(tree: machines.SysfsTree, nics: list[str], gbps: int = 400) -> machines.SysfsTree:
    links_everywhere(tree)
    for nic in nics:
        port_rate(tree, nic, gbps)
    healthy_stack(tree, gpu_bdfs(tree), nics)
    return tree


def two_level_switch(root, top: tuple, sub: tuple) -> machines.SysfsTree:
    """A GPU and a NIC, each under its own sub-switch of one switch whose top level has the
    ids ``top`` and its sub-switches ``sub``: nvidia-smi's PXB; PIX to NCCL when it flattens
    the switch (a Broadcom switch that presents itself as two levels)."""
    tree = machines.SysfsTree(root)
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    switch_port(tree, root_port, "0000:19:00.0", top)
    left, right = (switch_port(tree, "0000:19:00.0", bdf, top) for bdf in ("0000:1a:00.0", "0000:1a:01.0"))
    switch_port(tree, left, "0000:1b:00.0", sub)
    switch_port(tree, right, "0000:1e:00.0", sub)
    tree.gpu(switch_port(tree, "0000:1b:00.0", "0000:1c:00.0", sub), "0000:1d:00.0")
    tree.nic(switch_port(tree, "0000:1e:00.0", "0000:1f:00.0", sub), "0000:20:00.0", "mlx5_0")
    return finish(tree, ["mlx5_0"])


def detour_tie(root) -> machines.SysfsTree:
    """GPU1 (NVML index 1) is PXB from mlx5_0 (two PLX switches) and PHB from mlx5_1 (another
    root port); GPU0 sits behind another host bridge of the same socket (PHB from both). All
    links and ports are equally fast, so path types alone separate the NICs."""
    tree = machines.SysfsTree(root)
    other = tree.host_bridge(0x03)
    tree.gpu(tree.bridge(other, "0000:03:01.0", vendor=machines.INTEL), "0000:04:00.0")
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    switch_port(tree, root_port, "0000:19:00.0", PLX_SWITCH)
    left, right = (switch_port(tree, "0000:19:00.0", bdf, PLX_SWITCH) for bdf in ("0000:1a:00.0", "0000:1a:01.0"))
    switch_port(tree, left, "0000:1b:00.0", PLX_SWITCH)
    tree.gpu(switch_port(tree, "0000:1b:00.0", "0000:1c:00.0", PLX_SWITCH), "0000:1d:00.0")
    tree.nic(right, "0000:1e:00.0", "mlx5_0")
    tree.nic(tree.bridge(host, "0000:18:02.0", vendor=machines.INTEL), "0000:20:00.0", "mlx5_1")
    return finish(tree, ["mlx5_0", "mlx5_1"])


def nearest_nic_without_gdr(root) -> machines.SysfsTree:
    """GPU0 shares a switch with mlx5_0 (PIX), whose DMA-BUF probe fails (EOPNOTSUPP), and is
    PXB from mlx5_1 (behind a second switch), which passes it; no peer memory."""
    tree = machines.SysfsTree(root)
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    gpu_port, nic_port, far_port = tree.switch(root_port, "0000:19:00.0",
                                               ["0000:1a:00.0", "0000:1a:01.0", "0000:1a:02.0"])
    tree.gpu(gpu_port, "0000:1b:00.0")
    tree.nic(nic_port, "0000:1c:00.0", "mlx5_0")
    (below,) = tree.switch(far_port, "0000:1d:00.0", ["0000:1e:00.0"])
    tree.nic(below, "0000:1f:00.0", "mlx5_1")
    finish(tree, ["mlx5_0", "mlx5_1"])
    nic_probe(tree, {"mlx5_0": EOPNOTSUPP, "mlx5_1": EBADF})
    return tree


def dual_port_card(root, link_layers: tuple[str, str] = ("InfiniBand", "InfiniBand")) -> machines.SysfsTree:
    """Two GPUs and one dual-port card (mlx5_0 = function .0, mlx5_1 = function .1, 200 Gb/s
    each) under one switch."""
    tree = machines.SysfsTree(root)
    host = tree.host_bridge(0x18)
    root_port = tree.bridge(host, "0000:18:01.0", vendor=machines.INTEL)
    first, card, second = tree.switch(root_port, "0000:19:00.0", ["0000:1a:00.0", "0000:1a:01.0", "0000:1a:02.0"])
    tree.gpu(first, "0000:1b:00.0")
    tree.nic(card, "0000:1c:00.0", "mlx5_0")
    tree.nic(card, "0000:1c:00.1", "mlx5_1")
    tree.gpu(second, "0000:1d:00.0")
    finish(tree, ["mlx5_0", "mlx5_1"], gbps=200)
    for nic, layer in zip(("mlx5_0", "mlx5_1"), link_layers):
        tree.write(f"/sys/class/infiniband/{nic}/ports/1/link_layer", layer + "\n")
    return tree


def peermem_not_registered(root, dmabuf: bool = False) -> machines.SysfsTree:
    """MLNX_OFED's peer-memory API is there (/sys/kernel/mm/memory_peers) and nvidia-peermem
    is loaded, but its nv_mem client is not in the API's list. ``dmabuf``: an open driver on
    6.8 where DMA-BUF works as well."""
    tree = pix_pairs(root)
    if dmabuf:
        healthy_stack(tree, gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    else:
        stack(tree, driver=PROPRIETARY_DRIVER, kernel="5.15.0-105-generic")
        cuda_facts(tree, gpu_bdfs(tree), dma_buf=0)
        nic_probe(tree, {"mlx5_0": EOPNOTSUPP, "mlx5_1": EOPNOTSUPP})
    nvidia_peermem(tree)
    tree.path("/sys/kernel/mm/memory_peers").mkdir(parents=True)
    return tree


def gh200_nic_beside_gpu(root) -> machines.SysfsTree:
    """Grace Hopper with the NIC under a PCIe switch shared with the GPU (PIX), not behind
    Grace: NCCL forces a PCIe mapping of GPU memory (GDR mode PCI)."""
    tree = machines.SysfsTree(root)
    host = tree.host_bridge(0x00, numa=0, cpus="0-71", domain=9)
    root_port = tree.bridge(host, "0009:00:01.0", vendor=machines.NVIDIA)
    gpu_port, nic_port = tree.switch(root_port, "0009:01:00.0", ["0009:02:00.0", "0009:02:01.0"])
    gpu = tree.gpu(gpu_port, "0009:03:00.0")
    tree.nic(nic_port, "0009:04:00.0", "mlx5_0")
    finish(tree, ["mlx5_0"])
    cuda_facts(tree, [gpu], name="NVIDIA GH200 480GB")
    nvml_facts(tree, [gpu], c2c=True)
    return tree


# ---- issue 28: the registration NCCL uses, NCCL's release and environment ---------------------


def dmabuf_and_peermem(root) -> machines.SysfsTree:
    """Open module on 5.15 with MLNX_OFED: DMA-BUF works and nvidia-peermem is registered
    with the peer-memory API as well (every release of NCCL finds it), so NCCL could register
    either way and its release and NCCL_DMABUF_ENABLE choose."""
    tree = dmabuf_only(root)
    stack(tree, kernel="5.15.0-105-generic")
    nvidia_peermem(tree, memory_peers=True)
    return tree


def grace_pair(root) -> machines.SysfsTree:
    """Two Grace Hoppers in one node: each GPU reaches its own Grace over C2C, each Grace has
    one 400 Gb/s NIC on a root port (P2C from its GPU, SYS from the other), and the two GPUs
    share 18 NVLinks, so each can also reach the other Grace's NIC through its peer (PXN)."""
    tree = machines.SysfsTree(root)
    tree.cpuinfo(hypervisor=False)
    gpus = []
    for k in (0, 1):
        cpus = "0-71" if k == 0 else "72-143"
        gpu_host = tree.host_bridge(0x00, numa=k, cpus=cpus, domain=8 + k)
        gpus.append(tree.gpu(tree.bridge(gpu_host, f"000{8 + k}:00:01.0", vendor=machines.NVIDIA),
                             f"000{8 + k}:01:00.0"))
        nic_host = tree.host_bridge(0x00, numa=k, cpus=cpus, domain=k)
        tree.nic(tree.bridge(nic_host, f"000{k}:00:01.0", vendor=machines.NVIDIA), f"000{k}:01:00.0", f"mlx5_{k}")
    links_everywhere(tree)
    for k in (0, 1):
        port_rate(tree, f"mlx5_{k}", 400)
    stack(tree, driver=OPEN_DRIVER.replace("x86_64", "aarch64"), kernel="6.8.0-1013-nvidia-64k")
    cuda_facts(tree, gpus, name="NVIDIA GH200 480GB")
    nic_probe(tree, {"mlx5_0": EBADF, "mlx5_1": EBADF})
    nvml_facts(tree, gpus, c2c=True, nvlink={gpus[0]: [gpus[1]] * 18, gpus[1]: [gpus[0]] * 18})
    return tree


def hopper_pair_without_nvlink(root) -> machines.SysfsTree:
    """Two H100 PCIe cards (sm90) without NVLink bridges, each beside its NIC."""
    tree = dmabuf_only(root)
    nvml_facts(tree, gpu_bdfs(tree))
    return tree


def gpu_outside_sysfs(root) -> machines.SysfsTree:
    """What a VM or a container without the GPU's PCI function shows (the lab's guests too):
    the CUDA driver lists a GPU that sysfs has no NVIDIA function for, and the only RDMA
    device is Soft-RoCE. NCCL's topology cannot be read here."""
    tree = machines.SysfsTree(root)
    tree.software_rdma("rxe0")
    stack(tree)
    cuda_facts(tree, ["0000:00:05.0"])
    return tree
