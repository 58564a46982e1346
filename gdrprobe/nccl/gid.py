"""The GID NCCL uses on a RoCE port, by release (NVIDIA/nccl ``src/transport/net_ib/connect.cc``
ncclIbGetGidIndex from 2.21.5; ``net_ib.cc`` before):

- NCCL_IB_GID_INDEX (:data:`gdrprobe.nccl.params.IB_GID_INDEX`): a value >= 0 is the index,
  used as it is. Its default is 0 before 2.21.5, where NCCL has no walk: GID index 0 on every
  RoCE port. From 2.21.5 the default is -1: NCCL walks the table.
- The walk (2.21.5 on) starts at index 0 and takes a candidate (ncclUpdateGidIndex) that is
  of the wanted address family where the current one is not, or of the wanted family, valid
  and in range with the wanted RoCE version where the current one's differs or is not valid.
  The family is NCCL_IB_ADDR_FAMILY's (envIbAddrFamily: AF_INET unless exactly "AF_INET6"),
  the version NCCL_IB_ROCE_VERSION_NUM's (2), the range NCCL_IB_ADDR_RANGE's
  (envIbAddrRange: ADDRESS/BITS of that family, else every GID).

On InfiniBand NCCL ignores all of them (GID index 0). The endpoint (:mod:`gdrprobe.rdma.endpoint`)
asks :func:`nccl_gid_index` with the table it read; the campaigns ask :func:`stated_gid_index`
and :func:`gid_preference` with the job's environment and release.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping

from gdrprobe.nccl import params

ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# ibv_query_gid_type's names as pyverbs and sysfs give them, by RoCE version
ROCE_VERSIONS = {"RoCE v1": 1, "IB/RoCE v1": 1, "RoCE v2": 2}
AF_INET6 = "AF_INET6"
WALK_SINCE: params.Version = params.IB_ADDR_FAMILY.since     # the walk and its variables


@dataclasses.dataclass(frozen=True)
class GidPreference:
    """What NCCL's walk of a RoCE port's GID table asks for: the address family (4 or 6),
    the RoCE version and the address range (none: any address)."""

    family: int = 4
    roce_version: int = 2
    address_range: str | None = None     # e.g. "10.0.0.0/8"; NCCL ignores one it cannot read

    def network(self):
        """The range as NCCL reads it (envIbAddrRange): ADDRESS/BITS of the wanted family,
        else none (NCCL then matches every GID)."""
        if "/" not in (self.address_range or ""):
            return None
        try:
            network = ipaddress.ip_network(self.address_range, strict=False)
        except ValueError:
            return None
        return network if network.version == self.family else None


NCCL_DEFAULTS = GidPreference()     # none of the three variables set


def gid_preference(environ: Mapping[str, str], rules: params.Rules | None = None) -> GidPreference:
    """What the walk asks for under the job's environment (its release's defaults)."""
    family = params.IB_ADDR_FAMILY.value(environ, rules)
    return GidPreference(
        family=6 if family == AF_INET6 else 4,
        roce_version=params.IB_ROCE_VERSION_NUM.number(environ, rules),
        address_range=params.IB_ADDR_RANGE.value(environ, rules) or None)


def stated_gid_index(environ: Mapping[str, str], rules: params.Rules | None = None) -> int | None:
    """The GID index NCCL takes on a RoCE port without looking at the table: NCCL_IB_GID_INDEX
    when >= 0 (its default 0 before 2.21.5); None: NCCL walks the table (:func:`nccl_gid_index`)."""
    value = params.IB_GID_INDEX.number(environ, rules)
    return value if value >= 0 else None


def why_stated(environ: Mapping[str, str], rules: params.Rules | None = None) -> str:
    """Where :func:`stated_gid_index` comes from, in words."""
    raw = params.IB_GID_INDEX.raw(environ)
    if raw is not None:
        return f"NCCL_IB_GID_INDEX={raw}"
    version = rules.effective if rules is not None else params.LATEST
    return f"NCCL_IB_GID_INDEX unset: its default {params.IB_GID_INDEX.default(version)}, no walk before 2.21.5"


def gid_family(gid: str) -> int:
    """getGidAddrFamily: 4 for an IPv4-mapped GID (unicast ::ffff:a.b.c.d or the mapped
    multicast ff0e::ffff:a.b.c.d), else 6, an empty GID included."""
    raw = ipaddress.IPv6Address(gid).packed
    mapped = raw[:12] == bytes(10) + b"\xff\xff"
    mapped_multicast = raw[:4] == b"\xff\x0e\x00\x00" and raw[4:12] == bytes(6) + b"\xff\xff"
    return 4 if mapped or mapped_multicast else 6


def gid_valid(gid: str) -> bool:
    """validGid: configured (neither empty nor the bare fe80:: prefix) and not link-local."""
    raw = ipaddress.IPv6Address(gid).packed
    link_local = raw[:8] == b"\xfe\x80" + bytes(6)
    return raw != bytes(16) and not link_local


def gid_in_range(gid: str, network) -> bool:
    """matchGidAddrPrefix: within NCCL_IB_ADDR_RANGE (an IPv4 range compares the GID's last
    32 bits); every GID when no range is set."""
    if network is None:
        return True
    raw = ipaddress.IPv6Address(gid).packed
    address = (ipaddress.IPv4Address(raw[12:]) if network.version == 4
               else ipaddress.IPv6Address(raw))
    return address in network


def nccl_gid_index(gids: Iterable[tuple[int, str, str]], table_length: int,
                   preference: GidPreference = NCCL_DEFAULTS) -> int:
    """The GID index NCCL's walk ends on (2.21.5 on). gids are the port's populated entries
    (index, gid, type); the rest read as empty, as the kernel returns them. An IPv6-only port
    gets a GID this way too: NCCL does not refuse it."""
    network = preference.network()

    def facts(gid: str, version: int) -> tuple[int, bool, bool, int]:
        return gid_family(gid), gid_valid(gid), gid_in_range(gid, network), version

    # (family, valid, in range, RoCE version) per index; read once, not per step of the walk
    table = {index: facts(gid, ROCE_VERSIONS.get(kind, -1)) for index, gid, kind in gids}
    empty = facts(ZERO_GID, -1)
    current = 0
    for candidate in range(1, table_length):
        family, valid, _, version = table.get(current, empty)
        other_family, other_valid, in_range, other_version = table.get(candidate, empty)
        wanted = other_family == preference.family
        if other_family != family and wanted and in_range:
            current = candidate
        elif wanted and other_valid and in_range and (version != other_version or not valid) \
                and other_version == preference.roce_version:
            current = candidate
    return current
