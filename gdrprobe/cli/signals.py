"""SIGTERM as Ctrl-C for every command: one :data:`INTERRUPTS` that :func:`gdrprobe.cli.main`
installs and a command that installed its own handler installs again
(:func:`gdrprobe.cli.common.terminate_as_interrupt`)."""

from __future__ import annotations

import signal
import threading

from gdrprobe.errors import ExitCode


class Interrupts:
    """SIGTERM (a scheduler, kill, a container stopping) cleans up exactly as Ctrl-C does: it
    is raised as KeyboardInterrupt wherever the command runs (measure/loops.py holds it
    while a loop must finish). Which of the two came decides the exit code, 128 + the
    signal's number as a shell reports a command the signal ended: 130 for SIGINT, 143 for
    SIGTERM."""

    def __init__(self):
        self.terminated = False
        self._previous = None

    def install(self) -> None:
        """main(): catch SIGTERM for this command (the main thread only: Python's rule)."""
        self.terminated = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGTERM)
            self.catch_sigterm()

    def catch_sigterm(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum, frame):
        self.terminated = True
        raise KeyboardInterrupt

    def restore(self) -> None:
        """The handler main() found (a test calling main() keeps its own)."""
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def exit_code(self, code: int) -> int:
        """An interrupted command's code says which signal it was."""
        if code == ExitCode.INTERRUPTED and self.terminated:
            return int(ExitCode.TERMINATED)
        return code

    def what(self) -> str:
        return "terminated (SIGTERM)" if self.terminated else "interrupted (Ctrl-C: SIGINT)"


INTERRUPTS = Interrupts()
