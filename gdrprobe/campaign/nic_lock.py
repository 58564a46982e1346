"""One A/B per NIC at a time on a node: checks that share a NIC never measure each other.

Every torchrun worker calling ``gdrprobe.require()`` starts its check at once, and ranks
whose GPUs share a NIC would each measure half of it. Before its first run a check takes an
exclusive ``flock`` on a file named after the NIC, and holds it until its last run ends;
the kernel drops the lock when the process dies, so a killed check leaves nothing to clean
up. The files live in ``$GDRPROBE_LOCK_DIR`` when it is set (a directory every container
of the node mounts, where pods must coordinate), else in the first of
:data:`gdrprobe.defaults.LOCK_DIRS` that can hold them (``/run`` is root's; ``/tmp`` is
anyone's: created world-writable and sticky, as /tmp itself). The wait is bounded by the
caller (what its time budget leaves); a NIC still held then is "not testable" (exit 9), and
a lock that cannot be had at all (no usable directory) is said in the report and the check
runs without one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterator, Mapping

from gdrprobe import defaults
from gdrprobe.errors import NotTestable
from gdrprobe.files import NotRegularFile

LOCK_DIR_ENV = "GDRPROBE_LOCK_DIR"
POLL_S = 0.05


@dataclasses.dataclass(frozen=True)
class Held:
    path: str | None               # None: no lock could be had (note says why)
    waited_s: float

    def describe(self, note: str = "") -> str:
        if self.path is None:
            return f"no lock ({note})"
        return f"{self.path}, waited {self.waited_s:.1f} s"


def lock_dirs(environ: Mapping[str, str]) -> tuple[str, ...]:
    given = environ.get(LOCK_DIR_ENV)
    return (given,) if given else defaults.LOCK_DIRS


def lock_name(nic: str) -> str:
    return re.sub(r"[^\w.-]", "_", nic) + ".lock"


def shared_dir(path: str) -> None:
    """The directory, created world-writable and sticky (as /tmp) when this call makes it."""
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    os.chmod(path, 0o1777)


def open_lock_file(path: str) -> int:
    """A read-only descriptor (flock needs no more): the existing file, else a new one. No
    symbolic link is followed, a file another user made is opened, not re-created
    (fs.protected_regular refuses O_CREAT on those in a sticky directory), and only a
    regular file is kept: the directory is everyone's, and a FIFO someone made at the
    lock's name would block an open without O_NONBLOCK (the prolog "stuck", the node
    drained)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
    for _ in range(2):
        try:
            return regular_only(os.open(path, flags), path)
        except FileNotFoundError:
            pass
        try:
            return regular_only(os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), path)
        except FileExistsError:
            continue   # another check made it in between
    return regular_only(os.open(path, flags), path)


def regular_only(fd: int, path: str) -> int:
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(path, mode)
    return fd


def lock_file(nic: str, environ: Mapping[str, str]) -> tuple[int | None, str, str]:
    """(descriptor, path, why not): the NIC's lock file in the first usable directory."""
    problems = []
    for directory in lock_dirs(environ):
        path = os.path.join(directory, lock_name(nic))
        try:
            shared_dir(directory)
            return open_lock_file(path), path, ""
        except OSError as error:
            problems.append(f"{directory}: {error.strerror}")
    return None, "", "; ".join(problems)


@contextlib.contextmanager
def nic_lock(nic: str, wait_s: float, environ: Mapping[str, str],
             clock=time.monotonic, sleep=time.sleep) -> Iterator[tuple[Held, str]]:
    """Hold the NIC's lock for the block: (what was held, why none). Waits at most wait_s
    for another check to let go; NotTestable after that."""
    fd, path, problem = lock_file(nic, environ)
    if fd is None:
        yield Held(None, 0.0), f"set {LOCK_DIR_ENV} to a writable directory: {problem}"
        return
    try:
        started = clock()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if clock() - started >= wait_s:
                    raise NotTestable(
                        f"not testable: another gdrprobe check on this node held {nic} for "
                        f"{clock() - started:.1f} s, all this check's time budget left",
                        "check one node's GPUs in one process ('gdrprobe check --node'), or "
                        "give each check a larger time budget",
                        evidence=f"lock file {path}") from None
                sleep(POLL_S)
        yield Held(path, clock() - started), ""
    finally:
        os.close(fd)   # closing the descriptor releases the lock
