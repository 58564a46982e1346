"""Host memory: page-aligned anonymous memory for the probe's buffers."""

from __future__ import annotations

from gdrprobe import _native
from gdrprobe.errors import ResourceLimit
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
        self._register_with(lambda pv: pv.mr.MR(pd, self.length, access, address=self.address))

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
