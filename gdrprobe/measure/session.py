"""A probe between two endpoints: the client drives, the server lends its scratch buffer.

The client chooses the settings and sends them in the handshake; the server checks them
against its limits, builds a matching endpoint and buffer, and then follows the client
round by round: poison its buffer, let the client write, verify what landed. Either side
ending, failing or being interrupted ends the run on both with a clear error, and every
verbs object and buffer is released.
"""

from __future__ import annotations

import socket
import sys
import threading
import time

from gdrprobe import _native
from gdrprobe.memory.buffers import open_buffer
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma.endpoint import Endpoint, EndpointOptions
from gdrprobe.measure.loops import (STALL_FLOOR_S, LoopThread, bandwidth_result, check_status,
                                    latency_result, stall_timeout_s)
from gdrprobe.errors import GdrprobeError, IntegrityError, PeerError, RdmaError, UsageError
from gdrprobe.protocol.channel import (Channel, authenticate_as_client, authenticate_as_server,
                                       error_message)
from gdrprobe.protocol.fields import field
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.measure.options import ProbeOptions, check_latency_memory
from gdrprobe.report.model import EndpointSummary, Integrity, RunReport, RunSettings, to_dict
from gdrprobe.protocol.messages import (RemoteBuffer, address_from_message,
                                        integrity_from_message, summary_from_message)

DEFAULT_PORT = 18750
DEFAULT_MAX_BUFFER = 256 << 20
MIN_SERVER_TIMEOUT_S = 1.0
HEARTBEATS_PER_TIMEOUT = 4     # a client beats this often within the server's time-out
MAX_HEARTBEAT_S = 2.0
MAX_ROUND = 2**62


def raise_if_corrupt(integrity: Integrity, size: int, where: str) -> None:
    if integrity.ok:
        return
    details = []
    if integrity.bad_bytes:
        details.append(f"{integrity.bad_bytes} of {integrity.bytes_checked} bytes wrong, "
                       f"first at offset {integrity.first_bad_offset}")
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



def latency_config(handles, memory: MemoryProvider, remote, size: int, iterations: int,
                   max_inline: int, initiator: bool):
    """The ping-pong loop's settings for one side: it sends from the upper half of its
    buffer and the peer writes into the lower half."""
    half = memory.length // 2
    return _native.LatencyConfig(
        handles.qps[0], handles.cq, send_addr=memory.address + half, lkey=memory.lkey,
        recv_addr=memory.address, remote_addr=remote.address, rkey=remote.rkey,
        msg_size=size, iterations=iterations, max_inline=max_inline, initiator=initiator,
        stall_timeout_ns=int(STALL_FLOOR_S * 1e9))   # one message in flight


# ---- client --------------------------------------------------------------------------


class ProbeClient:
    """One run against a server: connect, authenticate, set up, measure, say goodbye."""

    def __init__(self, host: str, port: int, token: str, options: ProbeOptions,
                 endpoint_options: EndpointOptions, memory: MemorySpec = MemorySpec(),
                 remote_memory: MemorySpec | None = None, connect_wait_s: float = 0.0):
        self.host, self.port, self.token = host, port, token
        self.connect_wait_s = connect_wait_s
        self.options = options
        self.endpoint_options = options.endpoint_options(endpoint_options, server=False)
        self.memory = memory
        self.remote_memory = remote_memory
        check_latency_memory(options, memory, remote_memory)
        self.stop = _native.StopFlag()
        self.round = 0

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
                                 self.endpoint_options.remote_write) as memory:
                    return self._run_with(channel, endpoint, memory)
        except (GdrprobeError, KeyboardInterrupt) as error:
            # Tell the server why we stop, if it still listens.
            channel.send_last("abort", reason=getattr(error, "cause", "") or type(error).__name__)
            raise
        finally:
            channel.close()

    def _run_with(self, channel: Channel, endpoint: Endpoint, memory: MemoryProvider) -> RunReport:
        local = endpoint.address()
        remote_memory = self.remote_memory and self.remote_memory.to_message()
        channel.send("setup", settings=self.options.to_message(), endpoint=local.to_message(),
                     buffer=self._buffer_message(memory), server_memory=remote_memory)
        reply = channel.receive("setup_ok")
        remote_address = address_from_message(field(reply, "endpoint", dict), self.options.qps)
        remote_buffer = RemoteBuffer.from_message(field(reply, "buffer", dict))
        if remote_buffer.length < self.options.buffer_bytes:
            raise PeerError("the server's buffer is smaller than the largest message", "")
        remote = summary_from_message(field(reply, "summary", dict))
        server_timeout = field(reply, "timeout_s", (int, float), low=MIN_SERVER_TIMEOUT_S,
                               high=3600)
        self.heartbeat_s = min(MAX_HEARTBEAT_S, server_timeout / HEARTBEATS_PER_TIMEOUT)
        endpoint.connect(remote_address)
        handles = endpoint.handles()

        bandwidth, latency = [], []
        for size in self.options.sizes:
            self.round += 1
            if self.options.mode == "bandwidth":
                bandwidth.append(self._bandwidth_round(channel, handles, memory, remote_buffer, size))
            else:
                latency.append(self._latency_round(channel, handles, memory, remote_buffer, size))
        channel.send("bye")
        return RunReport(
            settings=self._settings(endpoint), handle_route=handles.route,
            local=endpoint_summary(endpoint, memory), remote=remote,
            bandwidth=tuple(bandwidth), latency=tuple(latency))

    def _buffer_message(self, memory: MemoryProvider) -> dict | None:
        # Only a latency run lets the server write into this side's buffer.
        if self.options.mode != "latency":
            return None
        return {"address": memory.address, "rkey": memory.rkey, "length": memory.length}

    def _settings(self, endpoint: Endpoint) -> RunSettings:
        o = self.options
        return RunSettings(mode=o.mode, sizes_bytes=o.sizes, iterations=o.iterations,
                           warmup_iterations=o.warmup_iterations, duration_s=o.duration_s,
                           warmup_s=o.warmup_s if o.duration_s else 0.0, qps=o.qps,
                           tx_depth=o.tx_depth, cq_moderation=o.cq_moderation,
                           post_list=o.post_list, mtu_bytes=endpoint.mtu)

    @staticmethod
    def _check_loop(channel: Channel, raw: dict, what: str,
                    stall_timeout: float = STALL_FLOOR_S) -> None:
        """A failed loop whose peer has also hung up is the peer's failure, not the NIC's."""
        try:
            check_status(raw, what, stall_timeout)
        except RdmaError as error:
            time.sleep(0.2)   # a dying peer's socket closes a moment after its QP
            if channel.peer_gone():
                raise PeerError(f"{what} failed: the server went away during the run",
                                "look at the server's host: was it stopped or killed?",
                                evidence=error.evidence) from error
            raise

    def _heartbeat(self, channel: Channel) -> dict:
        """run_interruptibly's arguments that keep the server's time-out from expiring."""
        return {"tick": lambda: channel.send("progress"), "tick_every_s": self.heartbeat_s}

    def _bandwidth_round(self, channel, handles, memory, remote, size):
        o = self.options
        seed = _native.pattern_seed(size, self.round)
        memory.fill_pattern(0, size, seed)
        stage_out_s = memory.stage_out(0, size)
        channel.send("start", size=size, round=self.round)
        channel.receive("ready")
        duration_ns = int(o.duration_s * 1e9) if o.duration_s else 0
        stall_s = stall_timeout_s(o.tx_depth * o.qps * size)
        config = _native.BandwidthConfig(
            handles.qps, handles.cq, local_addr=memory.address, lkey=memory.lkey,
            remote_addr=remote.address, rkey=remote.rkey, msg_size=size,
            iterations=o.iterations, warmup_iterations=o.warmup_iterations,
            duration_ns=duration_ns, warmup_ns=int(o.warmup_s * 1e9) if duration_ns else 0,
            tx_depth=o.tx_depth, cq_mod=o.cq_moderation, post_list=o.post_list,
            max_inline=o.max_inline, stall_timeout_ns=int(stall_s * 1e9))
        raw = LoopThread(_native.run_bandwidth, config, self.stop).wait(
            **self._heartbeat(channel))
        self._check_loop(channel, raw, f"the {size}-byte bandwidth round", stall_s)
        channel.send("done")
        verified = channel.receive("verified")
        integrity = integrity_from_message(verified)
        raise_if_corrupt(integrity, size, "the server")
        # A staged side copies every message once between GPU and host: charge that time.
        stage_in_s = field(verified, "stage_in_s", (int, float), low=0, high=3600)
        raw["elapsed_ns"] += int(raw["messages"] * (stage_out_s + stage_in_s) * 1e9)
        return bandwidth_result(size, raw, integrity)

    def _latency_round(self, channel, handles, memory, remote, size):
        o = self.options
        half = memory.length // 2
        memory.zero()
        memory.fill_pattern(half, size, _native.pattern_seed(size, self.round))
        channel.send("start", size=size, round=self.round)
        channel.receive("ready")
        config = latency_config(handles, memory, remote, size, o.iterations,
                                self.endpoint_options.max_inline, initiator=True)
        raw = LoopThread(_native.run_latency, config, self.stop).wait(
            **self._heartbeat(channel))
        self._check_loop(channel, raw, f"the {size}-byte latency round")
        channel.send("done")
        integrity = integrity_from_message(channel.receive("verified"))
        raise_if_corrupt(integrity, size, "the server")
        return latency_result(size, o.iterations, raw["round_trip"], integrity)


# ---- server --------------------------------------------------------------------------


class ProbeServer:
    """Serves runs one after another; a failed or hostile client ends only its own run."""

    def __init__(self, token: str, endpoint_options: EndpointOptions, *, bind: str = "0.0.0.0",
                 port: int = DEFAULT_PORT, timeout_s: float = 30.0,
                 max_buffer: int = DEFAULT_MAX_BUFFER, memory: MemorySpec = MemorySpec(),
                 log=None):
        if not MIN_SERVER_TIMEOUT_S <= timeout_s <= 3600:
            raise UsageError(f"server time-out {timeout_s:g} s: use {MIN_SERVER_TIMEOUT_S:g} "
                             "to 3600 s", "clients send a heartbeat several times per time-out")
        self.token = token
        self.endpoint_options = endpoint_options
        self.timeout_s = timeout_s
        self.max_buffer = max_buffer
        self.memory = memory
        self.log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.stop = _native.StopFlag()
        try:
            self.listener = socket.create_server((bind, port), reuse_port=False)
        except OSError as error:
            raise UsageError(f"cannot listen on {bind}:{port}: {error.strerror or error}",
                             "pick another port with -p or stop what uses it") from error
        self.port = self.listener.getsockname()[1]

    def serve(self, runs: int | None = None) -> None:
        """Serve runs until interrupted, or serve `runs` runs and raise the last one's
        error (so `serve --once` exits as its run ended)."""
        served = 0
        try:
            while runs is None or served < runs:
                conn, (peer, _) = self.listener.accept()
                served += 1
                try:
                    self.serve_one(conn, peer)
                except GdrprobeError as error:
                    self.log(f"gdrprobe serve: run from {peer} ended: {error.cause}")
                    if runs is not None and served == runs:
                        raise
                except Exception as error:   # a bug must not take the server down
                    self.log(f"gdrprobe serve: run from {peer} hit a gdrprobe bug: {error!r}")
        finally:
            self.close()

    def close(self) -> None:
        """Stop listening; a serve() blocked in accept() returns with an OSError."""
        try:
            self.listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.listener.close()

    def serve_one(self, conn: socket.socket, peer: str) -> None:
        channel = Channel(conn, self.timeout_s, peer=f"client {peer}")
        try:
            authenticate_as_server(channel, self.token)
            setup = channel.receive("setup")
            options = self._checked_options(field(setup, "settings", dict))
            remote_address = address_from_message(field(setup, "endpoint", dict), options.qps)
            remote_buffer = (None if setup.get("buffer") is None else
                             RemoteBuffer.from_message(field(setup, "buffer", dict)))
            spec = self._memory_for(setup, options)
            local_ip = conn.getsockname()[0]
            with Endpoint(options.endpoint_options(self.endpoint_options, server=True),
                          local_ip) as endpoint:
                with open_buffer(spec, endpoint, options.buffer_bytes, True) as memory:
                    self._serve_rounds(channel, options, endpoint, memory, remote_address,
                                       remote_buffer)
            self.log(f"gdrprobe serve: run from {peer} finished")
        except GdrprobeError as error:
            channel.send_last("error", **error_message(error))
            raise
        finally:
            channel.close()

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
        channel.send("setup_ok", endpoint=endpoint.address().to_message(),
                     buffer={"address": memory.address, "rkey": memory.rkey,
                             "length": memory.length},
                     summary=to_dict(endpoint_summary(endpoint, memory)),
                     timeout_s=self.timeout_s)
        while True:
            message = channel.receive("start", "bye")
            if message["type"] == "bye":
                return
            size = field(message, "size", int, low=1, high=max(options.sizes))
            seed = _native.pattern_seed(size, field(message, "round", int, low=0,
                                                    high=MAX_ROUND))
            if options.mode == "bandwidth":
                self._bandwidth_round(channel, memory, size, seed)
            else:
                self._latency_round(channel, options, handles, memory, remote_buffer, size, seed)

    def _wait_for_done(self, channel: Channel) -> None:
        """The client's heartbeats keep the run alive; silence past the time-out ends it."""
        while channel.receive("progress", "done")["type"] != "done":
            pass

    def _bandwidth_round(self, channel, memory, size, seed):
        memory.poison()
        channel.send("ready")
        self._wait_for_done(channel)
        memory.flush_remote_writes()
        stage_in_s = memory.stage_in(0, size)
        self._send_verification(channel, memory, size, seed, size, stage_in_s)

    def _send_verification(self, channel, memory, size, seed, checked, stage_in_s=0.0):
        bad, first_bad = memory.verify_pattern(0, checked, seed)
        stray, first_stray = memory.verify_poison(size) if checked == size else (0, -1)
        channel.send("verified", bytes_checked=checked, bad_bytes=bad,
                     first_bad_offset=first_bad, stray_bytes=stray,
                     first_stray_offset=first_stray, stage_in_s=stage_in_s)

    def _latency_round(self, channel, options, handles, memory, remote, size, seed):
        if remote is None:
            raise PeerError("a latency run needs the client's buffer", "")
        half = memory.length // 2
        memory.zero()
        memory.fill_pattern(half, size, seed)
        config = latency_config(handles, memory, remote, size, options.iterations,
                                options.max_inline, initiator=False)
        self.stop.clear()
        responder = LoopThread(_native.run_latency, config, self.stop)
        try:
            channel.send("ready")
            self._wait_for_done(channel)
        finally:
            raw = responder.finish()
        check_status(raw, f"the {size}-byte latency round")
        # The client's pattern arrived in our receive half; its last byte carries the tag.
        self._send_verification(channel, memory, size, seed, size - 1)


# ---- both ends in one process ------------------------------------------------------------


def run_loopback(options: ProbeOptions, endpoint_options: EndpointOptions,
                 memory: MemorySpec = MemorySpec(),
                 remote_memory: MemorySpec | None = None) -> RunReport:
    """A server thread and a client on 127.0.0.1 and the same device: one process, the
    same code path as two hosts."""
    from gdrprobe.protocol.channel import new_token

    token = new_token()
    # The server thread stays quiet: its errors reach the caller through the client.
    server = ProbeServer(token, endpoint_options, bind="127.0.0.1", port=0,
                         timeout_s=max(options.timeout_s, MIN_SERVER_TIMEOUT_S),
                         log=lambda text: None)
    try:
        client = ProbeClient("127.0.0.1", server.port, token, options, endpoint_options,
                             memory, remote_memory)
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
        thread.join(timeout=options.timeout_s + STALL_FLOOR_S)


def runner(options: ProbeOptions, endpoint_options: EndpointOptions, host: str | None = None,
           port: int = DEFAULT_PORT, token: str | None = None, connect_wait_s: float = 0.0):
    """run_once(local_memory, remote_memory) -> RunReport: against host, or in loopback
    when host is None. The A/B calls it once per arm and repeat."""
    if host is None:
        return lambda local, remote: run_loopback(options, endpoint_options, local, remote)
    return lambda local, remote: ProbeClient(host, port, token, options, endpoint_options,
                                             local, remote, connect_wait_s).run()
