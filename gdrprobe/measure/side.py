"""What the client and the server do alike, each on its side of a run: check the arguments
they are made with, pace their heartbeats, describe their side (to the peer and in the
report), and set up and check the latency round, which both sides of its ping-pong run."""

from __future__ import annotations

import contextlib
import math
import socket
import statistics

from gdrprobe import _native
from gdrprobe.errors import UsageError
from gdrprobe.measure.clock import LoopClock
from gdrprobe.measure.options import MAX_TIMEOUT_S, MIN_TIMEOUT_S
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.protocol.messages import PROGRESS, PassChecked, PassDone, RemoteBuffer, send
from gdrprobe.rdma.endpoint import Endpoint
from gdrprobe.report.model import EndpointSummary, Integrity

HEARTBEATS_PER_TIMEOUT = 4     # a peer beats this often within the other side's time-out
MAX_HEARTBEAT_S = 2.0


def check_timeout(timeout_s: float, what: str) -> None:
    if not (math.isfinite(timeout_s) and MIN_TIMEOUT_S <= timeout_s <= MAX_TIMEOUT_S):
        raise UsageError(f"{what} {timeout_s:g} s: use {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} s",
                         "the slowest step of a run (the server's set-up) needs a few seconds")


def check_tcp_port(port: int, what: str, allow_any: bool = False) -> None:
    """1 to 65535 (0 too, meaning any free port, where allow_any)."""
    if isinstance(port, bool) or not isinstance(port, int) or \
            not (0 if allow_any else 1) <= port <= 65535:
        raise UsageError(f"{what} {port} is not a TCP port", "use 1 to 65535")


def heartbeat_s(peer_timeout_s: float) -> float:
    """How often to tell the peer this side is alive: well within the peer's time-out."""
    return min(MAX_HEARTBEAT_S, peer_timeout_s / HEARTBEATS_PER_TIMEOUT)


def remote_buffer(memory: MemoryProvider) -> RemoteBuffer:
    """This side's buffer as the peer addresses it when it writes."""
    return RemoteBuffer(memory.address, memory.rkey, memory.length)


def endpoint_summary(endpoint: Endpoint, memory: MemoryProvider) -> EndpointSummary:
    """What a report says about one side of a run."""
    return EndpointSummary(host=socket.gethostname(), device=endpoint.device,
                           port=endpoint.options.port, gid_index=endpoint.gid_index,
                           gid=endpoint.gid, mtu_bytes=endpoint.mtu,
                           qp_numbers=tuple(qp.qp_num for qp in endpoint.qps),
                           memory=memory.report(), notes=endpoint.notes)


def offset_or_none(first: int) -> int | None:
    """A verifier's first wrong offset (-1: none) as a report says it."""
    return None if first < 0 else first


def send_half(memory: MemoryProvider) -> int:
    """Where a side's latency messages start: the upper half of its buffer (the peer
    writes into the lower half)."""
    return memory.length // 2


def prepare_latency_round(memory: MemoryProvider, size: int, seed: int) -> None:
    """Both sides before a latency round: the buffer zeroed (the loop waits for a tag in the
    last byte of what arrives) and the round's pattern in the message this side sends."""
    memory.zero()
    memory.fill_pattern(send_half(memory), size, seed)


def received_integrity(raw, size: int, tagged: bool = True) -> Integrity:
    """What the peer's latency messages carried into this side, each checked by the loop as
    it arrived (a LatencyLoopResult): the round's pattern in all but the last byte, which
    is the loop's tag (tagged), or in every byte (a READ's, which has no tag)."""
    checked = size - 1 if tagged else size
    return Integrity(checked=True, bytes_checked=raw.completed * checked,
                     bad_bytes=raw.bad_bytes,
                     first_bad_offset=raw.first_bad_offset if raw.bad_bytes else None,
                     stray_bytes=0, first_stray_offset=None,
                     messages_checked=max(1, raw.completed), messages_total=max(1, raw.completed),
                     bad_messages=raw.bad_messages)


def source_integrity(size: int, sources: int, bad_messages: int, bad_bytes: int,
                     first_bad: int) -> Integrity:
    """What the server of a READ round found in the source messages the client read: they
    must hold what was put there (a READ changes nothing on the side that answers it)."""
    return Integrity(checked=True, bytes_checked=sources * size, bad_bytes=bad_bytes,
                     first_bad_offset=offset_or_none(first_bad), stray_bytes=0,
                     first_stray_offset=None, messages_checked=sources, messages_total=sources,
                     bad_messages=bad_messages)


class Receives:
    """Whether a run's QP has its receive posted yet: the WRITE-with-immediate loop posts
    the first one and leaves one posted after every receive completion."""

    def __init__(self):
        self.posted = False

    def first_post(self) -> bool:
        """Whether the next loop must post the first receive (only the first loop does)."""
        first, self.posted = not self.posted, True
        return first


def prepare_imm_round(memory: MemoryProvider, size: int, seed: int, slots: int,
                      source: MemoryProvider | None = None) -> None:
    """Both sides before a WRITE-with-immediate latency round: the receive slots poisoned
    (each is written once a pass: one that was not stays poison) and the round's pattern in
    the message this side sends (in source, where the run sends from a buffer of its own)."""
    memory.poison(slots * size)
    if source is None:
        memory.fill_pattern(send_half(memory), size, seed)
    else:
        source.fill_pattern(0, size, seed)


def send_source(options, endpoint: Endpoint, size: int):
    """The buffer this side sends a latency round's messages from, as a context manager: a
    host buffer of its own where the run asks for NCCL's LL placement (options.send_memory:
    its send buffers in host memory, the receive buffer as asked); else None (the send half
    of the side's own buffer)."""
    from gdrprobe.memory.buffers import open_buffer
    from gdrprobe.memory.spec import MemorySpec

    if options.send_memory != "host":
        return contextlib.nullcontext()
    return open_buffer(MemorySpec(), endpoint, size, remote_write=False,
                       relaxed_ordering=options.relaxed_ordering)


class FlushTally:
    """A receiver's flushes in one round, checked and timed: each READs the first byte of the
    last message checked, which must be that message's (expected); the Integrity fields."""

    def __init__(self, flusher):
        self.flusher = flusher     # a measure.flush.Flusher; None: the run asks for no flush here
        self.reads = self.bad = 0
        self.first_bad: int | None = None
        self.elapsed_ns: list[int] = []   # each READ's time, post to completion

    def read(self, offset: int, expected: int) -> None:
        if self.flusher is None:
            return
        landed = self.flusher.read_back(offset, expected)
        self.reads += 1
        self.elapsed_ns.append(landed.elapsed_ns)
        if landed.byte != expected:
            self.bad += 1
            if self.first_bad is None:
                self.first_bad = offset

    def fields(self) -> dict:
        """What Integrity says of the flushes."""
        return {"flush_reads": self.reads, "flush_bad": self.bad,
                "first_flush_bad_offset": self.first_bad,
                "flush_us_median": (statistics.median(self.elapsed_ns) / 1000
                                    if self.elapsed_ns else None)}


class ImmCheck:
    """What one side of a WRITE-with-immediate latency round found in its receive slots,
    pass by pass: after each pass, with nothing in flight, every slot the pass wrote must hold
    the round's pattern (read back through the memory provider: GPU memory too), and is
    poisoned again for the next; a message whose immediate was not its number is wrong too.
    With a flusher (the run asks for NCCL's flush and the NIC writes GPU memory here), each
    check starts with it, as a bandwidth round's does (measure/round_check.py): the READ of
    the first byte of the pass's last message, which must bring back that message's."""

    def __init__(self, memory: MemoryProvider, size: int, seed: int, flusher=None):
        self.memory, self.size, self.seed = memory, size, seed
        self.flushes = FlushTally(flusher)
        self.messages = self.bad_messages = self.bad_bytes = 0
        self.first_bad: int | None = None

    def check_pass(self, raw, count: int) -> None:
        """The pass that just ended: its loop's result and its `count` messages' slots."""
        self._found(raw.bad_messages, raw.bad_bytes,
                    raw.first_bad_offset if raw.bad_bytes else -1)
        if count:
            self.flushes.read((count - 1) * self.size, _native.pattern_byte(self.seed, 0))
        self.memory.flush_remote_writes()
        for slot in range(count):
            bad, first = self.memory.verify_pattern(slot * self.size, self.size, self.seed)
            self._found(int(bad > 0), bad, first + slot * self.size if bad else -1)
        self.memory.poison(count * self.size)
        self.messages += count

    def _found(self, messages: int, bad: int, first: int) -> None:
        if bad and self.first_bad is None:
            self.first_bad = first
        self.bad_messages += messages
        self.bad_bytes += bad

    def integrity(self) -> Integrity:
        return Integrity(checked=True, bytes_checked=self.messages * self.size,
                         bad_bytes=self.bad_bytes, first_bad_offset=self.first_bad,
                         stray_bytes=0, first_stray_offset=None,
                         messages_checked=max(1, self.messages),
                         messages_total=max(1, self.messages), bad_messages=self.bad_messages,
                         **self.flushes.fields())


def imm_passes(iterations: int, slots: int) -> list[tuple[int, int]]:
    """A WRITE-with-immediate round's passes: (messages before it, its messages)."""
    return [(first, min(slots, iterations - first)) for first in range(0, iterations, slots)]


def receive_skipping_progress(channel, kind: str) -> dict:
    """The next message of this kind, past the peer's heartbeats (a bidirectional round:
    both sides' loops run, and both beat)."""
    while (message := channel.receive(PROGRESS, kind))["type"] == PROGRESS:
        pass
    return message


def exchange_passes(channel, check, index: int, messages: int) -> None:
    """A bidirectional round's pass, on either side, with this side's loop paused: say
    this side's pass `index` of `messages` has landed at the peer, wait for the peer's
    (its messages have landed here), check them (check: this side's RoundCheck), say so
    and wait until the peer has checked ours. Both sides do the same, in step, so no slot
    is written again before its check."""
    send(channel, PassDone(index, messages))
    landed = PassDone.from_message(receive_skipping_progress(channel, PassDone.KIND), index,
                                   check.slots)
    check.next_pass(landed.messages)
    send(channel, PassChecked(index))
    PassChecked.from_message(receive_skipping_progress(channel, PassChecked.KIND), index)


def latency_config(handles, memory: MemoryProvider, remote, size: int, iterations: int,
                   max_inline: int, initiator: bool, stall_s: float, clock: LoopClock,
                   seed: int, read: bool = False, imm: dict | None = None,
                   source: MemoryProvider | None = None):
    """The ping-pong loop's settings for one side (see send_half); read: the READ
    latency loop instead, which lands each READ at the start of memory; imm: the WRITE with
    immediate loop's pass (slots, first, post_recv: _native.LatencyConfig); source: the
    buffer it sends from, where not its own (send_source)."""
    return _native.LatencyConfig(
        handles, memory, remote, send_offset=send_half(memory) if source is None else 0,
        msg_size=size, iterations=iterations, max_inline=max_inline, initiator=initiator,
        stall_timeout_ns=int(stall_s * 1e9), seed=seed, read=read, imm=imm is not None,
        source=source, **(imm or {}), **clock.loop_args())
