"""The pair a training rank will use, and the hard time budget of its prelaunch check.

Inside a job the GPU comes from the launcher's local rank: torchrun sets ``LOCAL_RANK``
(torch.distributed.run), srun sets ``SLURM_LOCALID`` ("node local task ID", srun(1)), Open
MPI's mpirun sets ``OMPI_COMM_WORLD_LOCAL_RANK``. The rank counts the GPUs the process can
see: CUDA numbers them after applying ``CUDA_VISIBLE_DEVICES`` (CUDA C Programming Guide,
"CUDA Environment Variables"), so local rank r uses CUDA ordinal r, the way
``torch.cuda.set_device(local_rank)`` does; a task that sees exactly one GPU (Slurm's
``--gpus-per-task`` binding) uses that one whatever its rank. The NIC is the one NCCL will
use for that GPU, as the doctor decides it: the caller passes the decision in, because
measure never runs the doctor.

Pure but for the clock: the facts come in as data.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Callable
from collections.abc import Mapping

from gdrprobe import defaults
from gdrprobe.errors import UsageError, quoted
from gdrprobe.numbers import decimal, is_decimal
from gdrprobe.campaign.ab import StopSampling
from gdrprobe.campaign.gpus import GpuFacts, visible_entries
from gdrprobe.campaign.job_gpus import JobGpuSet
from gdrprobe.doctor.facts.pci import line_rate_gbps
from gdrprobe.measure.options import MIN_TIMEOUT_S, ProbeOptions
from gdrprobe.nccl.gin import GinMode
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report.check import NcclUse, RankPair
from gdrprobe.report.model import RunReport

if TYPE_CHECKING:     # the doctor's facts, read by machine_facts; named here for the types
    from gdrprobe.doctor.facts.rails import Link
    from gdrprobe.doctor.facts.topology import Topology

# In the order a nested launch sets them: torchrun under srun sets both, and the training
# script follows torchrun's. Each launcher's own node-local rank: MPI_LOCALRANKID from the
# Hydra process manager of MPICH and Intel MPI (MPICH src/pm/hydra/proxy/pmip_cb.c,
# launch_procs), MV2_COMM_WORLD_LOCAL_RANK from MVAPICH2's mpirun_rsh (MVAPICH2 user guide,
# "MPIRUN_RSH Parameters"), PALS_LOCAL_RANKID from HPE Cray PALS (one of libPALS's
# variables, flux-coral2 src/shell/plugins/cray_pals.c), FLUX_TASK_LOCAL_ID from Flux
# ("the local task rank", flux-core doc/man7/flux-environment.rst).
RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "PALS_LOCAL_RANKID",
                  "FLUX_TASK_LOCAL_ID")


@dataclasses.dataclass(frozen=True)
class NicChoice:
    nic: str
    reason: str


@dataclasses.dataclass(frozen=True)
class PortFacts:
    """One RDMA port as sysfs states it."""

    rate_gbps: float | None        # the line rate the kernel states (ports/N/rate)
    link_layer: str | None         # "InfiniBand" or "Ethernet"


@dataclasses.dataclass(frozen=True)
class MachineFacts:
    """What the doctor read that choosing GPUs and NICs rests on; the caller runs the
    doctor and hands this over (measure never runs it)."""

    gpus: GpuFacts
    nics: Mapping[str, NicChoice]     # GPU bus id -> the NIC NCCL will use for it
    cuda_facts: Mapping | None = None  # doctor.facts.cuda.gpu_inventory() or {"error": ...}
    nvidia_driver: str | None = None  # the first line of /proc/driver/nvidia/version
    findings: tuple = ()              # the doctor's findings, for the verdict's causes
    # GPU bus id -> whether NCCL will use GPUDirect RDMA for it, and if not why
    nccl: Mapping[str, NcclUse] = dataclasses.field(default_factory=dict)
    # The environment as NCCL sees it: the process's, then NCCL's configuration files.
    nccl_environ: Mapping[str, str] = dataclasses.field(default_factory=dict)
    ports: Mapping[tuple[str, int], PortFacts] = dataclasses.field(default_factory=dict)
    software_nics: tuple[str, ...] = ()   # RDMA devices with no PCI function (rxe, siw)
    nccl_rules: NcclRules = NcclRules()   # the rules of the NCCL the job loads
    # NCCL's answer for every GPU where its environment alone keeps it off GPUDirect
    # (machine.nccl_use_of: also for a GPU the doctor could not place or identify)
    nccl_everywhere: NcclUse | None = None
    # Where the GPUs and NICs sit, and the negotiated link of each port between any GPU and
    # NIC (bus id -> Link): what names the element rails share (check --all-rails)
    topology: Topology | None = None
    pcie_links: Mapping[str, Link] = dataclasses.field(default_factory=dict)
    # The GPUs of NCCL's communicator on this node, matched once to this node's GPUs
    # (machine_facts; the node check's GPUs); None: none named, every GPU of the node.
    job: JobGpuSet | None = None
    # GPU bus id -> the mode NCCL's GIN takes for it, and NVSHMEM IBGDA's where the job sets
    # its variables (gdrprobe.doctor.checks.gin); check --gin settles them with the registration
    gin: Mapping[str, GinMode] = dataclasses.field(default_factory=dict)
    ibgda: Mapping[str, GinMode] = dataclasses.field(default_factory=dict)

    def line_rate(self, nic: str, port: int) -> float | None:
        """The port's line rate as the kernel states it (Gb/s; the doctor's reading,
        :func:`gdrprobe.doctor.facts.pci.line_rate_gbps`); None where it states none."""
        stated = self.ports.get((nic, port))
        return line_rate_gbps((stated,) if stated else ())


# ---- rank -> CUDA ordinal -> GPU -----------------------------------------------------


def local_rank(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """(rank, variable) from the first launcher variable that is set; None outside a job."""
    for name in RANK_VARIABLES:
        value = environ.get(name, "").strip()
        if not value:
            continue
        if not is_decimal(value):
            raise UsageError(f"{name}={quoted(value)} is not a local rank",
                             f"the launcher sets {name} to 0, 1, ...; unset it or fix the "
                             "job script")
        return decimal(value), name
    return None


def cuda_ordinal(rank: int, variable: str, visible: int | None) -> int:
    """The CUDA ordinal a rank uses among `visible` GPUs (None: unknown)."""
    if visible == 0:
        raise UsageError(f"{variable}={rank} but this process sees no GPU",
                         "check CUDA_VISIBLE_DEVICES and the job's GPU request")
    if visible == 1:
        return 0
    if visible is not None and rank >= visible:
        raise UsageError(f"{variable}={rank} but this process sees {visible} GPUs",
                         "start one rank per visible GPU, or bind one GPU per task")
    return rank


def physical_gpu(ordinal: int, facts: GpuFacts,
                 entries: tuple[str, ...] | None) -> tuple[str | None, str]:
    """The PCI bus id behind a CUDA ordinal, and how it was found (None: unknown); entries:
    CUDA_VISIBLE_DEVICES's (visible_entries), which the driver has applied where it answered."""
    if facts.runtime_bus_ids is not None:
        if ordinal < len(facts.runtime_bus_ids):
            return facts.runtime_bus_ids[ordinal], (
                f"CUDA ordinal {ordinal} is {facts.runtime_bus_ids[ordinal]} "
                "(cuDeviceGetPCIBusId; the driver applied CUDA_VISIBLE_DEVICES)")
        return None, f"CUDA sees {len(facts.runtime_bus_ids)} GPU(s), none with ordinal {ordinal}"
    entry = str(ordinal) if entries is None else (entries[ordinal] if ordinal < len(entries) else "")
    index = decimal(entry)
    if index is None:
        return None, (f"CUDA_VISIBLE_DEVICES entry {quoted(entry)} cannot be resolved without "
                      f"the CUDA driver ({facts.runtime_error or 'not loaded'})")
    if index >= len(facts.sysfs_bus_ids):
        return None, f"no NVIDIA GPU number {index} in sysfs ({len(facts.sysfs_bus_ids)} found)"
    bus_id = facts.sysfs_bus_ids[index]
    return bus_id, (f"GPU {index} in PCI bus order is {bus_id} (no CUDA driver to ask: CUDA "
                    "numbers GPUs in bus order with CUDA_DEVICE_ORDER=PCI_BUS_ID, and on nodes "
                    "with identical GPUs by default too)")


def rank_pair(environ: Mapping[str, str], facts: GpuFacts, decisions: Mapping[str, NicChoice],
              gpu: str | None = None, device: str | None = None) -> RankPair:
    """The GPU and NIC to check: those given, else the ones this process's rank will use."""
    if gpu is not None:
        return given_gpu(gpu, facts, environ, decisions, device)
    rank = local_rank(environ)
    visible = (len(facts.runtime_bus_ids) if facts.runtime_bus_ids is not None
               else _visible_count(environ))
    if rank is None:
        ordinal, rank_text = 0, ""
        lead = "not in a torchrun/Slurm/MPI job (no local rank): CUDA ordinal 0; "
    else:
        ordinal = cuda_ordinal(rank[0], rank[1], visible)
        rank_text = f"{rank[1]}={rank[0]}"
        lead = f"{rank_text}: CUDA ordinal {ordinal}; "
    bus_id, how = physical_gpu(ordinal, facts, visible_entries(environ))
    return RankPair(rank=rank_text, cuda_ordinal=ordinal, gpu=bus_id or str(ordinal),
                    gpu_reason=lead + how, **_nic_fields(bus_id, decisions, device))


def given_gpu(gpu: str, facts: GpuFacts, environ: Mapping[str, str],
              decisions: Mapping[str, NicChoice], device: str | None) -> RankPair:
    """A GPU named by the caller: a bus id as is, an ordinal through the visible GPUs."""
    ordinal = decimal(gpu)
    bus_id = gpu if ordinal is None else physical_gpu(ordinal, facts, visible_entries(environ))[0]
    return RankPair(rank="", cuda_ordinal=ordinal, gpu=gpu, gpu_reason=f"GPU {gpu} as given",
                    **_nic_fields(bus_id, decisions, device))


# A node where neither sysfs nor CUDA shows a GPU still gets one check, of CUDA ordinal 0,
# so that its answer says why nothing can be measured (no CUDA driver, no RDMA device).
NO_GPU_FOUND = "node check: no GPU in sysfs or from CUDA: CUDA ordinal 0"


def node_pairs(facts: GpuFacts, decisions: Mapping[str, NicChoice],
               job: tuple[str, ...] | None = None, job_reason: str = "") -> list[RankPair]:
    """The GPUs of a node check with the NIC NCCL will use for each: the job's (bus ids,
    job_reason saying who named them) where given, else every GPU of the node: CUDA's where
    the driver answered, else sysfs's in PCI bus order, else CUDA ordinal 0 (whose check
    then says why it cannot run)."""
    if job is not None:
        cuda = facts.runtime_bus_ids or ()
        return [RankPair(rank="", cuda_ordinal=cuda.index(bus_id) if bus_id in cuda else None,
                         gpu=bus_id, gpu_reason=f"node check, the job's GPU: {job_reason}",
                         **_nic_fields(bus_id, decisions, None))
                for bus_id in job]
    if facts.runtime_bus_ids:
        return [RankPair(rank="", cuda_ordinal=ordinal, gpu=bus_id,
                         gpu_reason=f"node check: CUDA ordinal {ordinal}",
                         **_nic_fields(bus_id, decisions, None))
                for ordinal, bus_id in enumerate(facts.runtime_bus_ids)]
    if facts.sysfs_bus_ids:
        return [RankPair(rank="", cuda_ordinal=None, gpu=bus_id,
                         gpu_reason=f"node check: GPU {index} in sysfs (PCI bus order)",
                         **_nic_fields(bus_id, decisions, None))
                for index, bus_id in enumerate(facts.sysfs_bus_ids)]
    return [RankPair(rank="", cuda_ordinal=0, gpu="0", gpu_reason=NO_GPU_FOUND,
                     **_nic_fields(None, decisions, None))]


def _visible_count(environ: Mapping[str, str]) -> int | None:
    entries = visible_entries(environ)
    return None if entries is None else len(entries)


def _nic_fields(bus_id: str | None, decisions: Mapping[str, NicChoice],
                device: str | None) -> dict:
    if device is not None:
        return {"nic": device, "nic_reason": f"{device} as given"}
    choice = decisions.get(bus_id) if bus_id else None   # None: the first RDMA device
    if choice is None:
        why = "the GPU's PCI address is unknown" if bus_id is None else \
              f"no NIC decision for {bus_id} (no PCI RDMA NIC in sysfs)"
        return {"nic": None, "nic_reason": f"{why}: the first RDMA device"}
    return {"nic": choice.nic, "nic_reason": choice.reason}


# ---- the time budget -----------------------------------------------------------------


def check_time_budget(seconds: float | None) -> None:
    if seconds is not None and not 0 < seconds <= 3600:
        raise UsageError(f"time budget {seconds:g} s: use more than 0 and at most 3600 s",
                         f"e.g. --time-budget {defaults.CHECK_TIME_BUDGET_S:g} (the "
                         "default); None in the API for no limit")


class Budget:
    """A hard limit on a whole check, from its first line: doctor and set-up included."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        check_time_budget(seconds)
        self.seconds = seconds
        self.clock = clock
        self.started = clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.elapsed()


# A check's runs measure bandwidth for at most MAX_WINDOW_S, or until WINDOW_BYTES have
# landed if that comes first: the bytes of one ib_write_bw run at perftest's defaults
# (DEF_SIZE_BW 65536 x DEF_ITERS_WB 5000, src/perftest_parameters.h), what the A/B by hand
# trusts for a rate. A 400 Gb/s port moves them in 7 ms, so the windows there cost what the
# set-up does; the time cap holds where the link is slow (Soft-RoCE moved 56 MB in a 1 s
# window in the emulated lab) and is what the budget plans for. The warm-up before each
# window ends the same way. A run keeps at most MAX_IN_FLIGHT_BYTES in flight per QP: what
# perftest keeps in flight at its defaults (DEF_TX_BW 128 x DEF_SIZE_BW), five times what
# fills a 400 Gb/s port for a 30 us round trip; closing a window waits for all of it (128
# messages of 1 MiB took 3 s to drain in the emulated lab, 16 MiB 0.45 s).
MAX_WINDOW_S = 1.0
PERFTEST_DEFAULT_SIZE = 65536
PERFTEST_DEFAULT_ITERATIONS = 5000
WINDOW_BYTES = PERFTEST_DEFAULT_SIZE * PERFTEST_DEFAULT_ITERATIONS
MAX_IN_FLIGHT_BYTES = 128 * PERFTEST_DEFAULT_SIZE
# Filling the port. perftest signals every write of a message over 8 KiB unless asked
# otherwise (src/perftest_parameters.c: cq_mod becomes DISABLED_CQ_MOD_VALUE, 1, above
# MSG_SIZE_CQ_MOD_LIMIT, 8192): each completion frees its slot at once, so the queue never
# drains between batches, which a moderation equal to the depth (a check's 8 messages of
# 1 MiB) would do every batch. Its defaults are otherwise the same at any speed (one QP,
# DEF_TX_BW 128 writes in flight), and with them Azure's node health checks read 375 of
# 400 Gb/s between two GPU buffers of one node (gdrprobe.defaults.FLOOR). A check keeps
# less in flight per QP (MAX_IN_FLIGHT_BYTES, so that closing a window on a slow link is
# quick), so it runs CHECK_QPS QPs by default: 16 MiB in flight, 330 us of a 400 Gb/s port.
PERFTEST_CQ_MOD_LIMIT = 8192


def sized_for_budget(options: ProbeOptions, budget_s: float, runs: int,
                     keep_cq_moderation: bool = False) -> ProbeOptions:
    """Fixed-duration runs: half the budget measures across `runs` runs, in windows of at
    most MAX_WINDOW_S and WINDOW_BYTES; the rest is for set-up, warm-up and the doctor.
    Messages over 8 KiB signal every write, as perftest's do, unless keep_cq_moderation
    (asked for explicitly)."""
    duration = options.duration_s or min(MAX_WINDOW_S, max(0.1, budget_s / 2 / runs))
    warmup = min(options.warmup_s, duration / 4)
    depth = max(1, min(options.tx_depth, MAX_IN_FLIGHT_BYTES // max(options.sizes)))
    moderation = min(options.cq_moderation, depth)
    if max(options.sizes) > PERFTEST_CQ_MOD_LIMIT and not keep_cq_moderation:
        moderation = 1
    return dataclasses.replace(options, duration_s=duration, warmup_s=warmup, tx_depth=depth,
                               window_bytes=options.window_bytes or WINDOW_BYTES,
                               cq_moderation=moderation,
                               post_list=min(options.post_list, depth))


RunOnce = Callable[..., RunReport]


def budgeted(make_run_once: Callable[[ProbeOptions], RunOnce], options: ProbeOptions,
             budget: Budget) -> RunOnce:
    """run_once(local, remote) that keeps inside the budget. A run starts only when what is
    left holds both its expected cost (the dearest run so far) and the shortest out-of-band
    time-out, and each of its out-of-band steps may wait no longer than what was left when
    it started: a peer that stalls is given up on within the budget. Otherwise
    StopSampling: the A/B classifies what it has."""
    costs: list[float] = []

    def run_once(local, remote) -> RunReport:
        remaining = budget.remaining()
        expected = max(costs, default=(options.duration_s or 0) + options.warmup_s)
        needed = max(expected, MIN_TIMEOUT_S)
        if remaining < needed:
            if not costs:
                raise UsageError(
                    f"the time budget of {budget.seconds:g} s cannot hold one run: "
                    f"{budget.elapsed():.1f} s went to set-up and a run needs {needed:.1f} s "
                    f"(at least the shortest out-of-band time-out, {MIN_TIMEOUT_S:g} s)",
                    f"give a time budget of at least {math.ceil(budget.elapsed() + needed)} s")
            raise StopSampling(f"the time budget of {budget.seconds:g} s holds no further run "
                               f"({needed:.1f} s needed, {remaining:.1f} s left)")
        capped = dataclasses.replace(options, timeout_s=min(options.timeout_s, remaining))
        started = budget.clock()
        report = make_run_once(capped)(local, remote)
        costs.append(budget.clock() - started)
        return report

    return run_once
