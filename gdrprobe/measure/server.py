"""The side of a run that lends its scratch buffer: the server checks the client's settings
against its limits, builds a matching endpoint and buffer, and then follows the client
round by round: poison its buffer, let the client write, verify what landed.

Every connection that has not proved the token waits at the door (protocol/door.py), one
thread for all of them, so a stranger (an idle socket, a client trickling bytes, a flood
from many addresses) never makes a client wait and costs no thread of its own;
authenticated clients then get a thread each and take the NIC one at a time, in order, and
a waiting client is told its place and kept alive with messages until its turn. Logging
never blocks serving (protocol/serverlog.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ipaddress
import socket
import threading
import time

from gdrprobe import _native, defaults
from gdrprobe.errors import GdrprobeError, PeerError, UsageError
from gdrprobe.measure.clock import loop_clock
from gdrprobe.measure.flush import Flusher, wants_flush
from gdrprobe.measure.nccl_receiver import NcclReceiver
from gdrprobe.measure.nccl_shape import STEPS
from gdrprobe.measure.loops import (LoopThread, PassGate, bandwidth_in_flight, check_status,
                                    latency_in_flight, stall_timeout_s)
from gdrprobe.measure.nic_queue import NicQueue
from gdrprobe.measure.options import ProbeOptions, check_latency_memory
from gdrprobe.measure.round_check import RoundCheck
from gdrprobe.measure.side import (check_tcp_port, check_timeout, endpoint_summary,
                                   heartbeat_s, imm_passes, latency_config, prepare_imm_round,
                                   prepare_latency_round, received_integrity, remote_buffer,
                                   source_integrity, ImmCheck, Receives, exchange_passes,
                                   receive_skipping_progress, send_source)
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.channel import Channel
from gdrprobe.protocol.door import Door
from gdrprobe.protocol.fields import SAME_VERSION_FIX, peer_text
from gdrprobe.protocol.handshake import ServerSecret
from gdrprobe.protocol.messages import (BYE, PROGRESS, READY, Done, PassChecked, PassDone,
                                        Queued, Sent, Setup, SetupOk, Start, Verified,
                                        error_with_findings, send)
from gdrprobe.protocol.serverlog import LineLog
from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions, cq_entries
from gdrprobe.rdma.verbs import port_rate_gbps

PREFLIGHT_BYTES = 2 * 4096     # the smallest buffer: a page for the message, a page past it
MIN_MAX_BUFFER = 16 << 10      # holds the smallest run: that buffer and its queues
LISTEN_BACKLOG = 1024          # the kernel caps it at net.core.somaxconn
# What a run's queues make the server allocate, at most, by the two providers' own sizing.
# A send queue entry holds a header and the inline data or one scatter entry: on mlx5, 192
# bytes of RC segments (rdma-core providers/mlx5/verbs.c _sq_overhead) plus the inline or
# data segment, aligned to 64 (mlx5_calc_send_wqe), times max_send_wr rounded up to a power
# of two (mlx5_calc_sq_size); on Soft-RoCE, struct rxe_send_wqe (about 208 bytes,
# kernel-headers/rdma/rdma_user_rxe.h) plus max(inline, one SGE), the entry size and the
# entry count + 1 each rounded up to a power of two (the kernel's rxe_queue.h). A CQE is
# 64 or 128 bytes on mlx5 (get_cqe_size), a struct ib_wc rounded up on Soft-RoCE.
SEND_ENTRY_HEADER_BYTES = 208
SGE_BYTES = 16
CQE_BYTES = 128


def _power_of_two(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def queue_bytes(endpoint: EndpointOptions) -> int:
    """The most a run's QPs and CQ take (see SEND_ENTRY_HEADER_BYTES): each QP's send queue
    and its receive queue (one entry, NCCL's pattern 256), and the CQ of both."""
    entry = _power_of_two(SEND_ENTRY_HEADER_BYTES + max(endpoint.max_inline, SGE_BYTES))
    per_qp = (_power_of_two(endpoint.tx_depth + 1) + _power_of_two(endpoint.rx_depth + 1)) * entry
    completions = _power_of_two(cq_entries(endpoint) + 1) * CQE_BYTES
    return endpoint.num_qps * per_qp + completions


def check_bind(bind: str) -> None:
    """serve listens on an address, not a name: the address also picks the RoCE GID."""
    try:
        ipaddress.ip_address(bind)
    except ValueError as error:
        raise UsageError(f"--bind {bind!r} is not an IP address",
                         "give the address of the interface to listen on (its RoCE v2 GID "
                         "is the one used), e.g. --bind 10.0.0.2, or 0.0.0.0 for every "
                         "interface") from error


class ProbeServer:
    """Serves runs, one at a time on the NIC, to clients that prove the token; a failed
    or hostile client ends only its own connection, and a stranger never delays anyone.

    findings: this host's doctor findings, sent as given to a client whose run uses a GPU
    buffer here (with setup_ok, or with the error that ended the run), so its verdict can
    confirm or rule out causes on the host that owns the buffer; the caller chooses them."""

    def __init__(self, token: str | ServerSecret, endpoint_options: EndpointOptions, *,
                 bind: str = defaults.BIND, port: int = defaults.PORT,
                 timeout_s: float = defaults.TIMEOUT_S, max_buffer: int = defaults.MAX_BUFFER,
                 memory: MemorySpec = MemorySpec(), log=None, findings=(),
                 preflight: bool = True):
        check_timeout(timeout_s, "server time-out")
        check_tcp_port(port, "server port", allow_any=True)
        check_bind(bind)
        if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or \
                max_buffer < MIN_MAX_BUFFER:
            raise UsageError(f"--max-buffer {max_buffer}: use at least {MIN_MAX_BUFFER} bytes",
                             f"the default is {defaults.MAX_BUFFER >> 20} MiB")
        self.endpoint_options = endpoint_options
        self.timeout_s = timeout_s
        self.max_buffer = max_buffer
        self.memory = memory
        self.findings = tuple(findings)
        self._log = log or LineLog()
        self.stop = _native.StopFlag()
        self._nic = NicQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._channels: set[Channel] = set()
        self._closing = False
        self._runs: int | None = None
        self._served = 0
        self._last_error: Exception | None = None
        if preflight:
            self._preflight(bind)
        # A ServerSecret instead of a token: a loopback server, its key shared in-process.
        self.secret = token if isinstance(token, ServerSecret) else ServerSecret(token)
        try:
            self.listener = socket.create_server((bind, port), backlog=LISTEN_BACKLOG)
        except (OSError, OverflowError) as error:
            raise UsageError(f"cannot listen on {bind}:{port}: "
                             f"{getattr(error, 'strerror', None) or error}",
                             "pick another port with -p or stop what uses it") from error
        self.port = self.listener.getsockname()[1]
        try:
            self.door = Door(self.listener, self.secret, self._admitted,
                             lambda text: self.log(f"gdrprobe serve: {text}"))
        except BaseException:
            self.listener.close()
            raise

    def log(self, text: str) -> None:
        """Log a line; a log that fails must not stop the server."""
        try:
            self._log(text)
        except (OSError, ValueError):
            pass

    def _preflight(self, bind: str) -> None:
        """Open what every run will need before listening, so a server that cannot serve
        says why at once instead of failing every client: the device, its port, a GID for
        the bind address, and a registered buffer of its own memory kind."""
        local_ip = None if bind in ("", "0.0.0.0", "::") else bind
        options = dataclasses.replace(self.endpoint_options, num_qps=1, tx_depth=1,
                                      max_inline=0)
        with Endpoint(options, local_ip) as endpoint:
            with open_buffer(self.memory, endpoint, PREFLIGHT_BYTES, True):
                pass

    # -- accepting -----------------------------------------------------------------

    def serve(self, runs: int | None = None) -> None:
        """Serve until interrupted, or until `runs` authenticated runs have ended; then
        raise the last one's error (so `serve --once` exits as its run ended, a bug in
        gdrprobe included)."""
        self._runs = runs
        try:
            self.door.run()
        finally:
            self.close()
        if self._last_error is not None:
            raise self._last_error

    def _admitted(self, channel: Channel, source: str) -> None:
        """A client that proved the token (called by the door): a thread of its own."""
        thread = threading.Thread(target=self._connection, args=(channel, source),
                                  name=f"gdrprobe-client-{source}", daemon=True)
        with self._lock:
            if self._closing:
                channel.close()
                return
            # Started under the lock: close() never sees a thread it cannot join yet.
            thread.start()
            self._threads.add(thread)
            self._channels.add(channel)

    def close(self) -> None:
        """Stop accepting, end every connection (a run in progress releases its verbs
        objects and buffer as it ends) and wait for them, boundedly; then write out the
        log, boundedly too."""
        with self._lock:
            self._closing = True
            channels, threads = list(self._channels), list(self._threads)
        self.door.close()
        self.stop.set()
        for channel in channels:
            channel.shutdown()
        deadline = time.monotonic() + self.timeout_s
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        if isinstance(self._log, LineLog):
            self._log.close()

    # -- one connection --------------------------------------------------------------

    def _connection(self, channel: Channel, source: str) -> None:
        channel.timeout = self.timeout_s
        try:
            try:
                ended = self._authenticated_run(channel, source)
            except Exception as error:   # a bug must not take the server down...
                self.log(f"gdrprobe serve: a connection from {source} hit a gdrprobe bug: "
                         f"{error!r}")
                ended = error   # ...but ends its run: serve() raises it if it was the last
            self._count(ended)
        finally:
            channel.close()
            with self._lock:
                self._channels.discard(channel)
                self._threads.discard(threading.current_thread())

    def _authenticated_run(self, channel: Channel, source: str) -> GdrprobeError | None:
        """One client's run; its error (also sent to it), or None."""
        try:
            self.serve_one(channel, source)
        except GdrprobeError as error:
            channel.send_last("error", **error_with_findings(
                error, getattr(error, "owner_findings", ())))
            if not self._closing:
                self.log(f"gdrprobe serve: run from {source} ended: {error.cause}")
            return error
        self.log(f"gdrprobe serve: run from {source} finished")
        return None

    def _count(self, error: Exception | None) -> None:
        """Count an authenticated run; after the last one asked for, stop accepting."""
        with self._lock:
            if self._closing:
                return   # cut off by the server's own end: not a run
            self._served += 1
            if self._runs is None or self._served < self._runs:
                return
            self._closing = True
            self._last_error = error
        self.door.close()

    def serve_one(self, channel: Channel, source: str) -> None:
        """An authenticated client: its settings, its turn on the NIC, its rounds."""
        setup = Setup.from_message(channel.receive(Setup.KIND), self._checked_options,
                                   self._memory_choice)
        options = setup.settings
        spec = self.memory if setup.server_memory is None else setup.server_memory
        check_latency_memory(options, None, spec)

        def waiting(position: int, holder: str, held_s: float) -> None:
            if self._closing:
                raise PeerError("the server is shutting down (it served its last run)",
                                "start the server again, without --once to serve many runs")
            if channel.peer_gone():
                raise PeerError(f"the client at {source} left the queue", "")
            send(channel, Queued(position, holder, held_s))

        with self._nic.turn(source, heartbeat_s(options.timeout_s), waiting):
            self.stop.clear()
            local_ip = channel.sock.getsockname()[0]
            try:
                flushing = wants_flush(options.flush, spec)
                with Endpoint(options.endpoint_options(self.endpoint_options, server=True),
                              local_ip) as endpoint:
                    with open_buffer(spec, endpoint, options.buffer_bytes, not options.reads,
                                     options.relaxed_ordering,
                                     read_back=flushing or options.reads) as memory:
                        self._serve_rounds(channel, options, endpoint, memory, setup, flushing)
            except GdrprobeError as error:
                # A GPU buffer that would not register, or a broken path into it: the
                # client's verdict needs this host's findings about it all the more.
                if spec.kind == "gpu":
                    error.owner_findings = self.findings
                raise

    @staticmethod
    def _memory_choice(message: dict) -> MemorySpec:
        """The client's choice of this side's memory."""
        try:
            return MemorySpec.from_message(message)
        except UsageError as error:
            raise PeerError("the client asked for impossible memory: "
                            f"{peer_text(error.cause)}", SAME_VERSION_FIX) from error

    def _checked_options(self, message: dict) -> ProbeOptions:
        try:
            options = ProbeOptions.from_message(message)
        except UsageError as error:
            raise PeerError("the client asked for impossible settings: "
                            f"{peer_text(error.cause)}", SAME_VERSION_FIX) from error
        self._check_max_buffer(options)
        return options

    def _check_max_buffer(self, options: ProbeOptions) -> None:
        """--max-buffer bounds the memory a run makes this server allocate: its registered
        buffer and, at most, its queues (queue_bytes)."""
        buffer = options.buffer_bytes + options.pattern_bytes
        queues = queue_bytes(options.endpoint_options(self.endpoint_options, server=True))
        if buffer + queues <= self.max_buffer:
            return
        raise PeerError(
            f"the run needs {buffer + queues} bytes on the server and its --max-buffer is "
            f"{self.max_buffer}: {buffer} bytes of registered buffer (the slots of the "
            f"largest size, {max(options.sizes)} B, and a message past them) and up to "
            f"{queues} bytes of queues ({options.qps} QP(s) of {options.tx_depth} send "
            "entries, and their completion queue)",
            f"start the server with --max-buffer {buffer + queues} or more, or ask for "
            "smaller sizes, fewer QPs (-q) or a smaller TX depth (-t)")

    # -- the rounds ----------------------------------------------------------------------

    def _serve_rounds(self, channel, options, endpoint, memory, setup: Setup, flushing: bool):
        endpoint.connect(setup.endpoint)
        handles = endpoint.handles()
        if options.mode == "bandwidth" and not options.reads:
            memory.poison()   # for the first round (see _bandwidth_round; bidir: its slots)
        port_gbps = port_rate_gbps(endpoint.port_attr)
        with self._flusher(endpoint, memory, flushing, options) as flusher, \
                self._receiver(options, endpoint, memory, setup, flusher, port_gbps) as receiver:
            send(channel, SetupOk(endpoint.address(), remote_buffer(memory),
                                  endpoint_summary(endpoint, memory), self.timeout_s,
                                  self.findings if memory.kind == "gpu" else ()))
            self._rounds(channel, options, endpoint, handles, memory, setup, flusher, Receives(),
                         receiver)

    def _flusher(self, endpoint, memory, flushing: bool, options: ProbeOptions):
        """NCCL's flush QP for this receive buffer where the run asks for the flush and the
        NIC writes GPU memory directly (measure/flush.py); else nothing. NCCL's pattern
        flushes every step in flight of every channel."""
        if not (flushing and memory.gpudirect_target):
            return contextlib.nullcontext()
        depth = options.nccl.channels * STEPS if options.pattern else 1
        return Flusher(endpoint, memory, self.stop, port_rate_gbps(endpoint.port_attr), depth)

    def _receiver(self, options, endpoint, memory, setup: Setup, flusher, port_gbps):
        """NCCL's receiver of an NCCL-pattern run (measure/nccl_receiver.py); else nothing."""
        if not options.pattern:
            return contextlib.nullcontext()
        return NcclReceiver(options, endpoint, memory, setup.fifo, flusher, self.stop,
                            port_gbps)

    def _rounds(self, channel, options, endpoint, handles, memory, setup: Setup, flusher,
                receives: Receives, receiver):
        while True:
            message = channel.receive(Start.KIND, BYE)
            if message["type"] == BYE:
                return
            start = Start.from_message(message, max(options.sizes))
            seed = _native.pattern_seed(start.size, start.round)
            if start.pattern:
                if receiver is None:
                    raise PeerError("the client asked for an NCCL-pattern round in a run that "
                                    "has none", SAME_VERSION_FIX)
                receiver.round(channel, handles, start, seed)
            elif options.bidir:
                self._bidir_round(channel, options, endpoint, handles, memory, setup.buffer,
                                  start.size, seed, flusher)
            elif options.reads:
                self._read_round(channel, options, memory, start.size, seed)
            elif options.imm:
                self._imm_latency_round(channel, options, endpoint, handles, memory,
                                        setup.buffer, start.size, seed, receives, flusher)
            elif options.mode == "bandwidth":
                self._bandwidth_round(channel, options, memory, start.size, seed, flusher)
            else:
                self._latency_round(channel, options, endpoint, handles, memory,
                                    setup.buffer, start.size, seed)

    def _wait_for_done(self, channel: Channel, bandwidth: bool, on_pass=None) -> Done:
        """The client's heartbeats keep the run alive; silence past the time-out ends it.
        A bandwidth round's passes go to on_pass as they land."""
        kinds = (PROGRESS, Done.KIND) + ((PassDone.KIND,) if on_pass else ())
        while (message := channel.receive(*kinds))["type"] != Done.KIND:
            if message["type"] == PassDone.KIND:
                on_pass(message)
        return Done.from_message(message, bandwidth)

    def _bandwidth_round(self, channel, options, memory, size, seed, flusher=None):
        """Check a round the client has written: each pass as it lands, before the client
        writes its slots again, or (a sampling run) the slots' last messages at the end.
        The buffer is poisoned again for the next round (the slots: past them a stray write
        fails the run) before "verified" goes out, so the client writes at once after
        "start": one round trip a size, not two."""
        check = RoundCheck(memory, size, options.slots(size), options.source_slots(size), seed,
                           flusher)
        on_pass = None if options.sample_integrity else functools.partial(self._pass, channel,
                                                                           check)
        posted = self._wait_for_done(channel, bandwidth=True, on_pass=on_pass).messages
        check.settle(posted, options.sample_integrity, "the client")
        send(channel, Verified(check.integrity(posted), check.stage_in_s))

    @staticmethod
    def _pass(channel: Channel, check: RoundCheck, message: dict) -> None:
        landed = PassDone.from_message(message, check.passes, check.slots)
        check.next_pass(landed.messages)
        send(channel, PassChecked(landed.index))

    def _bidir_round(self, channel, options, endpoint, handles, memory, remote, size, seed,
                     flusher=None):
        """This side of a bidirectional round: its own loop WRITEs its sources (past its
        receive slots) into the client's slots while the client writes into this side's,
        both loops pausing after each pass until both sides have checked (exchange_passes,
        each check after NCCL's flush where the run asks for it), or (a sampling run) with
        no pause, the slots' last messages checked once the client's loop has ended; then
        "sent" (this loop's result) and "verified" (what landed here)."""
        if remote is None:
            raise PeerError("a bidirectional run needs the client's buffer", SAME_VERSION_FIX)
        what = f"the {size}-byte bidirectional round (the server's WRITEs)"
        sources, offset = options.source_slots(size), options.source_offset(size)
        memory.fill_slots(size, sources, seed, offset)
        stage_out_s = memory.stage_out(offset, sources * size) / sources
        check = RoundCheck(memory, size, options.slots(size), sources, seed, flusher, stray_end=offset)
        per_qp = options.iterations + options.warmup_iterations
        stall_s = stall_timeout_s(bandwidth_in_flight(size, options.qps, options.tx_depth,
                                                      per_qp), port_rate_gbps(endpoint.port_attr))
        passes = None if options.sample_integrity else PassGate(self.stop)
        config = _native.BandwidthConfig(
            handles, memory, remote, msg_size=size, iterations=options.iterations,
            warmup_iterations=options.warmup_iterations, tx_depth=options.tx_depth,
            cq_mod=options.cq_moderation, post_list=options.post_list,
            max_inline=options.max_inline if memory.inline_capable else 0,
            stall_timeout_ns=int(stall_s * 1e9), slots=options.slots(size), src_slots=sources,
            on_pass=passes, src_offset=offset, **loop_clock(options.clock).loop_args())
        loop = LoopThread(_native.run_bandwidth, config, self.stop, passes)
        # The word first, then the loop: the client's loop is built and starts on this word,
        # so the two loops start together, as perftest's do after their handshake.
        channel.send(READY)
        try:
            raw = loop.wait(tick=lambda: channel.send(PROGRESS),
                            tick_every_s=heartbeat_s(options.timeout_s),
                            on_pass=passes and functools.partial(exchange_passes, channel, check))
        finally:
            loop.finish()
        check_status(raw, what, stall_s)
        posted = Done.from_message(receive_skipping_progress(channel, Done.KIND), True).messages
        check.settle(posted, options.sample_integrity, "the client")
        send(channel, Sent(raw.messages, raw.posted, raw.elapsed_ns, raw.peak_bytes_per_s,
                           raw.passes, raw.paused_ns, stage_out_s))
        send(channel, Verified(check.integrity(posted), check.stage_in_s))

    def _read_round(self, channel, options, memory, size, seed):
        """A round the client READs: this side's NIC answers, reading this buffer. The
        round's source messages are put where the client reads them (a bandwidth round's
        source slots, or a latency round's one message at the start), the client is told
        it may read, and after its "done" the sources are checked to be as they were: a
        READ must not change what it reads."""
        bandwidth = options.mode == "bandwidth"
        sources = options.source_slots(size) if bandwidth else 1
        if bandwidth:
            memory.fill_slots(size, sources, seed)
        else:
            memory.fill_pattern(0, size, seed)
        stage_out_s = memory.stage_out(0, sources * size) / sources   # per message read
        channel.send(READY)
        self._wait_for_done(channel, bandwidth)
        if bandwidth:
            bad_messages, bad, first = memory.verify_messages(size, sources, sources, seed, 0,
                                                              sources)
        else:
            bad, first = memory.verify_pattern(0, size, seed)
            bad_messages = int(bad > 0)
        send(channel, Verified(source_integrity(size, sources, bad_messages, bad, first),
                               stage_out_s if bandwidth else None))

    def _imm_latency_round(self, channel, options, endpoint, handles, memory, remote, size,
                           seed, receives: Receives, flusher=None):
        """The responder of a WRITE-with-immediate ping-pong, pass by pass: each pass's
        loop answers the client's messages on its receive completions; at the client's
        "pass" this side checks its slots (ImmCheck, after NCCL's flush where the run asks
        for it) and starts the next pass's loop before it answers "checked". It sends from
        a host buffer of its own where the run asks for NCCL's LL placement (send_source)."""
        if remote is None:
            raise PeerError("a latency run needs the client's buffer", SAME_VERSION_FIX)
        with send_source(options, endpoint, size) as source:
            self._imm_passes(channel, options, endpoint, handles, memory, remote, size, seed,
                             receives, flusher, source)

    def _imm_passes(self, channel, options, endpoint, handles, memory, remote, size, seed,
                    receives: Receives, flusher, source):
        slots = options.slots(size)
        prepare_imm_round(memory, size, seed, slots, source)
        check = ImmCheck(memory, size, seed, flusher)
        what = f"the {size}-byte latency round (WRITE with immediate)"
        stall_s = stall_timeout_s(latency_in_flight(size), port_rate_gbps(endpoint.port_attr))
        passes = imm_passes(options.iterations, slots)
        inline = options.max_inline if (source or memory).inline_capable else 0

        def responder(index: int) -> LoopThread:
            first, count = passes[index]
            config = latency_config(handles, memory, remote, size, count, inline, False,
                                    stall_s, loop_clock(options.clock), seed,
                                    imm={"slots": slots, "first": first,
                                         "post_recv": receives.first_post()}, source=source)
            loop = LoopThread(_native.run_latency, config, self.stop)
            loop.start()
            return loop

        loop = responder(0)
        try:
            channel.send(READY)
            while (message := channel.receive(PROGRESS, PassDone.KIND, Done.KIND))["type"] \
                    != Done.KIND:
                if message["type"] == PROGRESS:
                    continue
                landed = PassDone.from_message(message, check.messages // slots, slots)
                raw = loop.finish(grace_s=stall_s)
                check_status(raw, what, stall_s)
                check.check_pass(raw, passes[landed.index][1])
                if landed.index + 1 < len(passes):
                    loop = responder(landed.index + 1)
                send(channel, PassChecked(landed.index))
        finally:
            loop.finish()
        send(channel, Verified(check.integrity()))

    def _latency_round(self, channel, options, endpoint, handles, memory, remote, size, seed):
        if remote is None:
            raise PeerError("a latency run needs the client's buffer", SAME_VERSION_FIX)
        prepare_latency_round(memory, size, seed)
        what = f"the {size}-byte latency round"
        stall_s = stall_timeout_s(latency_in_flight(size), port_rate_gbps(endpoint.port_attr))
        # The responder times nothing: its clock only keeps the stall deadline.
        config = latency_config(handles, memory, remote, size, options.iterations,
                                options.max_inline, False, stall_s, loop_clock(options.clock),
                                seed)
        responder = LoopThread(_native.run_latency, config, self.stop)
        try:
            responder.start()
            channel.send(READY)
            self._wait_for_done(channel, bandwidth=False)
        except BaseException:
            responder.finish()
            raise
        # Our last echo may still wait for its acknowledgement when the client, which has
        # it already, says done: give it the time one message may take.
        raw = responder.finish(grace_s=stall_s)
        if raw.status == _native.STATUS_STOPPED and not self._closing:
            raise PeerError(f"the client ended {what} after {raw.completed} of "
                            f"{options.iterations} round trips", "")
        check_status(raw, what, stall_s)
        send(channel, Verified(received_integrity(raw, size)))
