"""The receiver's check of one bandwidth round: every pass as it lands (the default), or
the messages the slots hold at the end (a sampling run), and the stray bytes past the slots.

A round's message k lands in slot k mod slots and was sent from source slot k mod
source_slots (csrc/gdr_pattern.h): the pattern it must carry follows from k alone, so a
check proves which message a slot holds, not only that it holds good bytes.

Where the run asks for NCCL's flush, each check starts with it (gdrprobe.measure.flush): the
READ of the first byte of the last message checked, where NCCL reads, which must bring back
the byte that message put there."""

from __future__ import annotations

from gdrprobe import _native
from gdrprobe.errors import PeerError
from gdrprobe.measure.side import FlushTally, offset_or_none
from gdrprobe.memory.provider import MemoryProvider
from gdrprobe.protocol.fields import SAME_VERSION_FIX
from gdrprobe.report.model import Integrity


class RoundCheck:
    """What the receiver has found so far in one size's round."""

    def __init__(self, memory: MemoryProvider, size: int, slots: int, source_slots: int,
                 seed: int, flusher=None, stray_end: int | None = None):
        self.memory, self.size, self.slots = memory, size, slots
        self.source_slots, self.seed = source_slots, seed
        self.flushes = FlushTally(flusher)   # flusher: a measure.flush.Flusher, or None
        self.stray_end = stray_end  # where stray bytes stop being looked for (None: the end;
                                    # a bidirectional round's own sources start there)
        self.passes = 0            # passes checked
        self.messages = 0          # messages checked
        self.bad_messages = self.bad_bytes = 0
        self.first_bad: int | None = None
        self._stage_s = 0.0
        self._slots_used = 0

    def next_pass(self, messages: int) -> None:
        """Check the next pass: `messages` messages, the round's next ones (a pass before
        the last is `slots` messages, except NCCL's pattern's first: its steps alone)."""
        self._check(self.messages, messages)
        self.passes += 1

    def settle(self, posted: int, sampled: bool, writer: str) -> None:
        """The round's end, the writer's loop over (its `posted` WRITEs have landed): a
        sampling run checks the messages the slots hold now; otherwise every pass must have
        been checked already. writer: who wrote, as an error names it ("the client")."""
        if posted == 0:
            raise PeerError(f"{writer} ended the {self.size}-byte round without writing", "")
        if sampled:
            self.last(posted)
        elif self.messages != posted:
            raise PeerError(f"{writer} posted {posted} messages of {self.size} B and had "
                            f"{self.messages} checked", SAME_VERSION_FIX)

    def last(self, posted: int) -> None:
        """A sampling run: check the messages the slots hold after `posted` were sent."""
        held = min(self.slots, posted)
        self._check(posted - held, held)

    def _check(self, first: int, count: int) -> None:
        used = min(self.slots, first % self.slots + count)
        self._flush(first + count - 1)
        self.memory.flush_remote_writes()
        self._stage_s += self.memory.stage_in(0, used * self.size)
        bad_messages, bad, first_bad = self.memory.verify_messages(
            self.size, self.slots, self.source_slots, self.seed, first, count)
        if bad and self.first_bad is None:
            self.first_bad = first_bad
        self.bad_messages += bad_messages
        self.bad_bytes += bad
        self.messages += count
        self._slots_used = max(self._slots_used, used)

    def _flush(self, last: int) -> None:
        """NCCL's flush after message `last` landed: its first byte read back, which must be
        the first byte of its pattern."""
        offset = (last % self.slots) * self.size
        expected = _native.pattern_byte(_native.slot_seed(self.seed, last % self.source_slots), 0)
        self.flushes.read(offset, expected)

    @property
    def stage_in_s(self) -> float:
        """A staged buffer's copy time per message checked (0.0 in place)."""
        return self._stage_s / self.messages if self.messages else 0.0

    def integrity(self, posted: int) -> Integrity:
        """The round's integrity, with the stray bytes past the slots used. The buffer is
        poisoned again up to there for the next round (past it, it was just found poison)."""
        used_bytes = self._slots_used * self.size
        stray, first_stray = self.memory.verify_poison(used_bytes, self.stray_end)
        self.memory.poison(used_bytes)
        return Integrity(checked=True, bytes_checked=self.messages * self.size,
                         bad_bytes=self.bad_bytes, first_bad_offset=self.first_bad,
                         stray_bytes=stray, first_stray_offset=offset_or_none(first_stray),
                         messages_checked=self.messages, messages_total=posted,
                         bad_messages=self.bad_messages, **self.flushes.fields())
