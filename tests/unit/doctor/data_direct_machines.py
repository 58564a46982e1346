"""Fixture machines for mlx5 data-direct NICs (issue 34): a GB300-like tray where each GPU
reaches Grace over C2C and sits under a PCIe switch beside its ConnectX's data-direct
function, while the ConnectX's RDMA device itself hangs off a Grace root port.

The data-direct function's PCI class (0x0880, "other system peripheral") is this fixture's
choice: gdrprobe finds it only through the path libmlx5 gives, never by its class. What a
capture stores of NCCL's data-direct sequence: :func:`data_direct_probe`.
"""

from __future__ import annotations

import json

from tests.unit.doctor import machines, nccl_machines

CAPTURE = nccl_machines.CAPTURE
DATA_DIRECT_CLASS, CONNECTX8_DMA = 0x088000, 0x1023
BLACKWELL = (10, 0)
EBADF, ENODEV, EOPNOTSUPP, EINVAL = 9, 19, 95, 22


def sysfs_path(tree: machines.SysfsTree, bdf: str) -> str:
    """The path as libmlx5 gives it: without the /sys prefix."""
    return tree.devices[bdf].removeprefix("/sys")


def data_direct_probe(tree: machines.SysfsTree, devices: dict | None = None, error: str | None = None) -> None:
    """Add NCCL's data-direct sequence, as the capture stores it, to the NIC facts."""
    path = tree.path(f"{CAPTURE}/nics.json")
    facts = json.loads(path.read_text()) if path.exists() else {}
    facts["data_direct"] = {"error": error} if error else {"devices": devices or {}}
    tree.write(f"{CAPTURE}/nics.json", json.dumps(facts))


def found(path: str) -> dict:
    return {"mlx5": True, "dmabuf_errno": EBADF, "path": path, "errno": None}


def not_data_direct(code: int = ENODEV) -> dict:
    return {"mlx5": True, "dmabuf_errno": EBADF, "path": None, "errno": code}


def gb300_tray(root, gpus: int = 2, probe: bool = True) -> machines.SysfsTree:
    """``gpus`` GPUs on one Grace: GPU k in PCI domain 8+k under a switch shared with mlx5_k's
    data-direct function (PIX); mlx5_k's RDMA device on a Grace root port in domain 0 (PHB
    on PCIe, P2C to NCCL). With data-direct NCCL 2.28.3+ opens only mlx5_k_dma, at the switch."""
    tree = machines.SysfsTree(root)
    grace = tree.host_bridge(0x00, numa=0, cpus="0-71", domain=0)
    gpu_bdfs, data_direct = [], {}
    for k in range(gpus):
        domain = 8 + k
        host = tree.host_bridge(0x00, numa=0, cpus="0-71", domain=domain)
        root_port = tree.bridge(host, f"{domain:04x}:00:01.0", vendor=machines.NVIDIA)
        gpu_port, dma_port = tree.switch(root_port, f"{domain:04x}:01:00.0",
                                         [f"{domain:04x}:02:00.0", f"{domain:04x}:02:01.0"])
        gpu_bdfs.append(tree.gpu(gpu_port, f"{domain:04x}:03:00.0"))
        dma = tree.function(dma_port, f"{domain:04x}:04:00.0", machines.MELLANOX, CONNECTX8_DMA,
                            DATA_DIRECT_CLASS)
        nic_port = tree.bridge(grace, f"0000:00:{k + 1:02x}.0", vendor=machines.NVIDIA)
        tree.nic(nic_port, f"0000:{k + 1:02x}:00.0", f"mlx5_{k}")
        data_direct[f"mlx5_{k}"] = found(sysfs_path(tree, dma))
    nics = list(data_direct)
    nccl_machines.finish(tree, nics)
    nccl_machines.stack(tree, driver=nccl_machines.OPEN_DRIVER.replace("x86_64", "aarch64"),
                        kernel="6.8.0-1013-nvidia-64k")
    nccl_machines.cuda_facts(tree, gpu_bdfs, capability=BLACKWELL, name="NVIDIA GB300")
    nccl_machines.nvml_facts(tree, gpu_bdfs, c2c=True)
    if probe:
        data_direct_probe(tree, data_direct)
    return tree
