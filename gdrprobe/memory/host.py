"""Host memory: page-aligned anonymous memory for the probe's buffers."""

from __future__ import annotations

from gdrprobe import _native
from gdrprobe.errors import ResourceLimit
from gdrprobe.memory.causes import host_registration_error
from gdrprobe.memory.provider import PROBE_ACCESS, MemoryProvider


class HostMemory(MemoryProvider):
    """Page-aligned anonymous memory, optionally huge pages, on the NIC's NUMA node."""

    kind = "host"

    def __init__(self, length: int, numa_node: int = -1, huge_pages: bool = False):
        self.length = length
        self.numa_node = numa_node
        self.huge_pages = huge_pages
        self.mr = None
        try:
            self._buffer = _native.HostBuffer(length, numa_node, huge_pages)
        except OSError as error:
            fix = ("reserve huge pages (echo N > /proc/sys/vm/nr_hugepages) or drop "
                   "--huge-pages") if huge_pages else "free memory or use smaller sizes"
            raise ResourceLimit(f"cannot allocate {length} bytes of host memory: {error}",
                                fix) from error

    @property
    def address(self) -> int:
        return self._buffer.address

    def register(self, pd, access: int = PROBE_ACCESS) -> None:
        self._register_with(
            lambda pv: pv.mr.MR(pd, self.length, access, address=self.address),
            lambda error: host_registration_error(error, f"{self.length} bytes of host memory"))

    def fill_pattern(self, offset: int, length: int, seed: int) -> None:
        _native.pattern_fill(self.address + offset, length, seed)

    def verify_pattern(self, offset: int, length: int, seed: int) -> tuple[int, int]:
        return _native.pattern_verify(self.address + offset, length, seed)

    def fill_slots(self, size: int, slots: int, seed: int) -> None:
        _native.slots_fill(self.address, size, slots, seed)

    def verify_slots(self, size: int, slots: int, seed: int) -> tuple[int, int, int]:
        return _native.slots_verify(self.address, size, slots, seed)

    def poison(self, end: int | None = None) -> None:
        _native.poison_fill(self.address, self.length if end is None else end)

    def verify_poison(self, start: int) -> tuple[int, int]:
        bad, first = _native.poison_verify(self.address + start, self.length - start)
        return bad, (first + start if bad else -1)

    def zero(self) -> None:
        _native.zero_fill(self.address, self.length)

    def describe(self) -> dict:
        return {"kind": self.kind, "length_bytes": self.length, "numa_node": self.numa_node,
                "huge_pages": self.huge_pages, "gpudirect_proof": False}

    def close(self) -> None:
        try:
            if self.mr is not None:
                mr, self.mr = self.mr, None
                mr.close()
        finally:   # the mapping goes even if deregistration failed
            self._buffer.close()
