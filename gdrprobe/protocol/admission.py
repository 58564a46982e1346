"""Who may talk to a server, and how much of it gets logged.

A server accepts every connection at once and authenticates each in a thread of its own,
so one stranger cannot make a client wait; these limits keep many strangers from
exhausting threads and sockets, and keep a guesser of the token to a few tries a minute:

- at most ``MAX_CONNECTIONS_PER_SOURCE`` open connections per source address and
  ``MAX_UNAUTHENTICATED`` connections that have not proved the token, in all;
- after ``MAX_FAILED_PROOFS`` wrong proofs from one source within ``FAILED_PROOF_WINDOW_S``,
  that source is refused until the window has passed.

Refusals and failures are logged once per source and burst (then at most once per window,
with the count of what was not logged), so a flood cannot flood the log.
"""

from __future__ import annotations

import collections
import threading
import time

MAX_CONNECTIONS_PER_SOURCE = 16
MAX_UNAUTHENTICATED = 256
MAX_FAILED_PROOFS = 10
FAILED_PROOF_WINDOW_S = 60.0
MAX_SOURCES_TRACKED = 4096   # bounds the memory a spoofing flood can make the server use


class BurstLog:
    """Log a line per (source, kind) at most once per window, counting the rest."""

    def __init__(self, log, window_s: float = FAILED_PROOF_WINDOW_S, clock=time.monotonic):
        self._log, self._window_s, self._clock = log, window_s, clock
        self._quiet_until: dict[tuple[str, str], tuple[float, int]] = {}
        self._lock = threading.Lock()

    def __call__(self, source: str, kind: str, text: str) -> None:
        now = self._clock()
        with self._lock:
            until, suppressed = self._quiet_until.get((source, kind), (0.0, 0))
            if now < until:
                self._quiet_until[(source, kind)] = (until, suppressed + 1)
                return
            _bounded_put(self._quiet_until, (source, kind), (now + self._window_s, 0))
        more = f" ({suppressed} more like it not logged)" if suppressed else ""
        self._log(f"{text}{more}; the next such line from {source} comes in "
                  f"{self._window_s:g} s at the earliest")


def _bounded_put(table: dict, key, value) -> None:
    """Insert, dropping the oldest entry when the table is full."""
    table.pop(key, None)
    if len(table) >= MAX_SOURCES_TRACKED:
        table.pop(next(iter(table)))
    table[key] = value


class Admission:
    """The server's door: counts open and unauthenticated connections per source and wrong
    proofs; thread-safe."""

    def __init__(self, log, clock=time.monotonic, *,
                 per_source: int = MAX_CONNECTIONS_PER_SOURCE,
                 unauthenticated: int = MAX_UNAUTHENTICATED,
                 failed_proofs: int = MAX_FAILED_PROOFS,
                 window_s: float = FAILED_PROOF_WINDOW_S):
        self._clock = clock
        self._per_source, self._max_unauthenticated = per_source, unauthenticated
        self._max_failed, self._window_s = failed_proofs, window_s
        self.log = BurstLog(log, window_s, clock)
        self._open: collections.Counter = collections.Counter()
        self._unauthenticated = 0
        self._failures: dict[str, collections.deque] = {}
        self._lock = threading.Lock()

    def admit(self, source: str) -> bool:
        """True (and counted) when a new connection from source may be served."""
        with self._lock:
            reason = self._refusal(source)
            if reason is None:
                self._open[source] += 1
                self._unauthenticated += 1
        if reason is not None:
            self.log(source, "refused", f"refusing connections from {source}: {reason}")
        return reason is None

    def _refusal(self, source: str) -> str | None:
        failures = self._recent_failures(source)
        if len(failures) >= self._max_failed:
            wait = failures[0] + self._window_s - self._clock()
            return (f"{len(failures)} wrong token proofs within {self._window_s:g} s "
                    f"(refused for {wait:.0f} s more)")
        if self._open[source] >= self._per_source:
            return f"it already holds {self._per_source} connections"
        if self._unauthenticated >= self._max_unauthenticated:
            return f"{self._max_unauthenticated} connections are still unauthenticated"
        return None

    def _recent_failures(self, source: str) -> collections.deque:
        failures = self._failures.get(source, collections.deque())
        horizon = self._clock() - self._window_s
        while failures and failures[0] < horizon:
            failures.popleft()
        if not failures:
            self._failures.pop(source, None)
        return failures

    def authenticated(self, source: str) -> None:
        with self._lock:
            self._unauthenticated -= 1

    def closed(self, source: str, authenticated: bool) -> None:
        with self._lock:
            self._open[source] -= 1
            if self._open[source] <= 0:
                del self._open[source]
            if not authenticated:
                self._unauthenticated -= 1

    def wrong_proof(self, source: str) -> None:
        with self._lock:
            failures = self._recent_failures(source)
            failures.append(self._clock())
            _bounded_put(self._failures, source, failures)
        self.log(source, "wrong token", f"a client at {source} presented the wrong token")
