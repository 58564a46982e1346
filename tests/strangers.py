"""Strangers for the hostile tests: idle connections to a server from many loopback
addresses (127.0.0.x: Linux routes all of 127/8 to lo), each opened again as soon as the
server cuts it. Bounded in connections and in time, served by one thread."""

from __future__ import annotations

import selectors
import socket
import threading
import time


class Strangers:
    """`per_address` idle connections from each of `addresses` to 127.0.0.1:port, refilled
    when cut, until stop(), `max_connects` connections or `max_s` seconds."""

    def __init__(self, port: int, addresses: list[str], per_address: int,
                 max_connects: int = 5000, max_s: float = 120.0):
        self.port, self.addresses, self.per_address = port, addresses, per_address
        self.max_connects, self.max_s = max_connects, max_s
        self.connects = self.cut = 0
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="strangers")

    def __enter__(self) -> Strangers:
        for address in self.addresses:
            for _ in range(self.per_address):
                self._connect(address)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(30)
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()

    def wait_until_cut(self, timeout_s: float = 30.0) -> int:
        """How many were cut, once one has been (the server's cut reaches this thread a
        moment after the client it made room for was served), or timeout_s has passed."""
        deadline = time.monotonic() + timeout_s
        while self.cut == 0 and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.05)
        return self.cut

    def _connect(self, address: str) -> None:
        if self.connects >= self.max_connects:
            return
        self.connects += 1
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                            source_address=(address, 0))
        except OSError:
            return   # refused or out of descriptors: counted, not retried at once
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ, address)

    def _run(self) -> None:
        ends = time.monotonic() + self.max_s
        while not self._stop.is_set() and time.monotonic() < ends:
            for key, _ in self._selector.select(0.2):
                try:
                    data = key.fileobj.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    continue   # the server's refusal; its end of stream follows
                self._selector.unregister(key.fileobj)
                key.fileobj.close()
                self.cut += 1
                self._connect(key.data)
