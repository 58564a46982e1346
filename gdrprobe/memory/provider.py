"""Memory providers: where the probe's bytes live and how verbs reaches them.

A provider allocates one buffer, registers it with a protection domain, writes and checks
the payload pattern, makes remote writes visible before a check, describes itself, and
frees everything. The engine and the exchange only use this interface, so GPU providers
plug in beside the host one without touching the loop.
"""

from __future__ import annotations

import abc
from typing import Callable

from gdrprobe import _native
from gdrprobe.memory.causes import host_registration_error
from gdrprobe.rdma import verbs

ACCESS_LOCAL_WRITE = 1
ACCESS_REMOTE_WRITE = 2
# Only for NCCL's flush: this side reads back what landed, on a QP connected to itself.
ACCESS_REMOTE_READ = 4
# The scratch buffer a peer writes: remote writes, never remote reads.
PROBE_ACCESS = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE
# A buffer only this side sends from.
LOCAL_ACCESS = ACCESS_LOCAL_WRITE


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

    # The CPU writes and checks the payload in its view of the buffer: host memory is its
    # own view; GPU memory has a pinned host copy, kept in step by push and pull.

    @property
    def cpu_view(self) -> int:
        """The address of the bytes the CPU fills and checks."""
        return self.address

    def push(self, offset: int, length: int) -> None:
        """Copy length bytes at offset from the CPU's view to the buffer (host: nothing)."""

    def pull(self, offset: int, length: int) -> None:
        """Copy length bytes at offset from the buffer to the CPU's view (host: nothing)."""

    def fill_pattern(self, offset: int, length: int, seed: int) -> None:
        """Write the payload pattern of seed into length bytes starting at offset."""
        _native.pattern_fill(self.cpu_view + offset, length, seed)
        self.push(offset, length)

    def verify_pattern(self, offset: int, length: int, seed: int) -> tuple[int, int]:
        """(wrong bytes, first wrong offset from `offset` or -1) of length bytes there."""
        self.pull(offset, length)
        return _native.pattern_verify(self.cpu_view + offset, length, seed)

    def fill_slots(self, size: int, slots: int, seed: int, offset: int = 0) -> None:
        """A bandwidth round's source messages from offset: slot k holds size bytes of the
        pattern of the slot's own seed (gdr_slot_seed of seed and k)."""
        _native.slots_fill(self.cpu_view + offset, size, slots, seed)
        self.push(offset, size * slots)

    def verify_messages(self, size: int, slots: int, source_slots: int, seed: int,
                        first: int, count: int) -> tuple[int, int, int]:
        """(messages holding a wrong byte, wrong bytes, first wrong offset or -1) of the
        round's messages first to first + count - 1, where they landed: message k in slot
        k mod slots, sent from source slot k mod source_slots (fill_slots)."""
        start = first % slots
        self.pull(0, size * (slots if start + count > slots else start + count))
        return _native.messages_verify(self.cpu_view, size, slots, source_slots, seed, first,
                                       count)

    def poison(self, end: int | None = None) -> None:
        """Fill the buffer up to end (all of it: None) with the poison byte."""
        end = self.length if end is None else end
        _native.poison_fill(self.cpu_view, end)
        self.push(0, end)

    def verify_poison(self, start: int, end: int | None = None) -> tuple[int, int]:
        """(non-poison bytes, first such offset or -1) from start to end (None: the end)."""
        end = self.length if end is None else end
        if start >= end:
            return 0, -1
        self._pull_nic_writes(start, end - start)
        bad, first = _native.poison_verify(self.cpu_view + start, end - start)
        return bad, (first + start if bad else -1)

    def _pull_nic_writes(self, offset: int, length: int) -> None:
        """Bring what the NIC wrote (stray writes too) into the CPU's view: the buffer is
        where the NIC writes, unless it registered the CPU's view itself."""
        self.pull(offset, length)

    def zero(self) -> None:
        """Clear the whole buffer."""
        _native.zero_fill(self.cpu_view, self.length)
        self.push(0, self.length)

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

    def report(self) -> dict:
        """The description plus why this provider was chosen, where something chose it."""
        reason = self.choice_reason
        return (self.describe() | {"relaxed_ordering": self.relaxed_ordering}
                | ({"mechanism_reason": reason} if reason else {}))

    @abc.abstractmethod
    def close(self) -> None:
        """Deregister and free; safe to call twice."""

    lkey: int = 0
    rkey: int = 0
    choice_reason: str = ""   # why this provider was chosen (set by gdrprobe.memory.buffers)
    relaxed_ordering: bool = False   # registered with IBV_ACCESS_RELAXED_ORDERING
    # Whether IBV_SEND_INLINE may send from this buffer: inline has the CPU copy the payload
    # from the SGE address, so only memory the CPU reads where verbs addresses it qualifies.
    inline_capable: bool = True
    # Whether the NIC writes this buffer's home directly through GPUDirect RDMA: the
    # receives NCCL flushes with an RDMA READ (gdrprobe.measure.flush).
    gpudirect_target: bool = False

    # What a refused registration calls the registered memory: "4096 bytes of host memory".
    registered_memory: str = "host memory"

    def _register_with(self, create_mr: Callable) -> None:
        """Register through create_mr(pyverbs) and keep the MR and its keys; a refusal
        becomes :meth:`_refused`'s error, the one a person can act on."""
        pv = verbs.pyverbs()
        try:
            self.mr = create_mr(pv)
        except pv.PyverbsRDMAError as error:
            raise self._refused(error) from error
        self.lkey, self.rkey = self.mr.lkey, self.mr.rkey

    def _refused(self, error: Exception) -> Exception:
        """A refused registration of host memory: a resource limit (the locked-memory
        limit), or a verbs error (:func:`gdrprobe.memory.causes.host_registration_error`)."""
        return host_registration_error(error, self._registered_what())

    def _registered_what(self) -> str:
        return f"{self.length} bytes of {self.registered_memory}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
