"""Whether processes a test started (and killed) are gone, read from /proc."""

from __future__ import annotations

import pathlib
import time


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for a parent that is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone_within(pid: int, seconds: float) -> bool:
    """A signal reaches a process at once, but a loaded machine may run its exit a moment
    after the one who sent it has moved on."""
    deadline = time.monotonic() + seconds
    while running(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def holding(token: str) -> list[int]:
    """The processes whose command line holds token."""
    found = []
    for proc in pathlib.Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and token.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:   # it ended while read
            continue
    return found
