"""The out-of-band channel: framed, bounded, timed-out, authenticated JSON messages over TCP.

Every frame is a 10-byte header (magic ``GDRP``, protocol version, body length) and a body
of at most ``MAX_MESSAGE_BYTES``; every read has a deadline for the whole frame. The
handshake (handshake.py) proves the token both ways and then seals the channel: from then
on every frame's body is a sequence number, the JSON, and an HMAC-SHA256 tag over header,
sequence number and JSON under a key of its direction, derived from the stretched token
and both nonces. A frame that was altered, forged, replayed or reordered is refused with
the reason; so is one that was dropped, once the next one arrives (a dropped last frame
looks like silence: a time-out).

Text from a peer that has not proved the token is never shown or logged, not even cut.

What this does not give: confidentiality (an eavesdropper reads addresses, keys and QP
numbers) and any protection of the RDMA traffic itself; see SECURITY.md.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import struct
import threading
import time

from gdrprobe.errors import WIRE_ERRORS, GdrprobeError, PeerError, RegistrationFailed
from gdrprobe.protocol.fields import SAME_VERSION_FIX, field, peer_text

# 4: a salt per handshake, the work puzzle, the refusal codes (handshake.py); a run's
#    integrity_bytes (measure/options.py)
# 5: every bandwidth message checked, pass by pass ("pass", "checked": messages.py), unless
#    the run samples (sample_integrity)
# 6: the puzzle rises with the server's load, up to 22 bits (admission.py); the refusal code
#    "overloaded" (a proof dropped unchecked)
# 7: a run's opcode (RDMA WRITE or READ: measure/options.py) and each side's READ credits
#    (its max_dest_rd_atomic, in the endpoint address)
# 8: NCCL's pattern (--pattern nccl): the client's FIFO in "setup", "start" with its pattern
#    and first step, and "received", the receiver's measurements (messages.py)
PROTOCOL_VERSION = 8
MAGIC = b"GDRP"
HEADER = struct.Struct(">4sHI")
SEQUENCE = struct.Struct(">Q")
TAG_BYTES = 32               # HMAC-SHA256
MAX_MESSAGE_BYTES = 64 * 1024
LINE_END = b"\r\n"
TOKEN_FIX = ("give the client the token the server printed: --token TOKEN or the "
             "GDRPROBE_TOKEN environment variable")


def frame_tag(key: bytes, header: bytes, sequence: bytes, body: bytes) -> bytes:
    return hmac.new(key, header + sequence + body, hashlib.sha256).digest()


def plain_frame(kind: str, **fields) -> bytes:
    """The bytes of one unsealed message (the handshake's)."""
    return _plain(_json(kind, fields), kind)


def line_frame(kind: str, **fields) -> bytes:
    """An unsealed message whose JSON ends with CRLF, JSON's own whitespace (RFC 8259): the
    client's hello, so that a line-based server that is no gdrprobe (HTTP, Redis, memcached)
    answers it at once instead of waiting for the rest of a line, and the client knows that
    server by the first byte of its answer (Channel._read_frame)."""
    return _plain(_json(kind, fields) + LINE_END, kind)


def _plain(body: bytes, kind: str) -> bytes:
    if len(body) > MAX_MESSAGE_BYTES:
        raise ValueError(f"message {kind} is {len(body)} bytes, over the limit")
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, len(body)) + body


def _json(kind: str, fields: dict) -> bytes:
    return json.dumps({"type": kind, **fields}, separators=(",", ":"),
                      allow_nan=False).encode()


def check_magic(start: bytes, peer: str) -> None:
    """The first bytes of a frame, as many as have arrived, must begin gdrprobe's magic: a
    peer that speaks another protocol is known by its first byte, not after a time-out."""
    if MAGIC[:len(start)] != start[:len(MAGIC)]:
        raise PeerError(f"the {peer} does not speak the gdrprobe protocol",
                        "point the client at a 'gdrprobe serve' port")


def frame_length(header: bytes, peer: str) -> int:
    """The body length a frame header announces, once magic, version and limit are right."""
    magic, version, length = HEADER.unpack(header)
    check_magic(magic, peer)
    if version != PROTOCOL_VERSION:
        raise PeerError(f"the {peer} speaks protocol {version}, this gdrprobe "
                        f"speaks {PROTOCOL_VERSION}", SAME_VERSION_FIX)
    if length > MAX_MESSAGE_BYTES:
        raise PeerError(f"the {peer} sent a {length}-byte message; the limit is "
                        f"{MAX_MESSAGE_BYTES}", "the peer is not a gdrprobe of this version")
    return length


def parse_message(body: bytes, peer: str) -> dict:
    """A frame's JSON: an object with a type, and no NaN or Infinity."""
    try:
        message = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as error:
        raise PeerError(f"the {peer} sent a message that is not JSON (or holds NaN or "
                        "Infinity)", "the peer is not a gdrprobe of this version") from error
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise PeerError(f"the {peer} sent a message without a type", SAME_VERSION_FIX)
    return message


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number a peer may send")


class Channel:
    """One connection; every receive is bounded and timed out, and after seal() every
    frame in both directions is authenticated and numbered."""

    def __init__(self, sock: socket.socket, timeout: float, peer: str = "peer"):
        self.sock = sock
        self.timeout = timeout
        self.peer = peer
        self._send_key = self._receive_key = None
        self._sent = self._received = 0
        self._send_lock = threading.Lock()
        sock.settimeout(timeout)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # small steps, no delay

    @property
    def authenticated(self) -> bool:
        return self._receive_key is not None

    def seal(self, send_key: bytes, receive_key: bytes) -> None:
        """From now on every frame carries a sequence number and a tag."""
        self._send_key, self._receive_key = send_key, receive_key
        self._sent = self._received = 0

    def frame(self, kind: str, **fields) -> bytes:
        """The bytes of one message as this channel sends it next (and counts it sent)."""
        if self._send_key is None:
            return plain_frame(kind, **fields)
        body = _json(kind, fields)
        length = SEQUENCE.size + len(body) + TAG_BYTES
        if length > MAX_MESSAGE_BYTES:
            raise ValueError(f"message {kind} is {length} bytes, over the limit")
        header = HEADER.pack(MAGIC, PROTOCOL_VERSION, length)
        sequence = SEQUENCE.pack(self._sent)
        self._sent += 1
        return header + sequence + body + frame_tag(self._send_key, header, sequence, body)

    def send(self, kind: str, **fields) -> None:
        with self._send_lock:
            self._send_bytes(self.frame(kind, **fields), kind)

    def send_line(self, kind: str, **fields) -> None:
        """An unsealed message ending its line (line_frame): the client's first."""
        with self._send_lock:
            self._send_bytes(line_frame(kind, **fields), kind)

    def _send_bytes(self, data: bytes, kind: str) -> None:
        try:
            self.sock.settimeout(self.timeout)   # not what a receive's deadline left
            self.sock.sendall(data)
        except OSError as error:
            raise PeerError(f"lost the connection to the {self.peer} while sending "
                            f"{kind}: {error}", "check that the other side is still "
                            "running") from error

    def _read_exact(self, count: int, deadline: float, timeout: float,
                    check=None) -> bytes:
        """count bytes, all of them before the deadline: a peer that trickles bytes is as
        slow as one that sends nothing. check(what arrived so far) may refuse them early."""
        chunks, remaining = [], count
        while remaining:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise socket.timeout
                self.sock.settimeout(left)
                chunk = self.sock.recv(min(remaining, 65536))
            except socket.timeout as error:
                raise PeerError(f"the {self.peer} did not answer within {timeout:g} s",
                                "check that it is running and reachable; raise --timeout "
                                "for slow links", evidence=self._silence()) from error
            except OSError as error:
                raise PeerError(f"lost the connection to the {self.peer}: {error}",
                                "check that the other side is still running") from error
            if not chunk:
                raise PeerError(f"the {self.peer} closed the connection",
                                "look at the other side's output for its reason")
            chunks.append(chunk)
            remaining -= len(chunk)
            if check is not None:          # only on a header: a join per chunk of a body is quadratic
                check(b"".join(chunks))
        return b"".join(chunks)

    def _silence(self) -> str:
        """What a time-out can and cannot say on a sealed channel."""
        if self._receive_key is None:
            return ""
        return (f"{self._received} authenticated frames had arrived in order; a frame "
                "dropped on the way, with none after it, cannot be told from one never sent")

    def _read_frame(self, deadline: float, timeout: float) -> bytes:
        """The JSON of the next frame, its seal checked once the channel is sealed."""
        if self._receive_key is None:
            header = self._read_exact(HEADER.size, deadline, timeout,
                                      lambda start: check_magic(start, self.peer))
            return self._read_exact(frame_length(header, self.peer), deadline, timeout)
        header = self._read_exact(HEADER.size, deadline, timeout)
        return self._open(header, self._read_exact(self._sealed_length(header), deadline, timeout))

    def _sealed_length(self, header: bytes) -> int:
        """The body length of a sealed frame's header. Both ends proved the same protocol in
        the handshake, so another magic or version here, or a length past the limit, is a
        header altered on the way: tampering, not a version mismatch."""
        magic, version, length = HEADER.unpack(header)
        if magic != MAGIC or version != PROTOCOL_VERSION:
            raise self._tampered(f"frame {self._received}'s header was altered: magic {magic!r} "
                                 f"and protocol {version} where the handshake agreed on "
                                 f"{MAGIC!r} and {PROTOCOL_VERSION}")
        if length > MAX_MESSAGE_BYTES:
            raise self._tampered(f"frame {self._received}'s header was altered: it announces "
                                 f"{length} bytes, over the limit of {MAX_MESSAGE_BYTES}")
        return length

    def _open(self, header: bytes, body: bytes) -> bytes:
        """The JSON of a sealed frame whose tag and sequence number are right."""
        if len(body) < SEQUENCE.size + TAG_BYTES:
            raise self._tampered("a frame too short to carry its sequence number and tag")
        sequence, payload, tag = (body[:SEQUENCE.size], body[SEQUENCE.size:-TAG_BYTES],
                                  body[-TAG_BYTES:])
        if not hmac.compare_digest(tag, frame_tag(self._receive_key, header, sequence, payload)):
            raise self._tampered(f"frame {self._received} failed its authentication check: "
                                 "altered on the way, or not sent by the peer")
        number = SEQUENCE.unpack(sequence)[0]
        if number < self._received:
            raise self._tampered(f"frame {number} arrived again after frame "
                                 f"{self._received - 1}: a replay")
        if number > self._received:
            raise self._tampered(f"frame {number} arrived where frame {self._received} was "
                                 "due: frames were dropped or reordered")
        self._received += 1
        return payload

    def _tampered(self, evidence: str) -> PeerError:
        return PeerError(f"the connection to the {self.peer} was tampered with",
                         "something between the hosts changes the out-of-band traffic: run "
                         "over a network path you trust", evidence=evidence)

    def receive(self, *expected: str, timeout: float | None = None) -> dict:
        """The next message, which must be one of the expected types (or an error), whole
        within the time-out."""
        timeout = self.timeout if timeout is None else timeout
        message = parse_message(self._read_frame(time.monotonic() + timeout, timeout),
                                self.peer)
        kind = message["type"]
        if kind in ("error", "abort") and kind not in expected and not self.authenticated:
            # Anyone can send these: never believed, their text never shown.
            raise PeerError(f"the {self.peer} ended the connection ({kind}) before the token "
                            "was proved", TOKEN_FIX)
        if kind == "error" and "error" not in expected:
            raise error_from_message(message, self.peer)
        if kind == "abort" and "abort" not in expected:
            raise abort_from_message(message, self.peer)
        if kind not in expected:
            # A stranger's type is not shown; an authenticated peer's is, cut.
            sent = (f"{peer_text(kind, 40)!r}" if self.authenticated else
                    "a message of another type")
            raise PeerError(f"the {self.peer} sent {sent} where {' or '.join(expected)} was "
                            "expected", SAME_VERSION_FIX)
        return message

    def send_last(self, kind: str, **fields) -> None:
        """A parting message (error, abort) to a peer that may already be gone: best effort,
        bounded, and never masking the error that caused it."""
        try:
            self.timeout = 1.0
            self.send(kind, **fields)
        except (GdrprobeError, OSError, ValueError):
            pass

    def peer_gone(self) -> bool:
        """True when the peer has closed its end (a process that died closes it too)."""
        return peek(self.sock) == b""

    def raise_if_peer_spoke(self) -> None:
        """Raise the error a peer sent unasked (it ended the run), if one is waiting."""
        if peek(self.sock):
            raise error_from_message(self.receive("error"), self.peer)

    def shutdown(self) -> None:
        """Wake a thread blocked on this connection (it sees the peer close)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def peek(sock: socket.socket) -> bytes | None:
    """The next byte without taking it, b"" when the peer has closed (or the socket failed),
    None when nothing is there; never waits. (With a time-out set, Python waits for data
    before any recv, MSG_DONTWAIT or not: the socket is made non-blocking for the look.)"""
    timeout = sock.gettimeout()
    try:
        sock.setblocking(False)
        return sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return None
    except OSError:
        return b""
    finally:
        try:
            sock.settimeout(timeout)
        except OSError:
            pass


def error_message(error: GdrprobeError) -> dict:
    """An error as the peer will rebuild it (see :func:`error_from_message`)."""
    return {"reason": error.cause, "fix": error.fix, "evidence": error.evidence,
            "category": type(error).__name__, "errno": getattr(error, "error_code", -1),
            "mechanism": getattr(error, "mechanism", "")}


def abort_message(error: BaseException) -> dict:
    """Why this side gives up a run (see :func:`abort_from_message`)."""
    return {"reason": getattr(error, "cause", "") or type(error).__name__}


def abort_from_message(message: dict, peer: str) -> PeerError:
    """An authenticated peer that gave up, its reason made safe to print."""
    return PeerError(f"the {peer} gave up: {peer_text(message.get('reason'))}", "")


def error_from_message(message: dict, peer: str) -> GdrprobeError:
    """An authenticated peer's error, its text made safe to print; its category chooses
    the kind of error (and so the exit code)."""
    reason = f"the {peer} reported: {peer_text(message.get('reason'))}"
    fix = peer_text(message.get("fix", ""))
    evidence = peer_text(message.get("evidence", ""))
    cls = WIRE_ERRORS.get(message.get("category"))
    if cls is RegistrationFailed:
        error = cls(reason, fix, evidence, field(message, "errno", int, default=-1),
                    peer_text(message.get("mechanism", ""), 40))
    else:
        error = (cls or PeerError)(reason, fix, evidence)
    error.peer_message = message   # the rest (findings, say) for the layer that reads it
    return error
