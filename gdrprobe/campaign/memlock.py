"""A run sized to the locked-memory limit it runs under.

Registering host memory pins it, and the kernel charges the pages to RLIMIT_MEMLOCK unless
the process holds CAP_IPC_LOCK (Linux drivers/infiniband/core/umem.c, ib_umem_get: the
registration fails with ENOMEM once ``pinned_vm`` would pass the limit). A run pins one
buffer per end in this process (loopback: both ends), sized by its integrity slots
(:func:`gdrprobe.defaults.integrity_slots`, :func:`gdrprobe.defaults.buffer_bytes`). Fewer
slots pin less and change no number measured: every message is still checked, in more
passes of fewer messages (a run that samples checks fewer); so a run that would not fit gets
fewer, down to one per size, and a run that does not fit even then is refused before
anything starts, with the number it needs and how to raise the limit. GPU memory registered
through DMA-BUF or peermem is not charged; the A/B's host arm, host memory at both ends, is
what pins most.

The limit is per process (the kernel charges ``mm->pinned_vm``), so a node check, one
process for every NIC, shares it among the NICs it checks at the same time
(:func:`fit_node_to_memlock`): each NIC's run gets fewer slots, and where even one slot
each does not fit, fewer NICs run at once and the others take their turn. gdrprobe's own
footprint never exceeds the limit, so a registration refused for it can only be the
node's; the report says how the node check was fitted.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource

from gdrprobe.doctor.checks.memlock import (effective_capabilities, has_ipc_lock,
                                            memlock_fix, pinned_bytes_now)
from gdrprobe.doctor.checks.probe_needs import MiB, QUEUE_MARGIN_BYTES
from gdrprobe.doctor.facts.container import detect_container
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.errors import ResourceLimit
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.sysroot import SysRoot

KiB = 1 << 10


@dataclasses.dataclass(frozen=True)
class LockedMemory:
    """What this process may still pin."""

    soft: float          # RLIMIT_MEMLOCK's soft limit in bytes; inf: unlimited
    hard: float
    pinned: int = 0      # already pinned by this process (VmPin), charged to the same limit
    exempt: bool = False  # CAP_IPC_LOCK held: the limit does not apply

    @property
    def room(self) -> float:
        return math.inf if self.exempt else self.soft - self.pinned


def locked_memory(root: SysRoot | None = None) -> LockedMemory:
    """This process's limit (getrlimit), what it has pinned and whether it is exempt, from
    /proc/self/status under root (the live machine unless given)."""
    root = root or SysRoot("/")
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    capabilities = effective_capabilities(root)
    return LockedMemory(_limit(soft), _limit(hard), pinned_bytes_now(root),
                        capabilities is not None and has_ipc_lock(capabilities))


def _limit(value: int) -> float:
    return math.inf if value == resource.RLIM_INFINITY else value


def pinned_bytes(options: ProbeOptions, ends: int) -> int:
    """What a run pins in this process: a buffer per end here (and NCCL's FIFO or
    clear-to-send elements, with --pattern nccl) and the verbs queues."""
    return ends * (options.buffer_bytes + options.pattern_bytes) + QUEUE_MARGIN_BYTES


def fewest_slots(options: ProbeOptions) -> ProbeOptions:
    """options with one integrity slot per size: the least a run can pin."""
    return dataclasses.replace(options, integrity_bytes=1)


def fitted(options: ProbeOptions, ends: int, room: float) -> ProbeOptions | None:
    """options as they are where their run pins no more than room; else with the most
    integrity bytes that fit; None where one slot per size does not fit either."""
    if pinned_bytes(options, ends) <= room:
        return options
    if pinned_bytes(fewest_slots(options), ends) > room:
        return None
    fits, too_many = 1, options.integrity_bytes
    while too_many - fits > 1:      # the largest integrity_bytes that fits
        middle = (fits + too_many) // 2
        trial = dataclasses.replace(options, integrity_bytes=middle)
        if pinned_bytes(trial, ends) <= room:
            fits = middle
        else:
            too_many = middle
    return dataclasses.replace(options, integrity_bytes=fits)


def fit_to_memlock(options: ProbeOptions, ends: int, memory: LockedMemory,
                   notice=None) -> ProbeOptions:
    """options as they are where they fit in what this process may still pin; else with
    the most integrity bytes that fit (notice says so); else ResourceLimit."""
    result = fitted(options, ends, memory.room)
    if result is None:
        raise too_little_memlock(fewest_slots(options), ends, memory)
    if result is not options and notice is not None:
        notice(f"{limit_name(memory)} holds {slots_change(options, result)}: the same "
               "measurement, every message still checked, in more passes "
               f"({_mib(pinned_bytes(result, ends))} pinned)")
    return result


def limit_name(memory: LockedMemory) -> str:
    return f"the locked-memory limit (RLIMIT_MEMLOCK {_mib(memory.soft)})"


def slots_change(options: ProbeOptions, result: ProbeOptions) -> str:
    """The integrity slots the limit left, at the size that needs most."""
    size = max(options.sizes, key=lambda s: options.slots(s) * s)
    return (f"{result.slots(size)} integrity slots of {size} B per end instead of "
            f"{options.slots(size)}")


@dataclasses.dataclass(frozen=True)
class NodeFit:
    """A node check sized to the limit its one process runs under."""

    options: ProbeOptions      # each NIC's runs
    at_once: int               # how many NICs are checked at the same time
    note: str = ""             # what the limit changed, said in the report ("": nothing)


def fit_node_to_memlock(options: ProbeOptions, ends: int, nics: int,
                        memory: LockedMemory) -> NodeFit:
    """Every NIC at once where its share of the room holds a run (with fewer slots where
    needed); else as many NICs at once as hold a run of one slot per size each, the others
    in turn; ResourceLimit where not even one does."""
    if nics < 1:
        return NodeFit(options, 0)
    least = pinned_bytes(fewest_slots(options), ends)
    at_once = nics if math.isinf(memory.room) else min(nics, int(max(memory.room, 0) // least))
    if at_once == 0:
        raise too_little_memlock(fewest_slots(options), ends, memory)
    result = fitted(options, ends, memory.room / at_once)
    if result is options and at_once == nics:
        return NodeFit(options, nics)
    holds = [f"{slots_change(options, result)} in each NIC's check"] \
        if result is not options else []
    if at_once < nics:
        holds.append(f"{at_once} of the {nics} NICs' checks at a time (the others take "
                     "their turn)")
    pinned = pinned_bytes(result, ends)
    return NodeFit(result, at_once,
                   f"{limit_name(memory)} holds {' and '.join(holds)}: each check pins "
                   f"{_mib(pinned)}, the node check at most {_mib(at_once * pinned)} of the "
                   f"{_mib(memory.room)} this process may pin; the same measurement, every "
                   "message still checked")


def too_little_memlock(fewest: ProbeOptions, ends: int, memory: LockedMemory) -> ResourceLimit:
    """The error of a run that does not fit even with one slot per size."""
    need = pinned_bytes(fewest, ends) + memory.pinned
    need_kib = -(-need // KiB)
    already = f", {_mib(memory.pinned)} of it already pinned" if memory.pinned else ""
    raise_soft = (f"'ulimit -l {need_kib}' (KiB) in the launching shell (the hard limit "
                  "allows it), or to make it stick: " if memory.hard >= need else "")
    container = detect_container(DoctorContext(SysRoot("/")))
    return ResourceLimit(
        f"this run pins {_mib(need)} of host memory ({ends} buffer(s) of "
        f"{_mib(fewest.buffer_bytes)} for {max(fewest.sizes)} B messages with one integrity "
        f"slot, and {_mib(QUEUE_MARGIN_BYTES)} for the verbs queues), more than the "
        f"locked-memory limit of {_mib(memory.soft)}{already}",
        f"raise the limit to at least {need_kib} KiB: {raise_soft}{memlock_fix(container, os.geteuid() == 0)} "
        "Or measure smaller messages (-s).",
        evidence=f"getrlimit(RLIMIT_MEMLOCK): soft {_mib(memory.soft)}, hard "
                 f"{_mib(memory.hard)}; CAP_IPC_LOCK not held")


def _mib(value: float) -> str:
    return "unlimited" if value == math.inf else f"{value / MiB:.1f} MiB"
