"""Memory providers: where the probe's bytes live and how verbs reaches them.

A provider allocates one buffer, registers it with a protection domain, writes and checks
the payload pattern, makes remote writes visible before a check, describes itself, and
frees everything. The engine and the exchange only use this interface, so GPU providers
plug in beside the host one without touching the loop.
"""

from __future__ import annotations

import abc
import errno

from gdrprobe import _native, verbs
from gdrprobe.errors import RdmaError, ResourceLimit

ACCESS_LOCAL_WRITE = 1
ACCESS_REMOTE_WRITE = 2
# The scratch buffer a peer writes: remote writes, never remote reads.
PROBE_ACCESS = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE
# A buffer only this side sends from.
LOCAL_ACCESS = ACCESS_LOCAL_WRITE

MEMLOCK_FIX = ("raise the locked-memory limit: 'ulimit -l unlimited' (limits.conf: "
               "'* soft memlock unlimited' and '* hard memlock unlimited', then log in again), "
               "or add the IPC_LOCK capability to the container")


class MemoryProvider(abc.ABC):
    """One registered buffer of ``length`` bytes."""

    kind: str = "abstract"
    length: int = 0

    @property
    @abc.abstractmethod
    def address(self) -> int:
        """The address verbs uses for this buffer (local SGEs and the peer's writes)."""

    @abc.abstractmethod
    def register(self, pd, access: int = PROBE_ACCESS) -> None:
        """Register the buffer with the protection domain; sets lkey and rkey."""

    @abc.abstractmethod
    def fill_pattern(self, offset: int, length: int, seed: int) -> None:
        """Write the payload pattern of seed into length bytes starting at offset."""

    @abc.abstractmethod
    def verify_pattern(self, offset: int, length: int, seed: int) -> tuple[int, int]:
        """(wrong bytes, first wrong offset from `offset` or -1) of length bytes there."""

    @abc.abstractmethod
    def poison(self) -> None:
        """Fill the whole buffer with the poison byte."""

    @abc.abstractmethod
    def verify_poison(self, start: int) -> tuple[int, int]:
        """(non-poison bytes, first such offset or -1) from start to the end."""

    @abc.abstractmethod
    def zero(self) -> None:
        """Clear the whole buffer."""

    def flush_remote_writes(self) -> None:
        """Make the peer's RDMA writes visible to the checks (a no-op for host memory)."""

    def stage_out(self, offset: int, length: int) -> float:
        """Before sending: copy the payload to where the NIC reads it; seconds spent.

        Only a staged buffer copies (GPU to its host bounce buffer); the rest send in place.
        """
        return 0.0

    def stage_in(self, offset: int, length: int) -> float:
        """After receiving: copy the payload to its home; seconds spent (0.0 in place)."""
        return 0.0

    @abc.abstractmethod
    def describe(self) -> dict:
        """What a report says about this buffer."""

    @abc.abstractmethod
    def close(self) -> None:
        """Deregister and free; safe to call twice."""

    lkey: int = 0
    rkey: int = 0
    choice_reason: str = ""   # why this provider was chosen (set by gdrprobe.buffers)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def registration_error(error, what: str) -> Exception:
    """Turn a failed memory registration into the error a person can act on."""
    code = getattr(error, "error_code", -1)
    if code in (errno.ENOMEM, errno.EAGAIN, errno.EPERM):
        return ResourceLimit(f"registering {what} failed: {errno.errorcode.get(code, code)}"
                             " (the locked-memory limit is the usual cause)", MEMLOCK_FIX,
                             evidence=str(error).splitlines()[0])
    return RdmaError(f"registering {what} failed", "check 'gdrprobe doctor' and dmesg",
                     evidence=str(error).splitlines()[0])


class HostMemory(MemoryProvider):
    """Page-aligned anonymous memory, optionally huge pages, on the NIC's NUMA node."""

    kind = "host"

    def __init__(self, length: int, numa_node: int = -1, huge_pages: bool = False):
        self.length = length
        self.numa_node = numa_node
        self.huge_pages = huge_pages
        self.mr = None
        try:
            self._address, self._mapped = _native.host_alloc(length, numa_node, huge_pages)
        except OSError as error:
            fix = ("reserve huge pages (echo N > /proc/sys/vm/nr_hugepages) or drop "
                   "--huge-pages") if huge_pages else "free memory or use smaller sizes"
            raise ResourceLimit(f"cannot allocate {length} bytes of host memory: {error}",
                                fix) from error

    @property
    def address(self) -> int:
        return self._address

    def register(self, pd, access: int = PROBE_ACCESS) -> None:
        pv = verbs.pyverbs()
        try:
            self.mr = pv.mr.MR(pd, self.length, access, address=self._address)
        except pv.PyverbsRDMAError as error:
            raise registration_error(error, f"{self.length} bytes of host memory") from error
        self.lkey, self.rkey = self.mr.lkey, self.mr.rkey

    def fill_pattern(self, offset: int, length: int, seed: int) -> None:
        _native.pattern_fill(self._address + offset, length, seed)

    def verify_pattern(self, offset: int, length: int, seed: int) -> tuple[int, int]:
        return _native.pattern_verify(self._address + offset, length, seed)

    def poison(self) -> None:
        _native.poison_fill(self._address, self.length)

    def verify_poison(self, start: int) -> tuple[int, int]:
        bad, first = _native.poison_verify(self._address + start, self.length - start)
        return bad, (first + start if bad else -1)

    def zero(self) -> None:
        _native.zero_fill(self._address, self.length)

    def describe(self) -> dict:
        return {"kind": self.kind, "length_bytes": self.length, "numa_node": self.numa_node,
                "huge_pages": self.huge_pages, "gpudirect_proof": False}

    def close(self) -> None:
        try:
            if self.mr is not None:
                mr, self.mr = self.mr, None
                mr.close()
        finally:   # the mapping goes even if deregistration failed
            if self._address:
                address, self._address = self._address, 0
                _native.host_free(address, self._mapped)
