"""The out-of-band channel: framed, bounded, timed-out, authenticated JSON messages over TCP.

Every frame is a 10-byte header (magic ``GDRP``, protocol version, body length) and a body
of at most ``MAX_MESSAGE_BYTES``; every read has a deadline for the whole frame. The first
four messages (hello, challenge, auth, welcome) prove, in both directions, that each end
knows the run's token, without sending it: the token is stretched with scrypt under the
server's salt, and each end shows an HMAC over both fresh nonces, the client first. From
then on every frame is sealed: its body is a sequence number, the JSON, and an
HMAC-SHA256 tag over header, sequence number and JSON under a key of its direction,
derived from the stretched token and both nonces. A frame that was altered, forged,
replayed, reordered or dropped is refused with the reason.

What this does not give: confidentiality (an eavesdropper reads addresses, keys and QP
numbers) and any protection of the RDMA traffic itself; see SECURITY.md.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import secrets
import socket
import struct
import threading
import time

from gdrprobe.errors import WIRE_ERRORS, GdrprobeError, PeerError, RegistrationFailed
from gdrprobe.protocol.fields import field, peer_text

PROTOCOL_VERSION = 3
MAGIC = b"GDRP"
HEADER = struct.Struct(">4sHI")
SEQUENCE = struct.Struct(">Q")
TAG_BYTES = 32               # HMAC-SHA256
MAX_MESSAGE_BYTES = 64 * 1024
NONCE_BYTES = 32
SALT_BYTES = 16
PROOF_BYTES = 32             # HMAC-SHA256
# The token stretch: scrypt (RFC 7914) with N=2^15, r=8, p=1 needs 128*r*N = 32 MiB and
# about 0.1 s per derivation on a current x86 core, so each guess at a token from a
# captured handshake costs the same (a plain HMAC costs about a microsecond). The
# parameters are fixed by the protocol version, never negotiated: no peer can lower them.
# OpenSSL refuses over 32 MiB unless maxmem says more.
KDF_N, KDF_R, KDF_P = 1 << 15, 8, 1
KDF_MAXMEM = 64 << 20
KEY_BYTES = 32
SHORT_TOKEN_CHARS = 16       # below this a human-chosen token is worth a warning
TOKEN_FIX = ("give the client the token the server printed: --token TOKEN or the "
             "GDRPROBE_TOKEN environment variable")


def new_token() -> str:
    """24 URL-safe characters, 144 random bits: out of reach of any guessing."""
    return secrets.token_urlsafe(18)


def token_warning(token: str) -> str | None:
    """A warning for a short token, or None."""
    if len(token) >= SHORT_TOKEN_CHARS:
        return None
    return (f"the token has {len(token)} characters: whoever captures one handshake can test "
            "guesses offline (each costs one scrypt); use the token 'gdrprobe serve' prints, "
            f"or at least {SHORT_TOKEN_CHARS} random characters")


@functools.lru_cache(maxsize=16)
def stretch(token: str, salt: bytes) -> bytes:
    """The key both ends derive from the token; cached, as an A/B connects many times to
    one server (one salt)."""
    return hashlib.scrypt(token.encode(), salt=salt, n=KDF_N, r=KDF_R, p=KDF_P,
                          maxmem=KDF_MAXMEM, dklen=KEY_BYTES)


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def proof(key: bytes, role: bytes, salt: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _mac(key, b"gdrprobe-2 proof ", role, salt, client_nonce, server_nonce)


def direction_keys(key: bytes, client_nonce: bytes, server_nonce: bytes) -> tuple[bytes, bytes]:
    """(client-to-server key, server-to-client key): one per direction, so a frame can
    never be reflected back to its sender."""
    return (_mac(key, b"gdrprobe-2 c2s", client_nonce, server_nonce),
            _mac(key, b"gdrprobe-2 s2c", client_nonce, server_nonce))


def frame_tag(key: bytes, header: bytes, sequence: bytes, body: bytes) -> bytes:
    return _mac(key, header, sequence, body)


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
        body = json.dumps({"type": kind, **fields}, separators=(",", ":"),
                          allow_nan=False).encode()
        if self._send_key is None:
            if len(body) > MAX_MESSAGE_BYTES:
                raise ValueError(f"message {kind} is {len(body)} bytes, over the limit")
            return HEADER.pack(MAGIC, PROTOCOL_VERSION, len(body)) + body
        length = SEQUENCE.size + len(body) + TAG_BYTES
        if length > MAX_MESSAGE_BYTES:
            raise ValueError(f"message {kind} is {length} bytes, over the limit")
        header = HEADER.pack(MAGIC, PROTOCOL_VERSION, length)
        sequence = SEQUENCE.pack(self._sent)
        self._sent += 1
        return header + sequence + body + frame_tag(self._send_key, header, sequence, body)

    def send(self, kind: str, **fields) -> None:
        with self._send_lock:
            data = self.frame(kind, **fields)
            try:
                self.sock.settimeout(self.timeout)   # not what a receive's deadline left
                self.sock.sendall(data)
            except OSError as error:
                raise PeerError(f"lost the connection to the {self.peer} while sending "
                                f"{kind}: {error}", "check that the other side is still "
                                "running") from error

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

    def _read_frame(self, deadline: float, timeout: float) -> bytes:
        """The JSON of the next frame, its seal checked once the channel is sealed."""
        header = self._read_exact(HEADER.size, deadline, timeout)
        magic, version, length = HEADER.unpack(header)
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
        body = self._read_exact(length, deadline, timeout)
        return body if self._receive_key is None else self._open(header, body)

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
        body = self._read_frame(time.monotonic() + timeout, timeout)
        try:
            message = json.loads(body, parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as error:
            raise PeerError(f"the {self.peer} sent a message that is not JSON (or holds "
                            "NaN or Infinity)", "the peer is not a gdrprobe of this "
                            "version") from error
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            raise PeerError(f"the {self.peer} sent a message without a type", "")
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
            raise PeerError(f"the {self.peer} sent {peer_text(kind, 40)!r} where "
                            f"{' or '.join(expected)} was expected", "run the same gdrprobe "
                            "version on both hosts")
        return message

    def send_last(self, kind: str, **fields) -> None:
        """A parting message (error, abort) to a peer that may already be gone: best effort,
        bounded, and never masking the error that caused it."""
        try:
            self.timeout = 1.0
            self.send(kind, **fields)
        except (GdrprobeError, OSError, ValueError):
            pass

    def _peek(self) -> bytes | None:
        """The next byte without taking it, b"" when the peer has closed, None when nothing
        is there; never waits. (With a time-out set, Python waits for data before any recv,
        MSG_DONTWAIT or not: the socket is made non-blocking for the look.)"""
        timeout = self.sock.gettimeout()
        try:
            self.sock.setblocking(False)
            return self.sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return None
        except OSError:
            return b""
        finally:
            try:
                self.sock.settimeout(timeout)
            except OSError:
                pass

    def peer_gone(self) -> bool:
        """True when the peer has closed its end (a process that died closes it too)."""
        return self._peek() == b""

    def raise_if_peer_spoke(self) -> None:
        """Raise the error a peer sent unasked (it ended the run), if one is waiting."""
        if self._peek():
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


def _hex_field(message: dict, name: str, size: int) -> bytes:
    """A hexadecimal field of exactly `size` bytes (nonces, salts and proofs)."""
    text = field(message, name, str)
    try:
        value = bytes.fromhex(text)
    except ValueError as error:
        raise PeerError(f"peer field {name!r} is not hexadecimal", "") from error
    if len(value) != size:
        raise PeerError(f"peer field {name!r} has the wrong length", "")
    return value


class WrongToken(PeerError):
    """A client's proof did not match: one online guess at the token."""


class ServerSecret:
    """The server's salt and its key: the token stretched once when it starts, or, with no
    token, 256 random bits for a server whose one client is in its own process (loopback)
    and authenticates with this very object. A random key is beyond guessing already, so
    it is not stretched: that saves the one scrypt a loopback process would make (most of
    a second in the emulated lab)."""

    def __init__(self, token: str | None):
        self.salt = secrets.token_bytes(SALT_BYTES)
        self.key = (secrets.token_bytes(KEY_BYTES) if token is None else
                    stretch(token, self.salt))


def client_key(credential: str | ServerSecret, salt: bytes) -> bytes:
    """The key a client proves: its token stretched under the server's salt, or the key of
    the ServerSecret of a server in this process."""
    if isinstance(credential, ServerSecret):
        return credential.key
    return stretch(credential, salt)


def authenticate_as_client(channel: Channel, credential: str | ServerSecret) -> None:
    """Prove the token first, then check that the server knows it too; then seal."""
    mine = secrets.token_bytes(NONCE_BYTES)
    channel.send("hello", nonce=mine.hex())
    challenge = channel.receive("challenge")
    theirs = _hex_field(challenge, "nonce", NONCE_BYTES)
    salt = _hex_field(challenge, "salt", SALT_BYTES)
    key = client_key(credential, salt)
    channel.send("auth", proof=proof(key, b"client", salt, mine, theirs).hex())
    welcome = channel.receive("welcome")
    if not hmac.compare_digest(_hex_field(welcome, "proof", PROOF_BYTES),
                               proof(key, b"server", salt, mine, theirs)):
        raise PeerError("the server's token is not this run's token", TOKEN_FIX)
    to_server, to_client = direction_keys(key, mine, theirs)
    channel.seal(send_key=to_server, receive_key=to_client)


def authenticate_as_server(channel: Channel, secret: ServerSecret, deadline: float) -> None:
    """Refuse, before anything else is said, a client that cannot prove the token; the
    whole exchange must end by the deadline. The server's own proof comes only after the
    client's: a stranger gets nothing to test guesses against."""
    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    theirs = _hex_field(channel.receive("hello", timeout=left()), "nonce", NONCE_BYTES)
    mine = secrets.token_bytes(NONCE_BYTES)
    channel.send("challenge", nonce=mine.hex(), salt=secret.salt.hex())
    shown = _hex_field(channel.receive("auth", timeout=left()), "proof", PROOF_BYTES)
    if not hmac.compare_digest(shown, proof(secret.key, b"client", secret.salt, theirs, mine)):
        channel.send_last("error", reason="wrong token", fix=TOKEN_FIX)
        raise WrongToken("a client presented the wrong token", TOKEN_FIX)
    channel.send("welcome", proof=proof(secret.key, b"server", secret.salt, theirs, mine).hex())
    to_server, to_client = direction_keys(secret.key, theirs, mine)
    channel.seal(send_key=to_client, receive_key=to_server)
