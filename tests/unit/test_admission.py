"""The door's places, the work it asks and the order of proof checks (pure logic): a few
addresses cannot fill the door, idle connections make room for ones that speak, a proof
being checked keeps its place, a source flooding proofs waits its turn like every other,
the puzzle rises with the proofs waiting and falls back when they are gone, a proof worked
for less than the paid bits costs a free check, and the least proven is dropped first."""

import threading

import pytest

from gdrprobe.protocol.admission import (CHALLENGED, CHECKING, MAX_PENDING, PER_SOURCE,
                                         FreeChecks, Places, ProofQueue, puzzle_bits, source_of)
from gdrprobe.protocol.handshake import MAX_PUZZLE_BITS, PAID_PUZZLE_BITS, PUZZLE_BITS


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


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


def test_a_client_that_said_hello_keeps_its_place_where_every_source_holds_as_many():
    """A door full of single connections from as many addresses: the newcomer's room came
    from the source first filled, the client's that had said hello, while others had said
    nothing (issue 43 item 2)."""
    places = Places(per_source=8, total=4)
    (client,) = fill(places, "client", 1, CHALLENGED)
    strangers = [conn for index in range(3) for conn in fill(places, f"stranger{index}", 1)]
    admitted, dropped = admit(places, Conn("late"), "stranger9")
    assert admitted and dropped == [strangers[0]] and client in places


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


def paid_queue(**kwargs) -> ProofQueue:
    return ProofQueue(paid_bits=PAID_PUZZLE_BITS, **kwargs)


def test_proofs_are_checked_one_source_at_a_time_in_turn():
    queue = paid_queue()
    for i in range(5):
        assert queue.put(f"flood#{i}", "flood", PAID_PUZZLE_BITS) is None
    queue.put("client#0", "client", PAID_PUZZLE_BITS)
    assert [queue.get() for _ in range(3)] == ["flood#0", "client#0", "flood#1"]


def test_a_closed_queue_ends_its_waiting_checkers():
    queue = paid_queue()
    got = []
    waiting = threading.Thread(target=lambda: got.append(queue.get()))
    waiting.start()
    queue.close()
    waiting.join(5)
    assert got == [None]


def test_the_most_proven_proof_is_checked_first():
    queue = paid_queue()
    queue.put("paid", "a", PAID_PUZZLE_BITS)
    queue.put("more", "b", PAID_PUZZLE_BITS + 2)
    assert [queue.get(), queue.get()] == ["more", "paid"]


def test_a_full_queue_drops_the_least_proven_for_a_proof_with_more_work_and_refuses_an_equal_one():
    queue = paid_queue(capacity=3)
    queue.put("a#0", "a", PAID_PUZZLE_BITS)
    queue.put("b#0", "b", PAID_PUZZLE_BITS)
    queue.put("a#1", "a", PAID_PUZZLE_BITS)
    assert queue.put("c#0", "c", PAID_PUZZLE_BITS) == "c#0"        # no more work: refused itself
    # fewest bits, then from the source holding most (a), then the oldest of it
    assert queue.put("d#0", "d", PAID_PUZZLE_BITS + 1) == "a#0"
    assert queue.put("e#0", "e", PAID_PUZZLE_BITS + 2) == "b#0"       # a and b hold one: the oldest
    assert [queue.get() for _ in range(3)] == ["e#0", "d#0", "a#1"]


def test_a_proof_past_its_wait_is_dropped_unchecked():
    clock = Clock()
    queue = paid_queue(wait_s=3.0, clock=clock)
    queue.put("old", "a", PAID_PUZZLE_BITS)
    clock.now += 2.0
    queue.put("new", "b", PAID_PUZZLE_BITS)
    assert (queue.expired(), queue.next_deadline()) == ([], 103.0)
    clock.now += 1.0
    assert queue.expired() == ["old"] and queue.get() == "new"


def test_a_proof_worked_for_less_than_the_paid_bits_is_checked_only_with_a_free_check():
    clock = Clock()
    queue = paid_queue(free=FreeChecks(burst=2, per_s=0.5, clock=clock, refill_after_s=0),
                       clock=clock)
    for name in ("cheap#0", "cheap#1", "cheap#2"):
        queue.put(name, "stranger", PUZZLE_BITS)
    queue.put("paid", "client", PAID_PUZZLE_BITS)
    assert [queue.get() for _ in range(3)] == ["paid", "cheap#0", "cheap#1"]   # 2 free checks
    assert queue.load() == (0.0, 1, 1, None)
    checked = []
    checker = threading.Thread(target=lambda: checked.append(queue.get()))
    checker.start()
    checker.join(0.2)
    assert checker.is_alive() and checked == []        # no free check left: it waits
    clock.now += 2.0                                    # one more refilled
    checker.join(10)
    assert checked == ["cheap#2"]


@pytest.mark.parametrize("free_left, cheap, waiting, bits", [
    (16, 0, 0, PUZZLE_BITS),                 # quiet
    (3, 2, 2, PUZZLE_BITS),                  # free checks left for every cheap proof and one more
    (2, 2, 2, PAID_PUZZLE_BITS + 1),         # not for one more: the paid bits, and proofs wait
    (0.5, 0, 0, PAID_PUZZLE_BITS),           # free checks spent, nothing waiting
    (0, 0, 1, PAID_PUZZLE_BITS),
    (0, 0, 4, min(PAID_PUZZLE_BITS + 2, MAX_PUZZLE_BITS)),   # a bit per doubling past one per checker
    (0, 0, 8, MAX_PUZZLE_BITS),
    (0, 0, 100, MAX_PUZZLE_BITS),            # never past what a client accepts
])
def test_the_puzzle_rises_with_the_load_and_falls_back_when_quiet(free_left, cheap, waiting, bits):
    assert puzzle_bits(PUZZLE_BITS, free_left, cheap, waiting, checkers=2) == bits


def test_a_server_with_nothing_to_stretch_asks_no_work_whatever_the_load():
    assert puzzle_bits(0, 0, 0, 100, checkers=2) == 0


def test_free_checks_refill_at_their_rate_up_to_their_burst():
    clock = Clock()
    free = FreeChecks(burst=2, per_s=1.0, clock=clock, refill_after_s=5.0)
    assert [free.take(), free.take(), free.take()] == [True, True, False]
    assert free.next_in_s() == 6.0              # the pause after the last one taken, then one
    clock.now += 10
    assert free.left() == 2


# ---- issue 43 item 2: a trickle of native solving cannot hold the door shut -----------------


def test_free_checks_do_not_refill_while_they_are_drained():
    """A stranger drawing on them every half second got the burst and one a second (76 in a
    minute); now the burst and what refilled while it drew them down (32 by 31.5 s), then
    one each time it leaves them untouched for the refill's wait (every 6 s)."""
    clock = Clock()
    free = FreeChecks(burst=16, per_s=1.0, clock=clock, refill_after_s=5.0)
    taken = 0
    for _ in range(120):
        taken += free.take()
        clock.now += 0.5
    assert taken == 32 + 5


def test_a_client_slower_than_the_refill_never_meets_the_pause():
    clock = Clock()
    free = FreeChecks(burst=16, per_s=1.0, clock=clock, refill_after_s=5.0)
    for _ in range(100):
        assert free.take()
        clock.now += 1.2


@pytest.mark.parametrize("least_paid, bits", [(PAID_PUZZLE_BITS, PAID_PUZZLE_BITS),
                                              (MAX_PUZZLE_BITS, MAX_PUZZLE_BITS),
                                              (MAX_PUZZLE_BITS + 3, MAX_PUZZLE_BITS)])
def test_a_newcomer_is_never_asked_less_than_the_least_worked_paid_proof_waiting(least_paid, bits):
    """With the free checks full (nobody used them: paid proofs went first) a newcomer was
    asked the quiet puzzle, and its proof waited behind every paid one until dropped."""
    assert puzzle_bits(PUZZLE_BITS, 16, 0, 1, checkers=2, least_paid=least_paid) == bits


def test_the_door_asks_a_newcomer_the_least_paid_bits_that_wait():
    queue = paid_queue()
    queue.put("stranger#0", "stranger", MAX_PUZZLE_BITS)
    free_left, cheap, waiting, least_paid = queue.load()
    assert (waiting, least_paid) == (1, MAX_PUZZLE_BITS)
    assert puzzle_bits(PUZZLE_BITS, free_left, cheap, waiting, 2, least_paid) == MAX_PUZZLE_BITS


def test_cheap_proofs_are_checked_in_turn_with_paid_ones():
    """Paid proofs that keep arriving no longer starve a proof worked for less."""
    queue = paid_queue()
    for index in range(3):
        queue.put(f"cheap#{index}", f"client{index}", PUZZLE_BITS)
    checked = []
    for index in range(6):
        queue.put(f"paid#{index}", f"stranger{index}", PAID_PUZZLE_BITS)
        checked.append(queue.get())
    assert checked == ["paid#0", "cheap#0", "paid#1", "cheap#1", "paid#2", "cheap#2"]
    assert [queue.get() for _ in range(3)] == ["paid#3", "paid#4", "paid#5"]


def test_a_cheap_proof_waits_its_turn_only_for_a_free_check():
    clock = Clock()
    queue = paid_queue(free=FreeChecks(burst=1, per_s=1.0, clock=clock, refill_after_s=5.0),
                       clock=clock)
    queue.put("cheap#0", "client0", PUZZLE_BITS)
    queue.put("cheap#1", "client1", PUZZLE_BITS)
    for index in range(3):
        queue.put(f"paid#{index}", f"stranger{index}", PAID_PUZZLE_BITS)
    assert [queue.get() for _ in range(4)] == ["paid#0", "cheap#0", "paid#1", "paid#2"]
