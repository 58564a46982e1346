"""The handshake: four plain messages that prove, in both directions, that each end knows
the run's token without sending it, and then seal the channel.

1. client -> ``hello``: a fresh 32-byte nonce.
2. server -> ``challenge``: its own fresh nonce and the bits of a work puzzle.
3. client -> ``auth``: a solution of the puzzle and its proof, an HMAC over both nonces
   under the token stretched with scrypt under this handshake's salt.
4. server -> ``welcome``: its own proof, shown only to a client that has proved the token;
   or ``refused``, with one of the codes in :data:`REFUSALS`.

The salt is drawn from both nonces, so it is fresh for every handshake and neither end
can fix it: a guess at the token tested offline against one captured handshake says
nothing about any other. The server stretches the token again for every handshake (one
scrypt), and the puzzle makes a stranger pay first: a SHA-256 over both nonces and the
solution must start with ``puzzle_bits`` zero bits, which costs the client 2^bits hashes on
average and the server one. A server whose key is random (loopback) stretches nothing and
asks for no work.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

from gdrprobe.errors import PeerError
from gdrprobe.protocol.channel import SAME_VERSION_FIX, TOKEN_FIX, Channel
from gdrprobe.protocol.fields import field

NONCE_BYTES = 32
SALT_BYTES = 16
PROOF_BYTES = 32             # HMAC-SHA256
KEY_BYTES = 32
SOLUTION_BYTES = 8
# The token stretch: scrypt (RFC 7914) with N=2^15, r=8, p=1 needs 128*r*N = 32 MiB and
# about 0.15 s per derivation on a current x86 core, so each guess at a token from a
# captured handshake costs the same (a plain HMAC costs about a microsecond). The
# parameters are fixed by the protocol version, never negotiated: no peer can lower them.
# OpenSSL refuses over 32 MiB unless maxmem says more.
KDF_N, KDF_R, KDF_P = 1 << 15, 8, 1
KDF_MAXMEM = 64 << 20
# The puzzle, asked before a server spends a scrypt on a stranger: 2^bits SHA-256 on
# average. Quiet, PUZZLE_BITS: 2^14, about 4 ms of this client's Python (0.27 us a try,
# an AMD EPYC with SHA-NI) and half a second in the emulated lab (24 us a try). Under load
# (admission.puzzle_bits) at least PAID_PUZZLE_BITS: 2^21 tries cost a native solver that
# hashes from the state of the puzzle's first block (one SHA-256 compression a try, 0.076 us
# with SHA-NI) 0.16 s of one core, and this client 0.5 s, against 0.069 s for the scrypt that
# checks the proof on the same core (benchmarks/RESULTS.md): a stranger pays more than twice
# the CPU of the server it makes check. Up to MAX_PUZZLE_BITS (2^22: 1.1 s here) as proofs
# pile up; a client refuses to work for more (a fake server cannot make it spin).
PUZZLE_BITS = 14
PAID_PUZZLE_BITS = 21
MAX_PUZZLE_BITS = 22
HELLO, CHALLENGE, AUTH, WELCOME, REFUSED = "hello", "challenge", "auth", "welcome", "refused"
REFUSAL_WAIT_S = 1.0           # for the refusal of a server that hung up as we sent
RETRY_FIX = "try again; the server keeps serving"
FLOOD_FIX = ("try again (the client does, after a pause); if it keeps happening, the server "
             "is flooded with connections: find what connects to its port")
TRANSIENT_REFUSALS = ("evicted", "busy", "overloaded")   # a flood at the door: worth another try
# What a refused client is told, by code: the server sends only the code, unauthenticated,
# and the client shows its own text for it, never the server's.
REFUSALS = {
    "token": ("the token did not match the server's", TOKEN_FIX),
    "evicted": ("it dropped this connection, which had not proved the token yet, to make "
                "room for newer ones from the same address (or for a flood from many)",
                "try again; if it keeps happening, something at this client's address (a "
                "NAT, a shared login node) holds many connections to the server: find it, "
                "or run from another address"),
    "busy": ("it is already checking as many token proofs from this address as it takes",
             RETRY_FIX),
    "overloaded": ("it dropped this connection's token proof unchecked: more proofs, from any "
                   "address, were waiting for its checkers than it keeps, and this one carried "
                   "the least work or had waited longest", FLOOD_FIX),
    "slow": ("this client did not finish the handshake within the server's deadline",
             "check the load on this host and the network path to the server"),
    "puzzle": ("the work this client sent did not solve the server's puzzle",
               SAME_VERSION_FIX),
    "malformed": ("it could not read this client's handshake",
                  SAME_VERSION_FIX),
    "closing": ("it is shutting down", "start the server again"),
}


class WrongToken(PeerError):
    """A client's proof did not match: one online guess at the token."""


class Refused(PeerError):
    """The server refused the connection before the token was proved; code says why, and
    transient whether another try may go better (a flood at the door)."""

    def __init__(self, cause: str, fix: str, code: str, transient: bool | None = None):
        super().__init__(cause, fix)
        self.code = code
        self.transient = code in TRANSIENT_REFUSALS if transient is None else transient


def stretch(token: str, salt: bytes) -> bytes:
    """The key both ends derive from the token under one handshake's salt."""
    return hashlib.scrypt(token.encode(), salt=salt, n=KDF_N, r=KDF_R, p=KDF_P,
                          maxmem=KDF_MAXMEM, dklen=KEY_BYTES)


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def handshake_salt(client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hashlib.sha256(b"gdrprobe-4 salt" + client_nonce + server_nonce).digest()[:SALT_BYTES]


def proof(key: bytes, role: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _mac(key, b"gdrprobe-4 proof ", role, client_nonce, server_nonce)


def direction_keys(key: bytes, client_nonce: bytes, server_nonce: bytes) -> tuple[bytes, bytes]:
    """(client-to-server key, server-to-client key): one per direction, so a frame can
    never be reflected back to its sender."""
    return (_mac(key, b"gdrprobe-4 c2s", client_nonce, server_nonce),
            _mac(key, b"gdrprobe-4 s2c", client_nonce, server_nonce))


def puzzle_input(client_nonce: bytes, server_nonce: bytes) -> bytes:
    """What the puzzle hashes before the solution (81 bytes: one whole SHA-256 block, whose
    state a solver computes once, and 17 bytes of the next)."""
    return b"gdrprobe-4 puzzle" + client_nonce + server_nonce


def _puzzle_hash(client_nonce: bytes, server_nonce: bytes):
    return hashlib.sha256(puzzle_input(client_nonce, server_nonce))


def _leading_zero_bits(digest: bytes, bits: int) -> bool:
    """Whether the digest starts with `bits` zero bits (at most 32)."""
    return bits == 0 or int.from_bytes(digest[:4], "big") >> (32 - bits) == 0


def solve_puzzle(bits: int, client_nonce: bytes, server_nonce: bytes) -> bytes:
    """The first counter whose hash starts with `bits` zero bits."""
    prefix = _puzzle_hash(client_nonce, server_nonce)
    counter = 0
    while True:
        solution = counter.to_bytes(SOLUTION_BYTES, "big")
        attempt = prefix.copy()
        attempt.update(solution)
        if _leading_zero_bits(attempt.digest(), bits):
            return solution
        counter += 1


def puzzle_solved(bits: int, client_nonce: bytes, server_nonce: bytes, solution: bytes) -> bool:
    attempt = _puzzle_hash(client_nonce, server_nonce)
    attempt.update(solution)
    return _leading_zero_bits(attempt.digest(), bits)


def hex_field(message: dict, name: str, size: int) -> bytes:
    """A hexadecimal field of exactly `size` bytes (nonces, proofs, puzzle solutions)."""
    text = field(message, name, str)
    try:
        value = bytes.fromhex(text)
    except ValueError as error:
        raise PeerError(f"peer field {name!r} is not hexadecimal", SAME_VERSION_FIX) from error
    if len(value) != size:
        raise PeerError(f"peer field {name!r} has the wrong length", SAME_VERSION_FIX)
    return value


class ServerSecret:
    """What a server proves: the token, stretched anew under every handshake's salt, or,
    with no token, 256 random bits for a server whose one client is in its own process
    (loopback) and authenticates with this very object. A random key is beyond guessing
    already, so it is not stretched and asks for no puzzle: that saves a loopback run a
    scrypt (most of a second in the emulated lab) and the work."""

    def __init__(self, token: str | None):
        self._token = token
        self._key = secrets.token_bytes(KEY_BYTES) if token is None else None

    @property
    def stretches(self) -> bool:
        """Whether checking a proof costs a scrypt (and so a stranger must work first)."""
        return self._token is not None

    @property
    def puzzle_bits(self) -> int:
        return PUZZLE_BITS if self.stretches else 0

    def key_for(self, salt: bytes) -> bytes:
        return self._key if self._token is None else stretch(self._token, salt)


def client_key(credential: str | ServerSecret, salt: bytes) -> bytes:
    """The key a client proves: its token stretched under the handshake's salt, or the key
    of the ServerSecret of a server in this process."""
    if isinstance(credential, ServerSecret):
        return credential.key_for(salt)
    return stretch(credential, salt)


def refusal_error(message: dict) -> PeerError:
    """A server's refusal, in this client's own words for its code (the server is not
    authenticated yet, so its text would not be believed or shown)."""
    code = message.get("reason")
    cause, fix = REFUSALS.get(code, ("for a reason this version of gdrprobe does not know",
                                     SAME_VERSION_FIX))
    cause = f"the server refused the connection: {cause}"
    if code == "token":
        return WrongToken(cause, fix)
    return Refused(cause, fix, code if code in REFUSALS else "")


def _reply(channel: Channel, expected: str) -> dict:
    reply = channel.receive(expected, REFUSED)
    if reply["type"] == REFUSED:
        raise refusal_error(reply)
    return reply


def _send(channel: Channel, kind: str, first: bool = False, **fields) -> None:
    """Send (the first message ending its line: Channel.send_line); a server that has hung
    up on us may have said why first."""
    try:
        (channel.send_line if first else channel.send)(kind, **fields)
    except PeerError as error:
        refusal = _refusal_waiting(channel)
        if refusal is None:
            raise
        raise refusal from error


def _refusal_waiting(channel: Channel) -> PeerError | None:
    try:
        return refusal_error(channel.receive(REFUSED, timeout=REFUSAL_WAIT_S))
    except PeerError:
        return None


def authenticate_as_client(channel: Channel, credential: str | ServerSecret,
                           notice=None) -> None:
    """Prove the token first, then check that the server knows it too; then seal.
    notice(text) hears when the server asked for more work than it does when quiet."""
    mine = secrets.token_bytes(NONCE_BYTES)
    _send(channel, HELLO, first=True, nonce=mine.hex())
    challenge = _reply(channel, CHALLENGE)
    theirs = hex_field(challenge, "nonce", NONCE_BYTES)
    bits = field(challenge, "puzzle_bits", int, low=0, high=MAX_PUZZLE_BITS)
    started = time.monotonic()
    solution = solve_puzzle(bits, mine, theirs)
    if bits > PUZZLE_BITS and notice is not None:
        notice(f"the server asked for {bits} bits of work instead of {PUZZLE_BITS}: it raises "
               "them while more token proofs wait to be checked than it checks for free (a "
               f"flood at its door, or many clients at once); solving took "
               f"{time.monotonic() - started:.1f} s")
    took = time.monotonic() - started
    key = client_key(credential, handshake_salt(mine, theirs))
    _send(channel, AUTH, solution=solution.hex(), proof=proof(key, b"client", mine, theirs).hex())
    try:
        welcome = _reply(channel, WELCOME)
    except Refused as refused:
        if refused.code != "slow" or bits <= PUZZLE_BITS:
            raise
        # The deadline passed while this host solved a puzzle a flood had raised: the next
        # try may be asked less, or be quicker.
        raise Refused(f"{refused.cause}: it had asked {bits} bits of work (a flood at its door), "
                      f"which took this host {took:.1f} s", refused.fix, refused.code,
                      transient=True) from None
    if not hmac.compare_digest(hex_field(welcome, "proof", PROOF_BYTES),
                               proof(key, b"server", mine, theirs)):
        raise PeerError("the server's token is not this run's token", TOKEN_FIX)
    to_server, to_client = direction_keys(key, mine, theirs)
    channel.seal(send_key=to_server, receive_key=to_client)


class ServerHandshake:
    """The server's side of one handshake, as steps a caller drives (the server's door
    reads and writes the frames without blocking): challenge, then the cheap checks of the
    auth message, then the proof (a scrypt for a token), then the welcome."""

    def __init__(self, secret: ServerSecret, hello: dict, puzzle_bits: int | None = None):
        self.secret = secret
        self.client_nonce = hex_field(hello, "nonce", NONCE_BYTES)
        self.server_nonce = secrets.token_bytes(NONCE_BYTES)
        self.shown = b""
        # The work this handshake asks: the door's, by its load; else the quiet bits.
        self.puzzle_bits = secret.puzzle_bits if puzzle_bits is None else puzzle_bits

    def challenge(self) -> dict:
        return {"nonce": self.server_nonce.hex(), "puzzle_bits": self.puzzle_bits}

    def read_auth(self, auth: dict) -> bool:
        """Keep the client's proof; False when its work does not solve the puzzle (its
        proof is then not worth a scrypt)."""
        solution = hex_field(auth, "solution", SOLUTION_BYTES)
        self.shown = hex_field(auth, "proof", PROOF_BYTES)
        return puzzle_solved(self.puzzle_bits, self.client_nonce, self.server_nonce, solution)

    def check_proof(self) -> tuple[dict, bytes, bytes]:
        """The welcome's fields and the (send, receive) keys of the sealed channel; raises
        WrongToken. Costs one scrypt when the secret is a token."""
        key = self.secret.key_for(handshake_salt(self.client_nonce, self.server_nonce))
        nonces = (self.client_nonce, self.server_nonce)
        if not hmac.compare_digest(self.shown, proof(key, b"client", *nonces)):
            raise WrongToken("a client presented the wrong token", TOKEN_FIX)
        to_server, to_client = direction_keys(key, *nonces)
        return {"proof": proof(key, b"server", *nonces).hex()}, to_client, to_server
