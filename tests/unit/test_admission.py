"""The server's door: per-source and global connection limits, the limit on wrong token
proofs, and logging once per burst (pure logic on a fake clock)."""

from gdrprobe.protocol.admission import Admission, BurstLog


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def make(**limits):
    lines, clock = [], Clock()
    return Admission(lines.append, clock, **limits), lines, clock


def test_connections_per_source_are_limited_and_freed_when_closed():
    door, lines, _ = make(per_source=2)
    assert door.admit("10.0.0.9") and door.admit("10.0.0.9")
    assert not door.admit("10.0.0.9")
    assert door.admit("10.0.0.7")                   # another source is not affected
    door.closed("10.0.0.9", authenticated=False)
    assert door.admit("10.0.0.9")
    assert len(lines) == 1 and "already holds 2 connections" in lines[0]


def test_unauthenticated_connections_are_limited_in_all_but_proved_ones_are_not():
    door, _, _ = make(unauthenticated=2)
    assert door.admit("a") and door.admit("b")
    assert not door.admit("c")
    door.authenticated("a")                          # a proved the token
    assert door.admit("c")
    door.closed("a", authenticated=True)
    assert not door.admit("d")


def test_wrong_proofs_lock_a_source_out_for_the_window():
    door, lines, clock = make(failed_proofs=3, window_s=60)
    for _ in range(3):
        assert door.admit("10.0.0.9")
        door.wrong_proof("10.0.0.9")
        door.closed("10.0.0.9", authenticated=False)
    assert not door.admit("10.0.0.9")
    assert door.admit("10.0.0.8")
    clock.now += 61
    assert door.admit("10.0.0.9")


def test_a_burst_is_logged_once_with_the_count_of_what_was_not():
    lines, clock = [], Clock()
    log = BurstLog(lines.append, window_s=60, clock=clock)
    for _ in range(50):
        log("10.0.0.9", "wrong token", "a client at 10.0.0.9 presented the wrong token")
    assert len(lines) == 1
    clock.now += 61
    log("10.0.0.9", "wrong token", "again")
    assert len(lines) == 2 and "49 more like it not logged" in lines[1]
    log("10.0.0.8", "wrong token", "another source")
    assert len(lines) == 3
