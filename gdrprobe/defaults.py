"""Every default in one table, as perftest keeps its defaults in perftest_parameters.h.

The public API, the command line, the wire and the lab all take their defaults from here;
what follows from a choice (the settings that depend on another one) is adjusted in one
function, :func:`gdrprobe.measure.options.dependent_settings`. Pure: imports nothing.
"""

from __future__ import annotations

# ---- the out-of-band channel -------------------------------------------------------------
PORT = 18750                       # gdrprobe serve's TCP port
BIND = "0.0.0.0"                   # what serve listens on
TIMEOUT_S = 30.0                   # every out-of-band step of a run
MAX_BUFFER = 256 << 20             # the most a client may make a server pin for a run
TOKEN_ENV = "GDRPROBE_TOKEN"       # where the command line looks for a token it was not given

# ---- one run (perftest's ib_write_bw defaults where it has one) ---------------------------
SIZE = 65536                       # DEF_SIZE_BW
ITERATIONS = 1000                  # perftest's DEF_ITERS is 1000 for latency, 5000 for BW
WARMUP_S = 0.5                     # a fixed-duration run's warm-up
TX_DEPTH = 128                     # DEF_TX_BW
CQ_MODERATION = 100                # DEF_CQ_MOD
QPS = 1
POST_LIST = 1
LATENCY_ITERATIONS = 1000          # DEF_ITERS for the latency tests
SWEEP_SIZES = tuple(1 << k for k in range(1, 24))   # 2 B .. 8 MiB, perftest's -a

# ---- integrity: what a run pins ---------------------------------------------------------
# In a bandwidth round the k-th message goes to slot k mod slots on both sides, each slot
# with a pattern of its own, so a wrong write that a later one would overwrite is still
# caught in its slot. The slots of one size are bounded in bytes (what the check pins, on
# both sides, within a default 8 MiB locked-memory limit) and in number (each is one check
# per round). ProbeOptions sizes a run's buffers with these two rules; the doctor compares
# the BAR1 aperture and the memlock limit with what a sweep pins by the same rules.
PAGE = 4096
INTEGRITY_CAP_BYTES = 4 << 20
# ... unless asked for more (run --integrity-bytes): each pass drains the queue once, a round
# trip the stream loses, which a long round trip makes dear (NCCL's pattern on a long wire)
MAX_INTEGRITY_BYTES = 1 << 30
MAX_SLOTS = 1024


def integrity_slots(size: int, messages: int | None = None,
                    cap_bytes: int = INTEGRITY_CAP_BYTES) -> int:
    """How many messages of this size land in a slot of their own: as many as the caps
    allow (cap_bytes: less than INTEGRITY_CAP_BYTES where the locked-memory limit asks for
    less), and no more than a run of ``messages`` sends (None: a run of fixed duration)."""
    fit = max(1, min(MAX_SLOTS, cap_bytes // size))
    return fit if messages is None else min(fit, messages)


def buffer_bytes(size: int, slots: int) -> int:
    """One side's buffer for messages of ``size`` in ``slots`` slots: the slots and a message
    past them (where stray writes show up), each page-rounded."""
    def pages(length: int) -> int:
        return -(-length // PAGE) * PAGE

    return pages(slots * size) + pages(size)

# ---- what a choice may be (the command line's choices and the API's checks) -------------
MEM_CHOICES = ("host", "gpu", "dmabuf", "peermem", "staged")   # gpu: the mechanism chosen
GPU_MEMORY_TYPES = ("device", "managed", "pinned-host")
GPU_MEMORY_TYPE = "device"
# How GPU device memory is allocated: vmm (cuMemCreate and cuMemMap, NCCL's own default since
# 2.19 where the driver supports it; cuMemAlloc elsewhere, as NCCL) or malloc (cuMemAlloc).
GPU_ALLOCATIONS = ("vmm", "malloc")
GPU_ALLOCATION = "vmm"
CLOCKS = ("auto", "counter", "monotonic")                        # measure/clock.py
CLOCK = "auto"
# The RDMA operation a run measures (measure/options.py): the client's NIC writes the
# server's buffer, writes it with an immediate (latency: each side waits on its receive
# completions, so either buffer may be GPU memory), or reads it (the server's NIC then
# reads its own memory).
OPCODES = ("write", "write_imm", "read")
# The latency loops whose CPU polls completions, not a receive buffer: either end may be GPU
# memory for WRITE with immediate, the READ's remote (fetched) end for READ (ib_read_lat).
LATENCY_A_B_OPCODES = ("write_imm", "read")
OPCODE = "write"
# --pattern: after each size's stream, the same size as NCCL's steps over its IB transport
# (measure/nccl_sender.py, gdrprobe.nccl.pattern).
PATTERNS = ("nccl",)

# ---- the A/B and its verdict ------------------------------------------------------------
A_B_SIZE = 1 << 20                 # the verdict compares bandwidth at large messages
REPEATS = 3                        # A/B repeats at most; sampling stops once it is clear
# The A/B's repeats at most while its answer is inconclusive (the median's 90% interval of the
# per-repeat ratios straddles the threshold, campaign/verdict.py), within a check's budget:
# with 16 the interval drops the 4 most extreme repeats at each end, so an answer stands
# though a quarter of the repeats were disturbed to the wrong side.
SETTLE_REPEATS = 16
THRESHOLD = 0.9                    # the GPU/host ratio that counts as engaged
# check --all-rails: a rail contends when together it keeps less than this of its solo
# bandwidth; the measured windows must overlap by at least RAILS_MIN_OVERLAP of the shortest
# one, or the rails did not really run together and the answer is inconclusive.
RAIL_RATIO = 0.9
RAILS_MIN_OVERLAP = 0.8
GPU_MEMORY = "gpu"                 # the GPU arm's mechanism: chosen automatically

# ---- the campaigns built on the A/B -----------------------------------------------------
CHECK_TIME_BUDGET_S = 30.0         # gdrprobe check's hard limit, set-up included
CHECK_QPS = 2                      # check: QPs per run (why: campaign/gate.py)
# check: the fraction of the port's line rate the deciding GPU arm must reach, where the
# rate is known and the NIC is hardware. Azure's node health checks expect 185 of 200 Gb/s
# (HDR) and 375 of 400 (NDR) from ib_write_bw between two GPU buffers of one node
# (azurehpc-health-checks conf/nd96asr_v4.conf, nd96isr_h100_v5.conf: 0.925 and 0.94, 8 MiB
# messages, perftest's 5000 iterations); check's windows are shorter and its messages 1 MiB,
# so the floor sits a margin below, and still above what a 400 Gb/s NIC reaches on a PCIe
# Gen4 x16 link (16 GT/s x 16 x 128/130 = 252 Gb/s: 0.63) or half its lanes.
FLOOR = 0.8
# check --latency: "latency degraded" where the GPU memory's median one-way latency (WRITE
# with immediate, GPU memory at both ends) is over the host memory's by more than this
# factor at a size. Uncalibrated, so a warning (exit 13), never a drain: the symptom users
# report on a path gone wrong is a doubling ("CUDA write latency value double than RDMA
# write latency in small payload", linux-rdma/perftest issue 276; NVIDIA's GPUDirect RDMA
# manual names "a very high latency" the symptom of a missing GDR path), while a healthy
# peer-to-peer hop adds a fraction of a host round trip.
LATENCY_FACTOR = 2.0
CHECK_LATENCY_SIZES = (8, 4096)    # check --latency: an NCCL LL line's payload, and a page
CHECK_LATENCY_ITERATIONS = LATENCY_ITERATIONS
LOCK_DIRS = ("/run/gdrprobe", "/tmp/gdrprobe")   # check: per-NIC lock files, first usable
SLOW_FRACTION = 0.8                # cluster: a pair below this share of the median is slow
BENCH_MEMORY = ("host", "dmabuf", "peermem", "staged")   # bench's memory kinds
MAX_DROP = 0.10                    # bench --baseline: the fall that flags a row
