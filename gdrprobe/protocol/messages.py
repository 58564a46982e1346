"""Every message of a run after the handshake, each built and parsed in one place.

A run's conversation, client to server unless marked (<-)::

    setup, queued* <-, setup_ok <-,
    then each round: start, ready <- (latency, READ, bidirectional), progress*,
    (pass, checked <-)*, done, sent <- (bidirectional), verified <-,
    and at the end: bye

An NCCL-pattern round (start with pattern "nccl"): ready <- (the receiver is set up), then
per pass: ready (the sender's loop runs), progress* both ways, pass, checked <-; then done,
received <- (what the receiver measured), verified <-.

A message with fields is a frozen dataclass: ``KIND`` is its type on the wire,
``to_message()`` its fields in the order they are sent, and ``from_message()`` rebuilds it
from what a peer sent, every field checked before it is used. :func:`send` puts one on a
channel. A message without fields is its type alone (READY, PROGRESS, BYE).

Owned elsewhere: the handshake (hello, challenge, auth, welcome) and the error or abort that
may end any step belong to the channel (channel.py); this module adds only what a server's
error says about its GPU buffer (:func:`error_with_findings`, :func:`findings_in`). Two
blocks of setup travel in their owners' wire forms, which live in layers above this one:
the run's settings (ProbeOptions) and the client's choice of the server's memory
(MemorySpec). This module carries them and hands their parsing back to the caller.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable, ClassVar, Protocol

from gdrprobe import _native
from gdrprobe.errors import GdrprobeError, PeerError
from gdrprobe.protocol.channel import Channel, error_message
from gdrprobe.protocol.fields import SAME_VERSION_FIX, field, int_list, peer_number, peer_text
from gdrprobe.rdma.endpoint import MAX_READ_CREDITS, EndpointAddress
from gdrprobe.rdma.verbs import MTUS
from gdrprobe.report.model import EndpointSummary, Finding, Integrity, Status, to_dict

QPN_MAX = (1 << 24) - 1
MAX_FINDINGS = 32        # a GPU buffer owner's doctor findings, sent with setup_ok
FINDING_TEXT_CHARS = 400
MAX_ROUND = 2**62
MAX_MESSAGES = 1 << 62   # the messages a bandwidth round may say it posted
MAX_QUEUE_POSITION = 1 << 20
MAX_STAGE_S = 3600       # a staged side's copy time per message, in seconds
# The form pyverbs' GID() takes (pyverbs/utils.py gid_str_to_array, rdma-core v44): eight
# ':'-separated groups of exactly four hex digits. '::1', which ipaddress would accept, is
# refused there, so it is refused here, before the QP is touched.
VERBS_GID = re.compile(r"[0-9a-fA-F]{4}(:[0-9a-fA-F]{4}){7}")

# Messages that say nothing but their type.
READY = "ready"          # <- a latency round's responder is polling: the client may start
PROGRESS = "progress"    # a heartbeat while the client's loop runs
BYE = "bye"              # the last round is over


def send(channel: Channel, message) -> None:
    """Put one of this module's messages on the channel."""
    channel.send(message.KIND, **message.to_message())


# ---- the blocks messages are made of -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RemoteBuffer:
    """Where the peer may write: its registered buffer's address, key and length."""

    address: int
    rkey: int
    length: int

    def to_message(self) -> dict:
        return {"address": self.address, "rkey": self.rkey, "length": self.length}

    @classmethod
    def from_message(cls, message: dict) -> RemoteBuffer:
        return cls(field(message, "address", int, low=0, high=2**64 - 1),
                   field(message, "rkey", int, low=0, high=2**32 - 1),
                   field(message, "length", int, low=1, high=2 * _native.MAX_SIZE))


def gid_from_message(message: dict) -> str:
    """A GID in the colon form verbs prints and takes, checked to be one."""
    text = field(message, "gid", str)
    if not VERBS_GID.fullmatch(text):
        raise PeerError(f"peer GID {peer_text(text, 64)!r} is not a GID in the form verbs "
                        "takes (8 groups of 4 hex digits)", SAME_VERSION_FIX)
    return text


def address_message(address: EndpointAddress) -> dict:
    """What the peer needs to connect its QPs to ours (the GID index stays local)."""
    return {"gid": address.gid, "lid": address.lid, "mtu": address.mtu,
            "qp_numbers": list(address.qp_numbers), "psns": list(address.psns),
            "read_credits": address.read_credits}


def address_from_message(message: dict, max_qps: int = _native.MAX_QPS) -> EndpointAddress:
    mtu = field(message, "mtu", int)
    if mtu not in MTUS:
        raise PeerError(f"peer MTU {peer_number(mtu)} is not an RDMA MTU", SAME_VERSION_FIX)
    qp_numbers = int_list(message, "qp_numbers", low=1, high=QPN_MAX, max_items=max_qps)
    psns = int_list(message, "psns", low=0, high=QPN_MAX, max_items=max_qps)
    if len(psns) != len(qp_numbers):
        raise PeerError(f"the peer sent {len(qp_numbers)} QP numbers and {len(psns)} PSNs",
                        SAME_VERSION_FIX)
    return EndpointAddress(gid=gid_from_message(message), gid_index=-1,
                           lid=field(message, "lid", int, low=0, high=0xFFFF), mtu=mtu,
                           qp_numbers=tuple(qp_numbers), psns=tuple(psns),
                           read_credits=field(message, "read_credits", int, low=1,
                                              high=MAX_READ_CREDITS))


def summary_message(summary: EndpointSummary) -> dict:
    # notes (why this device and GID) stay with the side that chose them: the wire is as it was
    return {key: value for key, value in to_dict(summary).items() if key != "notes"}


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


def integrity_message(integrity: Integrity) -> dict:
    """What a receiver found; no offset is sent as -1. NCCL's flush is told where it ran."""
    flush = {"flush_reads": integrity.flush_reads, "flush_bad": integrity.flush_bad,
             "first_flush_bad_offset": _offset_message(integrity.first_flush_bad_offset),
             "flush_us_median": integrity.flush_us_median}
    return {"bytes_checked": integrity.bytes_checked, "bad_bytes": integrity.bad_bytes,
            "first_bad_offset": _offset_message(integrity.first_bad_offset),
            "stray_bytes": integrity.stray_bytes,
            "first_stray_offset": _offset_message(integrity.first_stray_offset),
            "messages_checked": integrity.messages_checked,
            "messages_total": integrity.messages_total,
            "bad_messages": integrity.bad_messages} | (flush if integrity.flush_reads else {})


def _offset_message(offset: int | None) -> int:
    return -1 if offset is None else offset


def integrity_from_message(message: dict) -> Integrity:
    first_bad = field(message, "first_bad_offset", int, low=-1)
    first_stray = field(message, "first_stray_offset", int, low=-1)
    total = field(message, "messages_total", int, low=1)
    flush_reads = field(message, "flush_reads", int, low=0, high=total, default=0)
    first_flush_bad = field(message, "first_flush_bad_offset", int, low=-1, default=-1)
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
        flush_reads=flush_reads,
        flush_bad=field(message, "flush_bad", int, low=0, high=flush_reads, default=0),
        first_flush_bad_offset=None if first_flush_bad < 0 else first_flush_bad,
        flush_us_median=(None if message.get("flush_us_median") is None else
                         float(field(message, "flush_us_median", (int, float), low=0,
                                     high=MAX_STAGE_S * 1e6))),
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
        raise PeerError(f"the peer sent more than {MAX_FINDINGS} findings or malformed ones",
                        SAME_VERSION_FIX)
    statuses = {status.value for status in Status}
    found = []
    for item in items:
        status = field(item, "status", str)
        if status not in statuses:
            raise PeerError(f"the peer sent a finding with status {peer_text(status, 16)!r}",
                            SAME_VERSION_FIX)
        found.append(Finding(peer_text(field(item, "id", str), 80),
                             peer_text(field(item, "group", str), 20), Status(status),
                             peer_text(field(item, "summary", str), FINDING_TEXT_CHARS),
                             fix=peer_text(field(item, "fix", str), FINDING_TEXT_CHARS)))
    return tuple(found)


# ---- a server's error about its GPU buffer --------------------------------------------------


def error_with_findings(error: GdrprobeError, findings) -> dict:
    """The fields of a server's error: the channel's, and the doctor findings of the host
    that owns the buffer, with which the client's verdict confirms or rules out causes."""
    return error_message(error) | {"findings": findings_message(findings)}


def findings_in(error: GdrprobeError) -> tuple[Finding, ...]:
    """The findings a server's error carried (:func:`error_with_findings`); a malformed
    list is dropped rather than hiding the error it came with."""
    try:
        return findings_from_message(getattr(error, "peer_message", {}))
    except PeerError:
        return ()


# ---- the messages of a run ----------------------------------------------------------------


class WireForm(Protocol):
    """A block whose owner writes its wire form (to_message) and reads it back."""

    def to_message(self) -> dict: ...


class Settings(WireForm, Protocol):
    """The run's settings (ProbeOptions): setup's endpoint has one QP number per QP of the
    run's endpoint (the stream's, or NCCL's pattern's connections where they need more)."""

    endpoint_qps: int


@dataclasses.dataclass(frozen=True)
class Setup:
    """The client's request: the run's settings, its endpoint, its buffer (a latency run
    only: the server writes back), its choice of the server's memory (None: the
    server's own) and, for NCCL's pattern, its FIFO (where the server's clear-to-send go)."""

    KIND: ClassVar[str] = "setup"
    settings: Settings
    endpoint: EndpointAddress
    buffer: RemoteBuffer | None
    server_memory: WireForm | None   # MemorySpec
    fifo: RemoteBuffer | None = None

    def to_message(self) -> dict:
        return {"settings": self.settings.to_message(),
                "endpoint": address_message(self.endpoint),
                "buffer": None if self.buffer is None else self.buffer.to_message(),
                "server_memory": (None if self.server_memory is None else
                                  self.server_memory.to_message())} | (
                {} if self.fifo is None else {"fifo": self.fifo.to_message()})

    @classmethod
    def from_message(cls, message: dict, read_settings: Callable[[dict], Settings],
                     read_memory: Callable[[dict], WireForm]) -> Setup:
        """read_settings and read_memory rebuild the blocks this layer carries but does
        not own, each raising PeerError; the settings say how many QPs the endpoint has
        (endpoint_qps)."""
        settings = read_settings(field(message, "settings", dict))
        return cls(settings,
                   address_from_message(field(message, "endpoint", dict),
                                        settings.endpoint_qps),
                   None if message.get("buffer") is None else
                   RemoteBuffer.from_message(field(message, "buffer", dict)),
                   None if message.get("server_memory") is None else
                   read_memory(field(message, "server_memory", dict)),
                   None if message.get("fifo") is None else
                   RemoteBuffer.from_message(field(message, "fifo", dict)))


@dataclasses.dataclass(frozen=True)
class Queued:
    """<- The client's place in the server's queue for its NIC, the client 1 behind the
    run that holds it; sent every heartbeat, so a waiting client never times out."""

    KIND: ClassVar[str] = "queued"
    position: int
    running: str              # where the run that holds the NIC comes from
    running_s: float          # how long it has held it

    def to_message(self) -> dict:
        return {"position": self.position, "running": self.running,
                "running_s": self.running_s}

    @classmethod
    def from_message(cls, message: dict) -> Queued:
        return cls(field(message, "position", int, low=1, high=MAX_QUEUE_POSITION),
                   peer_text(field(message, "running", str, default="another client"), 64),
                   field(message, "running_s", (int, float), low=0, default=0.0))


@dataclasses.dataclass(frozen=True)
class SetupOk:
    """<- The server's side of the run, set up and connected: its endpoint, its buffer,
    what a report says about it, its time-out (the client's heartbeats keep within it)
    and, for a GPU buffer, its host's doctor findings."""

    KIND: ClassVar[str] = "setup_ok"
    endpoint: EndpointAddress
    buffer: RemoteBuffer
    summary: EndpointSummary
    timeout_s: float
    findings: tuple[Finding, ...]

    def to_message(self) -> dict:
        return {"endpoint": address_message(self.endpoint), "buffer": self.buffer.to_message(),
                "summary": summary_message(self.summary), "timeout_s": self.timeout_s,
                "findings": findings_message(self.findings)}

    @classmethod
    def from_message(cls, message: dict, max_qps: int,
                     timeout_bounds: tuple[float, float]) -> SetupOk:
        low, high = timeout_bounds
        return cls(address_from_message(field(message, "endpoint", dict), max_qps),
                   RemoteBuffer.from_message(field(message, "buffer", dict)),
                   summary_from_message(field(message, "summary", dict)),
                   field(message, "timeout_s", (int, float), low=low, high=high),
                   findings_from_message(message))


PATTERNS = ("", "nccl")   # a round's traffic: the stream, or NCCL's pattern


@dataclasses.dataclass(frozen=True)
class Start:
    """A round of one size; its number seeds the pattern both sides fill and check; pattern
    "nccl": the size as NCCL's steps, from step `first_step` of each connection."""

    KIND: ClassVar[str] = "start"
    size: int
    round: int
    pattern: str = ""
    first_step: int = 0

    def to_message(self) -> dict:
        nccl = {"pattern": self.pattern, "first_step": self.first_step} if self.pattern else {}
        return {"size": self.size, "round": self.round} | nccl

    @classmethod
    def from_message(cls, message: dict, max_size: int) -> Start:
        pattern = field(message, "pattern", str, default="")
        if pattern not in PATTERNS:
            raise PeerError(f"the client asked for a round of pattern {peer_text(pattern, 16)!r}",
                            SAME_VERSION_FIX)
        return cls(field(message, "size", int, low=1, high=max_size),
                   field(message, "round", int, low=0, high=MAX_ROUND), pattern,
                   field(message, "first_step", int, low=0, high=MAX_ROUND, default=0))


@dataclasses.dataclass(frozen=True)
class Done:
    """The client's loop has ended; a bandwidth round says how many messages it posted
    (the server checks the slots that hold the last ones), a latency round nothing."""

    KIND: ClassVar[str] = "done"
    messages: int | None = None

    def to_message(self) -> dict:
        return {} if self.messages is None else {"messages": self.messages}

    @classmethod
    def from_message(cls, message: dict, bandwidth: bool) -> Done:
        if not bandwidth:
            return cls()
        return cls(field(message, "messages", int, low=0, high=MAX_MESSAGES))


@dataclasses.dataclass(frozen=True)
class PassDone:
    """A bandwidth round's pass has landed: `messages` messages (all QPs), the round's
    pass * slots to pass * slots + messages - 1. The client waits for "checked" before it
    writes the slots again."""

    KIND: ClassVar[str] = "pass"
    index: int
    messages: int

    def to_message(self) -> dict:
        return {"index": self.index, "messages": self.messages}

    @classmethod
    def from_message(cls, message: dict, expected_index: int, slots: int) -> PassDone:
        index = field(message, "index", int, low=0, high=MAX_MESSAGES)
        if index != expected_index:
            raise PeerError(f"the client said pass {index} had landed where pass "
                            f"{expected_index} was next", SAME_VERSION_FIX)
        return cls(index, field(message, "messages", int, low=1, high=slots))


@dataclasses.dataclass(frozen=True)
class PassChecked:
    """<- The server has checked a pass (what it found comes with "verified")."""

    KIND: ClassVar[str] = "checked"
    index: int

    def to_message(self) -> dict:
        return {"index": self.index}

    @classmethod
    def from_message(cls, message: dict, expected_index: int) -> PassChecked:
        index = field(message, "index", int, low=0, high=MAX_MESSAGES)
        if index != expected_index:
            raise PeerError(f"the server said it checked pass {index}, not "
                            f"{expected_index}", SAME_VERSION_FIX)
        return cls(index)


@dataclasses.dataclass(frozen=True)
class Sent:
    """<- What the server's own loop did in a bidirectional round (its WRITEs into the
    client's slots): as a BandwidthLoopResult says it, and the seconds a staged buffer spent
    copying each message out."""

    KIND: ClassVar[str] = "sent"
    messages: int
    posted: int
    elapsed_ns: int
    peak_bytes_per_s: float
    passes: int
    paused_ns: int
    stage_out_s: float

    def to_message(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: dict) -> Sent:
        def count(name: str) -> int:
            return field(message, name, int, low=0, high=MAX_MESSAGES)
        return cls(count("messages"), count("posted"), count("elapsed_ns"),
                   float(field(message, "peak_bytes_per_s", (int, float), low=0)),
                   count("passes"), count("paused_ns"),
                   float(field(message, "stage_out_s", (int, float), low=0, high=MAX_STAGE_S)))


@dataclasses.dataclass(frozen=True)
class Verified:
    """<- What the server found in its buffer after a round; a bandwidth round adds the
    seconds a staged buffer spent copying each message in (latency: None)."""

    KIND: ClassVar[str] = "verified"
    integrity: Integrity
    stage_in_s: float | None = None

    def to_message(self) -> dict:
        staged = {} if self.stage_in_s is None else {"stage_in_s": self.stage_in_s}
        return integrity_message(self.integrity) | staged

    @classmethod
    def from_message(cls, message: dict, bandwidth: bool) -> Verified:
        integrity = integrity_from_message(message)
        if not bandwidth:
            return cls(integrity)
        return cls(integrity, field(message, "stage_in_s", (int, float), low=0,
                                    high=MAX_STAGE_S))


@dataclasses.dataclass(frozen=True)
class Received:
    """<- What the receiver of an NCCL-pattern round measured (measure/nccl_receiver.py), in
    ns: its steps consumed in the loaded passes and their time, the medians of a step alone
    (clear-to-send posted to consumed, to every immediate in, its flush) and in the loaded
    passes, and the flush READs made and how many brought back another byte."""

    KIND: ClassVar[str] = "received"
    steps: int
    elapsed_ns: int
    alone_step_ns: int
    alone_recv_ns: int
    alone_flush_ns: int
    loaded_step_ns: int
    loaded_flush_ns: int
    flush_reads: int
    flush_bad: int

    def to_message(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: dict) -> Received:
        return cls(*(field(message, name.name, int, low=0, high=MAX_MESSAGES)
                     for name in dataclasses.fields(cls)))
