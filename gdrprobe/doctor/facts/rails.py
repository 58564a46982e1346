"""Which PCIe element the rails of a node share: the place where the rails' traffic meets
when every rail (a GPU and the NIC NCCL uses for it) runs at once.

A rail's GPUDirect traffic climbs from the NIC to the bridge where its path turns toward the
GPU and down again; each port it passes below that turn carries it on the port's own link
(sysfs' ``current_link_width`` and ``current_link_speed`` of a root or downstream port state
the link below it, of a switch's upstream port its uplink). The element the rails share is the
narrowest link every rail crosses; with none, the switch every rail turns around in, the root
complex they all hang off, or the socket (NUMA node) their paths meet or cross. Pure: the tree
comes from :mod:`gdrprobe.doctor.facts.topology`, the links from :func:`read_links`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from gdrprobe.doctor.facts import pci
from gdrprobe.doctor.facts.topology import PcieDevice
from gdrprobe.nccl.topo import common_prefix, gt_per_s
from gdrprobe.numbers import decimal
from gdrprobe.sysroot import SysRoot

# What each PCIe transfer rate carries per lane after line encoding (PCIe base spec: 8b/10b
# for 2.5 and 5 GT/s, 128b/130b for 8 to 32 GT/s, 242/256 FLIT for 64 GT/s).
MAX_LANES = 32     # the widest PCIe link (x32)
ENCODING_EFFICIENCY = ((5.0, 8 / 10), (32.0, 128 / 130), (64.0, 242 / 256))

SWITCH_PORT, ROOT_PORT, SWITCH, ROOT_COMPLEX, SOCKET, SOCKETS = (
    "switch port", "root port", "PCIe switch", "root complex", "socket", "link between sockets")


@dataclasses.dataclass(frozen=True)
class Link:
    """A port's negotiated PCIe link as sysfs states it ("" where a file cannot be read)."""

    speed: str = ""        # current_link_speed, e.g. "16.0 GT/s PCIe"
    width: str = ""        # current_link_width, e.g. "16"

    @property
    def gbps(self) -> float | None:
        """The data rate after encoding, Gb/s; None where either file says nothing usable."""
        speed = gt_per_s(self.speed)
        lanes = decimal(self.width.strip())
        if lanes is None or lanes > MAX_LANES or speed == float("inf") or speed <= 0:
            return None
        efficiency = next((value for limit, value in ENCODING_EFFICIENCY if speed <= limit),
                          ENCODING_EFFICIENCY[-1][1])
        return lanes * speed * efficiency

    def describe(self) -> str:
        rate = self.gbps
        if rate is None:
            return "link not stated in sysfs"
        return f"x{self.width.strip()} at {self.speed.strip()} ({rate:.0f} Gb/s)"


@dataclasses.dataclass(frozen=True)
class Rail:
    gpu: PcieDevice
    nic: PcieDevice


@dataclasses.dataclass(frozen=True)
class SharedElement:
    """What every rail of a set passes through, and how its link compares with the rails'
    summed NIC bandwidth (``demand_gbps``; None where a NIC's rate is unknown)."""

    kind: str                       # one of SWITCH_PORT ... SOCKETS
    name: str                       # a port's BDF, a root complex (pci0000:00), "NUMA 0"
    rails: tuple[str, ...]          # "GPU0-mlx5_0", in the rails' order
    link: Link | None = None        # a port's link; None for a switch, root complex or socket
    demand_gbps: float | None = None

    @property
    def oversubscribed(self) -> bool:
        """The shared link carries less than the rails' NICs can send together."""
        rate = self.link.gbps if self.link else None
        return rate is not None and self.demand_gbps is not None and rate < self.demand_gbps

    def describe(self) -> str:
        where = f"{self.kind} {self.name}"
        if self.link is None:
            return where
        demand = (f" against {self.demand_gbps:.0f} Gb/s of the rails' NICs"
                  if self.demand_gbps is not None else "")
        return f"{where}, {self.link.describe()}{demand}"

    def as_json(self) -> dict:
        return {"kind": self.kind, "name": self.name, "description": self.describe(),
                "rails": list(self.rails),
                "link_speed": self.link.speed if self.link else None,
                "link_width": self.link.width if self.link else None,
                "link_gbps": round(self.link.gbps, 1) if self.link and self.link.gbps else None,
                "nic_sum_gbps": self.demand_gbps, "oversubscribed": self.oversubscribed}


def rail_name(rail: Rail) -> str:
    return f"{rail.gpu.name}-{rail.nic.name}"


def turn(rail: Rail) -> int:
    """How many bridges the rail's GPU and NIC share from the root port down (0 across root
    complexes): the last of them is where the traffic turns around."""
    if rail.gpu.host_bridge != rail.nic.host_bridge:
        return 0
    return common_prefix(rail.gpu.bridges, rail.nic.bridges)


def crossed_ports(rail: Rail) -> tuple[str, ...]:
    """The ports whose own link the rail's traffic crosses, root side first."""
    below = turn(rail)
    return tuple(dict.fromkeys(rail.nic.bridges[below:] + rail.gpu.bridges[below:]))


def port_kind(port: str, rails: Sequence[Rail]) -> str:
    roots = {device.bridges[0] for rail in rails for device in (rail.gpu, rail.nic) if device.bridges}
    return ROOT_PORT if port in roots else SWITCH_PORT


def summed(rails: Sequence[Rail], nic_gbps: Mapping[str, float | None]) -> float | None:
    rates = [nic_gbps.get(rail.nic.name) for rail in rails]
    return None if any(rate is None for rate in rates) else float(sum(rates))


def narrowest_shared_port(rails: Sequence[Rail], links: Mapping[str, Link]) -> str | None:
    """The port every rail crosses with the slowest stated link (unstated counts as the
    slowest: it is named, not judged); ties go to the deepest port."""
    first = crossed_ports(rails[0])
    shared = set(first).intersection(*(crossed_ports(rail) for rail in rails[1:]))
    if not shared:
        return None
    depth = {port: index for index, port in enumerate(first)}
    return min(shared, key=lambda port: (links.get(port, Link()).gbps or 0.0, -depth[port]))


def common_turn(rails: Sequence[Rail]) -> str | None:
    """The switch port every rail turns around at, when they all turn at the same one."""
    turns = {rail.nic.bridges[at - 1] if (at := turn(rail)) else None for rail in rails}
    return turns.pop() if len(turns) == 1 else None


def socket_element(rails: Sequence[Rail]) -> tuple[str, str] | None:
    """The socket the rails meet in, or the link between sockets a rail crosses."""
    nodes = {device.numa_node for rail in rails for device in (rail.gpu, rail.nic)}
    if -1 in nodes:
        return None
    if any(rail.gpu.numa_node != rail.nic.numa_node for rail in rails):
        return SOCKETS, "NUMA " + "-".join(str(node) for node in sorted(nodes))
    return (SOCKET, f"NUMA {nodes.pop()}") if len(nodes) == 1 else None


def shared_element(rails: Sequence[Rail], links: Mapping[str, Link],
                   nic_gbps: Mapping[str, float | None]) -> SharedElement | None:
    """The smallest element all ``rails`` share (``links``: each port's link by BDF;
    ``nic_gbps``: each NIC's line rate by name); None for fewer than two rails, or rails
    that share nothing this tree shows (each on its own socket, NUMA unknown)."""
    if len(rails) < 2:
        return None
    names = tuple(rail_name(rail) for rail in rails)
    demand = summed(rails, nic_gbps)
    port = narrowest_shared_port(rails, links)
    if port is not None:
        return SharedElement(port_kind(port, rails), port, names, links.get(port, Link()), demand)
    switch = common_turn(rails)
    if switch is not None:
        return SharedElement(SWITCH, switch, names, demand_gbps=demand)
    hosts = {device.host_bridge for rail in rails for device in (rail.gpu, rail.nic)}
    if len(hosts) == 1 and None not in hosts:
        return SharedElement(ROOT_COMPLEX, hosts.pop(), names, demand_gbps=demand)
    socket = socket_element(rails)
    return SharedElement(*socket, names, demand_gbps=demand) if socket else None


def read_links(root: SysRoot, rails: Sequence[Rail]) -> dict[str, Link]:
    """Each port the rails cross, with its negotiated link as sysfs states it."""
    return {port: Link(pci.current_link_speed(root, port) or "", pci.current_link_width(root, port) or "")
            for rail in rails for port in crossed_ports(rail)}
