"""The worker thread a C loop runs in: an interrupt never leaves the loop running unwatched."""

import os
import signal
import time

import pytest

from gdrprobe import _native
from gdrprobe.measure.loops import LoopThread


def loop_until_stopped(config, stop):
    """Stands in for a C loop: runs until its stop flag is set."""
    while not stop.is_set:
        time.sleep(0.001)
    return {"stopped_by_flag": True}


def test_an_interrupt_while_the_loop_starts_is_raised_after_it_and_stops_it(monkeypatch):
    runner = LoopThread(loop_until_stopped, None, _native.StopFlag())
    real_start = runner._thread.start

    def start_with_a_ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)   # arrives while Thread.start() runs
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
