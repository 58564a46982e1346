"""The server's NIC queue: one holder at a time, in order; a waiting client hears its place
every heartbeat and may give up."""

import threading
import time

import pytest

from gdrprobe.errors import PeerError
from gdrprobe.measure.nic_queue import NicQueue


def test_clients_take_the_nic_in_order_and_waiters_hear_their_place():
    queue, order, heard = NicQueue(), [], []
    first_in, release = threading.Event(), threading.Event()

    def first():
        with queue.turn("10.0.0.1", 0.05, lambda *a: None):
            order.append("first")
            first_in.set()
            release.wait(5)

    def second():
        first_in.wait(5)
        with queue.turn("10.0.0.2", 0.05, lambda *place: heard.append(place)):
            order.append("second")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    first_in.wait(5)
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        threading.Event().wait(0.01)
    release.set()
    for thread in threads:
        thread.join(5)
    assert order == ["first", "second"]
    position, holder, held_s = heard[0]
    assert (position, holder) == (1, "10.0.0.1") and held_s >= 0


def test_a_waiter_that_gives_up_leaves_the_queue():
    queue = NicQueue()
    holding, done = threading.Event(), threading.Event()

    def holder():
        with queue.turn("a", 0.05, lambda *a: None):
            holding.set()
            done.wait(5)

    thread = threading.Thread(target=holder)
    thread.start()
    holding.wait(5)

    def leave(*place):
        raise PeerError("the client left the queue", "")

    with pytest.raises(PeerError):
        with queue.turn("b", 0.05, leave):
            pass
    done.set()
    thread.join(5)
    with queue.turn("c", 0.05, leave):   # nobody ahead: no wait, no message
        pass
