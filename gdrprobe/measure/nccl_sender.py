"""The sending side of an NCCL-pattern round (the client): NCCL's sender over its IB
transport (csrc/gdr_nccl.c gdr_nccl_send_run). Per pass its loop polls its FIFO for each
step's clear-to-send, in order, and posts the step's data as NCCL does (over the
connection's QPs, the last WRITE with the size as immediate); the receiver
(gdrprobe.measure.nccl_receiver) paces it. A round is one pass of steps alone (one in
flight: the step time NCCL's ceiling follows from), then the loaded passes, NCCL_STEPS in
flight; the receiver checks each pass before its slots are offered again.

What the round reports (gdrprobe.report.nccl_pattern): the rate the receiver measured over
the loaded passes; a step alone split into clear-to-send, data (this side's post to the
completion of its last WRITE) and flush (the receiver's READ); the same with steps in
flight; and the ceiling per connection, NCCL_STEPS x the size / a step alone."""

from __future__ import annotations

import array
import contextlib

from gdrprobe import _nccl, _native
from gdrprobe.errors import PeerError
from gdrprobe.measure.loops import LoopThread, check_status, stall_timeout_s
from gdrprobe.measure.nccl_shape import STEPS, median_ns, pattern_passes, times
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.side import receive_skipping_progress
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.fields import SAME_VERSION_FIX
from gdrprobe.protocol.messages import (PROGRESS, READY, Done, PassChecked, PassDone, Received,
                                        RemoteBuffer, Start, Verified, send)
from gdrprobe.report.nccl_pattern import NcclPatternResult, StepPhases


def not_protocol(raw, what: str) -> None:
    """A loop that ended on a clear-to-send it could not send into: the receiver's fault."""
    if raw.status == _nccl.STATUS_PROTOCOL:
        raise PeerError(f"{what}: the receiver's clear-to-send named no step this side may "
                        "send (its size, tag or address was not one it may ask for)",
                        SAME_VERSION_FIX)


class NcclSender:
    """This side's FIFO (a registered host buffer the receiver's clear-to-send land in) and
    the connections' step count, which goes on across rounds as NCCL's does. A context
    manager: the FIFO is released on every path."""

    def __init__(self, options: ProbeOptions, endpoint, stop: _native.StopFlag):
        self.options, self.stop = options, stop
        self.next_step = 0
        self._resources = contextlib.ExitStack()
        self.fifo = self._resources.enter_context(open_buffer(
            MemorySpec(), endpoint, options.pattern_bytes, remote_write=True,
            relaxed_ordering=False))
        self.fifo.zero()   # no element names a step yet

    def fifo_buffer(self) -> RemoteBuffer:
        return RemoteBuffer(self.fifo.address, self.fifo.rkey, self.fifo.length)

    def close(self) -> None:
        self._resources.close()

    def __enter__(self) -> NcclSender:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def round(self, channel, handles, memory: MemoryProvider, remote, size: int,
              round_number: int, clock, port_gbps, heartbeat_s: float):
        """One size's round: (its NcclPatternResult, the worst clock check of its passes). The
        caller judges the receiver's check of the bytes (result.integrity)."""
        o = self.options
        shape = o.nccl.loop_shape(size, o.integrity_bytes)
        ring, slots = shape["ring_slots"], o.nccl.channels * shape["ring_slots"]
        seed = _native.pattern_seed(size, round_number)
        memory.fill_slots(size, slots + 1, seed)
        memory.stage_out(0, (slots + 1) * size)
        stall_s = stall_timeout_s(size * STEPS * o.nccl.channels, port_gbps)
        what = f"the {size}-byte NCCL-pattern round"
        passes = pattern_passes(o.iterations, ring)
        send(channel, Start(size, round_number, "nccl", self.next_step))
        receive_skipping_progress(channel, READY)
        sent = Sent(), Sent()
        checks, messages = [], 0
        for index, steps in enumerate(passes):
            config = _nccl.NcclSendConfig(
                handles, memory, self.fifo, remote, shape, first_id=self.next_step,
                first_message=messages, steps=steps, stall_timeout_ns=int(stall_s * 1e9),
                **clock.loop_args())
            loop = LoopThread(_nccl.run_nccl_send, config, self.stop)
            loop.start()
            channel.send(READY)
            raw = loop.wait(tick=beat(channel, what), tick_every_s=heartbeat_s)
            not_protocol(raw, what)
            check_status(raw, what, stall_s)
            sent[index > 0].add(raw)
            checks.append(raw.clock_check)
            send(channel, PassDone(index, o.nccl.channels * steps))
            PassChecked.from_message(receive_skipping_progress(channel, PassChecked.KIND), index)
            self.next_step += steps
            messages += o.nccl.channels * steps
        send(channel, Done(messages))
        received = Received.from_message(receive_skipping_progress(channel, Received.KIND))
        verified = Verified.from_message(channel.receive(Verified.KIND), bandwidth=True)
        result = pattern_result(o, size, received, sent, verified, len(passes))
        return result, max(checks, key=lambda check: abs(check.agreement - 1.0))


def beat(channel, what: str):
    """The heartbeat while the sender's loop runs: the receiver beats too, so only its
    hanging up ends the loop early."""
    def tick():
        if channel.peer_gone():
            raise PeerError(f"{what} failed: the server went away during the run",
                            "look at the server's host: was it stopped or killed?")
        channel.send(PROGRESS)
    return tick


class Sent:
    """The sender's step times over passes (the alone pass, or the loaded ones)."""

    def __init__(self):
        self.wait, self.data = array.array("Q"), array.array("Q")

    def add(self, raw) -> None:
        self.wait.extend(times(raw.wait_ns))
        self.data.extend(times(raw.data_ns))


def pattern_result(options: ProbeOptions, size: int, received: Received,
                   sent: tuple[Sent, Sent], verified: Verified, passes: int) -> NcclPatternResult:
    """The round's report row: the receiver's rate and step times with the sender's."""
    alone, loaded = sent
    step, flush = received.alone_step_ns / 1000, received.alone_flush_ns / 1000
    data = median_ns(alone.data) / 1000
    alone_phases = StepPhases(step, max(0.0, step - data - flush), data, flush)
    loaded_phases = StepPhases(received.loaded_step_ns / 1000, median_ns(loaded.wait) / 1000,
                               median_ns(loaded.data) / 1000, received.loaded_flush_ns / 1000)
    rate = received.steps * size * 8 / received.elapsed_ns if received.elapsed_ns else 0.0
    shape = options.nccl
    return NcclPatternResult(
        size_bytes=size, channels=shape.channels, qps_per_connection=shape.qps_per_connection,
        split=shape.split, adaptive_routing=shape.adaptive_routing, steps_in_flight=STEPS,
        steps=received.steps // shape.channels, elapsed_s=received.elapsed_ns / 1e9,
        rate_gbps=rate, connection_gbps=rate / shape.channels, alone=alone_phases,
        loaded=loaded_phases,
        ceiling_gbps=STEPS * size * 8 / received.alone_step_ns if received.alone_step_ns else 0.0,
        integrity=verified.integrity, passes=passes)
