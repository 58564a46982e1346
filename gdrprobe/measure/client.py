"""The side of a run that drives it: the client chooses the settings, sends them in the
handshake, writes each round into the server's buffer and measures; the server verifies
what landed. Either side ending, failing or being interrupted ends the run on both with a
clear error, and every verbs object and buffer is released."""

from __future__ import annotations

import array
import contextlib
import dataclasses
import functools
import math
import random
import socket
import time

from gdrprobe import _native
from gdrprobe.errors import GdrprobeError, IntegrityError, PeerError, RdmaError, UsageError
from gdrprobe.measure.clock import LoopClock, loop_clock, monotonic
from gdrprobe.measure.loops import (LoopThread, PassGate, bandwidth_in_flight, bandwidth_result,
                                    bidir_result, check_status, latency_in_flight,
                                    latency_result, stall_timeout_s)
from gdrprobe.measure.options import (MAX_TIMEOUT_S, MIN_TIMEOUT_S, ProbeOptions,
                                      check_latency_memory)
from gdrprobe.measure.nccl_sender import NcclSender
from gdrprobe.measure.round_check import RoundCheck
from gdrprobe.measure.side import (ImmCheck, Receives, check_tcp_port, check_timeout,
                                   endpoint_summary, exchange_passes, heartbeat_s, imm_passes,
                                   latency_config, prepare_imm_round, prepare_latency_round,
                                   receive_skipping_progress, received_integrity,
                                   remote_buffer, send_source)
from gdrprobe.measure.flush import Flusher, wants_flush
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.protocol.channel import Channel, abort_message
from gdrprobe.protocol.fields import SAME_VERSION_FIX
from gdrprobe.protocol.handshake import (Refused, ServerSecret,
                                         authenticate_as_client)
from gdrprobe.protocol.messages import (BYE, PROGRESS, READY, Done, PassChecked, PassDone,
                                        Queued, Sent, Setup, SetupOk, Start, Verified,
                                        findings_in, send)
from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions
from gdrprobe.rdma.verbs import port_rate_gbps
from gdrprobe.report.model import Integrity, RunReport, RunSettings

CONNECT_RETRY_S = 0.5
# A connection dropped at a flooded door is tried again, after a pause that doubles from
# RETRY_FIRST_S up to RETRY_MAX_S, each drawn at random between half and all of it (so the
# clients a flood pushed out do not come back together): at most 7.5 s of pauses in all.
HANDSHAKE_TRIES = 5
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 4.0


def retry_pause_s(attempt: int) -> float:
    """The pause after the attempt-th refusal: half to all of a ceiling that doubles."""
    ceiling = min(RETRY_FIRST_S * 2 ** (attempt - 1), RETRY_MAX_S)
    return random.uniform(ceiling / 2, ceiling)


def check_host(host: str) -> None:
    """A server host the resolver can take (Python's would raise, not answer, for a label
    of over 63 characters or an empty one: RFC 1035 section 2.3.4)."""
    try:
        host.encode("idna")
    except UnicodeError as error:
        shown = host if len(host) <= 80 else host[:80] + "..."
        raise UsageError(f"{shown!r} is not a host name: a part between dots is empty or "
                         "over 63 characters, or holds a character no host name has",
                         "give the server's host name or IP address") from error


def raise_if_corrupt(integrity: Integrity, size: int, where: str) -> None:
    if integrity.ok:
        return
    details = []
    if integrity.bad_bytes:
        details.append(f"{integrity.bad_bytes} of {integrity.bytes_checked} bytes wrong in "
                       f"{integrity.bad_messages} message(s) ({integrity.coverage}), first "
                       f"at offset {integrity.first_bad_offset}")
    if integrity.stray_bytes:
        details.append(f"{integrity.stray_bytes} bytes written past the message, first at "
                       f"offset {integrity.first_stray_offset}")
    if integrity.flush_bad:
        details.append(f"NCCL's flush READ brought back another byte than the last message "
                       f"wrote in {integrity.flush_bad} of {integrity.flush_reads} reads, first "
                       f"at offset {integrity.first_flush_bad_offset}: the writes had not "
                       "landed when their completion said so")
    raise IntegrityError(f"payload corrupted at {size} B on {where}: " + "; ".join(details),
                         "GPU buffers: check the IOMMU (must be off or passthrough) and ACS "
                         "with 'gdrprobe doctor'; host buffers: suspect the NIC or its driver")


def perftest_program(options: ProbeOptions) -> str:
    """perftest's program that measures what this run does (ib_write_bw, ib_read_lat ...)."""
    verb = "write" if options.imm else options.opcode
    program = f"ib_{verb}_{'bw' if options.mode == 'bandwidth' else 'lat'}"
    return program + (" --write_with_imm" if options.imm else "")


def integrity_method(options: ProbeOptions) -> str:
    """Which messages the receiver checks, as the report says it (docs/method.md)."""
    if options.imm:
        return ("every message checked, each way: each side's receive slots read back after "
                "each pass, outside every sample, and each immediate matched to its message")
    if options.reads and options.mode == "latency":
        return "every READ's bytes checked after its completion, outside its sample"
    if options.reads and not options.sample_integrity:
        return ("every message checked: the reader pauses between passes of a slot ring and "
                "checks what its READs brought, outside the measured window")
    if options.mode == "latency":
        return "every message checked, each way, as it arrives (after the timing)"
    if options.sample_integrity:
        return "sampled: the messages the slots hold at the end of each size"
    return ("every message checked: the sender pauses between passes of a slot ring while "
            "the receiver checks them, outside the measured window")


def flush_method(options: ProbeOptions) -> str:
    """NCCL's flush as the report says it (docs/method.md#the-flush), with what asked for it."""
    return (f"before each check the receiver read back the first byte of the last message "
            f"with an RDMA READ on a loopback QP, as NCCL does: {options.flush}")


def raise_if_server_ended(channel: Channel, what: str, evidence: str = "") -> None:
    """The server's reason, if it ended the run and said why; else, if it has hung up, that
    it went away."""
    channel.raise_if_peer_spoke()
    if channel.peer_gone():
        raise PeerError(f"{what} failed: the server went away during the run",
                        "look at the server's host: was it stopped or killed?",
                        evidence=evidence)


class ProbeClient:
    """One run against a server: connect, authenticate, set up (waiting for the server's NIC
    if another run holds it), measure, say goodbye."""

    def __init__(self, host: str, port: int, token: str | ServerSecret, options: ProbeOptions,
                 endpoint_options: EndpointOptions, memory: MemorySpec = MemorySpec(),
                 remote_memory: MemorySpec | None = None, connect_wait_s: float = 0.0,
                 on_result=None, notice=None, on_ready=None):
        check_host(host)
        check_tcp_port(port, "server port")
        check_timeout(options.timeout_s, "time-out")
        if not (math.isfinite(connect_wait_s) and 0 <= connect_wait_s <= MAX_TIMEOUT_S):
            raise UsageError(f"connect wait {connect_wait_s:g} s: use 0 to {MAX_TIMEOUT_S:g} s",
                             "")
        self.host, self.port, self.token = host, port, token
        self.connect_wait_s = connect_wait_s
        self.options = options
        self.endpoint_options = options.endpoint_options(endpoint_options, server=False)
        self.memory = memory
        self.remote_memory = remote_memory
        self.on_result = on_result      # called with each size's result as it is measured
        # called once both ends are set up, just before the first loop: runs on several NICs
        # that must measure at the same time wait there for each other (campaign.rails)
        self.on_ready = on_ready
        self.notice = notice or (lambda text: None)   # what a person may want to know
        check_latency_memory(options, memory, remote_memory)
        self.stop = _native.StopFlag()
        self.round = 0
        self.clock: LoopClock | None = None   # chosen when the loops are about to run
        self.gpu_mechanism = ""   # the GPU side's mechanism, once both buffers are open
        self.remote_findings = ()   # the server's doctor findings about its GPU buffer
        self.receives = Receives()  # the QP's receive, posted once (WRITE with immediate)
        self.reverse: list = []     # a bidirectional run's rows of the server's WRITEs
        self.endpoint: Endpoint | None = None   # this side's, once open
        self.flusher = None   # NCCL's flush of this side's own GPU buffer, where it receives

    def connect(self) -> Channel:
        """Connect, retrying a refused connection for connect_wait_s (a server that is
        still starting, as when both ends are launched together)."""
        deadline = time.monotonic() + self.connect_wait_s
        while True:
            try:
                sock = socket.create_connection((self.host, self.port),
                                                timeout=self.options.timeout_s)
                return Channel(sock, self.options.timeout_s, peer="server")
            except ConnectionRefusedError as error:
                if time.monotonic() < deadline:
                    time.sleep(CONNECT_RETRY_S)
                    continue
                raise self._unreachable(error) from error
            except OSError as error:
                raise self._unreachable(error) from error

    def _unreachable(self, error: OSError) -> PeerError:
        return PeerError(f"cannot reach a gdrprobe server at {self.host}:{self.port}: "
                         f"{error.strerror or error}", "start 'gdrprobe serve' on the peer and "
                         "check the address, the port (-p) and firewalls")

    def authenticated(self) -> Channel:
        """A connection that proved the token. One the server dropped unproved (a flood at
        its door) is tried again, HANDSHAKE_TRIES times in all, after a pause with jitter;
        each pause is announced with the server's reason, in this client's words."""
        for attempt in range(1, HANDSHAKE_TRIES + 1):
            channel = self.connect()
            try:
                authenticate_as_client(channel, self.token, notice=self.notice)
                return channel
            except Refused as error:
                channel.close()
                if not error.transient or attempt == HANDSHAKE_TRIES:
                    raise
                pause = retry_pause_s(attempt)
                self.notice(f"{error.cause}; trying again in {pause:.1f} s "
                            f"(try {attempt + 1} of {HANDSHAKE_TRIES})")
                time.sleep(pause)
            except BaseException:
                channel.close()
                raise

    def run(self) -> RunReport:
        channel = self.authenticated()
        try:
            local_ip = channel.sock.getsockname()[0]
            with Endpoint(self.endpoint_options, local_ip) as endpoint:
                flushing = self._flushes_own_buffer()
                with open_buffer(self.memory, endpoint, self.options.buffer_bytes,
                                 self.endpoint_options.remote_write,
                                 self.options.relaxed_ordering, read_back=flushing) as memory, \
                        self._sender(endpoint) as sender:
                    self.endpoint = endpoint
                    with (Flusher(endpoint, memory, self.stop, port_rate_gbps(endpoint.port_attr))
                          if flushing and memory.gpudirect_target else contextlib.nullcontext()) as flusher:
                        self.flusher = flusher
                        return self._run_with(channel, endpoint, memory, sender)
        except (GdrprobeError, KeyboardInterrupt) as error:
            # Tell the server why we stop, if it still listens.
            channel.send_last("abort", **abort_message(error))
            if isinstance(error, GdrprobeError):
                # What the A/B needs of a GPU arm that ended in error: its mechanism, and
                # the findings of the host that owns a remote GPU buffer.
                error.mechanism = getattr(error, "mechanism", "") or self.gpu_mechanism
                error.remote_findings = self.remote_findings or findings_in(error)
            raise
        finally:
            channel.close()

    def _flushes_own_buffer(self) -> bool:
        """Whether this side's own buffer receives (a WRITE-with-immediate latency round, a
        bidirectional one) and the run asks for NCCL's flush of it (measure/flush.py)."""
        receives = self.options.bidir or (self.options.imm and self.options.mode == "latency")
        return receives and wants_flush(self.options.flush, self.memory)

    def _sender(self, endpoint: Endpoint):
        """NCCL's sender and its FIFO for an NCCL-pattern run (measure/nccl_sender.py)."""
        if not self.options.pattern:
            return contextlib.nullcontext()
        return NcclSender(self.options, endpoint, self.stop)

    def _run_with(self, channel: Channel, endpoint: Endpoint, memory: MemoryProvider,
                  sender: NcclSender | None = None) -> RunReport:
        # Only a WRITE latency run and a bidirectional one let the server write into this
        # side's buffer.
        written = self.options.mode == "latency" and not self.options.reads
        own_buffer = remote_buffer(memory) if written or self.options.bidir else None
        send(channel, Setup(self.options, endpoint.address(), own_buffer, self.remote_memory,
                            sender.fifo_buffer() if sender else None))
        server = self._await_turn(channel)
        if server.buffer.length < self.options.buffer_bytes:
            raise PeerError("the server's buffer is smaller than the largest message",
                            SAME_VERSION_FIX)
        self.gpu_mechanism = (memory.report().get("mechanism")
                              or server.summary.memory.get("mechanism", ""))
        self.remote_findings = server.findings
        self.heartbeat_s = heartbeat_s(server.timeout_s)
        endpoint.connect(server.endpoint)
        handles = endpoint.handles()
        self.port_gbps = port_rate_gbps(endpoint.port_attr)

        self.clock = loop_clock(self.options.clock)
        if (self.options.reads or self.options.bidir) and self.options.mode == "bandwidth":
            memory.poison()   # where the READs or the server's WRITEs land
        bandwidth, latency = [], []
        rows = bandwidth if self.options.mode == "bandwidth" else latency
        if self.on_ready is not None:
            self.on_ready()
        # The stream uses the run's QPs; NCCL's pattern, the first of them its connections
        # have (the endpoint has as many as the larger needs).
        stream = dataclasses.replace(handles, qps=handles.qps[:self.options.qps])
        patterns = []
        for size in self.options.sizes:
            result = self._measured_round(channel, stream, memory, server.buffer, size)
            rows.append(result)
            pattern = {}
            if sender is not None:   # NCCL's pattern after the stream, with its row
                patterns.append(self._measured_round(
                    channel, handles, memory, server.buffer, size,
                    functools.partial(self._nccl_round, sender)))
                pattern = {"nccl": patterns[-1]}
            if self.on_result is not None:   # a bidirectional run's with the server's row
                self.on_result(*((result, self.reverse[-1]) if self.options.bidir else (result,)),
                               **pattern)
        channel.send(BYE)
        flushed = any(row.integrity.flush_reads for row in (*bandwidth, *latency, *self.reverse))
        return RunReport(
            settings=self._settings(endpoint, memory, flushed), handle_route=handles.route,
            local=endpoint_summary(endpoint, memory), remote=server.summary,
            bandwidth=tuple(bandwidth), latency=tuple(latency),
            remote_findings=self.remote_findings, reverse=tuple(self.reverse),
            bidirectional=tuple(bidir_result(*pair) for pair in zip(bandwidth, self.reverse)),
            nccl=tuple(patterns))

    def _measured_round(self, channel, handles, memory, remote, size, measure=None):
        """One size's round (measure: the run's own kind, else that one); measured again
        with CLOCK_MONOTONIC, which this run then keeps, when the cycle counter disagreed
        with it over the round."""
        measure = measure or self._round_kind()
        while True:
            self.round += 1
            result, clock_check = measure(channel, handles, memory, remote, size)
            doubt = self.clock.doubt(clock_check)
            if doubt is None:
                return result
            self.clock = monotonic(doubt)
            self.notice(f"{doubt}: measuring the {size}-byte round again with CLOCK_MONOTONIC")

    def _round_kind(self):
        """The round this run measures at each size."""
        bandwidth = self.options.mode == "bandwidth"
        if self.options.bidir:
            return self._bidir_round
        if self.options.imm:
            return self._imm_latency_round
        if self.options.reads:
            return self._read_bandwidth_round if bandwidth else self._read_latency_round
        return self._bandwidth_round if bandwidth else self._latency_round

    def _await_turn(self, channel: Channel) -> SetupOk:
        """The server's setup_ok, after any number of 'queued' messages while other runs
        hold its NIC: each is a heartbeat, so waiting is never a time-out."""
        shown = None
        while True:
            reply = channel.receive(SetupOk.KIND, Queued.KIND)
            if reply["type"] == SetupOk.KIND:
                return SetupOk.from_message(reply, self.options.endpoint_qps,
                                            (MIN_TIMEOUT_S, MAX_TIMEOUT_S))
            queued = Queued.from_message(reply)
            if queued.position != shown:
                shown = queued.position
                self.notice(f"queued at the server behind a run from {queued.running}: "
                            f"{queued.position - 1} more waiting ahead of this one")

    def _settings(self, endpoint: Endpoint, memory: MemoryProvider,
                  flushed: bool = False) -> RunSettings:
        o = self.options
        return RunSettings(mode=o.mode, sizes_bytes=o.sizes, iterations=o.iterations,
                           warmup_iterations=o.warmup_iterations, duration_s=o.duration_s,
                           warmup_s=o.warmup_s if o.duration_s else 0.0,
                           window_bytes=o.window_bytes, qps=o.qps,
                           tx_depth=o.tx_depth, cq_moderation=o.cq_moderation,
                           post_list=o.post_list, mtu_bytes=endpoint.mtu,
                           inline_bytes=self._inline_bytes(memory),
                           clock=self.clock.description if self.clock else "",
                           integrity=integrity_method(o),
                           flush=flush_method(o) if flushed else "",
                           opcode=o.opcode, perftest=perftest_program(o), send_memory=o.send_memory,
                           pattern=f"nccl: {o.nccl.describe()}" if o.pattern else "",
                           inline_note=("" if memory.inline_capable or not o.max_inline else
                                        f"inline off: the source is a {memory.kind} buffer "
                                        "the CPU cannot read where verbs addresses it"))

    def _inline_bytes(self, memory: MemoryProvider) -> int:
        """Messages up to this size are posted inline; never from a GPU buffer, where the
        CPU would copy from an IOVA or GPU address and bypass GPUDirect."""
        return self.options.max_inline if memory.inline_capable else 0

    @staticmethod
    def _check_loop(channel: Channel, raw, what: str, stall_s: float) -> None:
        """A failed loop whose peer has also hung up is the peer's failure, not the NIC's."""
        try:
            check_status(raw, what, stall_s)
        except RdmaError as error:
            time.sleep(0.2)   # a dying peer's socket closes a moment after its QP
            # A server that ended the run said why before it released its buffer (which
            # failed our writes): its reason, not the symptom.
            raise_if_server_ended(channel, what, error.evidence)
            raise

    def _heartbeat(self, channel: Channel, what: str) -> dict:
        """LoopThread.wait's arguments: every beat tells the server we are alive and ends
        the loop at once if the server has hung up (a dead server's QP may not say so for
        a while, and a latency loop would wait for its echo until the stall time-out)."""
        def beat():
            # In a bidirectional round the server speaks while this loop runs (its passes):
            # only its hanging up ends the loop early.
            if not self.options.bidir:
                raise_if_server_ended(channel, what)
            elif channel.peer_gone():
                raise PeerError(f"{what} failed: the server went away during the run",
                                "look at the server's host: was it stopped or killed?")
            channel.send(PROGRESS)

        return {"tick": beat, "tick_every_s": self.heartbeat_s}

    def _bandwidth_loop(self, channel, handles, memory, remote, size, what, on_pass, go=None):
        """Run one size's bandwidth loop (WRITE or READ, by the run's opcode): each pass
        goes to on_pass(index, messages) before the loop goes on, unless the run samples.
        go, if given, runs once the loop is built, just before it starts: a bidirectional
        round waits there for the server's word, so that little work (sharing the CPUs
        with the server's timed loop) comes between that word and this side's first WRITE."""
        o = self.options
        duration_ns = int(o.duration_s * 1e9) if o.duration_s else 0
        passes = None if o.sample_integrity else PassGate(self.stop)
        per_qp = None if o.duration_s else o.iterations + o.warmup_iterations
        stall_s = stall_timeout_s(bandwidth_in_flight(size, o.qps, o.tx_depth, per_qp),
                                  self.port_gbps)
        config = _native.BandwidthConfig(
            handles, memory, remote, msg_size=size,
            iterations=o.iterations, warmup_iterations=o.warmup_iterations,
            duration_ns=duration_ns, warmup_ns=int(o.warmup_s * 1e9) if duration_ns else 0,
            window_messages=o.window_messages(size), tx_depth=o.tx_depth,
            cq_mod=o.cq_moderation, post_list=o.post_list,
            max_inline=self._inline_bytes(memory), stall_timeout_ns=int(stall_s * 1e9),
            slots=o.slots(size), src_slots=o.source_slots(size), on_pass=passes,
            read=o.reads, src_offset=o.source_offset(size), **self.clock.loop_args())
        loop = LoopThread(_native.run_bandwidth, config, self.stop, passes)
        if go is not None:
            go()
        raw = loop.wait(**self._heartbeat(channel, what), on_pass=on_pass)
        self._check_loop(channel, raw, what, stall_s)
        return raw

    def _bandwidth_round(self, channel, handles, memory, remote, size):
        what = f"the {size}-byte bandwidth round"
        seed = _native.pattern_seed(size, self.round)
        sources = self.options.source_slots(size)
        memory.fill_slots(size, sources, seed)
        stage_out_s = memory.stage_out(0, sources * size) / sources   # per message
        # No wait for the server: its buffer was poisoned before setup_ok or the last
        # "verified", and the channel keeps "start" ahead of "done".
        send(channel, Start(size, self.round))
        raw = self._bandwidth_loop(channel, handles, memory, remote, size, what,
                                   functools.partial(self._pass_checked, channel))
        send(channel, Done(raw.posted))
        verified = Verified.from_message(channel.receive(Verified.KIND), bandwidth=True)
        raise_if_corrupt(verified.integrity, size, "the server")
        # A staged side copies every message once between GPU and host: charge that time.
        result = bandwidth_result(size, raw, verified.integrity,
                                  stage_s_per_message=stage_out_s + verified.stage_in_s)
        return result, raw.clock_check

    def _bidir_round(self, channel, handles, memory, remote, size):
        """Both directions at once (perftest's -b): this side WRITEs its sources (past its
        receive slots) into the server's slots while the server WRITEs its own into this
        side's; each side's loop pauses after each pass until both have checked what the
        other wrote (exchange_passes), or (a sampling run) with no pause, each side checking
        its slots' last messages once the other's loop has ended. Each side times its own
        loop; the server's comes back in "sent", the reverse row."""
        o = self.options
        what = f"the {size}-byte bidirectional round"
        seed = _native.pattern_seed(size, self.round)
        sources, offset = o.source_slots(size), o.source_offset(size)
        memory.fill_slots(size, sources, seed, offset)
        stage_out_s = memory.stage_out(offset, sources * size) / sources   # per message
        check = RoundCheck(memory, size, o.slots(size), sources, seed, self.flusher, stray_end=offset)
        send(channel, Start(size, self.round))
        raw = self._bandwidth_loop(channel, handles, memory, remote, size, what,
                                   functools.partial(exchange_passes, channel, check),
                                   go=lambda: receive_skipping_progress(channel, READY))
        send(channel, Done(raw.posted))
        sent = Sent.from_message(receive_skipping_progress(channel, Sent.KIND))
        check.settle(sent.posted, o.sample_integrity, "the server")
        verified = Verified.from_message(channel.receive(Verified.KIND), bandwidth=True)
        raise_if_corrupt(verified.integrity, size, "the server")
        integrity = check.integrity(sent.posted)
        raise_if_corrupt(integrity, size, "this side (the server's WRITEs)")
        self.reverse.append(bandwidth_result(size, sent, integrity,
                                             sent.stage_out_s + check.stage_in_s))
        return (bandwidth_result(size, raw, verified.integrity,
                                 stage_s_per_message=stage_out_s + verified.stage_in_s),
                raw.clock_check)

    def _nccl_round(self, sender: NcclSender, channel, handles, memory, remote, size):
        """NCCL's pattern at this size after its stream (measure/nccl_sender.py)."""
        result, clock_check = sender.round(channel, handles, memory, remote, size, self.round,
                                           self.clock, self.port_gbps, self.heartbeat_s)
        raise_if_corrupt(result.integrity, size, "the server (NCCL's pattern)")
        return result, clock_check

    @staticmethod
    def _pass_checked(channel: Channel, index: int, messages: int) -> None:
        """A pass has landed: the server checks it before the loop writes its slots again."""
        send(channel, PassDone(index, messages))
        PassChecked.from_message(channel.receive(PassChecked.KIND), index)

    def _read_bandwidth_round(self, channel, handles, memory, remote, size):
        """RDMA READ bandwidth (perftest's ib_read_bw): this side's NIC reads the server's
        source slots into its own slots and this side checks what landed, pass by pass as
        WRITE's receiver does (the server checks its sources were left as they were)."""
        o = self.options
        what = f"the {size}-byte READ bandwidth round"
        seed = _native.pattern_seed(size, self.round)
        check = RoundCheck(memory, size, o.slots(size), o.source_slots(size), seed)
        send(channel, Start(size, self.round))
        channel.receive(READY)   # the server's sources are in place
        raw = self._bandwidth_loop(channel, handles, memory, remote, size, what,
                                   lambda index, messages: check.next_pass(messages))
        if o.sample_integrity:
            check.last(raw.posted)
        send(channel, Done(raw.posted))
        # A staged server copied each source out once (its "stage_in_s" field here).
        source = Verified.from_message(channel.receive(Verified.KIND), bandwidth=True)
        raise_if_corrupt(source.integrity, size, "the server (the sources the READs read)")
        integrity = check.integrity(raw.posted)
        raise_if_corrupt(integrity, size, "this side (what the READs brought)")
        result = bandwidth_result(size, raw, integrity,
                                  stage_s_per_message=source.stage_in_s + check.stage_in_s)
        return result, raw.clock_check

    def _read_latency_round(self, channel, handles, memory, remote, size):
        """RDMA READ latency (perftest's ib_read_lat): one READ of the server's message
        posted and its completion polled, iterations times; each READ's bytes checked
        after its sample."""
        o = self.options
        what = f"the {size}-byte READ latency round"
        seed = _native.pattern_seed(size, self.round)
        send(channel, Start(size, self.round))
        channel.receive(READY)
        stall_s = stall_timeout_s(size, self.port_gbps)
        config = latency_config(handles, memory, remote, size, o.iterations, 0, True, stall_s,
                                self.clock, seed, read=True)
        raw = LoopThread(_native.run_latency, config, self.stop).wait(
            **self._heartbeat(channel, what))
        self._check_loop(channel, raw, what, stall_s)
        send(channel, Done())
        source = Verified.from_message(channel.receive(Verified.KIND), bandwidth=False)
        raise_if_corrupt(source.integrity, size, "the server (the message the READs read)")
        integrity = received_integrity(raw, size, tagged=False)
        raise_if_corrupt(integrity, size, "this side (what the READs brought)")
        return (latency_result(size, o.iterations, raw.round_trip, integrity, one_way=False),
                raw.clock_check)

    def _imm_latency_round(self, channel, handles, memory, remote, size):
        """The ping-pong of WRITEs with immediate (perftest's ib_write_lat
        --write_with_imm): each side waits on its receive completions, so either buffer may
        be GPU memory. The round runs in passes of its receive slots; after each, outside
        every sample, this side checks its slots (through the memory provider) and the
        server its own before the next pass writes them again."""
        with send_source(self.options, self.endpoint, size) as source:
            return self._imm_passes(channel, handles, memory, remote, size, source)

    def _imm_passes(self, channel, handles, memory, remote, size, source):
        """The passes of one WRITE-with-immediate round, sent from source where the run has
        one of its own (NCCL's LL placement: measure/side.py send_source)."""
        o = self.options
        what = f"the {size}-byte latency round (WRITE with immediate)"
        seed = _native.pattern_seed(size, self.round)
        slots = o.slots(size)
        prepare_imm_round(memory, size, seed, slots, source)
        echo = ImmCheck(memory, size, seed, self.flusher)
        send(channel, Start(size, self.round))
        channel.receive(READY)
        stall_s = stall_timeout_s(latency_in_flight(size), self.port_gbps)
        samples = array.array("Q")
        for index, (first, count) in enumerate(imm_passes(o.iterations, slots)):
            config = latency_config(handles, memory, remote, size, count,
                                    self._inline_bytes(source or memory), True, stall_s, self.clock,
                                    seed, imm={"slots": slots, "first": first,
                                               "post_recv": self.receives.first_post()},
                                    source=source)
            raw = LoopThread(functools.partial(_native.run_latency, keep_samples=True), config,
                             self.stop).wait(**self._heartbeat(channel, what))
            self._check_loop(channel, raw, what, stall_s)
            samples.frombytes(raw.samples)
            echo.check_pass(raw, count)
            self._pass_checked(channel, index, count)
        send(channel, Done())
        integrity = Verified.from_message(channel.receive(Verified.KIND),
                                          bandwidth=False).integrity
        raise_if_corrupt(integrity, size, "the server")
        raise_if_corrupt(echo.integrity(), size, "this side (the server's echo)")
        round_trip = _native.summarize_round_trips(samples)
        return latency_result(size, o.iterations, round_trip, integrity), raw.clock_check

    def _latency_round(self, channel, handles, memory, remote, size):
        o = self.options
        what = f"the {size}-byte latency round"
        seed = _native.pattern_seed(size, self.round)
        prepare_latency_round(memory, size, seed)
        send(channel, Start(size, self.round))
        channel.receive(READY)
        stall_s = stall_timeout_s(latency_in_flight(size), self.port_gbps)
        config = latency_config(handles, memory, remote, size, o.iterations,
                                self.endpoint_options.max_inline, True, stall_s, self.clock,
                                seed)
        raw = LoopThread(_native.run_latency, config, self.stop).wait(
            **self._heartbeat(channel, what))
        self._check_loop(channel, raw, what, stall_s)
        send(channel, Done())
        integrity = Verified.from_message(channel.receive(Verified.KIND),
                                          bandwidth=False).integrity
        raise_if_corrupt(integrity, size, "the server")
        # The echoes too: the server sent the same pattern into our receive half.
        echo = received_integrity(raw, size)
        raise_if_corrupt(echo, size, "this side (the server's echo)")
        return latency_result(size, o.iterations, raw.round_trip, integrity), raw.clock_check
