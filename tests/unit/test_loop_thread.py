"""The worker thread a C loop runs in: an interrupt never leaves the loop running unwatched."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from gdrprobe import _native
from gdrprobe.measure.loops import LoopThread


# Long enough for any machine to deliver a signal; short enough that a lost interrupt fails
# the test rather than hanging it.
GIVE_UP_S = 30.0


def loop_until_stopped(config, stop):
    """Stands in for a C loop: runs until its stop flag is set (or it gives up)."""
    deadline = time.monotonic() + GIVE_UP_S
    while not stop.is_set:
        if time.monotonic() > deadline:
            return {"stopped_by_flag": False}
        time.sleep(0.001)
    return {"stopped_by_flag": True}


@pytest.fixture
def bystander():
    """Another thread of the process, started before the loop's (a thread inherits its
    creator's signal mask, and start() blocks SIGINT in its own): a training job has many,
    pytest-timeout has one."""
    idle = threading.Event()
    thread = threading.Thread(target=idle.wait, name="bystander", daemon=True)
    thread.start()
    yield thread
    idle.set()
    thread.join(5)


def ctrl_c(to: threading.Thread) -> None:
    """A Ctrl-C that the kernel hands to one thread. To this one (the main thread, the only
    thread of a plain process), it waits while start() blocks SIGINT. To another thread, it
    does not: once that thread's C handler has run, Python raises KeyboardInterrupt in the
    main thread at its next bytecode, whatever the main thread's mask."""
    signal.pthread_kill(to.ident, signal.SIGINT)
    if to is not threading.current_thread():
        time.sleep(0.05)     # the other thread's C handler has run by now


@pytest.mark.parametrize("taken_by", ["this thread", "another thread"])
def test_an_interrupt_while_the_loop_starts_is_raised_after_it_and_stops_it(
        monkeypatch, bystander, taken_by):
    # SIGINT raises KeyboardInterrupt here even under nohup: conftest.py installs Python's
    # handler for every test.
    runner = LoopThread(loop_until_stopped, None, _native.StopFlag())
    real_start = runner._thread.start

    def start_with_a_ctrl_c():
        ctrl_c(bystander if taken_by == "another thread" else threading.current_thread())
        real_start()

    monkeypatch.setattr(runner._thread, "start", start_with_a_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        runner.wait()
    # Raised only once the loop ran, and only after the loop was stopped.
    assert runner.stop.is_set and not runner._thread.is_alive()
    assert runner.finish() == {"stopped_by_flag": True}
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_a_loop_that_never_started_has_nothing_to_finish():
    assert LoopThread(loop_until_stopped, None, _native.StopFlag()).finish() is None
