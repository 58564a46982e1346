"""The door's places and the order of proof checks (pure logic): a few addresses cannot
fill the door, idle connections make room for ones that speak, a proof being checked
keeps its place, and a source flooding proofs waits its turn like every other."""

import threading

import pytest

from gdrprobe.protocol.admission import (CHALLENGED, CHECKING, MAX_PENDING, PER_SOURCE,
                                         FairQueue, Places, source_of)


class Conn:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return self.name


def admit(places: Places, conn: Conn, source: str) -> tuple[bool, list[Conn]]:
    """What the door does with a newcomer (less reading a silent victim's late hello):
    (admitted, the connections dropped to make room for it)."""
    dropped = []
    while places.full_for(source):
        victim = places.victim(source)
        if victim is None:
            return False, dropped
        places.release(victim)
        dropped.append(victim)
    places.admit(conn, source)
    return True, dropped


def fill(places: Places, source: str, count: int, stage: int | None = None) -> list[Conn]:
    conns = []
    for i in range(count):
        conn = Conn(f"{source}#{i}")
        admitted, dropped = admit(places, conn, source)
        assert admitted and dropped == []
        if stage is not None:
            places.advance(conn, stage)
        conns.append(conn)
    return conns


def test_a_few_addresses_cannot_fill_the_door():
    places = Places()
    for host in range(16):
        fill(places, f"127.0.0.{host + 1}", PER_SOURCE)
    assert len(places) == 16 * PER_SOURCE < MAX_PENDING
    admitted, dropped = admit(places, Conn("client"), "10.0.0.9")
    assert admitted and dropped == []


def test_a_newcomer_at_a_full_source_takes_the_place_of_its_oldest_silent_one():
    places = Places(per_source=3)
    first, second, third = fill(places, "10.0.0.9", 3)
    places.advance(first, CHALLENGED)                   # said hello: shown more
    admitted, dropped = admit(places, Conn("client"), "10.0.0.9")
    assert admitted and dropped == [second]             # silent, and older than third


def test_a_client_that_said_hello_outlasts_every_silent_stranger_of_its_address():
    places = Places(per_source=4)
    fill(places, "10.0.0.9", 4)
    client = Conn("client")
    assert admit(places, client, "10.0.0.9")[0]
    places.advance(client, CHALLENGED)
    for i in range(100):                                # strangers refilling, idle
        admitted, dropped = admit(places, Conn(f"refill#{i}"), "10.0.0.9")
        assert admitted and client not in dropped
    assert places.stage(client) == CHALLENGED


def test_a_proof_being_checked_keeps_its_place_and_a_newcomer_is_refused_instead():
    places = Places(per_source=2)
    fill(places, "10.0.0.9", 2, stage=CHECKING)
    assert admit(places, Conn("newcomer"), "10.0.0.9") == (False, [])
    assert admit(places, Conn("other"), "10.0.0.8")[0]


def test_a_full_door_takes_room_from_the_source_that_holds_most():
    places = Places(per_source=8, total=10)
    big = fill(places, "10.0.0.1", 6)
    fill(places, "10.0.0.2", 4)
    admitted, dropped = admit(places, Conn("client"), "10.0.0.3")
    assert admitted and dropped == [big[0]]


def test_a_full_door_of_proofs_being_checked_refuses_a_newcomer():
    places = Places(per_source=4, total=4)
    fill(places, "10.0.0.1", 4, stage=CHECKING)
    assert admit(places, Conn("client"), "10.0.0.3") == (False, [])


def test_released_places_are_free_again():
    places = Places(per_source=1)
    (conn,) = fill(places, "10.0.0.9", 1, stage=CHECKING)
    places.release(conn)
    assert admit(places, Conn("next"), "10.0.0.9") == (True, [])
    assert len(places) == 1


@pytest.mark.parametrize("address, source", [
    ("10.0.0.9", "10.0.0.9"),
    ("::ffff:10.0.0.9", "10.0.0.9"),                   # an IPv4 client of a dual-stack server
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),     # one host's share of a network
    ("2001:db8:1:2:bbbb::7", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
])
def test_a_source_is_an_address_or_an_ipv6_64(address, source):
    assert source_of(address) == source


def test_proofs_are_checked_one_source_at_a_time_in_turn():
    queue = FairQueue()
    for i in range(5):
        queue.put("flood", f"flood#{i}")
    queue.put("client", "client#0")
    assert [queue.get() for _ in range(3)] == ["flood#0", "client#0", "flood#1"]


def test_a_closed_queue_ends_its_waiting_checkers():
    queue = FairQueue()
    got = []
    waiting = threading.Thread(target=lambda: got.append(queue.get()))
    waiting.start()
    queue.close()
    waiting.join(5)
    assert got == [None]
