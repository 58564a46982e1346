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

Checking a proof costs a scrypt; :class:`FairQueue` hands the proofs that solved the
puzzle to the checking threads one source at a time, in turn, so a source flooding proofs
delays others by at most one proof each.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import threading

from gdrprobe.rdma.verbs import gid_ip_address   # an IPv4-mapped IPv6 address, unmapped

PER_SOURCE = 8
MAX_PENDING = 256
IPV6_SOURCE_PREFIX = 64

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
        for source in sorted(self._by_source, key=lambda s: -len(self._by_source[s])):
            victim = self._least_shown(self._by_source[source])
            if victim is not None:
                return victim
        return None


class FairQueue:
    """Work by source, handed out one source at a time in turn; thread-safe. get() waits,
    and returns None once the queue is closed."""

    def __init__(self):
        self._queues: collections.OrderedDict[str, collections.deque] = \
            collections.OrderedDict()
        self._ready = threading.Condition()
        self._closed = False

    def put(self, source: str, item) -> None:
        with self._ready:
            self._queues.setdefault(source, collections.deque()).append(item)
            self._ready.notify()

    def get(self):
        with self._ready:
            while not self._queues and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            source, items = self._queues.popitem(last=False)
            item = items.popleft()
            if items:
                self._queues[source] = items    # to the back of the line
            return item

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
