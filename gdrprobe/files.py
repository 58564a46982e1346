"""Files at paths gdrprobe is given (the command line, the environment, a capture): read only
when they are regular files, within a size and a nesting depth, and written only where a
regular file or nothing stands.

Read: a FIFO blocks whoever opens it until something writes to it, a device can answer
forever (``/dev/zero``) or do something when opened, and a directory reads as nothing; so a
path is looked at with stat first, opened without blocking (O_NONBLOCK) and checked again
with fstat, and read up to a limit; its links are followed as the kernel follows them (a
chain of more than 40 fails with ELOOP). JSON is parsed only when its nesting is at most
:data:`MAX_JSON_DEPTH` deep (Python's parser recurses once per level).

Written: the file is replaced in one step (a temporary file beside it, renamed over it:
a reader or node_exporter's text-file collector never sees half a file), and only where a
regular file or nothing stands: a rename would replace a symbolic link, a FIFO or a device
node (``--prometheus /dev/null``, meaning "discard", would replace the node's /dev/null).
The path is looked at before anything is probed (:func:`check_output_path`) and again just
before the rename.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from typing import Any

from gdrprobe.errors import UsageError

FILE_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
              (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link"))
MAX_JSON_DEPTH = 64              # arrays and objects within each other, at most
WRITTEN_MODE = 0o644             # what node_exporter's collector and other users read


def file_kind(mode: int) -> str:
    """What a file is, as an error names it ("a FIFO", "a regular file")."""
    return next((what for test, what in FILE_KINDS if test(mode)), "a regular file")


class NotRegularFile(OSError):
    """A path whose file is not a regular one: never read (a FIFO would block, a device could
    answer forever or change something)."""

    def __init__(self, path: str, mode: int):
        self.kind = file_kind(mode)
        super().__init__(errno.EINVAL, f"not a regular file: {self.kind}", path)


def open_regular(path: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of the regular file at path; NotRegularFile for anything else, which is
    never opened where stat tells first (opening a device can do something), and otherwise
    opened without blocking (O_NONBLOCK: a FIFO never waits for a writer) and refused after
    fstat. A chain of links is followed as the kernel follows it (ELOOP past 40)."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, mode)
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, mode)
        os.set_blocking(fd, True)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: str, limit: int) -> bytes:
    """At most ``limit`` bytes of the regular file at path (:func:`open_regular`)."""
    with os.fdopen(open_regular(path), "rb") as handle:
        return handle.read(limit)


class TooLarge(ValueError):
    """A file or document past a bound gdrprobe reads."""


def read_bounded(path: str, limit: int) -> bytes:
    """The whole regular file at path; TooLarge when it holds more than ``limit`` bytes."""
    data = read_regular(path, limit + 1)
    if len(data) > limit:
        raise TooLarge(f"it is larger than {limit} bytes, the most gdrprobe reads of it")
    return data


def json_depth(value: Any) -> int:
    """How deeply arrays and objects nest in a parsed JSON value (a walk, not a recursion)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        pending.extend((inner, depth + 1) for inner in item)
    return deepest


def parse_json(data: bytes | str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON document nested at most ``max_depth`` deep, without NaN or Infinity; ValueError
    (TooLarge for the depth) for anything else, never a RecursionError: Python's parser
    recurses once per level, and says so past its recursion limit (about 1,000)."""
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise TooLarge(f"its arrays and objects nest more than {max_depth} deep") from None
    if json_depth(value) > max_depth:
        raise TooLarge(f"its arrays and objects nest more than {max_depth} deep")
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


# ---- writing ------------------------------------------------------------------------------


def check_output_path(path: str, flag: str) -> None:
    """Refuse, before anything is probed, a path gdrprobe could not write as asked: anything
    but a regular file or nothing (a symbolic link, a FIFO, a device, a directory, a
    socket), a file this user may not replace, a directory that is not there or not
    writable. A UsageError names what is there and the fix."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as error:
        raise UsageError(f"{flag} {path}: {error.strerror}; nothing was measured",
                         f"give {flag} a path in a directory that exists") from None
    if mode is not None and not stat.S_ISREG(mode):
        raise not_regular_output(path, flag, mode)
    if mode is not None and not os.access(path, os.W_OK):
        raise UsageError(f"{flag} {path}: the file is not writable; nothing was measured",
                         f"give {flag} a path this user may write, or run as its owner")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        what = "is not a directory" if os.path.lexists(directory) else "does not exist"
        raise UsageError(f"{flag} {path}: {directory} {what}; nothing was measured",
                         f"create {directory} first, or pass a path in a directory that exists")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: the directory {directory} is not writable; nothing "
                         "was measured", f"give {flag} a path in a directory this user may write")


def not_regular_output(path: str, flag: str, mode: int) -> UsageError:
    kind = file_kind(mode)
    target = f" to {os.readlink(path)}" if stat.S_ISLNK(mode) else ""
    return UsageError(f"{flag} {path} is {kind}{target}, not a regular file: gdrprobe writes "
                      "only where a regular file or nothing stands (its new file would "
                      f"replace the {kind.split(' ', 1)[1]}); nothing was measured",
                      f"give {flag} the path of a regular file, or of none yet; to keep no "
                      f"output, leave {flag} out")


def replace_file(path: str, data: bytes, flag: str = "") -> None:
    """``data`` at path, replacing a regular file there in one step (written beside it and
    renamed); a UsageError where something else stands there, or it cannot be written."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        fd, staged = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    except OSError as error:
        raise unwritable(path, error) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(staged, WRITTEN_MODE)
        _still_regular_or_nothing(path, flag)
        os.replace(staged, path)
    except OSError as error:
        os.unlink(staged)
        raise unwritable(path, error) from None
    except BaseException:
        os.unlink(staged)
        raise


def _still_regular_or_nothing(path: str, flag: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISREG(mode):
        raise not_regular_output(path, flag or "the output", mode)


def unwritable(path: str, error: OSError) -> UsageError:
    return UsageError(f"cannot write {path}: {error.strerror or error}",
                      "pass a path in a directory that exists and is writable")
