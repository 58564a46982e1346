"""Loopback sockets, a door serving in a thread, and a client's channel to it."""

import contextlib
import queue
import socket
import threading

from gdrprobe.errors import PeerError
from gdrprobe.protocol.channel import Channel
from gdrprobe.protocol.door import Door

TOKEN = "token-1234567890abcdef"


def tcp_pair():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        left = socket.create_connection(listener.getsockname())
        right, _ = listener.accept()
    return left, right


@contextlib.contextmanager
def serving(secret, **limits):
    """A door on a local port in a thread of its own: (port, the sealed channels it hands
    on, its log)."""
    listener = socket.create_server(("127.0.0.1", 0))
    handed, lines = queue.Queue(), []
    door = Door(listener, secret, lambda channel, address: handed.put(channel), lines.append,
                **limits)
    thread = threading.Thread(target=door.run)
    thread.start()
    try:
        yield listener.getsockname()[1], handed, lines
    finally:
        door.close()
        thread.join(10)
        while not handed.empty():
            handed.get().close()


def connect(port: int, address: str = "127.0.0.1") -> Channel:
    """A client's channel to the door, from one of the loopback addresses."""
    return Channel(socket.create_connection(("127.0.0.1", port), timeout=5.0,
                                            source_address=(address, 0)), 5.0, "server")


def fails(call) -> PeerError | None:
    try:
        call()
    except PeerError as error:
        return error
    return None
