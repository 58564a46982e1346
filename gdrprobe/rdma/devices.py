"""Inventory of the RDMA devices: verbs attributes, ports and GID tables.

Attributes come from verbs (pyverbs); the network interface behind each RoCE GID comes
from sysfs, which verbs does not report.
"""

from __future__ import annotations

import struct

from gdrprobe.rdma import verbs
from gdrprobe.report.model import DeviceInfo, DeviceReport, GidEntry, PortInfo
from gdrprobe.sysroot import SysRoot


def format_guid(raw: int) -> str:
    """A GUID as verbs reports it (big-endian bytes in a host integer), in sysfs form."""
    digits = struct.pack("<Q", raw).hex()
    return ":".join(digits[i:i + 4] for i in range(0, 16, 4))


def gid_netdev(root: SysRoot, device: str, port: int, index: int) -> str | None:
    return root.read(f"/sys/class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/{index}")


def read_gids(ctx, device: str, port: int, attr, port_count: int,
              root: SysRoot) -> tuple[GidEntry, ...]:
    """The populated GID entries of a port (empty slots are skipped)."""
    ethernet = attr.link_layer == verbs.LINK_LAYER_ETHERNET
    return tuple(GidEntry(
        index=index,
        gid=gid,
        type=gid_type,
        netdev=gid_netdev(root, device, port, index) if ethernet else None,
        ip_address=verbs.gid_ip_address(gid) if ethernet else None,
    ) for index, gid, gid_type in verbs.populated_gids(ctx, port, attr, port_count))


def read_port(ctx, device: str, port: int, port_count: int, root: SysRoot) -> PortInfo:
    attr = ctx.query_port(port)
    lane_gbps = verbs.SPEED_GBPS.get(attr.active_speed)
    lanes = verbs.WIDTH_LANES.get(attr.active_width)
    return PortInfo(
        port=port,
        state=verbs.PORT_STATES.get(attr.state, str(attr.state)),
        physical_state=verbs.PHYSICAL_STATES.get(attr.phys_state, str(attr.phys_state)),
        link_layer=verbs.LINK_LAYERS.get(attr.link_layer, str(attr.link_layer)),
        active_mtu_bytes=verbs.mtu_bytes(attr.active_mtu),
        max_mtu_bytes=verbs.mtu_bytes(attr.max_mtu),
        active_speed=f"{lane_gbps} Gbps" if lane_gbps else f"unknown ({attr.active_speed})",
        active_width=f"{lanes}X" if lanes else f"unknown ({attr.active_width})",
        rate_gbps=verbs.port_rate_gbps(attr),
        lid=attr.lid,
        gids=read_gids(ctx, device, port, attr, port_count, root),
    )


def read_device(name: str, listed, root: SysRoot) -> DeviceInfo:
    """One device; listed is its entry of the verbs device list."""
    pv = verbs.pyverbs()
    with pv.device.Context(name=name) as ctx:
        attr = ctx.query_device()
        ports = tuple(read_port(ctx, name, port, attr.phys_port_cnt, root)
                      for port in range(1, attr.phys_port_cnt + 1))
    return DeviceInfo(
        name=name,
        node_guid=format_guid(attr.node_guid),
        transport=verbs.TRANSPORTS.get(listed.transport_type, "unknown"),
        node_type=verbs.NODE_TYPES.get(listed.node_type, "unknown"),
        firmware_version=attr.fw_version or "",
        vendor_id=attr.vendor_id,
        vendor_part_id=attr.vendor_part_id,
        ports=ports,
    )


def list_devices(device: str | None = None, root: str = "/") -> DeviceReport:
    """Every RDMA device (or only the named one) with its ports and GIDs."""
    listed = verbs.devices()
    names = [verbs.resolve_device(device, list(listed))] if device else list(listed)
    sysroot = SysRoot(root)
    return DeviceReport(devices=tuple(read_device(name, listed[name], sysroot)
                                      for name in names))
