"""Strangers for the hostile tests and benchmarks, from many loopback addresses (127.0.0.x:
Linux routes all of 127/8 to lo), bounded in connections and in time:

- :class:`Strangers`: idle connections, each opened again as soon as the server cuts it,
  served by one thread;
- :class:`ProofFlood`: strangers that solve the server's puzzle, whatever it asks, and send
  a random proof, again as soon as they are refused, a thread per address.
"""

from __future__ import annotations

import collections
import itertools
import secrets
import selectors
import socket
import threading
import time

from gdrprobe.errors import PeerError
from gdrprobe.protocol import handshake as hs
from gdrprobe.protocol.channel import Channel


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


class ProofFlood:
    """`workers` threads (one per address unless told), each going round its share of
    `addresses`, one connection at a time: hello, the puzzle the challenge asks solved, a
    random proof, the refusal read; again at once. Until stop(), `max_proofs` proofs in all
    or `max_s` seconds. Records the bits each challenge asked, the refusal codes, and the
    CPU its threads spent (time.thread_time). Python solves on one core a process, so a
    benchmark runs a flood per core with a few workers each: more threads than that only
    share the core and miss the server's deadline. ``solve`` replaces the Python solver (a
    native one that lets go of the GIL: benchmarks/door_flood.py), ``pause_s`` is a worker's
    pause after each refusal, and ``in_flight`` counts the proofs sent and not yet answered."""

    def __init__(self, port: int, addresses: list[str], max_proofs: int = 2000,
                 max_s: float = 60.0, workers: int | None = None, solve=None,
                 pause_s: float = 0.0):
        self.port, self.addresses = port, addresses
        self.max_proofs, self.max_s = max_proofs, max_s
        self._solve, self._pause_s = solve or hs.solve_puzzle, pause_s
        self.in_flight = 0
        self.bits: list[int] = []
        self.refusals: collections.Counter = collections.Counter()
        self.cpu_s = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        workers = min(workers or len(addresses), len(addresses))
        self._threads = [threading.Thread(target=self._run, args=(addresses[worker::workers],),
                                          daemon=True, name=f"proof-flood-{worker}")
                         for worker in range(workers)]

    def __enter__(self) -> ProofFlood:
        self._ends = time.monotonic() + self.max_s
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def wait_for(self, bits: int, proofs: int, timeout_s: float = 30.0) -> int:
        """The most bits a challenge asked, once one asked `bits` and `proofs` proofs were
        sent, or timeout_s has passed."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (max(self.bits, default=0) < bits
                                               or len(self.bits) < proofs):
            time.sleep(0.05)
        return max(self.bits, default=0)

    def _going(self) -> bool:
        return (not self._stop.is_set() and time.monotonic() < self._ends
                and len(self.bits) < self.max_proofs)

    def _run(self, addresses: list[str]) -> None:
        started = time.thread_time()
        try:
            for turn in itertools.count():
                if not self._going():
                    break
                try:
                    self._one(addresses[turn % len(addresses)])
                    time.sleep(self._pause_s)
                except (OSError, PeerError):
                    time.sleep(0.01)      # refused at accept, or cut: counted, tried again
        finally:
            with self._lock:
                self.cpu_s += time.thread_time() - started

    def _one(self, address: str) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10,
                                        source_address=(address, 0))
        channel = Channel(sock, 10.0, peer="server")
        try:
            mine = secrets.token_bytes(hs.NONCE_BYTES)
            channel.send(hs.HELLO, nonce=mine.hex())
            challenge = channel.receive(hs.CHALLENGE, hs.REFUSED)
            if challenge["type"] == hs.REFUSED:
                self._refused(challenge)
                return
            bits = challenge["puzzle_bits"]
            solution = self._solve(bits, mine, bytes.fromhex(challenge["nonce"]))
            with self._lock:
                self.bits.append(bits)
                self.in_flight += 1
            try:
                channel.send(hs.AUTH, solution=solution.hex(), proof=secrets.token_hex(hs.PROOF_BYTES))
                self._refused(channel.receive(hs.REFUSED))
            finally:
                with self._lock:
                    self.in_flight -= 1
        finally:
            channel.close()

    def _refused(self, message: dict) -> None:
        with self._lock:
            self.refusals[str(message.get("reason"))] += 1
