"""The handshake's messages that describe an endpoint, a buffer and a verification, with
every field a peer sends checked before it is used."""

from __future__ import annotations

import dataclasses
import ipaddress

from gdrprobe import _native
from gdrprobe.rdma.endpoint import EndpointAddress
from gdrprobe.rdma.verbs import MTUS
from gdrprobe.errors import PeerError
from gdrprobe.protocol.fields import field, int_list
from gdrprobe.report.model import EndpointSummary, Integrity

QPN_MAX = (1 << 24) - 1


@dataclasses.dataclass(frozen=True)
class RemoteBuffer:
    address: int
    rkey: int
    length: int

    @classmethod
    def from_message(cls, message: dict) -> "RemoteBuffer":
        return cls(field(message, "address", int, low=0, high=2**64 - 1),
                   field(message, "rkey", int, low=0, high=2**32 - 1),
                   field(message, "length", int, low=1, high=2 * _native.MAX_SIZE))


def gid_from_message(message: dict) -> str:
    """A GID in the colon form verbs prints, checked to be one."""
    text = field(message, "gid", str)
    try:
        ipaddress.IPv6Address(text)
    except ValueError as error:
        raise PeerError(f"peer GID {text[:64]!r} is not a GID", "") from error
    return text


def address_from_message(message: dict, max_qps: int = _native.MAX_QPS) -> EndpointAddress:
    mtu = field(message, "mtu", int)
    if mtu not in MTUS:
        raise PeerError(f"peer MTU {mtu} is not an RDMA MTU", "")
    return EndpointAddress(
        gid=gid_from_message(message),
        gid_index=-1,
        lid=field(message, "lid", int, low=0, high=0xFFFF),
        mtu=mtu,
        qp_numbers=tuple(int_list(message, "qp_numbers", low=1, high=QPN_MAX,
                                  max_items=max_qps)),
        psns=tuple(int_list(message, "psns", low=0, high=QPN_MAX, max_items=max_qps)),
    )


def summary_from_message(message: dict) -> EndpointSummary:
    memory = field(message, "memory", dict)
    return EndpointSummary(
        host=field(message, "host", str), device=field(message, "device", str),
        port=field(message, "port", int, low=1, high=255),
        gid_index=field(message, "gid_index", int, low=0, high=1 << 16),
        gid=gid_from_message(message), mtu_bytes=field(message, "mtu_bytes", int),
        qp_numbers=tuple(int_list(message, "qp_numbers", low=1, high=QPN_MAX,
                                  max_items=_native.MAX_QPS)),
        memory={str(k): v for k, v in list(memory.items())[:16]
                if isinstance(v, (str, int, float, bool, type(None)))},
    )


def integrity_from_message(message: dict) -> Integrity:
    first_bad = field(message, "first_bad_offset", int, low=-1)
    first_stray = field(message, "first_stray_offset", int, low=-1)
    return Integrity(
        checked=True,
        bytes_checked=field(message, "bytes_checked", int, low=0),
        bad_bytes=field(message, "bad_bytes", int, low=0),
        first_bad_offset=None if first_bad < 0 else first_bad,
        stray_bytes=field(message, "stray_bytes", int, low=0),
        first_stray_offset=None if first_stray < 0 else first_stray,
    )


