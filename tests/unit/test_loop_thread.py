"""The worker thread a C loop runs in: an interrupt never leaves the loop running unwatched."""

import os
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


def ctrl_c_to_this_process():
    os.kill(os.getpid(), signal.SIGINT)


def ctrl_c_to_another_thread():
    """What a process with other threads sees (a training job's, pytest-timeout's): the
    kernel hands the signal to a thread that does not block it, and Python then raises
    KeyboardInterrupt in the main thread at its next bytecode, whatever its mask."""
    idle = threading.Event()
    other = threading.Thread(target=idle.wait, name="another-thread", daemon=True)
    other.start()
    try:
        signal.pthread_kill(other.ident, signal.SIGINT)
        time.sleep(0.05)     # the signal's C handler has run; Python acts on it next
    finally:
        idle.set()


@pytest.mark.parametrize("ctrl_c", [ctrl_c_to_this_process, ctrl_c_to_another_thread])
def test_an_interrupt_while_the_loop_starts_is_raised_after_it_and_stops_it(monkeypatch, ctrl_c):
    # SIGINT raises KeyboardInterrupt here even under nohup: conftest.py installs Python's
    # handler for every test.
    runner = LoopThread(loop_until_stopped, None, _native.StopFlag())
    real_start = runner._thread.start

    def start_with_a_ctrl_c():
        ctrl_c()              # arrives while Thread.start() runs
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
