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

# ---- the A/B and its verdict ------------------------------------------------------------
A_B_SIZE = 1 << 20                 # the verdict compares bandwidth at large messages
REPEATS = 3                        # A/B repeats at most; sampling stops once it is clear
THRESHOLD = 0.9                    # the GPU/host ratio that counts as engaged
GPU_MEMORY = "gpu"                 # the GPU arm's mechanism: chosen automatically

# ---- the campaigns built on the A/B -----------------------------------------------------
CHECK_TIME_BUDGET_S = 30.0         # gdrprobe check's hard limit, set-up included
SLOW_FRACTION = 0.8                # cluster: a pair below this share of the median is slow
