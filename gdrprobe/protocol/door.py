"""A server's door: every connection that has not proved the token, served by one thread
that never blocks, so a stranger costs no thread of its own, and no scrypt until it has
solved the handshake's puzzle.

The door accepts, reads the hello, sends the challenge (its puzzle as hard as the load asks:
admission.puzzle_bits), reads the auth and checks the puzzle itself; the proof (a scrypt
under a token) waits for one of a few checking threads in a short queue, the most worked
for first, fairly by source, and is dropped unchecked when it has waited too long or a
proof that carries more work needs its place (admission.ProofQueue); a client that proved
the token gets its welcome and is handed on, its channel sealed, to
``on_authenticated(channel, address)``. Every connection has a
deadline (hello within ``HELLO_S``, the whole handshake within ``PRE_AUTH_S`` and the time
a slow client takes for the puzzle it was asked, ``SLOW_TRY_S`` a try), anything
wrong closes it at once, and every refusal tells the client why, in a code its own
gdrprobe turns into words (handshake.REFUSALS). The door logs only its own words.
"""

from __future__ import annotations

import errno
import queue
import selectors
import socket
import threading
import time

from gdrprobe.errors import PeerError
from gdrprobe.protocol.admission import (CHALLENGED, CHECKING, MAX_PENDING, PER_SOURCE,
                                         PROOF_WAIT_S, SILENT, Places, ProofQueue, puzzle_bits,
                                         source_of)
from gdrprobe.protocol.channel import (HEADER, Channel, frame_length, parse_message, peek,
                                       plain_frame)
from gdrprobe.protocol.handshake import (AUTH, CHALLENGE, HELLO, REFUSED, WELCOME,
                                         ServerHandshake, ServerSecret, WrongToken)
from gdrprobe.protocol.serverlog import BurstLog

# A client sends hello as soon as it has connected; the whole handshake also holds the
# client's puzzle and scrypt (0.5 s and 1.2 s in the emulated lab, several times that on a
# loaded one), whatever --timeout says.
HELLO_S = 5.0
PRE_AUTH_S = 15.0
# And the puzzle asked, at this much a try: a Python client on a slow or busy host (0.24 us
# a try on an idle x86 core, 0.9 us on one loaded to 10, and then only a share of it):
# 16.8 s more at 22 bits.
SLOW_TRY_S = 4e-6
CHECKERS = 2                   # threads checking proofs: at most 2 scrypts, 64 MiB, at once
MAX_HANDSHAKE_FRAME = 1024     # hello and auth are about 100 and 200 bytes
ACCEPTS_PER_WAKE = 64
ACCEPT_TRANSIENT = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED)
ACCEPT_PAUSE_S = 0.1
TICK_S = 1.0                   # the longest the loop sleeps without looking at deadlines
_LISTENER, _WAKE = "listener", "wake"
# Why a connection was closed, as the log says it (never the peer's own words).
ENDED = {"malformed": "it sent what a gdrprobe client does not send",
         "closed": "it closed the connection", "slow": "it missed the handshake's deadline",
         "puzzle": "its work did not solve the puzzle"}
# Why a proof was dropped before a checker took it.
UNCHECKED = {"room": "the queue for the checkers was full, and no proof in it carried less work",
             "waited": f"it waited {PROOF_WAIT_S:g} s for a checker"}


class _Pending:
    """A connection at the door: its socket, what has arrived of its next frame, its
    handshake once it said hello, and the deadline of its next step."""

    def __init__(self, sock: socket.socket, address: str, source: str, accepted: float):
        self.sock, self.address, self.source = sock, address, source
        self.accepted = accepted
        self.deadline = accepted + HELLO_S
        self.inbox = bytearray()
        self.handshake: ServerHandshake | None = None
        self.bits = 0                # the work its challenge asked


class Door:
    """Call run() in the thread that serves the door; close() from any thread ends it."""

    def __init__(self, listener: socket.socket, secret: ServerSecret, on_authenticated,
                 log, *, per_source: int = PER_SOURCE, total: int = MAX_PENDING,
                 checkers: int = CHECKERS, clock=time.monotonic, proofs: ProofQueue | None = None):
        self._listener, self._secret = listener, secret
        self._on_authenticated = on_authenticated
        self.log = BurstLog(log, clock=clock)
        self._clock = clock
        self._places = Places(per_source, total)
        self._proofs = proofs or ProofQueue(clock=clock)
        self._checker_count = checkers
        self._asked_bits = secret.puzzle_bits    # the work asked of the last newcomer
        self._checked: queue.SimpleQueue = queue.SimpleQueue()
        self._checkers = [threading.Thread(target=self._check_proofs, daemon=True,
                                           name="gdrprobe-proof-check")
                          for _ in range(checkers if secret.stretches else 0)]
        self._selector = selectors.DefaultSelector()
        self._wake_read, self._wake_write = socket.socketpair()
        for sock in (self._wake_read, self._wake_write, listener):
            sock.setblocking(False)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._running = self._shut = False
        self._accept_again = 0.0     # accepting pauses after a transient failure

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> None:
        """Serve the door until close()."""
        with self._lock:
            if self._shut:
                return
            self._running = True
        try:
            self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
            self._selector.register(self._wake_read, selectors.EVENT_READ, _WAKE)
            for checker in self._checkers:
                checker.start()
            while not self._closed.is_set():
                for key, _ in self._selector.select(self._sleep_s()):
                    if key.data is _LISTENER:
                        self._accept()
                    elif key.data is _WAKE:
                        self._drain_wake()
                    else:
                        self._readable(key.data)
                self._finish_checked()
                self._expire()
                self._drop_waited_out()
        finally:
            self._shut_down()

    def close(self) -> None:
        """Stop accepting and refuse every pending connection; run() returns."""
        self._closed.set()
        with self._lock:
            running = self._running
        if running:
            self._wake()
        else:
            self._shut_down()

    def _sleep_s(self) -> float:
        now = self._clock()
        deadlines = [p.deadline for p in self._places if self._places.stage(p) < CHECKING]
        if self._accept_again:
            deadlines.append(self._accept_again)
        if (proof_deadline := self._proofs.next_deadline()) is not None:
            deadlines.append(proof_deadline)
        return max(0.0, min([now + TICK_S, *deadlines]) - now)

    def _wake(self) -> None:
        try:
            self._wake_write.send(b"x")
        except OSError:
            pass   # already awake (full) or shut

    def _drain_wake(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except OSError:
            pass

    # -- accepting -------------------------------------------------------------------------

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as error:
                if error.errno not in ACCEPT_TRANSIENT:
                    raise
                # Out of descriptors or buffers for a moment: say so, breathe, go on.
                self.log("", "accept", f"accepting a connection failed: {error.strerror}")
                self._selector.unregister(self._listener)
                self._accept_again = self._clock() + ACCEPT_PAUSE_S
                return
            self._admit(sock, address[0])

    def _admit(self, sock: socket.socket, address: str) -> None:
        sock.setblocking(False)
        pending = _Pending(sock, address, source_of(address), self._clock())
        while self._places.full_for(pending.source):
            victim = self._places.victim(pending.source)
            if victim is None:
                self._refuse_newcomer(pending)
                return
            if self._spoke(victim):
                continue   # its hello was waiting to be read: not silent after all
            self.log(victim.source, "evicted", f"dropped a connection from {victim.address} "
                     "that had not proved the token, to make room for a newer one")
            self._refuse(victim, "evicted")
        self._places.admit(pending, pending.source)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._selector.register(sock, selectors.EVENT_READ, pending)

    def _refuse_newcomer(self, pending: _Pending) -> None:
        """No room: every place it could take has a token proof being checked, at its own
        address ("busy") or, the door full, anywhere ("overloaded")."""
        if self._places.at_source_limit(pending.source):
            self.log(pending.source, "busy", f"refused a connection from {pending.address}: "
                     "every place its address may hold has a token proof being checked")
            code = "busy"
        else:
            self.log(pending.source, "overloaded", f"refused a connection from "
                     f"{pending.address}: every place at the door has a token proof being checked")
            code = "overloaded"
        self._send(pending, plain_frame(REFUSED, reason=code))
        self._close(pending)

    def _spoke(self, pending: _Pending) -> bool:
        """Read what a silent connection has sent and not been read yet (its hello, when a
        burst of connections came first): whether it moved on or ended."""
        if self._places.stage(pending) != SILENT:
            return False
        self._readable(pending)
        return pending not in self._places or self._places.stage(pending) != SILENT

    def _expire(self) -> None:
        now = self._clock()
        if self._accept_again and now >= self._accept_again:
            self._accept_again = 0.0
            self._selector.register(self._listener, selectors.EVENT_READ, _LISTENER)
        for pending in [p for p in self._places if p.deadline <= now
                        and self._places.stage(p) < CHECKING]:
            self._end(pending, "slow")

    # -- the handshake -----------------------------------------------------------------------

    def _readable(self, pending: _Pending) -> None:
        if pending not in self._places:
            return   # dropped earlier in the same round of events
        try:
            data = pending.sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._end(pending, "closed", tell=False)
            return
        pending.inbox += data
        try:
            while pending in self._places and self._places.stage(pending) < CHECKING:
                message = self._next_message(pending)
                if message is None:
                    return
                self._step(pending, message)
        except PeerError:
            self._end(pending, "malformed")

    @staticmethod
    def _next_message(pending: _Pending) -> dict | None:
        """The next whole frame's message, None until it has all arrived."""
        if len(pending.inbox) < HEADER.size:
            return None
        length = frame_length(bytes(pending.inbox[:HEADER.size]), "client")
        if length > MAX_HANDSHAKE_FRAME:
            raise PeerError("a handshake frame over its size", "")
        if len(pending.inbox) < HEADER.size + length:
            return None
        body = bytes(pending.inbox[HEADER.size:HEADER.size + length])
        del pending.inbox[:HEADER.size + length]
        return parse_message(body, "client")

    def _step(self, pending: _Pending, message: dict) -> None:
        stage = self._places.stage(pending)
        if stage == SILENT and message["type"] == HELLO:
            pending.bits = self._puzzle_bits()
            pending.handshake = ServerHandshake(self._secret, message, pending.bits)
            pending.deadline = pending.accepted + PRE_AUTH_S + (1 << pending.bits) * SLOW_TRY_S
            self._places.advance(pending, CHALLENGED)
            if not self._send(pending, plain_frame(CHALLENGE, **pending.handshake.challenge())):
                self._end(pending, "closed", tell=False)
        elif stage == CHALLENGED and message["type"] == AUTH:
            if not pending.handshake.read_auth(message):
                self._end(pending, "puzzle")
                return
            self._places.advance(pending, CHECKING)
            self._selector.unregister(pending.sock)   # nothing more is due from it
            if self._secret.stretches:
                refused = self._proofs.put(pending, pending.source, pending.bits)
                if refused is not None:
                    self._drop_unchecked(refused, "room")
            else:
                self._checked.put((pending, self._outcome(pending)))
        else:
            raise PeerError("a message out of order", "")

    def _puzzle_bits(self) -> int:
        """The work to ask of a newcomer, by the load; a change is logged (once a minute).
        The connections asked the quiet puzzle that have not answered yet count against the
        free checks like the cheap proofs waiting: a free check is promised once."""
        free_left, cheap, waiting, least_paid = self._proofs.load()
        promised = sum(1 for pending in self._places if self._places.stage(pending) == CHALLENGED
                       and pending.bits < self._proofs.paid_bits)
        bits = puzzle_bits(self._secret.puzzle_bits, free_left, cheap + promised, waiting,
                           self._checker_count, least_paid)
        if bits != self._asked_bits:
            self._asked_bits = bits
            self.log("the puzzle", "puzzle", f"asking {bits} bits of work of new connections: "
                     f"{waiting} token proof(s) waiting for a checker, {int(free_left)} free "
                     "check(s) left")
        return bits

    def _drop_waited_out(self) -> None:
        for pending in self._proofs.expired():
            self._drop_unchecked(pending, "waited")

    def _drop_unchecked(self, pending: _Pending, why: str) -> None:
        """A proof the door will not check: the client is told, and tries again."""
        self.log(pending.source, "overloaded", f"dropped a token proof from {pending.address} "
                 f"unchecked ({pending.bits} bits of work): {UNCHECKED[why]}")
        self._refuse(pending, "overloaded")

    @staticmethod
    def _outcome(pending: _Pending):
        """The handshake's keys, or the WrongToken; a scrypt under a token."""
        try:
            return pending.handshake.check_proof()
        except WrongToken as error:
            return error

    def _check_proofs(self) -> None:
        """A checking thread: the next proof the queue hands out, until closed."""
        while (pending := self._proofs.get()) is not None:
            if peek(pending.sock) == b"":
                outcome = None   # gave up waiting: no scrypt for it
            else:
                outcome = self._outcome(pending)
            self._checked.put((pending, outcome))
            self._wake()

    def _finish_checked(self) -> None:
        while True:
            try:
                pending, outcome = self._checked.get_nowait()
            except queue.Empty:
                return
            if pending not in self._places:
                continue
            if outcome is None:
                self._end(pending, "closed", tell=False)
            elif isinstance(outcome, WrongToken):
                self.log(pending.source, "wrong token",
                         f"a client at {pending.address} presented the wrong token")
                self._refuse(pending, "token")
            else:
                self._welcome(pending, *outcome)

    def _welcome(self, pending: _Pending, welcome: dict, send_key: bytes,
                 receive_key: bytes) -> None:
        self._forget(pending)
        if not self._send(pending, plain_frame(WELCOME, **welcome)):
            pending.sock.close()
            return
        pending.sock.setblocking(True)
        channel = Channel(pending.sock, PRE_AUTH_S, peer=f"client {pending.address}")
        channel.seal(send_key=send_key, receive_key=receive_key)
        try:
            self._on_authenticated(channel, pending.address)
        except Exception as error:   # a bug, or no thread to be had: not the door's end
            self.log(pending.source, "handoff", f"a client at {pending.address} proved the "
                     f"token but could not be served: {error!r}")
            channel.close()

    # -- ending a connection ---------------------------------------------------------------

    def _end(self, pending: _Pending, why: str, tell: bool = True) -> None:
        self.log(pending.source, "unauthenticated", f"a connection from {pending.address} "
                 f"ended before it proved the token: {ENDED[why]}")
        if tell:
            self._refuse(pending, why)
        else:
            self._close(pending)

    def _refuse(self, pending: _Pending, code: str) -> None:
        """Tell the client why (best effort: never waiting on it), then close."""
        self._send(pending, plain_frame(REFUSED, reason=code))
        self._close(pending)

    @staticmethod
    def _send(pending: _Pending, data: bytes) -> bool:
        """All of a small frame at once, or False: a socket that cannot take a few hundred
        bytes at once is not a client worth waiting for."""
        try:
            return pending.sock.send(data) == len(data)
        except OSError:
            return False

    def _forget(self, pending: _Pending) -> None:
        self._places.release(pending)
        try:
            self._selector.unregister(pending.sock)
        except (KeyError, ValueError):
            pass   # not registered (being checked) or already closed

    def _close(self, pending: _Pending) -> None:
        """Close without a reset: what the client sent is read first, so our refusal
        reaches it before the end of the stream does."""
        self._forget(pending)
        try:
            pending.sock.setblocking(False)
            while pending.sock.recv(65536):
                pass
        except OSError:
            pass
        pending.sock.close()

    def _shut_down(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
        self._proofs.close()
        for pending in self._places:
            self._refuse(pending, "closing")
        try:
            self._listener.close()
        finally:
            self._selector.close()
            self._wake_read.close()
            self._wake_write.close()
        for checker in self._checkers:
            if checker.is_alive():
                checker.join(PRE_AUTH_S)
