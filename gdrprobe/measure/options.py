"""What a client asks of a run: sizes, iterations, queue settings. The server receives the
same object in the handshake and checks it again against the same bounds."""

from __future__ import annotations

import dataclasses

from gdrprobe import _native, defaults
from gdrprobe.measure.clock import CLOCK_CHOICES
from gdrprobe.measure.nccl_shape import CTS_QP_SEND_WRS, FIFO_BYTES, RECV_WRS, NcclShape
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.rdma.endpoint import LATENCY_MAX_INLINE, EndpointOptions
from gdrprobe.rdma.verbs import MTUS
from gdrprobe.errors import UsageError
from gdrprobe.protocol.fields import field, int_list

MAX_SIZE = _native.MAX_SIZE
MAX_ITERATIONS = 10**9
MAX_WINDOW_BYTES = 1 << 50
MAX_QPS = _native.MAX_QPS
MAX_TX_DEPTH = 16384
MAX_POST_LIST = _native.MAX_POST_LIST
MAX_INLINE = 1024
SWEEP_SIZES = defaults.SWEEP_SIZES
# The shortest time-out a run can meet: its slowest out-of-band step is the server's set-up
# (device, QPs, registering the buffer), which took up to 3 s in the emulated lab.
MIN_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 3600.0
# Integrity: a bandwidth round's messages land in slots bounded in bytes and number (the
# rules: gdrprobe.defaults.integrity_slots, buffer_bytes), and the round runs in passes of
# that many, the receiver checking each pass before its slots are written again; a run
# that samples checks only the last pass. The report says how many were checked.
INTEGRITY_CAP_BYTES = defaults.INTEGRITY_CAP_BYTES
MAX_SLOTS = defaults.MAX_SLOTS
MAX_FLUSH_RULE_CHARS = 1000
OPCODES = defaults.OPCODES
PATTERNS = defaults.PATTERNS


def dependent_settings(options: ProbeOptions) -> dict:
    """The settings left to follow from others (perftest adjusts its dependent settings in
    one function too): a latency run is a ping-pong, one write in flight, so its TX depth
    is 1 unless asked; CQ moderation is perftest's 100, never above the TX depth."""
    tx_depth = options.tx_depth
    if tx_depth is None:
        tx_depth = 1 if options.mode == "latency" else defaults.TX_DEPTH
    cq_moderation = options.cq_moderation
    if cq_moderation is None:
        cq_moderation = min(defaults.CQ_MODERATION, tx_depth)
    return {"tx_depth": tx_depth, "cq_moderation": cq_moderation}


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
    """What the client asks for; the server receives and re-checks it."""

    mode: str = "bandwidth"
    sizes: tuple[int, ...] = (defaults.SIZE,)
    iterations: int = defaults.ITERATIONS
    warmup_iterations: int = 0
    duration_s: float | None = None
    warmup_s: float = defaults.WARMUP_S
    # With duration_s: the warm-up and the measured window each also end once this many
    # bytes (all QPs) have landed, if that comes first; None: time alone ends them.
    window_bytes: int | None = None
    qps: int = defaults.QPS
    tx_depth: int | None = None       # None: 1 for latency (a ping-pong), else TX_DEPTH
    cq_moderation: int | None = None  # None: CQ_MODERATION, at most the TX depth
    post_list: int = defaults.POST_LIST
    mtu: int | None = None
    timeout_s: float = defaults.TIMEOUT_S
    inline_size: int | None = None   # None: perftest's defaults (220 B latency, 0 bandwidth)
    relaxed_ordering: bool = True    # register with IBV_ACCESS_RELAXED_ORDERING, as NCCL does
    clock: str = defaults.CLOCK      # the loops' clock: measure/clock.py
    # The bytes one size's integrity slots may take: less than the cap where the
    # locked-memory limit asks for less (campaign/memlock.py), more where asked (a long
    # round trip: each pass drains the queue once); both sides size by it.
    integrity_bytes: int = INTEGRITY_CAP_BYTES
    # Check only the messages the slots hold at the end of each size, not every one: no
    # pauses between passes, at the price of missing corruption that comes and goes.
    sample_integrity: bool = False
    # NCCL's flush: the receiver reads back each GPU buffer the NIC wrote with an RDMA READ
    # on a loopback QP before checking it (measure/flush.py); the rule that asks for it, as
    # the report says it ("": no flush).
    flush: str = ""
    opcode: str = defaults.OPCODE    # OPCODES: what the client's NIC does to the server's buffer
    # Both sides WRITE at once, each into the other's slots (perftest's -b): every message
    # checked both ways, pass by pass in step (measure/side.py exchange_passes), or, a
    # sampling run, each side's slots at the end once the other's loop has ended.
    bidir: bool = False
    # Where each side's latency messages are sent from (WRITE with immediate): "" its own
    # buffer; "host": a host buffer apart, where NCCL's LL protocol keeps its send buffers
    # with GPUDirect too, its receive buffers in GPU memory (src/transport/net.cc
    # sendProxyConnect: NCCL_NET_MAP_ADD_POINTER(map, 0, p != NCCL_PROTO_LL && useGdr, ...)).
    send_memory: str = ""
    # "nccl": after each size's stream, the same size as NCCL's steps over its IB transport
    # (measure/nccl_sender.py, nccl_receiver.py), in the connections `nccl` describes.
    pattern: str = ""
    nccl: NcclShape | None = None

    def __post_init__(self):
        for name, value in dependent_settings(self).items():
            object.__setattr__(self, name, value)
        if self.pattern and self.nccl is None:
            object.__setattr__(self, "nccl", NcclShape())
        self.validate()
        if self.duration_s is None:
            # perftest clamps both to the iteration count (perftest_parameters.c): with more
            # writes in flight, or between signals, than the run has, the only signalled
            # write is the last one and a slow link looks stalled.
            object.__setattr__(self, "tx_depth", min(self.tx_depth, self.iterations))
            object.__setattr__(self, "cq_moderation", min(self.cq_moderation, self.tx_depth))
            object.__setattr__(self, "post_list", min(self.post_list, self.tx_depth))

    def validate(self) -> None:
        problems = []
        if self.mode not in ("bandwidth", "latency"):
            problems.append(f"mode {self.mode!r} is not bandwidth or latency")
        if not self.sizes or any(not 1 <= s <= MAX_SIZE for s in self.sizes):
            problems.append(f"sizes must be 1 B to {MAX_SIZE} B")
        if self.mode == "latency" and min(self.sizes, default=2) < 2:
            problems.append("latency needs messages of at least 2 bytes")
        if not 1 <= self.iterations <= MAX_ITERATIONS:
            problems.append(f"iterations must be 1 to {MAX_ITERATIONS}")
        if not 0 <= self.warmup_iterations <= MAX_ITERATIONS:
            problems.append("warm-up iterations must not be negative")
        if self.duration_s is not None and not 0 < self.duration_s <= 3600:
            problems.append("duration must be over 0 and at most 3600 s")
        if not 0 <= self.warmup_s <= 600:
            problems.append("warm-up must be 0 to 600 s")
        if self.window_bytes is not None and not (
                self.duration_s and 1 <= self.window_bytes <= MAX_WINDOW_BYTES):
            problems.append(f"window bytes must be 1 to {MAX_WINDOW_BYTES} and bound a run "
                            "of fixed duration")
        if not 1 <= self.qps <= MAX_QPS:
            problems.append(f"QPs must be 1 to {MAX_QPS}")
        if not 1 <= self.tx_depth <= MAX_TX_DEPTH:
            problems.append(f"TX depth must be 1 to {MAX_TX_DEPTH}")
        if not 1 <= self.cq_moderation <= self.tx_depth:
            problems.append("CQ moderation must be 1 to the TX depth")
        if not 1 <= self.post_list <= min(MAX_POST_LIST, self.tx_depth):
            problems.append(f"post list must be 1 to min({MAX_POST_LIST}, TX depth)")
        if self.mtu is not None and self.mtu not in MTUS:
            problems.append("MTU must be 256, 512, 1024, 2048 or 4096")
        if self.mode == "latency" and (self.qps != 1 or self.duration_s):
            problems.append("latency runs one QP and a fixed number of iterations")
        if self.opcode not in OPCODES:
            problems.append(f"opcode {self.opcode!r} is not one of {', '.join(OPCODES)}")
        if self.opcode == "write_imm" and self.mode != "latency":
            problems.append("write_imm measures latency (--latency): a bandwidth run WRITEs")
        if self.bidir and (self.mode != "bandwidth" or self.opcode != "write"
                           or self.duration_s):
            problems.append("--bidir runs WRITE bandwidth for a number of iterations (no -D, "
                            "--latency or --opcode)")
        if self.sample_integrity and self.qps > 1:
            problems.append("--sample-integrity checks the last message each slot holds, and "
                            "RDMA orders WRITEs only within a QP: over several QPs a slot's "
                            "last message may land before an earlier one (sample with -q 1, "
                            "or check every message without --sample-integrity)")
        if self.send_memory not in ("", "host"):
            problems.append(f"send memory {self.send_memory!r} is not '' or 'host'")
        if self.send_memory and not self.imm:
            problems.append("a send buffer in host memory apart is for latency with WRITE with "
                            "immediate (the CPU writes the tag into the message otherwise)")
        if self.opcode == "read" and self.flush:
            problems.append("NCCL's flush follows a WRITE into GPU memory: a READ run has none")
        if self.pattern:
            problems += self._pattern_problems()
        if self.inline_size is not None and not 0 <= self.inline_size <= MAX_INLINE:
            problems.append(f"inline size must be 0 to {MAX_INLINE} bytes")
        if not MIN_TIMEOUT_S <= self.timeout_s <= MAX_TIMEOUT_S:   # NaN fails this too
            problems.append(f"time-out must be {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} s")
        if self.clock not in CLOCK_CHOICES:
            problems.append(f"clock must be one of {', '.join(CLOCK_CHOICES)}")
        if not isinstance(self.flush, str) or len(self.flush) > MAX_FLUSH_RULE_CHARS:
            problems.append(f"the flush rule must be text of at most {MAX_FLUSH_RULE_CHARS} "
                            "characters")
        if not 1 <= self.integrity_bytes <= defaults.MAX_INTEGRITY_BYTES:
            problems.append(f"integrity bytes must be 1 to {defaults.MAX_INTEGRITY_BYTES}")
        if problems:
            raise UsageError("; ".join(problems), "each option's range is in the --help of the "
                             "command run ('gdrprobe bench --help', 'gdrprobe run --help')")

    def _pattern_problems(self) -> list[str]:
        if self.pattern not in PATTERNS:
            return [f"pattern {self.pattern!r} is not one of {', '.join(PATTERNS)}"]
        found = self.nccl.problems()
        if self.mode != "bandwidth" or self.opcode != "write" or self.bidir or self.duration_s \
                or self.sample_integrity:
            found.append("--pattern nccl measures WRITE bandwidth for a number of iterations, "
                         "every message checked (no -D, --latency, --opcode, --bidir or "
                         "--sample-integrity)")
        return found

    def nccl_ring(self, size: int) -> int:
        """An NCCL-pattern round's receive slots per channel (a pass of steps)."""
        return self.nccl.ring(size, self.integrity_bytes)

    def slots(self, size: int) -> int:
        """How many messages of this size each land in a slot of their own: as many as a
        bandwidth round posts, within the caps; a latency round has one message each way."""
        if self.mode == "latency":
            # A WRITE with immediate lands in a ring of slots, each written once a pass and
            # checked after it (measure/side.py ImmCheck); the tagged ping-pong in one.
            return defaults.integrity_slots(size, self.iterations, self.integrity_bytes) \
                if self.imm else 1
        messages = None if self.duration_s else (self.iterations + self.warmup_iterations) * self.qps
        return defaults.integrity_slots(size, messages, self.integrity_bytes)

    def source_slots(self, size: int) -> int:
        """The sender's distinct messages of this size: one more than the slots, so that
        no slot receives the same bytes twice running (gdr_pattern.h); they fit in the
        sender's buffer, which has room for a message past the slots."""
        return self.slots(size) + 1

    @property
    def buffer_bytes(self) -> int:
        """For the size that needs most: its slots and a message past them (where stray
        writes show up), each page-rounded. Latency: the receive half and the send half
        (with immediate, the receive half holds the slots: twice the room)."""
        halves = 2 if self.imm or self.bidir else 1
        return max(halves * defaults.buffer_bytes(size, self._slots_held(size))
                   for size in self.sizes)

    def _slots_held(self, size: int) -> int:
        """The most slots a size's rounds use: the stream's, or the NCCL pattern's rings."""
        if not self.pattern:
            return self.slots(size)
        return max(self.slots(size), self.nccl.channels * self.nccl_ring(size))

    @property
    def pattern_bytes(self) -> int:
        """Each side's host buffer for NCCL's pattern: the sender's FIFO, the receiver's
        clear-to-send elements (one connection's each, per channel)."""
        return self.nccl.channels * FIFO_BYTES if self.pattern else 0

    def source_offset(self, size: int) -> int:
        """Where a side's source slots start: at 0, but in a bidirectional round, where each
        side also receives, past its receive slots (the upper half of buffer_bytes)."""
        return defaults.buffer_bytes(size, self.slots(size)) if self.bidir else 0

    def to_message(self) -> dict:
        return dataclasses.asdict(self) | {"sizes": list(self.sizes),
                                           "nccl": self.nccl and self.nccl.to_message()}

    @classmethod
    def from_message(cls, message: dict) -> ProbeOptions:
        duration = message.get("duration_s")
        return cls(
            mode=field(message, "mode", str),
            sizes=tuple(int_list(message, "sizes", low=1, high=MAX_SIZE, max_items=64)),
            iterations=field(message, "iterations", int, low=1, high=MAX_ITERATIONS),
            warmup_iterations=field(message, "warmup_iterations", int, low=0,
                                    high=MAX_ITERATIONS),
            duration_s=None if duration is None else float(field(message, "duration_s",
                                                                  (int, float), low=0)),
            warmup_s=float(field(message, "warmup_s", (int, float), low=0, high=600)),
            window_bytes=(None if message.get("window_bytes") is None else
                          field(message, "window_bytes", int, low=1, high=MAX_WINDOW_BYTES)),
            qps=field(message, "qps", int, low=1, high=MAX_QPS),
            tx_depth=field(message, "tx_depth", int, low=1, high=MAX_TX_DEPTH),
            cq_moderation=field(message, "cq_moderation", int, low=1, high=MAX_TX_DEPTH),
            post_list=field(message, "post_list", int, low=1, high=MAX_POST_LIST),
            mtu=None if message.get("mtu") is None else field(message, "mtu", int),
            timeout_s=float(field(message, "timeout_s", (int, float), low=MIN_TIMEOUT_S,
                                  high=MAX_TIMEOUT_S)),
            inline_size=(None if message.get("inline_size") is None else
                         field(message, "inline_size", int, low=0, high=MAX_INLINE)),
            relaxed_ordering=field(message, "relaxed_ordering", bool),
            clock=field(message, "clock", str),
            integrity_bytes=field(message, "integrity_bytes", int, low=1,
                                  high=defaults.MAX_INTEGRITY_BYTES),
            sample_integrity=field(message, "sample_integrity", bool),
            flush=field(message, "flush", str, default=""),
            opcode=field(message, "opcode", str),
            bidir=field(message, "bidir", bool),
            send_memory=field(message, "send_memory", str, default=""),
            pattern=field(message, "pattern", str, default=""),
            nccl=(None if message.get("nccl") is None else
                  NcclShape.from_message(field(message, "nccl", dict))),
        )

    def window_messages(self, size: int) -> int:
        """The messages (all QPs) that end a warm-up or window early; 0: none do (window
        bytes come only with a duration: validate)."""
        return -(-self.window_bytes // size) if self.window_bytes else 0

    def endpoint_options(self, base: EndpointOptions, server: bool) -> EndpointOptions:
        """The endpoint for one side: the server's QPs take writes, and in a latency run
        (a ping-pong of writes) the client's do too; in a READ run only the server's QPs
        are read, and nothing is written remotely."""
        if self.reads:
            return dataclasses.replace(base, num_qps=self.qps, tx_depth=self.tx_depth,
                                       max_inline=0, mtu=self.mtu, remote_write=False,
                                       remote_read=server)
        written = server or self.mode == "latency" or self.bidir
        if self.pattern:   # NCCL's QPs: its queue depths, the clear-to-send inline or not
            # and written into the client's FIFO
            return dataclasses.replace(
                base, num_qps=self.endpoint_qps,
                tx_depth=max(self.tx_depth, CTS_QP_SEND_WRS), rx_depth=RECV_WRS,
                max_inline=max(self.max_inline, 64 if self.nccl.inline_cts else 0),
                mtu=self.mtu, remote_write=True)
        return dataclasses.replace(base, num_qps=self.qps, tx_depth=self.tx_depth,
                                   max_inline=self.max_inline, mtu=self.mtu,
                                   remote_write=written)

    @property
    def endpoint_qps(self) -> int:
        """Each side's QPs: the stream's, or NCCL's pattern's connections where more."""
        return max(self.qps, self.nccl.qps) if self.pattern else self.qps

    @property
    def imm(self) -> bool:
        """Whether the latency ping-pong WRITEs with immediate (perftest's
        --write_with_imm): each side waits on its receive completions."""
        return self.opcode == "write_imm"

    @property
    def reads(self) -> bool:
        """Whether the client READs the server's buffer instead of writing it."""
        return self.opcode == "read"

    @property
    def max_inline(self) -> int:
        if self.reads:
            return 0   # a READ request carries no data to inline
        if self.inline_size is not None:
            return self.inline_size
        return LATENCY_MAX_INLINE if self.mode == "latency" else 0


def check_latency_memory(options: ProbeOptions, client: MemorySpec | None,
                         server: MemorySpec | None) -> None:
    """The latency loop's CPU touches the buffer the bytes arrive in, which it cannot do in
    GPU memory: the WRITE ping-pong polls the last byte of each side's buffer (with
    immediate it polls completions: any memory); a READ
    latency loop polls its completion queue but checks each READ's bytes in the client's
    buffer, while the server's (what the READ fetches) may be GPU memory."""
    if options.mode != "latency" or options.imm:
        return
    polled = (client,) if options.reads else (client, server)
    if any(spec and spec.kind != "host" for spec in polled):
        if options.reads:
            raise UsageError("READ latency lands in host memory on this side: the CPU checks "
                             "each READ's bytes there, which it cannot do in GPU memory",
                             "drop --mem for --latency --opcode read (--remote-mem gpu puts "
                             "the bytes the NIC reads in GPU memory)")
        raise UsageError("latency runs use host memory on both sides: the CPU polls the "
                         "receive buffer, which it cannot do in GPU memory",
                         "use --opcode write_imm (perftest's --write_with_imm: each side waits "
                         "on its receive completions), or drop --mem/--remote-mem")
