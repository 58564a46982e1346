"""NCCL's network devices on one node, as its IB transport and topology code make them:

1. Each ACTIVE port of an RDMA device that NCCL_IB_HCA keeps is a device of its own
   (``src/transport/net_ib/init.cc`` ncclIbInitDevices), at the speed the port states
   (``src/graph/topo.cc`` ncclTopoAddNet: Mb/s / 8000, 10 Gb/s when none).
2. Its place on the PCIe tree is the PCI function ncclIbGetPciPath names: the device's
   sysfs path with the function number set to 0 and, while NCCL_IB_MERGE_VFS is on (its
   default), the device number too, so a card's second port and its virtual functions sit
   where its first function sits.
3. From NCCL 2.24.3, devices at most NCCL_NET_MERGE_LEVEL apart (default PORT: the ports
   of one card, or functions that differ only in their last digit) fuse into one virtual
   NIC (``topo.cc`` ncclTopoAutoMerge, ncclTopoGetPath): up to four devices
   (NCCL_NET_MAX_DEVS_PER_NIC_V11, the internal IB transport's limit), named by joining
   theirs with '+' and as fast as their sum (``init.cc`` ncclIbMakeVDeviceInternal), which
   refuses devices of different link layers, and every fusion when NCCL_IB_MERGE_NICS=0.

Not modelled: NCCL_NET_FORCE_MERGE (fusions named by hand) and NCCL_NET_MERGE_POLICY=RAIL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.nccl import params
from gdrprobe.nccl.env import HcaFilter, merge_level
from gdrprobe.nccl.topo import NET_FALLBACK_GBPS, PATH_RANK, NcclPciTree, PcieEndpoint, Port, nccl_ports

MAX_DEVS_PER_VNIC = 4


@dataclasses.dataclass(frozen=True)
class Net:
    """One of NCCL's network devices: a port, or a virtual NIC fused from several."""

    device: PcieEndpoint           # where NCCL places it: its (first) device's PCI function
    port: int | None               # None: sysfs lists no port, or a virtual NIC
    gbs: float                     # NCCL's speed: the port's (or the sum's) Mb/s / 8000
    label: str                     # the device's name, ":port" where it has several; a+b when fused
    link_layer: str | None = None
    members: tuple[str, ...] = ()  # the labels of the devices fused into it; empty: not fused
    data_direct_of: str | None = None  # <dev>_dma: the RDMA device whose data-direct face it is

    @property
    def ibdev(self) -> str:
        """The RDMA device verbs opens for it (a data-direct face is its device's)."""
        return self.data_direct_of or self.device.name


def physical_nets(nic: PcieEndpoint, listed: tuple[Port, ...], hca: HcaFilter | None) -> list[Net]:
    """The device's ports NCCL opens, in port order; a device whose ports sysfs does not
    list counts as one device at NCCL's fallback speed, unless NCCL_IB_HCA drops it."""
    ports = nccl_ports(nic.name, listed, hca)
    if ports:
        return [Net(nic, port.number, port.nccl_gbps / 8.0,
                    nic.name if len(ports) == 1 else f"{nic.name}:{port.number}", port.link_layer)
                for port in ports]
    if listed or (hca is not None and not hca.selects(nic.name)):
        return []
    return [Net(nic, None, NET_FALLBACK_GBPS / 8.0, nic.name)]


def data_direct_net(net: Net, device: PcieEndpoint) -> Net:
    """The port's data-direct face (:mod:`gdrprobe.nccl.data_direct`): named ``<dev>_dma``
    and placed at the data-direct device, at the port's speed (``init.cc`` ncclIbInitDevices)."""
    return dataclasses.replace(net, device=device, label=device.name + net.label[len(net.ibdev):],
                               data_direct_of=net.ibdev)


def merge_vfs(environ: Mapping[str, str]) -> bool:
    """NCCL_IB_MERGE_VFS (default 1): a NIC's virtual functions count as its physical one
    (net_ib ncclIbGetPciPath)."""
    return params.IB_MERGE_VFS.number(environ) != 0


def mapped_function(bdf: str, merge_vfs: bool) -> str:
    """ncclIbGetPciPath: the last character of the path (the function) becomes 0, and with
    NCCL_IB_MERGE_VFS the two before the dot (the device) become 00."""
    mapped = bdf[:-1] + "0"
    return mapped[:-4] + "00" + mapped[-2:] if merge_vfs else mapped


def pci_place(device: PcieEndpoint, merge_vfs: bool) -> tuple:
    """What NCCL compares to find two devices on one PCI function."""
    return device.host_bridge, device.bridges, mapped_function(device.bdf, merge_vfs)


def multi_port(a: str, b: str) -> bool:
    """ncclTopoGetPath's multi-port test: bus ids equal but for their last character."""
    return len(a) == len(b) and a[:-1] == b[:-1]


class NetBuilder:
    """NCCL's network devices for one environment over the node's NICs and ports."""

    def __init__(self, environ: Mapping[str, str], tree: NcclPciTree, fusion: bool):
        self.tree = tree
        self.fusion = fusion
        self.merge_vfs = merge_vfs(environ)
        self.merge_nics = params.IB_MERGE_NICS.number(environ) != 0
        self.level = merge_level(environ)

    def distance(self, a: Net, b: Net) -> int:
        """ncclTopoGetPath between two devices' nodes in NCCL's XML: one device or one PCI
        function is PORT, else the path between their places (switches not flattened: the
        XML is read before ncclTopoFlattenBcmSwitches runs)."""
        one_function = pci_place(a.device, self.merge_vfs) == pci_place(b.device, self.merge_vfs)
        if a.device.name == b.device.name or one_function or multi_port(a.device.bdf, b.device.bdf):
            return PATH_RANK["NVL"]
        return PATH_RANK[self.tree.path_type(a.device, b.device)]

    def fusable(self, group: list[Net]) -> bool:
        """ncclIbMakeVDeviceInternal: one link layer, and NCCL_IB_MERGE_NICS not 0."""
        return self.merge_nics and len({net.link_layer for net in group}) == 1

    def fuse(self, nets: list[Net]) -> list[Net]:
        """ncclTopoAutoMerge: each device not yet placed takes every later unplaced device
        within the merge level, up to four; a refused fusion leaves them apart."""
        if not self.fusion:
            return nets
        placed: set[int] = set()
        fused: list[Net] = []
        for i, root in enumerate(nets):
            if i in placed:
                continue
            group = [i]
            for j in range(len(nets)):
                if len(group) == MAX_DEVS_PER_VNIC:
                    break
                if j != i and j not in placed and self.distance(root, nets[j]) <= self.level.rank:
                    group.append(j)
            members = [nets[k] for k in group]
            if len(members) > 1 and self.fusable(members):
                placed.update(group)
                fused.append(virtual_nic(members))
            else:
                placed.add(i)
                fused.append(root)
        return fused


def virtual_nic(members: list[Net]) -> Net:
    """ncclIbMakeVDeviceInternal: the names joined with '+', the speeds summed, placed at the
    first device's PCI function (topo.cc ncclTopoGetVNicParent)."""
    first = members[0]
    return Net(first.device, None, sum(net.gbs for net in members),
               "+".join(net.device.name for net in members), first.link_layer,
               tuple(net.label for net in members), first.data_direct_of)
