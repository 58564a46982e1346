"""The handshake's messages that describe an endpoint, a buffer and a verification, with
every field a peer sends checked before it is used."""

from __future__ import annotations

import dataclasses
import re

from gdrprobe import _native
from gdrprobe.rdma.endpoint import EndpointAddress
from gdrprobe.rdma.verbs import MTUS
from gdrprobe.errors import PeerError
from gdrprobe.protocol.fields import field, int_list, peer_text
from gdrprobe.report.model import EndpointSummary, Finding, Integrity, Status

QPN_MAX = (1 << 24) - 1
MAX_FINDINGS = 32        # a GPU buffer owner's doctor findings, sent with setup_ok
FINDING_TEXT_CHARS = 400
# The form pyverbs' GID() takes (pyverbs/utils.py gid_str_to_array, rdma-core v44): eight
# ':'-separated groups of exactly four hex digits. '::1', which ipaddress would accept, is
# refused there, so it is refused here, before the QP is touched.
VERBS_GID = re.compile(r"[0-9a-fA-F]{4}(:[0-9a-fA-F]{4}){7}")


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
    """A GID in the colon form verbs prints and takes, checked to be one."""
    text = field(message, "gid", str)
    if not VERBS_GID.fullmatch(text):
        raise PeerError(f"peer GID {peer_text(text, 64)!r} is not a GID in the form verbs "
                        "takes (8 groups of 4 hex digits)", "run the same gdrprobe version "
                        "on both hosts")
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
        host=peer_text(field(message, "host", str), 64),
        device=peer_text(field(message, "device", str), 64),
        port=field(message, "port", int, low=1, high=255),
        gid_index=field(message, "gid_index", int, low=0, high=1 << 16),
        gid=gid_from_message(message), mtu_bytes=field(message, "mtu_bytes", int),
        qp_numbers=tuple(int_list(message, "qp_numbers", low=1, high=QPN_MAX,
                                  max_items=_native.MAX_QPS)),
        memory={peer_text(k, 40): peer_text(v) if isinstance(v, str) else v
                for k, v in list(memory.items())[:16]
                if isinstance(v, (str, int, float, bool, type(None)))},
    )


def integrity_from_message(message: dict) -> Integrity:
    first_bad = field(message, "first_bad_offset", int, low=-1)
    first_stray = field(message, "first_stray_offset", int, low=-1)
    total = field(message, "messages_total", int, low=1)
    return Integrity(
        checked=True,
        bytes_checked=field(message, "bytes_checked", int, low=0),
        bad_bytes=field(message, "bad_bytes", int, low=0),
        first_bad_offset=None if first_bad < 0 else first_bad,
        stray_bytes=field(message, "stray_bytes", int, low=0),
        first_stray_offset=None if first_stray < 0 else first_stray,
        messages_checked=field(message, "messages_checked", int, low=1, high=total),
        messages_total=total,
        bad_messages=field(message, "bad_messages", int, low=0, high=total),
    )


def findings_message(findings) -> list[dict]:
    """Doctor findings as the peer rebuilds them (:func:`findings_from_message`)."""
    return [{"id": f.id, "group": f.group, "status": Status(f.status).value,
             "summary": f.summary[:FINDING_TEXT_CHARS], "fix": f.fix[:FINDING_TEXT_CHARS]}
            for f in list(findings)[:MAX_FINDINGS]]


def findings_from_message(message: dict) -> tuple[Finding, ...]:
    """The findings the server sent about the host that owns its buffer, each checked."""
    items = field(message, "findings", list, default=[])
    if len(items) > MAX_FINDINGS or not all(isinstance(item, dict) for item in items):
        raise PeerError(f"the peer sent more than {MAX_FINDINGS} findings or malformed ones", "")
    statuses = {status.value for status in Status}
    found = []
    for item in items:
        status = field(item, "status", str)
        if status not in statuses:
            raise PeerError(f"the peer sent a finding with status {peer_text(status, 16)!r}", "")
        found.append(Finding(peer_text(field(item, "id", str), 80),
                             peer_text(field(item, "group", str), 20), Status(status),
                             peer_text(field(item, "summary", str), FINDING_TEXT_CHARS),
                             fix=peer_text(field(item, "fix", str), FINDING_TEXT_CHARS)))
    return tuple(found)
