"""The server's NIC, taken by one authenticated client's run at a time, in arrival order."""

from __future__ import annotations

import contextlib
import threading
import time


class NicQueue:
    """Authenticated clients take the server's NIC one at a time, in arrival order."""

    def __init__(self):
        self._cond = threading.Condition()
        self._queue: list[int] = []   # tickets; the first holds the NIC
        self._tickets = 0
        self._holder = ("", 0.0)      # who holds it, since when (monotonic)

    @contextlib.contextmanager
    def turn(self, source: str, heartbeat_s: float, on_wait):
        """Hold the NIC inside the block. While others hold it, on_wait(position, holder
        source, seconds held) runs every heartbeat_s (and may raise to give up)."""
        with self._cond:
            ticket = self._tickets
            self._tickets += 1
            self._queue.append(ticket)
        try:
            while True:
                with self._cond:
                    if self._queue[0] == ticket:
                        self._holder = (source, time.monotonic())
                        break
                    position = self._queue.index(ticket)
                    holder, since = self._holder
                on_wait(position, holder, time.monotonic() - since)
                with self._cond:
                    if self._queue[0] != ticket:
                        self._cond.wait(heartbeat_s)
            yield
        finally:
            with self._cond:
                self._queue.remove(ticket)
                self._cond.notify_all()
