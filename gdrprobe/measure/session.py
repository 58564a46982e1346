"""A probe between two endpoints: the client drives, the server lends its scratch buffer.

The client chooses the settings and sends them in the handshake; the server checks them
against its limits, builds a matching endpoint and buffer, and then follows the client
round by round: poison its buffer, let the client write, verify what landed. Either side
ending, failing or being interrupted ends the run on both with a clear error, and every
verbs object and buffer is released.

The server accepts and authenticates every connection at once, each in a thread of its
own, so a stranger (an idle socket, a client trickling bytes) never makes a client wait;
authenticated clients then take the NIC one at a time, in order, and a waiting client is
told its place and kept alive with messages until its turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import math
import socket
import sys
import threading
import time

from gdrprobe import _native
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions
from gdrprobe.measure.clock import LoopClock, loop_clock, monotonic
from gdrprobe.measure.loops import (LoopThread, bandwidth_in_flight, bandwidth_result,
                                    check_status, latency_in_flight, latency_result,
                                    stall_timeout_s)
from gdrprobe.errors import GdrprobeError, IntegrityError, PeerError, RdmaError, UsageError
from gdrprobe.protocol.admission import Admission
from gdrprobe.protocol.channel import (Channel, ServerSecret, WrongToken,
                                       authenticate_as_client, authenticate_as_server,
                                       error_message)
from gdrprobe.protocol.fields import field, peer_text
from gdrprobe.rdma.verbs import port_rate_gbps
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.measure.options import (MAX_TIMEOUT_S, MIN_TIMEOUT_S, ProbeOptions,
                                      check_latency_memory)
from gdrprobe.report.model import EndpointSummary, Integrity, RunReport, RunSettings, to_dict
from gdrprobe.protocol.messages import (RemoteBuffer, address_from_message, findings_from_message,
                                        findings_message, integrity_from_message,
                                        summary_from_message)
from gdrprobe.campaign.verdict import speaks_to_verdict

DEFAULT_PORT = 18750
DEFAULT_MAX_BUFFER = 256 << 20
MIN_MAX_BUFFER = 2 * 4096       # the smallest run: a page for the message, a page past it
HEARTBEATS_PER_TIMEOUT = 4     # a peer beats this often within the other side's time-out
MAX_HEARTBEAT_S = 2.0
MAX_ROUND = 2**62
# A connection must prove the token within this, whatever --timeout says: enough for two
# round trips and the client's one scrypt on a slow (emulated) machine, short enough that
# strangers holding connections open cost little.
PRE_AUTH_S = 10.0
LISTEN_BACKLOG = 1024          # the kernel caps it at net.core.somaxconn
PREFLIGHT_BYTES = MIN_MAX_BUFFER
ACCEPT_TRANSIENT = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED)
MAX_QUEUE_POSITION = 1 << 20


def check_timeout(timeout_s: float, what: str) -> None:
    if not (math.isfinite(timeout_s) and MIN_TIMEOUT_S <= timeout_s <= MAX_TIMEOUT_S):
        raise UsageError(f"{what} {timeout_s:g} s: use {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} s",
                         "the slowest step of a run (the server's set-up) needs a few seconds")


def check_tcp_port(port: int, what: str, allow_any: bool = False) -> None:
    """1 to 65535 (0 too, meaning any free port, where allow_any)."""
    if isinstance(port, bool) or not isinstance(port, int) or \
            not (0 if allow_any else 1) <= port <= 65535:
        raise UsageError(f"{what} {port} is not a TCP port", "use 1 to 65535")


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
    raise IntegrityError(f"payload corrupted at {size} B on {where}: " + "; ".join(details),
                         "GPU buffers: check the IOMMU (must be off or passthrough) and ACS "
                         "with 'gdrprobe doctor'; host buffers: suspect the NIC or its driver")


def endpoint_summary(endpoint: Endpoint, memory: MemoryProvider) -> EndpointSummary:
    """What a report says about one side of a run."""
    return EndpointSummary(host=socket.gethostname(), device=endpoint.device,
                           port=endpoint.options.port, gid_index=endpoint.gid_index,
                           gid=endpoint.gid, mtu_bytes=endpoint.mtu,
                           qp_numbers=tuple(qp.qp_num for qp in endpoint.qps),
                           memory=memory.report())



def findings_in(error: GdrprobeError) -> tuple:
    """The findings a server's error carried about the host that owns its GPU buffer; a
    malformed list is dropped rather than hiding the error it came with."""
    try:
        return findings_from_message(getattr(error, "peer_message", {}))
    except PeerError:
        return ()


def latency_config(handles, memory: MemoryProvider, remote, size: int, iterations: int,
                   max_inline: int, initiator: bool, stall_s: float, clock: LoopClock):
    """The ping-pong loop's settings for one side: it sends from the upper half of its
    buffer and the peer writes into the lower half."""
    half = memory.length // 2
    return _native.LatencyConfig(
        handles.qps[0], handles.cq, send_addr=memory.address + half, lkey=memory.lkey,
        recv_addr=memory.address, remote_addr=remote.address, rkey=remote.rkey,
        msg_size=size, iterations=iterations, max_inline=max_inline, initiator=initiator,
        stall_timeout_ns=int(stall_s * 1e9), **clock.loop_args())


# ---- client --------------------------------------------------------------------------


class ProbeClient:
    """One run against a server: connect, authenticate, set up (waiting for the server's NIC
    if another run holds it), measure, say goodbye."""

    def __init__(self, host: str, port: int, token: str | ServerSecret, options: ProbeOptions,
                 endpoint_options: EndpointOptions, memory: MemorySpec = MemorySpec(),
                 remote_memory: MemorySpec | None = None, connect_wait_s: float = 0.0,
                 on_result=None, notice=None):
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
        self.notice = notice or (lambda text: None)   # what a person may want to know
        check_latency_memory(options, memory, remote_memory)
        self.stop = _native.StopFlag()
        self.round = 0
        self.clock: LoopClock | None = None   # chosen when the loops are about to run
        self.gpu_mechanism = ""   # the GPU side's mechanism, once both buffers are open
        self.remote_findings = ()   # the server's doctor findings about its GPU buffer

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
                    time.sleep(0.5)
                    continue
                raise self._unreachable(error) from error
            except OSError as error:
                raise self._unreachable(error) from error

    def _unreachable(self, error: OSError) -> PeerError:
        return PeerError(f"cannot reach a gdrprobe server at {self.host}:{self.port}: "
                         f"{error.strerror or error}", "start 'gdrprobe serve' on the peer and "
                         "check the address, the port (-p) and firewalls")

    def run(self) -> RunReport:
        channel = self.connect()
        try:
            authenticate_as_client(channel, self.token)
            local_ip = channel.sock.getsockname()[0]
            with Endpoint(self.endpoint_options, local_ip) as endpoint:
                with open_buffer(self.memory, endpoint, self.options.buffer_bytes,
                                 self.endpoint_options.remote_write,
                                 self.options.relaxed_ordering) as memory:
                    return self._run_with(channel, endpoint, memory)
        except (GdrprobeError, KeyboardInterrupt) as error:
            # Tell the server why we stop, if it still listens.
            channel.send_last("abort", reason=getattr(error, "cause", "") or type(error).__name__)
            if isinstance(error, GdrprobeError):
                # What the A/B needs of a GPU arm that ended in error: its mechanism, and
                # the findings of the host that owns a remote GPU buffer.
                error.mechanism = getattr(error, "mechanism", "") or self.gpu_mechanism
                error.remote_findings = self.remote_findings or findings_in(error)
            raise
        finally:
            channel.close()

    def _run_with(self, channel: Channel, endpoint: Endpoint, memory: MemoryProvider) -> RunReport:
        local = endpoint.address()
        remote_memory = self.remote_memory and self.remote_memory.to_message()
        channel.send("setup", settings=self.options.to_message(), endpoint=local.to_message(),
                     buffer=self._buffer_message(memory), server_memory=remote_memory)
        reply = self._await_turn(channel)
        remote_address = address_from_message(field(reply, "endpoint", dict), self.options.qps)
        remote_buffer = RemoteBuffer.from_message(field(reply, "buffer", dict))
        if remote_buffer.length < self.options.buffer_bytes:
            raise PeerError("the server's buffer is smaller than the largest message", "")
        remote = summary_from_message(field(reply, "summary", dict))
        self.gpu_mechanism = (memory.report().get("mechanism")
                              or remote.memory.get("mechanism", ""))
        self.remote_findings = findings_from_message(reply)
        server_timeout = field(reply, "timeout_s", (int, float), low=MIN_TIMEOUT_S,
                               high=MAX_TIMEOUT_S)
        self.heartbeat_s = min(MAX_HEARTBEAT_S, server_timeout / HEARTBEATS_PER_TIMEOUT)
        endpoint.connect(remote_address)
        handles = endpoint.handles()
        self.port_gbps = port_rate_gbps(endpoint.port_attr)

        self.clock = loop_clock(self.options.clock)
        bandwidth, latency = [], []
        rows = bandwidth if self.options.mode == "bandwidth" else latency
        for size in self.options.sizes:
            result = self._measured_round(channel, handles, memory, remote_buffer, size)
            rows.append(result)
            if self.on_result is not None:
                self.on_result(result)
        channel.send("bye")
        return RunReport(
            settings=self._settings(endpoint, memory), handle_route=handles.route,
            local=endpoint_summary(endpoint, memory), remote=remote,
            bandwidth=tuple(bandwidth), latency=tuple(latency),
            remote_findings=self.remote_findings)

    def _measured_round(self, channel, handles, memory, remote, size):
        """One size's round; measured again with CLOCK_MONOTONIC, which this run then
        keeps, when the cycle counter disagreed with it over the round."""
        measure = (self._bandwidth_round if self.options.mode == "bandwidth" else
                   self._latency_round)
        while True:
            self.round += 1
            result, clock_check = measure(channel, handles, memory, remote, size)
            doubt = self.clock.doubt(clock_check)
            if doubt is None:
                return result
            self.clock = monotonic(doubt)
            self.notice(f"{doubt}: measuring the {size}-byte round again with CLOCK_MONOTONIC")

    def _await_turn(self, channel: Channel) -> dict:
        """The server's setup_ok, after any number of 'queued' messages while other runs
        hold its NIC: each is a heartbeat, so waiting is never a time-out."""
        shown = None
        while True:
            reply = channel.receive("setup_ok", "queued")
            if reply["type"] == "setup_ok":
                return reply
            position = field(reply, "position", int, low=1, high=MAX_QUEUE_POSITION)
            if position != shown:
                shown = position
                running = peer_text(field(reply, "running", str, default="another client"), 64)
                self.notice(f"queued at the server behind a run from {running}: "
                            f"{position - 1} more waiting ahead of this one")

    def _buffer_message(self, memory: MemoryProvider) -> dict | None:
        # Only a latency run lets the server write into this side's buffer.
        if self.options.mode != "latency":
            return None
        return {"address": memory.address, "rkey": memory.rkey, "length": memory.length}

    def _settings(self, endpoint: Endpoint, memory: MemoryProvider) -> RunSettings:
        o = self.options
        return RunSettings(mode=o.mode, sizes_bytes=o.sizes, iterations=o.iterations,
                           warmup_iterations=o.warmup_iterations, duration_s=o.duration_s,
                           warmup_s=o.warmup_s if o.duration_s else 0.0,
                           window_bytes=o.window_bytes, qps=o.qps,
                           tx_depth=o.tx_depth, cq_moderation=o.cq_moderation,
                           post_list=o.post_list, mtu_bytes=endpoint.mtu,
                           inline_bytes=self._inline_bytes(memory),
                           clock=self.clock.description if self.clock else "",
                           inline_note=("" if memory.inline_capable or not o.max_inline else
                                        f"inline off: the source is a {memory.kind} buffer "
                                        "the CPU cannot read where verbs addresses it"))

    def _inline_bytes(self, memory: MemoryProvider) -> int:
        """Messages up to this size are posted inline; never from a GPU buffer, where the
        CPU would copy from an IOVA or GPU address and bypass GPUDirect."""
        return self.options.max_inline if memory.inline_capable else 0

    @staticmethod
    def _check_loop(channel: Channel, raw: dict, what: str, stall_s: float) -> None:
        """A failed loop whose peer has also hung up is the peer's failure, not the NIC's."""
        try:
            check_status(raw, what, stall_s)
        except RdmaError as error:
            time.sleep(0.2)   # a dying peer's socket closes a moment after its QP
            # A server that ended the run said why before it released its buffer (which
            # failed our writes): its reason, not the symptom.
            channel.raise_if_peer_spoke()
            if channel.peer_gone():
                raise PeerError(f"{what} failed: the server went away during the run",
                                "look at the server's host: was it stopped or killed?",
                                evidence=error.evidence) from error
            raise

    def _heartbeat(self, channel: Channel, what: str) -> dict:
        """LoopThread.wait's arguments: every beat tells the server we are alive and ends
        the loop at once if the server has hung up (a dead server's QP may not say so for
        a while, and a latency loop would wait for its echo until the stall time-out)."""
        def beat():
            channel.raise_if_peer_spoke()
            if channel.peer_gone():
                raise PeerError(f"{what} failed: the server went away during the run",
                                "look at the server's host: was it stopped or killed?")
            channel.send("progress")

        return {"tick": beat, "tick_every_s": self.heartbeat_s}

    def _bandwidth_round(self, channel, handles, memory, remote, size):
        o = self.options
        what = f"the {size}-byte bandwidth round"
        seed = _native.pattern_seed(size, self.round)
        slots = o.slots(size)
        memory.fill_slots(size, slots, seed)
        stage_out_s = memory.stage_out(0, slots * size) / slots   # per message
        # No wait for the server: its buffer was poisoned before setup_ok or the last
        # "verified", and the channel keeps "start" ahead of "done".
        channel.send("start", size=size, round=self.round)
        duration_ns = int(o.duration_s * 1e9) if o.duration_s else 0
        per_qp = None if o.duration_s else o.iterations + o.warmup_iterations
        stall_s = stall_timeout_s(bandwidth_in_flight(size, o.qps, o.tx_depth, per_qp),
                                  self.port_gbps)
        config = _native.BandwidthConfig(
            handles.qps, handles.cq, local_addr=memory.address, lkey=memory.lkey,
            remote_addr=remote.address, rkey=remote.rkey, msg_size=size,
            iterations=o.iterations, warmup_iterations=o.warmup_iterations,
            duration_ns=duration_ns, warmup_ns=int(o.warmup_s * 1e9) if duration_ns else 0,
            window_messages=o.window_messages(size), tx_depth=o.tx_depth,
            cq_mod=o.cq_moderation, post_list=o.post_list,
            max_inline=self._inline_bytes(memory), stall_timeout_ns=int(stall_s * 1e9),
            slots=slots, **self.clock.loop_args())
        raw = LoopThread(_native.run_bandwidth, config, self.stop).wait(
            **self._heartbeat(channel, what))
        self._check_loop(channel, raw, what, stall_s)
        channel.send("done", messages=raw["posted"])
        verified = channel.receive("verified")
        integrity = integrity_from_message(verified)
        raise_if_corrupt(integrity, size, "the server")
        # A staged side copies every message once between GPU and host: charge that time.
        stage_in_s = field(verified, "stage_in_s", (int, float), low=0, high=3600)
        raw["elapsed_ns"] += int(raw["messages"] * (stage_out_s + stage_in_s) * 1e9)
        result = bandwidth_result(size, raw, integrity)
        if stage_out_s + stage_in_s > 0:   # what a pipeline overlapping copies could reach
            result = dataclasses.replace(
                result, stage_copy_gbps=size * 8 / (stage_out_s + stage_in_s) / 1e9)
        return result, raw["clock_check"]

    def _latency_round(self, channel, handles, memory, remote, size):
        o = self.options
        what = f"the {size}-byte latency round"
        half = memory.length // 2
        seed = _native.pattern_seed(size, self.round)
        memory.zero()
        memory.fill_pattern(half, size, seed)
        channel.send("start", size=size, round=self.round)
        channel.receive("ready")
        stall_s = stall_timeout_s(latency_in_flight(size), self.port_gbps)
        config = latency_config(handles, memory, remote, size, o.iterations,
                                self.endpoint_options.max_inline, True, stall_s, self.clock)
        raw = LoopThread(_native.run_latency, config, self.stop).wait(
            **self._heartbeat(channel, what))
        self._check_loop(channel, raw, what, stall_s)
        channel.send("done")
        integrity = integrity_from_message(channel.receive("verified"))
        raise_if_corrupt(integrity, size, "the server")
        # The echo too: the server wrote the same pattern into our receive half (its last
        # byte is the loop's tag).
        echo_bad, echo_first = memory.verify_pattern(0, size - 1, seed)
        echo = Integrity(checked=True, bytes_checked=size - 1, bad_bytes=echo_bad,
                         first_bad_offset=echo_first if echo_bad else None, stray_bytes=0,
                         first_stray_offset=None, messages_total=o.iterations,
                         bad_messages=int(echo_bad > 0))
        raise_if_corrupt(echo, size, "this side (the server's echo)")
        return latency_result(size, o.iterations, raw["round_trip"], integrity), raw["clock_check"]


# ---- server --------------------------------------------------------------------------


class NicQueue:
    """Authenticated clients take the server's NIC one at a time, in arrival order."""

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: list[int] = []   # tickets; the first holds the NIC
        self._tickets = 0
        self._holder = ("", 0.0)      # who holds it, since when (monotonic)

    @contextlib.contextmanager
    def turn(self, source: str, heartbeat_s: float, on_wait):
        """Hold the NIC inside the block. While others hold it, on_wait(position, holder
        source, seconds held) runs every heartbeat_s (and may raise to give up)."""
        with self._cond:
            ticket = self._tickets
            self._tickets += 1
            self._queue.append(ticket)
        try:
            while True:
                with self._cond:
                    if self._queue[0] == ticket:
                        self._holder = (source, time.monotonic())
                        break
                    position = self._queue.index(ticket)
                    holder, since = self._holder
                on_wait(position, holder, time.monotonic() - since)
                with self._cond:
                    if self._queue[0] != ticket:
                        self._cond.wait(heartbeat_s)
            yield
        finally:
            with self._cond:
                self._queue.remove(ticket)
                self._cond.notify_all()


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class ProbeServer:
    """Serves runs, one at a time on the NIC, to clients that prove the token; a failed
    or hostile client ends only its own connection, and a stranger never delays anyone."""

    def __init__(self, token: str | ServerSecret, endpoint_options: EndpointOptions, *,
                 bind: str = "0.0.0.0", port: int = DEFAULT_PORT, timeout_s: float = 30.0,
                 max_buffer: int = DEFAULT_MAX_BUFFER, memory: MemorySpec = MemorySpec(),
                 log=None, findings=(), preflight: bool = True):
        check_timeout(timeout_s, "server time-out")
        check_tcp_port(port, "server port", allow_any=True)
        if isinstance(max_buffer, bool) or not isinstance(max_buffer, int) or \
                max_buffer < MIN_MAX_BUFFER:
            raise UsageError(f"--max-buffer {max_buffer}: use at least {MIN_MAX_BUFFER} bytes",
                             "the default is 256 MiB")
        self.endpoint_options = endpoint_options
        self.timeout_s = timeout_s
        self.max_buffer = max_buffer
        self.memory = memory
        self.findings = tuple(findings)   # this host's doctor findings (the caller ran it)
        self._log = log or _stderr
        self.stop = _native.StopFlag()
        self.admission = Admission(lambda text: self.log(f"gdrprobe serve: {text}"))
        self._nic = NicQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._channels: set[Channel] = set()
        self._closing = False
        self._runs: int | None = None
        self._served = 0
        self._last_error: GdrprobeError | None = None
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

    def log(self, text: str) -> None:
        """Log a line; a reader of stderr that went away must not stop the server."""
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
        raise the last one's error (so `serve --once` exits as its run ended)."""
        self._runs = runs
        try:
            while True:
                try:
                    conn, address = self.listener.accept()
                except OSError as error:
                    if self._closing:
                        break
                    if error.errno not in ACCEPT_TRANSIENT:
                        raise
                    # Out of descriptors or buffers for a moment: say so, breathe, go on.
                    self.admission.log("", "accept", f"accepting a connection failed: {error}")
                    time.sleep(0.1)
                    continue
                self._start_connection(conn, address[0])
        finally:
            self.close()
        if self._last_error is not None:
            raise self._last_error

    def _start_connection(self, conn: socket.socket, source: str) -> None:
        if self._closing or not self.admission.admit(source):
            conn.close()
            return
        thread = threading.Thread(target=self._connection, args=(conn, source),
                                  name=f"gdrprobe-client-{source}", daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def close(self) -> None:
        """Stop accepting, end every connection (a run in progress releases its verbs
        objects and buffer as it ends) and wait for them, boundedly."""
        with self._lock:
            self._closing = True
            channels, threads = list(self._channels), list(self._threads)
        self._stop_listening()
        self.stop.set()
        for channel in channels:
            channel.shutdown()
        deadline = time.monotonic() + self.timeout_s
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _stop_listening(self) -> None:
        """A serve() blocked in accept() returns with an OSError."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()

    # -- one connection --------------------------------------------------------------

    def _connection(self, conn: socket.socket, source: str) -> None:
        channel = Channel(conn, PRE_AUTH_S, peer=f"client {source}")
        with self._lock:
            self._channels.add(channel)
        authenticated = False
        try:
            try:
                authenticate_as_server(channel, self.secret, time.monotonic() + PRE_AUTH_S)
            except WrongToken:
                self.admission.wrong_proof(source)
                return
            except GdrprobeError as error:
                # Never believed, never shown verbatim: only the reason we gave up.
                self.admission.log(source, "unauthenticated", f"a connection from {source} "
                                   f"ended before it proved the token: {error.cause}")
                return
            authenticated = True
            self.admission.authenticated(source)
            channel.timeout = self.timeout_s
            self._count(source, self._authenticated_run(channel, source))
        except Exception as error:   # a bug must not take the server down
            self.log(f"gdrprobe serve: a connection from {source} hit a gdrprobe bug: "
                     f"{error!r}")
        finally:
            self.admission.closed(source, authenticated)
            channel.close()
            with self._lock:
                self._channels.discard(channel)
                self._threads.discard(threading.current_thread())

    def _authenticated_run(self, channel: Channel, source: str) -> GdrprobeError | None:
        """One client's run; its error (also sent to it), or None."""
        try:
            self.serve_one(channel, source)
        except GdrprobeError as error:
            channel.send_last("error", **error_message(error),
                              findings=getattr(error, "owner_findings", []))
            if not self._closing:
                self.log(f"gdrprobe serve: run from {source} ended: {error.cause}")
            return error
        self.log(f"gdrprobe serve: run from {source} finished")
        return None

    def _count(self, source: str, error: GdrprobeError | None) -> None:
        """Count an authenticated run; after the last one asked for, stop accepting."""
        with self._lock:
            if self._closing:
                return   # cut off by the server's own end: not a run
            self._served += 1
            if self._runs is None or self._served < self._runs:
                return
            self._closing = True
            self._last_error = error
        self._stop_listening()

    def serve_one(self, channel: Channel, source: str) -> None:
        """An authenticated client: its settings, its turn on the NIC, its rounds."""
        setup = channel.receive("setup")
        options = self._checked_options(field(setup, "settings", dict))
        remote_address = address_from_message(field(setup, "endpoint", dict), options.qps)
        remote_buffer = (None if setup.get("buffer") is None else
                         RemoteBuffer.from_message(field(setup, "buffer", dict)))
        spec = self._memory_for(setup, options)
        heartbeat_s = min(MAX_HEARTBEAT_S, options.timeout_s / HEARTBEATS_PER_TIMEOUT)

        def waiting(position: int, holder: str, held_s: float) -> None:
            if self._closing:
                raise PeerError("the server is shutting down (it served its last run)",
                                "start the server again, without --once to serve many runs")
            if channel.peer_gone():
                raise PeerError(f"the client at {source} left the queue", "")
            channel.send("queued", position=position, running=holder, running_s=held_s)

        with self._nic.turn(source, heartbeat_s, waiting):
            self.stop.clear()
            local_ip = channel.sock.getsockname()[0]
            try:
                with Endpoint(options.endpoint_options(self.endpoint_options, server=True),
                              local_ip) as endpoint:
                    with open_buffer(spec, endpoint, options.buffer_bytes, True,
                                     options.relaxed_ordering) as memory:
                        self._serve_rounds(channel, options, endpoint, memory,
                                           remote_address, remote_buffer)
            except GdrprobeError as error:
                # A GPU buffer that would not register, or a broken path into it: the
                # client's verdict needs this host's findings about it all the more.
                if spec.kind == "gpu":
                    error.owner_findings = self._verdict_findings()
                raise

    def _verdict_findings(self) -> list[dict]:
        """This host's doctor findings that confirm or rule out a verdict's causes."""
        return findings_message(f for f in self.findings if speaks_to_verdict(f.id))

    def _memory_for(self, setup: dict, options: ProbeOptions) -> MemorySpec:
        """The client's choice of this side's memory, else the server's own."""
        if setup.get("server_memory") is None:
            spec = self.memory
        else:
            try:
                spec = MemorySpec.from_message(field(setup, "server_memory", dict))
            except UsageError as error:
                raise PeerError(f"the client asked for impossible memory: {error.cause}", "")
        check_latency_memory(options, spec, None)
        return spec

    def _checked_options(self, message: dict) -> ProbeOptions:
        try:
            options = ProbeOptions.from_message(message)
        except UsageError as error:
            raise PeerError(f"the client asked for impossible settings: {error.cause}", "")
        if options.buffer_bytes > self.max_buffer:
            raise PeerError(f"the client asked for a {options.buffer_bytes}-byte buffer; this "
                            f"server allows {self.max_buffer}", "use smaller sizes or start "
                            "the server with a larger --max-buffer")
        return options

    def _serve_rounds(self, channel, options, endpoint, memory, remote_address, remote_buffer):
        endpoint.connect(remote_address)
        handles = endpoint.handles()
        if options.mode == "bandwidth":
            memory.poison()   # for the first round (see _bandwidth_round)
        channel.send("setup_ok", endpoint=endpoint.address().to_message(),
                     buffer={"address": memory.address, "rkey": memory.rkey,
                             "length": memory.length},
                     summary=to_dict(endpoint_summary(endpoint, memory)),
                     timeout_s=self.timeout_s,
                     # This host's doctor on its GPU buffer's path: the client's verdict
                     # confirms or rules out causes with them.
                     findings=self._verdict_findings() if memory.kind == "gpu" else [])
        while True:
            message = channel.receive("start", "bye")
            if message["type"] == "bye":
                return
            size = field(message, "size", int, low=1, high=max(options.sizes))
            seed = _native.pattern_seed(size, field(message, "round", int, low=0,
                                                    high=MAX_ROUND))
            if options.mode == "bandwidth":
                self._bandwidth_round(channel, options, memory, size, seed)
            else:
                self._latency_round(channel, options, endpoint, handles, memory,
                                    remote_buffer, size, seed)

    def _wait_for_done(self, channel: Channel) -> dict:
        """The client's heartbeats keep the run alive; silence past the time-out ends it."""
        while (message := channel.receive("progress", "done"))["type"] != "done":
            pass
        return message

    def _bandwidth_round(self, channel, options, memory, size, seed):
        """Verify a round the client has written. The buffer is poisoned again for the next
        round (the slots: past them a stray write fails the run) before "verified" goes
        out, so the client writes at once after "start": one round trip a size, not two."""
        posted = field(self._wait_for_done(channel), "messages", int, low=0, high=1 << 62)
        if posted == 0:
            raise PeerError(f"the client ended the {size}-byte round without writing", "")
        used = min(options.slots(size), posted)   # slots holding the last messages
        memory.flush_remote_writes()
        stage_in_s = memory.stage_in(0, used * size) / used   # per message
        bad_messages, bad, first_bad = memory.verify_slots(size, used, seed)
        stray, first_stray = memory.verify_poison(used * size)
        memory.poison(used * size)   # the rest was just found to be poison still
        channel.send("verified", bytes_checked=used * size, bad_bytes=bad,
                     first_bad_offset=first_bad, stray_bytes=stray,
                     first_stray_offset=first_stray, messages_checked=used,
                     messages_total=posted, bad_messages=bad_messages, stage_in_s=stage_in_s)

    def _latency_round(self, channel, options, endpoint, handles, memory, remote, size, seed):
        if remote is None:
            raise PeerError("a latency run needs the client's buffer", "")
        half = memory.length // 2
        memory.zero()
        memory.fill_pattern(half, size, seed)
        what = f"the {size}-byte latency round"
        stall_s = stall_timeout_s(latency_in_flight(size), port_rate_gbps(endpoint.port_attr))
        # The responder times nothing: its clock only keeps the stall deadline.
        config = latency_config(handles, memory, remote, size, options.iterations,
                                options.max_inline, False, stall_s, loop_clock(options.clock))
        responder = LoopThread(_native.run_latency, config, self.stop)
        try:
            responder.start()
            channel.send("ready")
            self._wait_for_done(channel)
        except BaseException:
            responder.finish()
            raise
        # Our last echo may still wait for its acknowledgement when the client, which has
        # it already, says done: give it the time one message may take.
        raw = responder.finish(grace_s=stall_s)
        if raw["status"] == _native.STATUS_STOPPED and not self._closing:
            raise PeerError(f"the client ended {what} after {raw['completed']} of "
                            f"{options.iterations} round trips", "")
        check_status(raw, what, stall_s)
        # The client's last message arrived in our receive half; its last byte is the tag.
        bad, first_bad = memory.verify_pattern(0, size - 1, seed)
        channel.send("verified", bytes_checked=size - 1, bad_bytes=bad,
                     first_bad_offset=first_bad, stray_bytes=0, first_stray_offset=-1,
                     messages_checked=1, messages_total=options.iterations,
                     bad_messages=int(bad > 0))


# ---- both ends in one process ------------------------------------------------------------


@functools.cache
def loopback_secret() -> ServerSecret:
    """One random key and salt for every loopback run of this process: both ends are this
    process, the client authenticates with this object (no token is stretched), and an A/B
    or a bench sweep runs many times."""
    return ServerSecret(None)


def run_loopback(options: ProbeOptions, endpoint_options: EndpointOptions,
                 memory: MemorySpec = MemorySpec(),
                 remote_memory: MemorySpec | None = None, on_result=None) -> RunReport:
    """A server thread and a client on 127.0.0.1 and the same device: one process, the
    same code path as two hosts."""
    secret = loopback_secret()
    # The server thread stays quiet: its errors reach the caller through the client. It
    # skips the preflight: the client opens the same device at once and fails with the
    # same cause; a run saves a device open and a registration.
    server = ProbeServer(secret, endpoint_options, bind="127.0.0.1", port=0,
                         timeout_s=options.timeout_s, log=lambda text: None, preflight=False)
    try:
        client = ProbeClient("127.0.0.1", server.port, secret, options, endpoint_options,
                             memory, remote_memory, on_result=on_result)
    except BaseException:
        server.close()
        raise
    outcome: dict = {}

    def serve():
        try:
            server.serve(runs=1)
        except GdrprobeError as error:
            outcome["error"] = error
        except OSError:
            pass   # closed by the client side before a connection came

    thread = threading.Thread(target=serve, name="gdrprobe-loopback-server", daemon=True)
    thread.start()
    try:
        return client.run()
    except PeerError as error:
        # The client saw the server hang up; the server thread knows why.
        thread.join(timeout=options.timeout_s)
        raise outcome.get("error", error) from error
    finally:
        server.close()
        thread.join(timeout=options.timeout_s)


def runner(options: ProbeOptions, endpoint_options: EndpointOptions, host: str | None = None,
           port: int = DEFAULT_PORT, token: str | None = None, connect_wait_s: float = 0.0,
           on_result=None, notice=None):
    """run_once(local_memory, remote_memory) -> RunReport: against host, or in loopback
    when host is None. The A/B calls it once per arm and repeat; a sweep passes on_result
    to see each size's result as it is measured; notice(text) hears what a person may want
    to know while it runs (a place in the server's queue)."""
    if host is None:
        return lambda local, remote: run_loopback(options, endpoint_options, local, remote,
                                                  on_result)
    return lambda local, remote: ProbeClient(host, port, token, options, endpoint_options,
                                             local, remote, connect_wait_s, on_result,
                                             notice).run()
