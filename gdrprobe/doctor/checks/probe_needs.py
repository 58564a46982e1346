"""What the probe itself needs of the machine, for the checks that compare the machine with
it (the BAR1 aperture, the memlock limit): derived from the rules that size a run's buffers
(:func:`gdrprobe.defaults.integrity_slots`, :func:`gdrprobe.defaults.buffer_bytes`), the
same ones :class:`gdrprobe.measure.options.ProbeOptions` applies."""

from __future__ import annotations

from gdrprobe import defaults

MiB = 1 << 20
# One side's buffer of a full sweep, at the size that needs most.
SWEEP_BUFFER_BYTES = max(defaults.buffer_bytes(size, defaults.integrity_slots(size))
                         for size in defaults.SWEEP_SIZES)
# What the probe pins per arm in loopback: a buffer at each end.
PROBE_ARM_PINNED_BYTES = 2 * SWEEP_BUFFER_BYTES
# Host-pinned memory: the host arm's buffers, the staged arm's bounce buffers, and a
# margin for the verbs queues (QP and CQ rings are pinned too). GPU memory registered
# through DMA-BUF or peermem is not charged to RLIMIT_MEMLOCK.
QUEUE_MARGIN_BYTES = 4 * MiB
PROBE_MEMLOCK_BYTES = 2 * PROBE_ARM_PINNED_BYTES + QUEUE_MARGIN_BYTES
# The least `gdrprobe check` pins: one integrity slot at its message size at each end of the
# loopback A/B, and the queues (campaign/memlock.py fits a run down to this before it
# refuses one). The kernel's default limit since Linux 5.16, 8 MiB, holds it.
CHECK_MEMLOCK_BYTES = 2 * defaults.buffer_bytes(defaults.A_B_SIZE, 1) + QUEUE_MARGIN_BYTES


def format_mib(size: int) -> str:
    return f"{size // MiB} MiB"
