"""What an NCCL-pattern round asks of its connections (``--pattern nccl``): channels, QPs per
connection and how a step uses them, as the client's NCCL settings say
(:mod:`gdrprobe.nccl.pattern` reads them; this is their form on the wire), and how a round is
cut into passes of the receive ring, each checked before its slots are written again."""

from __future__ import annotations

import array
import dataclasses
import statistics

from gdrprobe import _native, defaults
from gdrprobe.errors import UsageError
from gdrprobe.protocol.fields import field

STEPS = 8                       # NCCL_STEPS: steps in flight per connection
FIFO_BYTES = 256 * 8 * 64       # a connection's FIFO: 256 slots of 8 elements of 64 bytes
CTS_QP_SEND_WRS = 2 * 256       # NCCL's QPs: max_send_wr 2 x NET_IB_MAX_REQUESTS (connect.cc)
RECV_WRS = 256                  # ... and max_recv_wr NET_IB_MAX_REQUESTS
MAX_CHANNELS = 32
MAX_AR_THRESHOLD = 1 << 62


@dataclasses.dataclass(frozen=True)
class NcclShape:
    """One run's connections. Each channel is a connection of its own (its QPs, FIFO and
    receive ring), as NCCL opens one per channel."""

    channels: int = 1
    qps_per_connection: int = 1        # NCCL_IB_QPS_PER_CONNECTION
    split: bool = False                # NCCL_IB_SPLIT_DATA_ON_QPS
    adaptive_routing: bool = False     # comm->ar (NCCL_IB_ADAPTIVE_ROUTING, the link layer)
    ar_threshold: int = 8192           # NCCL_IB_AR_THRESHOLD
    inline_cts: bool = False           # NCCL_IB_USE_INLINE

    def problems(self) -> list[str]:
        found = []
        if not 1 <= self.channels <= MAX_CHANNELS:
            found.append(f"NCCL-pattern channels must be 1 to {MAX_CHANNELS}")
        if self.qps_per_connection < 1 or \
                self.channels * self.qps_per_connection > _native.MAX_QPS:
            found.append(f"channels x QPs per connection must be 1 to {_native.MAX_QPS}")
        if not 0 <= self.ar_threshold <= MAX_AR_THRESHOLD:
            found.append("the adaptive-routing threshold must not be negative")
        return found

    @property
    def qps(self) -> int:
        return self.channels * self.qps_per_connection

    def ring(self, size: int, integrity_bytes: int) -> int:
        """Receive slots per channel: NCCL's NCCL_STEPS at least, else as many as the
        integrity cap gives each channel (a pass is this many steps per channel)."""
        return max(STEPS, defaults.integrity_slots(size, None, integrity_bytes // self.channels))

    def loop_shape(self, size: int, integrity_bytes: int) -> dict:
        """The shape the native loops take (gdrprobe._nccl)."""
        return {"channels": self.channels, "qps_per_conn": self.qps_per_connection,
                "split": int(self.split), "adaptive_routing": int(self.adaptive_routing),
                "ar_threshold": self.ar_threshold, "inline_cts": int(self.inline_cts),
                "step_bytes": size, "ring_slots": self.ring(size, integrity_bytes)}

    def describe(self) -> str:
        split = "split over the QPs" if self.split else "each step on one QP in turn"
        routing = (f", adaptive routing over {self.ar_threshold} B" if self.adaptive_routing
                   else "")
        return (f"{self.channels} channel(s) x {self.qps_per_connection} QP(s), {split}"
                f"{routing}, {STEPS} steps in flight")

    def to_message(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_message(cls, message: dict) -> NcclShape:
        return cls(channels=field(message, "channels", int, low=1, high=MAX_CHANNELS),
                   qps_per_connection=field(message, "qps_per_connection", int, low=1,
                                            high=_native.MAX_QPS),
                   split=field(message, "split", bool),
                   adaptive_routing=field(message, "adaptive_routing", bool),
                   ar_threshold=field(message, "ar_threshold", int, low=0, high=MAX_AR_THRESHOLD),
                   inline_cts=field(message, "inline_cts", bool))


def check_shape(shape: NcclShape) -> None:
    problems = shape.problems()
    if problems:
        raise UsageError("; ".join(problems), "see 'gdrprobe run --help' (--pattern nccl)")


ALONE_STEPS = 16     # a round's first pass: steps alone, one in flight per connection


def pattern_passes(steps: int, ring: int) -> list[int]:
    """A round's passes, steps per connection in each: the steps alone (a ring's at most),
    then the loaded ones, `steps` in rings (each pass checked before its slots are offered
    again)."""
    return [min(ring, ALONE_STEPS)] + [min(ring, steps - done) for done in range(0, steps, ring)]


def times(raw: bytes) -> array.array:
    """A loop's per-step times (uint64 ns, gdrprobe._nccl.NcclLoopResult)."""
    found = array.array("Q")
    found.frombytes(raw)
    return found


def median_ns(values) -> int:
    """The median of step times in ns; 0 for none."""
    return int(statistics.median(values)) if len(values) else 0
