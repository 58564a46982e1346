"""Inventory of the RDMA devices: verbs attributes, ports and GID tables.

Attributes come from verbs (pyverbs); the network interface behind each RoCE GID comes
from sysfs, which verbs does not report.
"""

from __future__ import annotations

import errno
import os
import struct

from gdrprobe.errors import NoDevice
from gdrprobe.rdma import verbs
from gdrprobe.report.model import DeviceInfo, DeviceReport, GidEntry, PortInfo
from gdrprobe.sysroot import SysRoot

UVERBS_CLASS_DIR = "/sys/class/infiniband_verbs"
DEV_INFINIBAND = "/dev/infiniband"


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
    speed = verbs.port_speed(attr)
    lane_gbps = verbs.SPEED_GBPS.get(speed)
    lanes = verbs.WIDTH_LANES.get(attr.active_width)
    return PortInfo(
        port=port,
        state=verbs.PORT_STATES.get(attr.state, str(attr.state)),
        physical_state=verbs.PHYSICAL_STATES.get(attr.phys_state, str(attr.phys_state)),
        link_layer=verbs.LINK_LAYERS.get(attr.link_layer, str(attr.link_layer)),
        active_mtu_bytes=verbs.mtu_bytes(attr.active_mtu),
        max_mtu_bytes=verbs.mtu_bytes(attr.max_mtu),
        active_speed=f"{lane_gbps} Gbps" if lane_gbps else f"unknown ({speed})",
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
    """Every RDMA device (or only the named one) with its ports and GIDs; those this process
    cannot open are listed as skipped, with why (a named one is an error)."""
    listed = verbs.devices()
    names = [verbs.resolve_device(device, list(listed))] if device else list(listed)
    sysroot = SysRoot(root)
    devices, skipped = [], []
    for name in names:
        refusal = open_refusal(name, sysroot)
        if refusal is not None and device:
            raise open_failed(name, *refusal)
        if refusal is not None:
            skipped.append(f"{name}: {refusal[1]}")
            continue
        devices.append(read_device(name, listed[name], sysroot))
    return DeviceReport(devices=tuple(devices), skipped=tuple(skipped))


# ---- which devices this process can open ------------------------------------------------


def verbs_node(device: str, root: SysRoot) -> str | None:
    """The verbs character device of an RDMA device ("uverbs0"), as libibverbs finds it:
    /sys/class/infiniband_verbs/uverbsN/ibdev names the device (rdma-core
    libibverbs/init.c setup_sysfs_dev); where that class is not there (an older capture),
    the device's own infiniband_verbs directory. None when neither names one."""
    entries = root.listdir(UVERBS_CLASS_DIR)
    for entry in entries:
        if root.read(f"{UVERBS_CLASS_DIR}/{entry}/ibdev") == device:
            return entry
    own = [] if entries else root.listdir(f"/sys/class/infiniband/{device}/device/"
                                          "infiniband_verbs")
    return own[0] if own else None


OPEN_FIXES = {
    errno.ENOENT: "pass the device's node into the container (--device=/dev/infiniband, or "
                  "the RDMA device plugin's resource in Kubernetes), or load ib_uverbs",
    errno.EACCES: "run as a user who may read and write the node (rdma-core's udev rules "
                  "make it 0666), or in a container allow the device (its devices cgroup)",
}
OPEN_FIXES[errno.EPERM] = OPEN_FIXES[errno.EACCES]
OPEN_FIXES[errno.ENXIO] = OPEN_FIXES[errno.ENODEV] = OPEN_FIXES[errno.ENOENT]
OPEN_FIX = "check 'dmesg' and the device with 'rdma dev' and 'ibv_devinfo'"


def open_refusal(device: str, root: SysRoot | None = None) -> tuple[int, str] | None:
    """(errno, why) when this process cannot open the device's verbs node read-write, as
    ibv_open_device opens it (libibverbs/device.c verbs_open_device); None when it can.
    NCCL skips such a device (ncclIbInitDevices: "Unable to open device")."""
    root = root or SysRoot()
    node = verbs_node(device, root)
    if node is None:
        return errno.ENODEV, f"no entry of {UVERBS_CLASS_DIR} names {device}"
    path = f"{DEV_INFINIBAND}/{node}"
    if not root.exists(path):   # libibverbs does not even list it (init.c try_access_device)
        return errno.ENOENT, f"{path}: {os.strerror(errno.ENOENT)}"
    try:
        root.try_open_device(path)
    except OSError as error:
        return error.errno, f"{path}: {error.strerror}"
    return None


def open_failed(device: str, code: int, why: str) -> NoDevice:
    """The error of a device this process cannot open."""
    return NoDevice(f"RDMA device {device} cannot be opened ({why})",
                    OPEN_FIXES.get(code, OPEN_FIX), evidence=f"open {why}")


def choose_device(name: str | None, root: SysRoot | None = None) -> tuple[str, tuple[str, ...]]:
    """(device, notes): the named device, else the first one libibverbs lists that this
    process can open, with a note for each one skipped and why. libibverbs lists only
    devices whose node exists in /dev/infiniband (libibverbs/init.c try_access_device), and
    NCCL then skips those it cannot open; so does this."""
    names = verbs.device_names()
    if name is not None:
        return verbs.resolve_device(name, names), ()
    notes = []
    for candidate in names:
        refusal = open_refusal(candidate, root)
        if refusal is None:
            return candidate, tuple(notes)
        notes.append(f"{candidate} skipped: {refusal[1]}")
    raise NoDevice("no RDMA device can be opened by this process",
                   OPEN_FIXES.get(refusal[0], OPEN_FIX), evidence="; ".join(notes))
