"""A server's log: never a reason to stop serving, never flooded by strangers.

- :class:`LineLog` writes whole lines from one thread of its own, so no caller waits on
  the stream (stderr under ``serve | less``, or a paused terminal) and lines never
  interleave; when nobody reads the stream, lines beyond a bounded queue are dropped,
  counted, and the count is logged once the stream moves again.
- :class:`BurstLog` logs a line per source and kind at most once per window, with the
  count of what it left out, so a flood of strangers cannot flood the log.
"""

from __future__ import annotations

import collections
import sys
import threading
import time

QUEUE_LINES = 1000
FLUSH_ON_CLOSE_S = 1.0
BURST_WINDOW_S = 60.0
MAX_SOURCES_TRACKED = 4096   # bounds the memory a spoofing flood can make the server use


class LineLog:
    """log(text): one line, queued for the writer thread; never waits."""

    def __init__(self, stream=None, capacity: int = QUEUE_LINES):
        self._stream = stream                # None: sys.stderr when writing
        self._capacity = capacity
        self._lines: collections.deque[str] = collections.deque()
        self._dropped = 0
        self._closed = False
        self._broken = False                 # the stream refused a write: nobody reads it
        self._changed = threading.Condition()
        self._writer: threading.Thread | None = None

    def __call__(self, text: str) -> None:
        line = " ".join(text.splitlines())   # one line, whatever the text holds
        with self._changed:
            if self._closed or self._broken or len(self._lines) >= self._capacity:
                self._dropped += 1
                return
            self._lines.append(line)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_lines, daemon=True,
                                                name="gdrprobe-log")
                self._writer.start()
            self._changed.notify()

    @property
    def dropped(self) -> int:
        """Lines dropped and not yet reported in the log."""
        with self._changed:
            return self._dropped

    def _write_lines(self) -> None:
        while True:
            with self._changed:
                while not self._lines and not self._closed:
                    self._changed.wait()
                if not self._lines:
                    return
                batch, self._lines = list(self._lines), collections.deque()
                dropped, self._dropped = self._dropped, 0
            if dropped:
                # Dropped while these lines filled the queue: they come after them.
                batch.append(f"gdrprobe serve: {dropped} log lines dropped: nobody was "
                             "reading this log")
            try:
                stream = self._stream or sys.stderr
                stream.write("".join(line + "\n" for line in batch))
                stream.flush()
            except (OSError, ValueError):
                with self._changed:
                    self._broken = True
                    self._lines.clear()
                return

    def close(self, timeout_s: float = FLUSH_ON_CLOSE_S) -> None:
        """Write what is queued, waiting at most timeout_s for a stream nobody reads."""
        with self._changed:
            self._closed = True
            self._changed.notify()
            writer = self._writer
        if writer is not None:
            writer.join(timeout_s)


class BurstLog:
    """Log a line per (source, kind) at most once per window, counting the rest."""

    def __init__(self, log, window_s: float = BURST_WINDOW_S, clock=time.monotonic):
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
        self._log(f"{text}{more}; the next such line about {source} comes in "
                  f"{self._window_s:g} s at the earliest")


def _bounded_put(table: dict, key, value) -> None:
    """Insert, dropping the oldest entry when the table is full."""
    table.pop(key, None)
    if len(table) >= MAX_SOURCES_TRACKED:
        table.pop(next(iter(table)))
    table[key] = value
