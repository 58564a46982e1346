"""A server's log never blocks serving: a stream nobody reads costs the callers nothing,
lines come out whole and never interleave, and what was dropped is counted; a burst from
one source is logged once."""

from __future__ import annotations

import re
import threading

from gdrprobe.protocol.serverlog import BurstLog, LineLog

TOKEN = "token-1234567890abcdef"
DROPPED = re.compile(r"gdrprobe serve: (\d+) log lines dropped: nobody was reading this log")


class StalledStream:
    """A stream whose writes wait until released (stderr under 'serve | less', paused)."""

    def __init__(self):
        self.released = threading.Event()
        self.text = ""
        self.writes = 0

    def write(self, text: str) -> int:
        self.released.wait(30)
        self.text += text
        self.writes += 1
        return len(text)

    def flush(self) -> None:
        pass


def log_from_threads(log, threads: int, lines: int) -> bool:
    """Whether every thread logged all its lines within 10 s (none was made to wait)."""
    def speak(name):
        for i in range(lines):
            log(f"{name} line {i} " + "x" * 100)

    workers = [threading.Thread(target=speak, args=(f"t{n}",)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(10)
    return not any(worker.is_alive() for worker in workers)


def test_a_stream_nobody_reads_makes_no_caller_wait_and_the_drops_are_counted():
    stream = StalledStream()
    log = LineLog(stream, capacity=50)
    assert log_from_threads(log, threads=8, lines=200)
    stream.released.set()                # the reader is back
    log.close()
    lines = stream.text.splitlines()
    written = [line for line in lines if line.endswith(" " + "x" * 100)]
    notices = [DROPPED.fullmatch(line) for line in lines if line not in written]
    assert all(notices)                  # whole lines only: each a line or a notice
    dropped = sum(int(notice.group(1)) for notice in notices)
    assert len(written) + dropped == 8 * 200
    assert len(written) <= 2 * 50        # the batch being written and the queue behind it


def test_lines_are_whole_and_never_interleave():
    stream = StalledStream()
    stream.released.set()
    log = LineLog(stream)
    assert log_from_threads(log, threads=8, lines=100)
    log.close()
    lines = stream.text.splitlines()
    assert len(lines) == 800 and all(line.endswith(" " + "x" * 100) for line in lines)


def test_a_line_with_newlines_stays_one_line():
    stream = StalledStream()
    stream.released.set()
    log = LineLog(stream)
    log("one\ntwo\r\nthree")
    log.close()
    assert stream.text == "one two three\n"


def test_a_stream_that_went_away_ends_the_writer_quietly():
    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

    log = LineLog(Gone())
    log("first")
    log.close()
    log("after")                         # no writer, no error
    assert log.dropped >= 1


def test_a_servers_log_does_not_block_it_when_stderr_is_not_read(monkeypatch):
    """The server's default log: stderr stalled, every caller still goes on at once."""
    from gdrprobe.measure.server import ProbeServer
    from gdrprobe.rdma.endpoint import EndpointOptions

    stream = StalledStream()
    monkeypatch.setattr("sys.stderr", stream)
    server = ProbeServer(TOKEN, EndpointOptions(), bind="127.0.0.1", port=0, preflight=False)
    try:
        assert log_from_threads(server.log, threads=4, lines=2000)
    finally:
        stream.released.set()
        server.close()
    assert "log lines dropped" in stream.text


def test_a_burst_is_logged_once_with_the_count_of_what_was_not():
    class Clock:
        now = 1000.0

        def __call__(self):
            return self.now

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
