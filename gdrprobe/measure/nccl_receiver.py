"""The receiving side of an NCCL-pattern round (the server, or loopback's server thread):
NCCL's receiver over its IB transport (csrc/gdr_nccl.c gdr_nccl_recv_run). Per pass its
loop posts each step's receives and clear-to-send (at most NCCL_STEPS ahead of the steps it
has consumed; one in the first pass, the steps alone), completes each step on its
immediates, flushes it where NCCL would (a GPU buffer the NIC writes, by NCCL's rule), and
consumes it. Between passes, with nothing in flight, it checks every step's bytes where they
landed (gdrprobe.measure.round_check) before any of those slots is offered again.

The conversation (protocol/messages.py): after "start" this side says "ready"; per pass it
waits for the sender's "ready" (the sender's loop runs and polls its FIFO), runs its loop,
waits for the sender's "pass", checks the pass and says "checked"; after "done" it sends
"received" (what it measured) and "verified"."""

from __future__ import annotations

import array
import contextlib
import dataclasses

from gdrprobe import _nccl, _native
from gdrprobe.errors import PeerError
from gdrprobe.measure.clock import loop_clock
from gdrprobe.measure.loops import LoopThread, check_status, stall_timeout_s
from gdrprobe.measure.nccl_shape import STEPS, median_ns, pattern_passes, times
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.measure.round_check import RoundCheck
from gdrprobe.measure.side import heartbeat_s, receive_skipping_progress
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.fields import SAME_VERSION_FIX
from gdrprobe.protocol.messages import (PROGRESS, READY, Done, PassChecked, PassDone, Received,
                                        RemoteBuffer, Start, Verified, send)
from gdrprobe.report.model import Integrity


class NcclReceiver:
    """NCCL-pattern rounds on one side's connections: the clear-to-send elements (a
    registered host buffer), NCCL's flush QP where it flushes, and the rounds. A context
    manager: both are released on every path."""

    def __init__(self, options: ProbeOptions, endpoint, memory: MemoryProvider,
                 fifo: RemoteBuffer | None, flusher, stop: _native.StopFlag, port_gbps):
        if fifo is None:
            raise PeerError("an NCCL-pattern run needs the client's FIFO", SAME_VERSION_FIX)
        self.options, self.memory, self.fifo, self.flusher = options, memory, fifo, flusher
        self.stop, self.port_gbps = stop, port_gbps
        self._resources = contextlib.ExitStack()
        self.cts = self._resources.enter_context(open_buffer(
            MemorySpec(), endpoint, options.pattern_bytes, remote_write=False,
            relaxed_ordering=False))

    def close(self) -> None:
        self._resources.close()

    def __enter__(self) -> NcclReceiver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def round(self, channel, handles, start: Start, seed: int) -> None:
        """One NCCL-pattern round of start.size, as the client's sender drives it."""
        o, size = self.options, start.size
        shape = o.nccl.loop_shape(size, o.integrity_bytes)
        ring, slots = shape["ring_slots"], o.nccl.channels * shape["ring_slots"]
        check = RoundCheck(self.memory, size, slots, slots + 1, seed)
        stall_s = stall_timeout_s(size * STEPS * o.nccl.channels, self.port_gbps)
        what = f"the {size}-byte NCCL-pattern round (the receiver)"
        passes = pattern_passes(o.iterations, ring)
        found = Found(size, slots, flushed=self.flusher is not None)
        channel.send(READY)
        first_id = start.first_step
        for index, steps in enumerate(passes):
            receive_skipping_progress(channel, READY)
            config = _nccl.NcclRecvConfig(
                handles, self.memory, self.cts, self.fifo, self.flusher, shape, seed=seed,
                first_id=first_id, first_message=check.messages, steps=steps,
                window=1 if index == 0 else STEPS, stall_timeout_ns=int(stall_s * 1e9),
                **loop_clock(o.clock).loop_args())
            loop = LoopThread(_nccl.run_nccl_recv, config, self.stop)
            try:
                raw = loop.wait(tick=lambda: channel.send(PROGRESS),
                                tick_every_s=heartbeat_s(o.timeout_s))
            finally:
                loop.finish()
            check_status(raw, what, stall_s)
            landed = PassDone.from_message(receive_skipping_progress(channel, PassDone.KIND),
                                           index, slots)
            if landed.messages != o.nccl.channels * steps:
                raise PeerError(f"the client sent {landed.messages} steps in pass {index}, not "
                                f"{o.nccl.channels * steps}", SAME_VERSION_FIX)
            check.next_pass(landed.messages)
            found.add(raw, alone=index == 0)
            first_id += steps
            send(channel, PassChecked(index))
        done = Done.from_message(receive_skipping_progress(channel, Done.KIND), True)
        if done.messages != check.messages:
            raise PeerError(f"the client sent {done.messages} steps of {size} B and had "
                            f"{check.messages} checked", SAME_VERSION_FIX)
        send(channel, found.received(check.messages))
        send(channel, Verified(found.integrity(check.integrity(done.messages)),
                               check.stage_in_s))


class Found:
    """What the receiver's passes of one round measured and found (messages of `size` in
    `slots` slots; flushed: NCCL's flush ran after every step)."""

    def __init__(self, size: int, slots: int, flushed: bool):
        self.size, self.slots, self.flushed = size, slots, flushed
        self.alone = {"step": array.array("Q"), "recv": array.array("Q"), "flush": array.array("Q")}
        self.loaded = {"step": array.array("Q"), "flush": array.array("Q")}
        self.steps = self.elapsed_ns = self.bad_imm = self.flush_bad = 0
        self.first_flush_bad: int | None = None

    def add(self, raw, alone: bool) -> None:
        """A pass's loop result: the pass of steps alone, or a loaded one."""
        if alone:
            for name, values in (("step", raw.step_ns), ("recv", raw.recv_ns),
                                 ("flush", raw.flush_ns)):
                self.alone[name].extend(times(values))
        else:
            self.loaded["step"].extend(times(raw.step_ns))
            self.loaded["flush"].extend(times(raw.flush_ns))
            self.steps += raw.steps
            self.elapsed_ns += raw.elapsed_ns
        self.bad_imm += raw.bad_imm
        if raw.flush_bad and self.first_flush_bad is None:
            self.first_flush_bad = raw.first_flush_bad
        self.flush_bad += raw.flush_bad

    def received(self, steps: int) -> Received:
        return Received(steps=self.steps, elapsed_ns=self.elapsed_ns,
                        alone_step_ns=median_ns(self.alone["step"]),
                        alone_recv_ns=median_ns(self.alone["recv"]),
                        alone_flush_ns=median_ns(self.alone["flush"]),
                        loaded_step_ns=median_ns(self.loaded["step"]),
                        loaded_flush_ns=median_ns(self.loaded["flush"]),
                        flush_reads=steps if self.flushed else 0, flush_bad=self.flush_bad)

    def integrity(self, checked: Integrity) -> Integrity:
        """The bytes' check, with each immediate that was not its step's size counted as a
        wrong message (its 4 bytes wrong, as the latency loop counts a wrong immediate), and
        NCCL's flush READs (one per step)."""
        bad_imm = min(self.bad_imm, checked.messages_total)
        flush_times = [*self.alone["flush"], *self.loaded["flush"]]
        first_flush = (None if self.first_flush_bad is None
                       else (self.first_flush_bad % self.slots) * self.size)
        return dataclasses.replace(
            checked, bad_messages=min(checked.messages_total, checked.bad_messages + bad_imm),
            bad_bytes=checked.bad_bytes + 4 * bad_imm,
            first_bad_offset=(0 if checked.first_bad_offset is None and bad_imm
                              else checked.first_bad_offset),
            flush_reads=checked.messages_total if self.flushed else 0,
            flush_bad=self.flush_bad, first_flush_bad_offset=first_flush,
            flush_us_median=median_ns(flush_times) / 1000 if self.flushed else None)
