"""Who gets a place at a server's door, and whose token proof is checked next.

The door (door.py) holds every connection that has not proved the token yet. A source is
an IPv4 address or an IPv6 /64 (what one host commonly holds), and the rules are:

- at most ``PER_SOURCE`` unproved connections per source and ``MAX_PENDING`` in all, so
  strangers need more than ``MAX_PENDING // PER_SOURCE`` addresses to fill the door;
- a newcomer is never refused for room while someone has shown less than it may: when its
  source (or the door) is full, the connection that has shown least makes room, from the
  newcomer's own source, or else from the source that holds most: first one that has sent
  nothing yet, then one that said hello but has not answered the challenge, the oldest
  first. A connection whose proof is being checked has done the puzzle and keeps its
  place; a newcomer whose source has nothing else to give up is refused ("busy").

So idle connections, from any number of addresses, never keep out a client that speaks:
a client from another address always gets in, and so does one from the strangers' own
address (a NAT, a shared login node), whose hello puts it ahead of every silent one.

Checking a proof costs a scrypt, so the cost falls on whoever sends it (SECURITY.md states
the bound, benchmarks/door_flood.py measures it):

- the puzzle asked of a new connection rises with the load (:func:`puzzle_bits`): the quiet
  bits only while no paid proof waits and the free checks (:class:`FreeChecks`: a burst of
  scrypts for proofs worked for less, refilled a few a second, and once drained only after
  a pause) cover every proof waiting; else at least the paid bits, whose work costs the
  stranger's CPU more than the scrypt costs the server's, a bit more per doubling of the
  proofs waiting for a checker, and never less than the least worked paid proof waiting: a
  newcomer's proof is never of a lower class than those it waits with;
- :class:`ProofQueue` holds the proofs that solved their puzzle, at most a few, each for at
  most ``PROOF_WAIT_S``; a newcomer into a full queue takes the place of the least proven
  waiting (fewest bits, then from the source holding most, then the oldest) only when it
  carries more work, and a proof past its wait is dropped unchecked; the checkers take the
  most proven first, a source at a time in turn, and a proof worked for less than the paid
  bits with a free check, in turn with the paid ones (paid proofs never starve it).
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import threading
import time

from gdrprobe.protocol.handshake import MAX_PUZZLE_BITS, PAID_PUZZLE_BITS
from gdrprobe.rdma.verbs import gid_ip_address   # an IPv4-mapped IPv6 address, unmapped

PER_SOURCE = 8
MAX_PENDING = 256
IPV6_SOURCE_PREFIX = 64
# Proofs waiting for a checker, at most, and for how long: with two checkers of a scrypt of
# 0.07 s (benchmarks/RESULTS.md), a full queue is checked in a third of a second.
PROOFS_WAITING = 8
PROOF_WAIT_S = 3.0
# Scrypts a server spends on proofs worked for less than PAID_PUZZLE_BITS: a burst, then
# this many a second (0.07 s of CPU each); once drawn down to none, refilled only after
# FREE_REFILL_AFTER_S with none taken: a stranger who keeps drawing on them gets the burst
# (and what refilled while it drew) and then one every FREE_REFILL_AFTER_S + 1 s at most; a
# client that connects more often than once a second for long, or any client during a
# flood, solves the paid puzzle.
FREE_CHECKS = 16
FREE_CHECKS_PER_S = 1.0
FREE_REFILL_AFTER_S = 5.0
SERVED_SOURCES = 4096        # sources whose last turn the proof queue remembers

SILENT, CHALLENGED, CHECKING = 0, 1, 2   # what a pending connection has shown, in order


def source_of(address: str) -> str:
    """The source a peer address counts against: the address (an IPv4 client of a
    dual-stack server as its IPv4 address), an IPv6 one's /64."""
    ip = ipaddress.ip_address(gid_ip_address(address.split("%")[0]) or address)
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/{IPV6_SOURCE_PREFIX}", strict=False))
    return str(ip)


@dataclasses.dataclass
class _Place:
    source: str
    stage: int
    order: int      # admission order: lower is older


class Places:
    """The door's places, by source; pure bookkeeping over opaque connection objects."""

    def __init__(self, per_source: int = PER_SOURCE, total: int = MAX_PENDING):
        self._per_source, self._total = per_source, total
        self._places: dict[object, _Place] = {}
        self._by_source: dict[str, set] = collections.defaultdict(set)
        self._admitted = 0

    def __len__(self) -> int:
        return len(self._places)

    def __contains__(self, conn) -> bool:
        return conn in self._places

    def __iter__(self):
        """The connections holding a place, as a list taken now (the caller may release)."""
        return iter(list(self._places))

    def full_for(self, source: str) -> bool:
        """Whether a newcomer from source needs another connection to make room first."""
        return (len(self._by_source.get(source, ())) >= self._per_source
                or len(self._places) >= self._total)

    def at_source_limit(self, source: str) -> bool:
        """Whether source holds every place one source may (not the door's total)."""
        return len(self._by_source.get(source, ())) >= self._per_source

    def victim(self, source: str) -> object | None:
        """The connection that makes room for a newcomer from source (the door drops it),
        or None when none may: all it could take are proofs being checked."""
        own = self._by_source.get(source, ())
        if len(own) >= self._per_source:
            return self._least_shown(own)
        return self._from_the_largest_source()

    def admit(self, conn, source: str) -> None:
        """A place for conn, which has shown nothing yet (there is room: full_for)."""
        self._admitted += 1
        self._places[conn] = _Place(source, SILENT, self._admitted)
        self._by_source[source].add(conn)

    def advance(self, conn, stage: int) -> None:
        self._places[conn].stage = stage

    def stage(self, conn) -> int:
        return self._places[conn].stage

    def release(self, conn) -> None:
        place = self._places.pop(conn, None)
        if place is not None:
            self._by_source[place.source].discard(conn)
            self._forget_empty(place.source)

    def _forget_empty(self, source: str) -> None:
        if not self._by_source.get(source):
            self._by_source.pop(source, None)

    def _least_shown(self, conns) -> object | None:
        """The connection that has shown least, the oldest first; never one being checked."""
        candidates = [conn for conn in conns if self._places[conn].stage < CHECKING]
        if not candidates:
            return None
        return min(candidates, key=lambda conn: (self._places[conn].stage,
                                                 self._places[conn].order))

    def _from_the_largest_source(self) -> object | None:
        """The least shown connection of the sources that hold most (of all of them where
        several hold as many: a connection that said hello never makes room while one that
        said nothing is there), else of the next largest."""
        by_size = collections.defaultdict(list)
        for conns in self._by_source.values():
            by_size[len(conns)].extend(conns)
        for size in sorted(by_size, reverse=True):
            victim = self._least_shown(by_size[size])
            if victim is not None:
                return victim
        return None


def puzzle_bits(quiet_bits: int, free_left: float, cheap_waiting: int, waiting: int,
                checkers: int, least_paid: int | None = None) -> int:
    """The work asked of a new connection: quiet_bits while no paid proof waits and the
    free checks left cover every proof worked for less that waits, and this one; else
    PAID_PUZZLE_BITS and one bit more per doubling of the proofs waiting past one per
    checker, and at least ``least_paid`` (the least worked paid proof waiting), up to
    MAX_PUZZLE_BITS."""
    if quiet_bits == 0 or least_paid is None and free_left >= cheap_waiting + 1:
        return quiet_bits
    loaded = PAID_PUZZLE_BITS + (waiting // checkers).bit_length()
    return min(max(loaded, least_paid or 0), MAX_PUZZLE_BITS)


class FreeChecks:
    """The scrypts spent on proofs worked for less than the paid bits: `burst` at once,
    refilled at `per_s` a second (a token bucket); once drawn down to none, it refills only
    after `refill_after_s` with none taken: checks drained without a pause do not refill
    while they are drained, and a client that draws on them slower than they refill never
    meets the pause. Not thread-safe: ProofQueue holds it under its lock."""

    def __init__(self, burst: int = FREE_CHECKS, per_s: float = FREE_CHECKS_PER_S,
                 clock=time.monotonic, refill_after_s: float = FREE_REFILL_AFTER_S):
        self._burst, self._per_s, self._clock = burst, per_s, clock
        self._refill_after_s = refill_after_s
        self._left, self._at = float(burst), clock()
        self._drained = float("-inf")    # when a take last left none

    def left(self) -> float:
        now = self._clock()
        refilling = max(self._at, self._drained + self._refill_after_s)
        if now > refilling:
            self._left = min(self._burst, self._left + (now - refilling) * self._per_s)
        self._at = now
        return self._left

    def take(self) -> bool:
        if self.left() < 1:
            return False
        self._left -= 1
        if self._left < 1:
            self._drained = self._at
        return True

    def next_in_s(self) -> float:
        """Seconds until one is left."""
        if self._per_s <= 0:
            return PROOF_WAIT_S
        left = self.left()
        pause = max(0.0, self._drained + self._refill_after_s - self._at)
        return 0.0 if left >= 1 else pause + (1 - left) / self._per_s


@dataclasses.dataclass(eq=False)
class _Proof:
    item: object
    source: str
    bits: int
    queued: float       # by the queue's clock
    order: int


class ProofQueue:
    """Proofs that solved their puzzle, waiting for a checker; thread-safe.

    put() (the door) returns what it refused: None, the newcomer, or the waiting proof it
    pushed out; expired() (the door) returns the proofs past ``wait_s``; get() (a checker)
    waits for the next proof to check and returns None once the queue is closed."""

    def __init__(self, capacity: int = PROOFS_WAITING, wait_s: float = PROOF_WAIT_S,
                 paid_bits: int = PAID_PUZZLE_BITS, free: FreeChecks | None = None,
                 clock=time.monotonic):
        self._capacity, self._wait_s, self._paid_bits = capacity, wait_s, paid_bits
        self._clock = clock
        self._free = free or FreeChecks(clock=clock)
        self._waiting: list[_Proof] = []
        self._served: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._count = 0
        self._cheap_turn = False     # the next check goes to a cheap proof, where one may
        self._ready = threading.Condition()
        self._closed = False

    @property
    def paid_bits(self) -> int:
        return self._paid_bits

    # -- the door's side --------------------------------------------------------------------

    def put(self, item, source: str, bits: int) -> object | None:
        with self._ready:
            self._count += 1
            proof = _Proof(item, source, bits, self._clock(), self._count)
            refused = None
            if len(self._waiting) >= self._capacity:
                least = min(self._waiting, key=self._least_proven)
                if least.bits >= bits:
                    return item                    # it carries no more work than any
                self._waiting.remove(least)
                refused = least.item
            self._waiting.append(proof)
            self._ready.notify()
            return refused

    def expired(self) -> list:
        """The proofs that waited past wait_s, taken out."""
        with self._ready:
            now = self._clock()
            gone = [proof for proof in self._waiting if now - proof.queued >= self._wait_s]
            self._waiting = [proof for proof in self._waiting if proof not in gone]
            return [proof.item for proof in gone]

    def next_deadline(self) -> float | None:
        with self._ready:
            return min((proof.queued + self._wait_s for proof in self._waiting), default=None)

    def load(self) -> tuple[float, int, int, int | None]:
        """(free checks left, proofs waiting worked for less than the paid bits, proofs
        waiting, the bits of the least worked paid proof waiting or None): what puzzle_bits
        weighs."""
        with self._ready:
            cheap = sum(proof.bits < self._paid_bits for proof in self._waiting)
            least_paid = min((proof.bits for proof in self._waiting if proof.bits >= self._paid_bits),
                             default=None)
            return self._free.left(), cheap, len(self._waiting), least_paid

    def _least_proven(self, proof: _Proof):
        """Fewest bits first, then from the source with most waiting, then the oldest."""
        held = sum(other.source == proof.source for other in self._waiting)
        return proof.bits, -held, proof.order

    # -- the checkers' side -----------------------------------------------------------------

    def get(self):
        with self._ready:
            while not self._closed:
                proof = self._next()
                if proof is not None:
                    self._waiting.remove(proof)
                    self._count += 1
                    self._served[proof.source] = self._count
                    self._served.move_to_end(proof.source)
                    while len(self._served) > SERVED_SOURCES:
                        self._served.popitem(last=False)
                    return proof.item
                cheap_only = bool(self._waiting)
                self._ready.wait(self._free.next_in_s() if cheap_only else None)
            return None

    def _next(self) -> _Proof | None:
        """The most proven proof, the source whose last turn is oldest first, then the
        oldest; one worked for less than the paid bits only with a free check, and in turn
        with the paid ones: after a paid proof, a cheap one goes first where one waits and
        a free check is left."""
        paid = [proof for proof in self._waiting if proof.bits >= self._paid_bits]
        cheap = [proof for proof in self._waiting if proof.bits < self._paid_bits]
        take_cheap = bool(cheap) and (self._cheap_turn or not paid) and self._free.take()
        candidates = cheap if take_cheap else paid
        if not candidates:
            return None
        self._cheap_turn = not take_cheap
        return min(candidates, key=lambda proof: (-proof.bits, self._served.get(proof.source, 0),
                                                  proof.order))

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
