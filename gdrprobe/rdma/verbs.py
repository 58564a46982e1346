"""Access to pyverbs: loaded on first use, with the fix named when it is missing.

Also the names of the verbs enumerations a person reads (port states, MTUs, speeds).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from collections.abc import Iterable

from gdrprobe.errors import MissingDependency, NoDevice, NoRdmaDevice

PYVERBS_FIX = (
    "install rdma-core's Python bindings (Debian/Ubuntu: apt-get install python3-pyverbs; "
    "RHEL: dnf install python3-pyverbs; MLNX_OFED/DOCA-OFED ship them too) and create the "
    "virtual environment with --system-site-packages so it can import them"
)

NO_DEVICE_FIX = (
    "load the RDMA driver (e.g. modprobe mlx5_ib, or rdma link add rxe0 type rxe netdev "
    "IFACE for Soft-RoCE), pass /dev/infiniband into the container, and make sure /sys is "
    "mounted; 'rdma link show' and 'ibv_devices' should list the device"
)

PORT_STATES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
PHYSICAL_STATES = {1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION_TRAINING",
                   5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY_TEST"}
LINK_LAYERS = {0: "Unspecified", 1: "InfiniBand", 2: "Ethernet"}
TRANSPORTS = {0: "InfiniBand", 1: "iWARP", 2: "usNIC", 3: "usNIC UDP", 4: "unspecified"}
NODE_TYPES = {1: "CA", 2: "switch", 3: "router", 4: "RNIC", 5: "usNIC", 6: "usNIC UDP",
              7: "unspecified"}
# Data rate in Gb/s per lane of ibv_port_attr.active_speed (SDR .. XDR), and lanes of
# active_width: the kernel's table (drivers/infiniband/core/sysfs.c rate_show, the
# ports/N/rate file) and rdma-core's (ibv_devinfo.c speed_str), so speed x width is the line
# rate sysfs states, e.g. "100 Gb/sec (4X EDR)".
SPEED_GBPS = {1: 2.5, 2: 5.0, 4: 10.0, 8: 10.0, 16: 14.0, 32: 25.0, 64: 50.0, 128: 100.0,
              256: 200.0}
WIDTH_LANES = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}


def port_speed(port_attr) -> int:
    """The port's speed code. XDR (256) does not fit ibv_port_attr.active_speed, a u8: the
    kernel reports it in the extended query's active_speed_ex (include/rdma/ib_verbs.h
    IB_SPEED_XDR; ib_uverbs_query_port_resp_ex), which rdma-core 49 and later put in
    ibv_port_attr.active_speed_ex and pyverbs exposes; where it is set it is the speed
    (rdma-core's speed_to_str in pyverbs/device.pyx and ibv_devinfo)."""
    return getattr(port_attr, "active_speed_ex", 0) or port_attr.active_speed


def port_rate_gbps(port_attr) -> float | None:
    """The port's line rate (speed per lane x lanes), None when verbs does not say."""
    lane_gbps = SPEED_GBPS.get(port_speed(port_attr))
    lanes = WIDTH_LANES.get(port_attr.active_width)
    return lane_gbps * lanes if lane_gbps and lanes else None


def rate_file_gbps(text: str | None) -> float | None:
    """The line rate the kernel states in /sys/class/infiniband/DEV/ports/N/rate, e.g.
    "100 Gb/sec (4X EDR)": its rate_show prints speed x width from the table above, the
    same product as :func:`port_rate_gbps`. None when the file states none."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text or "")
    return float(match.group(1)) if match else None


IBV_PORT_ACTIVE = 4
LINK_LAYER_ETHERNET = 2
GID_TYPE_SYSFS_ROCE_V2 = 1  # ibv_query_gid_type's enum (not ibv_gid_type's)
# ibv_gid_entry.gid_type, as ibv_query_gid_table reports it: enum ibv_gid_type in rdma-core's
# libibverbs/verbs.h (the kernel's IB_UVERBS_GID_TYPE_* in the same order).
GID_TYPES = {0: "IB", 1: "RoCE v1", 2: "RoCE v2"}
ROCE_V2 = GID_TYPES[2]


@functools.cache
def pyverbs():
    """The pyverbs modules gdrprobe uses, as a namespace; MissingDependency if absent."""
    try:
        import pyverbs.cq as cq
        import pyverbs.device as device
        import pyverbs.enums as enums
        import pyverbs.mr as mr
        import pyverbs.pd as pd
        import pyverbs.qp as qp
        import pyverbs.addr as addr
        import pyverbs.base as base
        from pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError
    except ImportError as error:
        raise MissingDependency(f"pyverbs is not importable ({error})", PYVERBS_FIX) from error

    class Namespace:
        pass

    ns = Namespace()
    ns.cq, ns.device, ns.enums, ns.mr, ns.pd, ns.qp, ns.addr, ns.base = (
        cq, device, enums, mr, pd, qp, addr, base)
    ns.PyverbsError, ns.PyverbsRDMAError = PyverbsError, PyverbsRDMAError
    return ns


def devices() -> dict:
    """The RDMA devices the verbs library sees, by name; NoRdmaDevice when there are none."""
    pv = pyverbs()
    try:
        listed = pv.device.get_device_list()
    except pv.PyverbsError as error:
        raise NoRdmaDevice("no RDMA device found: the verbs library could not list devices",
                           NO_DEVICE_FIX, evidence=str(error).splitlines()[0]) from error
    if not listed:
        raise NoRdmaDevice("no RDMA device found", NO_DEVICE_FIX,
                           evidence="ibv_get_device_list returned an empty list")
    # pyverbs 44 names devices in bytes, later versions in str.
    return {d.name.decode() if isinstance(d.name, bytes) else d.name: d for d in listed}


def rdma_core_version() -> str | None:
    """The rdma-core release of the libibverbs this process loaded (through pyverbs): its
    file is libibverbs.so.1.<ABI minor>.<rdma-core version> (rdma-core's
    libibverbs/CMakeLists.txt, Documentation/versioning.md). None when it cannot be seen."""
    pyverbs()
    try:
        with open("/proc/self/maps") as maps:
            found = re.search(r"libibverbs\.so\.1\.\d+\.(\d+\.\d+)", maps.read())
    except OSError:
        return None
    return found.group(1) if found else None


def device_names() -> list[str]:
    return list(devices())


def resolve_device(name: str | None, names: list[str] | None = None) -> str:
    """The device to use: the named one (checked) or the first one; names, when the
    caller already listed them, saves listing again."""
    names = names or device_names()
    if name is None:
        return names[0]
    if name not in names:
        raise NoDevice(f"RDMA device {name!r} does not exist",
                       f"use one of: {', '.join(names)} (see 'gdrprobe devices')")
    return name


def populated_gids(ctx, port: int, port_attr, port_count: int) -> list[tuple[int, str, str]]:
    """(index, gid, type) of every populated entry of a port's GID table, type one of
    GID_TYPES' names.

    One ibv_query_gid_table call (rdma-core 32+; it reads sysfs itself where the kernel
    lacks the ioctl) instead of an ibv_query_gid per slot: a RoCE port's table has 1024
    slots (rxe, mlx5), and reading them one by one made opening a device take most of a
    second in the lab. The call returns the valid entries of every port of the device and
    fails when they do not fit (the kernel's rdma_query_gid_table), hence room for
    port_count tables.
    """
    if not hasattr(ctx, "query_gid_table"):   # pyverbs before rdma-core 32
        return _populated_gids_by_slot(ctx, port, port_attr)
    table = ctx.query_gid_table(port_attr.gid_tbl_len * port_count)
    return sorted((entry.gid_index, entry.gid_str(),
                   GID_TYPES.get(entry.gid_type, f"unknown ({entry.gid_type})"))
                  for entry in table
                  if entry.port_num == port and not is_zero_gid(entry.gid_str()))


def _populated_gids_by_slot(ctx, port: int, port_attr) -> list[tuple[int, str, str]]:
    ethernet = port_attr.link_layer == LINK_LAYER_ETHERNET
    entries = []
    for index in range(port_attr.gid_tbl_len):
        gid = ctx.query_gid(port, index).gid
        if is_zero_gid(gid):
            continue
        v2 = ethernet and ctx.query_gid_type(port, index) == GID_TYPE_SYSFS_ROCE_V2
        entries.append((index, gid, GID_TYPES[2 if v2 else 1 if ethernet else 0]))
    return entries


def mtu_bytes(mtu_enum: int) -> int:
    """ibv_mtu (1..5) to bytes (256..4096)."""
    return 128 << mtu_enum if 1 <= mtu_enum <= 5 else 0


MTUS = tuple(mtu_bytes(value) for value in range(1, 6))   # the path MTUs verbs knows


def mtu_enum(mtu: int) -> int:
    for value in range(1, 6):
        if mtu_bytes(value) == mtu:
            return value
    raise ValueError(f"{mtu} is not an RDMA MTU (256, 512, 1024, 2048, 4096)")


def gid_ip_address(gid: str) -> str | None:
    """The IP address a RoCE GID encodes: IPv4-mapped or a plain IPv6 address."""
    try:
        address = ipaddress.IPv6Address(gid)
    except ValueError:
        return None
    if address.ipv4_mapped:
        return str(address.ipv4_mapped)
    return None if address.is_unspecified else str(address)


def ipv4_roce_v2_gid(gids: Iterable[tuple[int, str, str]]) -> tuple[int, str] | None:
    """The first (index, gid) of a port's populated GIDs, given as (index, gid, type), that is
    RoCE v2 and maps an IPv4 address: the GID that reaches this port over IPv4."""
    for index, gid, gid_type in gids:
        address = gid_ip_address(gid) if gid_type == ROCE_V2 else None
        if address is not None and ipaddress.ip_address(address).version == 4:
            return index, gid
    return None


def is_zero_gid(gid: str) -> bool:
    """Whether a GID as pyverbs writes it (eight groups of four hex digits) is all zero."""
    return not gid.replace(":", "").strip("0")
