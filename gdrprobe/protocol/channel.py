"""The out-of-band channel: framed, bounded, timed-out JSON messages over TCP.

Every message is a 10-byte header (magic ``GDRP``, protocol version, payload length) and
a JSON object with a ``type``. Payloads over ``MAX_MESSAGE_BYTES`` are refused before
they are read; every read has a time-out. Before anything else both ends prove that they
know the run's token with an HMAC over fresh nonces, so the token itself never crosses the
wire and a peer without it learns no key and no address.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import socket
import struct
import time

from gdrprobe.errors import WIRE_ERRORS, GdrprobeError, PeerError, RegistrationFailed
from gdrprobe.protocol.fields import field

PROTOCOL_VERSION = 1
MAGIC = b"GDRP"
HEADER = struct.Struct(">4sHI")
MAX_MESSAGE_BYTES = 64 * 1024
NONCE_BYTES = 32
PROOF_BYTES = 32   # HMAC-SHA256
TOKEN_FIX = ("give the client the token the server printed: --token TOKEN or the "
             "GDRPROBE_TOKEN environment variable")


def new_token() -> str:
    return secrets.token_urlsafe(18)


class Channel:
    """One authenticated-or-not connection; every receive is bounded and timed out."""

    def __init__(self, sock: socket.socket, timeout: float, peer: str = "peer"):
        self.sock = sock
        self.timeout = timeout
        self.peer = peer
        sock.settimeout(timeout)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)   # small steps, no delay

    def send(self, kind: str, **fields) -> None:
        payload = json.dumps({"type": kind, **fields}, separators=(",", ":")).encode()
        if len(payload) > MAX_MESSAGE_BYTES:
            raise ValueError(f"message {kind} is {len(payload)} bytes, over the limit")
        try:
            self.sock.sendall(HEADER.pack(MAGIC, PROTOCOL_VERSION, len(payload)) + payload)
        except OSError as error:
            raise PeerError(f"lost the connection to the {self.peer} while sending {kind}: "
                            f"{error}", "check that the other side is still running") from error

    def _read_exact(self, count: int, deadline: float, timeout: float) -> bytes:
        """count bytes, all of them before the deadline: a peer that trickles bytes is as
        slow as one that sends nothing."""
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
                                "for slow links") from error
            except OSError as error:
                raise PeerError(f"lost the connection to the {self.peer}: {error}",
                                "check that the other side is still running") from error
            if not chunk:
                raise PeerError(f"the {self.peer} closed the connection",
                                "look at the other side's output for its reason")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def receive(self, *expected: str, timeout: float | None = None) -> dict:
        """The next message, which must be one of the expected types (or an error), whole
        within the time-out."""
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        magic, version, length = HEADER.unpack(self._read_exact(HEADER.size, deadline, timeout))
        if magic != MAGIC:
            raise PeerError(f"the {self.peer} does not speak the gdrprobe protocol",
                            "point the client at a 'gdrprobe serve' port",
                            evidence=f"first bytes {magic!r}")
        if version != PROTOCOL_VERSION:
            raise PeerError(f"the {self.peer} speaks protocol {version}, this gdrprobe "
                            f"speaks {PROTOCOL_VERSION}", "run the same gdrprobe version "
                            "on both hosts")
        if length > MAX_MESSAGE_BYTES:
            raise PeerError(f"the {self.peer} sent a {length}-byte message; the limit is "
                            f"{MAX_MESSAGE_BYTES}", "the peer is not a gdrprobe of this version")
        try:
            message = json.loads(self._read_exact(length, deadline, timeout))
        except (ValueError, RecursionError) as error:
            raise PeerError(f"the {self.peer} sent a message that is not JSON",
                            "the peer is not a gdrprobe of this version") from error
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise PeerError(f"the {self.peer} sent a message without a type", "")
        if message["type"] == "error" and "error" not in expected:
            raise error_from_message(message, self.peer)
        if message["type"] == "abort" and "abort" not in expected:
            raise PeerError(f"the {self.peer} gave up: {field(message, 'reason', str)}", "")
        if message["type"] not in expected:
            raise PeerError(f"the {self.peer} sent {message['type']!r} where "
                            f"{' or '.join(expected)} was expected", "run the same gdrprobe "
                            "version on both hosts")
        return message

    def send_last(self, kind: str, **fields) -> None:
        """A parting message (error, abort) to a peer that may already be gone: best effort,
        bounded, and never masking the error that caused it."""
        try:
            self.sock.settimeout(1.0)
            self.send(kind, **fields)
        except (GdrprobeError, OSError):
            pass

    def peer_gone(self) -> bool:
        """True when the peer has closed its end (a process that died closes it too)."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def error_message(error: GdrprobeError) -> dict:
    """An error as the peer will rebuild it (see :func:`error_from_message`)."""
    return {"reason": error.cause, "fix": error.fix, "evidence": error.evidence,
            "category": type(error).__name__, "errno": getattr(error, "error_code", -1),
            "mechanism": getattr(error, "mechanism", "")}


def error_from_message(message: dict, peer: str) -> GdrprobeError:
    reason = f"the {peer} reported: {field(message, 'reason', str)}"
    fix = field(message, "fix", str, default="")
    evidence = field(message, "evidence", str, default="")
    cls = WIRE_ERRORS.get(field(message, "category", str, default=""))
    if cls is RegistrationFailed:
        return cls(reason, fix, evidence, field(message, "errno", int, default=-1),
                   field(message, "mechanism", str, default=""))
    return (cls or PeerError)(reason, fix, evidence)


def _proof(token: str, role: bytes, first: bytes, second: bytes) -> str:
    return hmac.new(token.encode(), role + first + second, hashlib.sha256).hexdigest()


def _hex_field(message: dict, name: str, size: int) -> bytes:
    """A hexadecimal field of exactly `size` bytes (nonces and proofs)."""
    text = field(message, name, str)
    try:
        value = bytes.fromhex(text)
    except ValueError as error:
        raise PeerError(f"peer field {name!r} is not hexadecimal", "") from error
    if len(value) != size:
        raise PeerError(f"peer field {name!r} has the wrong length", "")
    return value


def _proof_matches(message: dict, expected: str) -> bool:
    return hmac.compare_digest(_hex_field(message, "proof", PROOF_BYTES), bytes.fromhex(expected))


def authenticate_as_client(channel: Channel, token: str) -> None:
    """Prove the token first, then check that the server knows it too."""
    mine = secrets.token_bytes(NONCE_BYTES)
    channel.send("hello", nonce=mine.hex())
    theirs = _hex_field(channel.receive("challenge"), "nonce", NONCE_BYTES)
    channel.send("auth", proof=_proof(token, b"client", theirs, mine))
    welcome = channel.receive("welcome")
    if not _proof_matches(welcome, _proof(token, b"server", mine, theirs)):
        raise PeerError("the server's token is not this run's token", TOKEN_FIX)


def authenticate_as_server(channel: Channel, token: str) -> None:
    """Refuse, before anything else is said, a client that cannot prove the token. The
    server's own proof comes only after the client's: an unauthenticated client gets
    nothing to test guesses of the token against."""
    theirs = _hex_field(channel.receive("hello"), "nonce", NONCE_BYTES)
    mine = secrets.token_bytes(NONCE_BYTES)
    channel.send("challenge", nonce=mine.hex())
    if not _proof_matches(channel.receive("auth"), _proof(token, b"client", mine, theirs)):
        channel.send("error", reason="wrong token", fix=TOKEN_FIX)
        raise PeerError("a client presented the wrong token", TOKEN_FIX)
    channel.send("welcome", proof=_proof(token, b"server", theirs, mine))
