"""How nccl-log reads its input: a file or a pipe, in blocks, refused where it is no text
log, split into lines of bounded length (:mod:`gdrprobe.nccl.log` reads what they say)."""

from __future__ import annotations

import functools
import os
import re
import select
import stat
from collections.abc import Callable, Iterator

from gdrprobe.errors import UsageError

BLOCK_BYTES = 1 << 20        # read this much at a time
# A longer line is read in pieces of this size and counted once as cut. NCCL writes one
# record per write (debug.cc ncclDebugLog: a 1 KiB prefix buffer, then one vfprintf); a
# line holds several only where processes' writes interleaved.
MAX_LINE_BYTES = 64 << 10
READ_FIX = "pass the file the job wrote with NCCL_DEBUG=INFO (NCCL_DEBUG_FILE names it)"

STDIN = "-"            # the name of standard input: ... 2>&1 | gdrprobe nccl-log -


def open_log(path: str):
    """The log's file, unbuffered: path, or for STDIN standard input (its descriptor
    duplicated, so that closing the log leaves sys.stdin open)."""
    if path == STDIN:
        return os.fdopen(os.dup(0), "rb", buffering=0)
    return open(path, "rb", buffering=0)


def log_name(path: str) -> str:
    """How a message names the log."""
    return "on standard input" if path == STDIN else path


NCCL_MARK = re.compile(rb"NCCL (?:INFO|WARN|TRACE|DIAG) |NCCL version \d|RCCL version : \d")
CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0e-\x1a\x1c-\x1f]")   # not tab, line ends, form feed, ESC


def lines_of(read: Callable[[], bytes], head: bytes, scan) -> Iterator[tuple[int, bytes, bool]]:
    """The file's lines, starting with the head already read (so a pipe, <(zcat log.gz),
    reads too): each line's number, its bytes and whether it ended with a line end. A line
    longer than MAX_LINE_BYTES comes in pieces of at most that size, all with its number,
    all but the last as not ended; it is counted once in scan.cut_lines, and so is a last
    line with no line end (``scan``: a :class:`gdrprobe.nccl.log.Scan`, whose saw_nccl,
    cut_lines and lines it sets). Memory: a block and a piece at most."""
    number, tail, block, long_line = 1, b"", head, False
    while block:
        if not scan.saw_nccl:
            scan.saw_nccl = NCCL_MARK.search(tail[-32:] + block) is not None
        lines = (tail + block).split(b"\n")
        tail = lines.pop()
        for line in lines:
            if long_line or len(line) > MAX_LINE_BYTES:
                scan.cut_lines += not long_line
                yield from pieces(number, line, ended=True)
                long_line = False
            else:
                yield number, line, True
            number += 1
        if len(tail) > MAX_LINE_BYTES:       # a long line still going: its pieces so far
            scan.cut_lines += not long_line
            long_line = True
            whole = len(tail) - len(tail) % MAX_LINE_BYTES
            yield from pieces(number, tail[:whole], ended=False)
            tail = tail[whole:]
        block = read()
    if tail or long_line:
        scan.cut_lines += bool(tail.strip()) and not long_line
        if tail:
            yield number, tail, False
        number += 1
    scan.lines = number - 1


def pieces(number: int, line: bytes, ended: bool) -> Iterator[tuple[int, bytes, bool]]:
    for start in range(0, max(len(line), 1), MAX_LINE_BYTES):
        piece = line[start:start + MAX_LINE_BYTES]
        yield number, piece, ended and start + MAX_LINE_BYTES >= len(line)


def check_text(head: bytes, path: str) -> None:
    """Refuse what is not a text log, naming what it is."""
    if not head:
        raise UsageError(f"NCCL log {path} is empty", fix=READ_FIX)
    if head[:2] == b"\x1f\x8b":
        raise UsageError(f"NCCL log {path} is gzip-compressed",
                         fix=f"read it through a pipe: gdrprobe nccl-log <(zcat {path})")
    text = head.decode("utf-8", "replace")
    odd = text.count("\ufffd") + len(CONTROL_BYTES.findall(head))
    if b"\0" in head or odd > len(text) // 10:
        raise UsageError(f"NCCL log {path} is not text (binary data)", fix=READ_FIX)


# CPython runs a signal's handler between bytecodes, so a SIGTERM or Ctrl-C that lands just
# before a blocking read() waits for that read to return: on a pipe whose writer stalls
# (<(zcat ...), a FIFO) that is never. A pipe is read only once poll() says it has data,
# waiting at most this long at a time, so the handler runs within that time.
SIGNAL_LOOK_MS = 500


def block_reader(handle) -> Callable[[], bytes]:
    """read() of an unbuffered file: the next BLOCK_BYTES, fewer only at the end."""
    if stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        return functools.partial(handle.read, BLOCK_BYTES)
    waiter = select.poll()
    waiter.register(handle, select.POLLIN)

    def read_pipe() -> bytes:
        block = bytearray()
        while len(block) < BLOCK_BYTES:
            if not waiter.poll(SIGNAL_LOOK_MS):
                continue
            piece = handle.read(BLOCK_BYTES - len(block))
            if not piece:
                break
            block += piece
        return bytes(block)
    return read_pipe
