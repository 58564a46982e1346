"""NCCL's communicator on this node as a rank's check can know it: the GPUs NCCL's rules
count.

NCCL's topology holds the communicator's GPUs, not the node's: each rank detects only the
GPU it manages, and the topologies of the communicator's ranks on this host (those with its
host hash) are fused (NVIDIA/nccl v2.30.7 ``src/graph/topo.cc`` ncclTopoGetSystem: "Detect
only the GPU managed by this process. We'll get any others through XML fusion.", then
bootstrapIntraNodeAllGather over those local ranks). Every count NCCL's decision makes is
over those GPUs: the GPUs local to a NIC in its NIC choice (ncclTopoGetLocalNetType:
``dev % localGpuCount``, and netsPerGpu over them), the PXN relays, "the only GPU"
(:mod:`gdrprobe.nccl.decision`).

A node check names the job's GPUs (:mod:`gdrprobe.campaign.job_gpus`). A rank's check
(``check()``, ``require()`` in a running job) asks for the job's communicator: its tasks on
this node, one GPU each, local rank r on CUDA ordinal r among the GPUs it sees (the rule of
:func:`gdrprobe.campaign.gate.rank_pair`). Each launcher states its count of tasks on this
node beside the local rank (:data:`LOCAL_SIZES`). Where a task sees one GPU alone (one GPU
bound per task) the others' GPUs are not this process's to name, and where the launcher
states no count (Flux), the job's GPUs as the scheduler or the container runtime names them
stand for the communicator's; where nothing names them, every GPU of the node is counted, as
NCCL would count them in a communicator of the whole node, and the check's placement says
so.

Pure: the environment comes in as data.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from gdrprobe.campaign.gate import local_rank, physical_gpu
from gdrprobe.campaign.gpus import GpuFacts, visible_entries
from gdrprobe.campaign.job_gpus import ORDINAL, GpuName, JobGpus, JobGpuSet, job_gpus
from gdrprobe.errors import UsageError, quoted
from gdrprobe.numbers import is_decimal

SLURM_TASKS = "SLURM_STEP_TASKS_PER_NODE"
# Each launcher's count of its tasks on this node, by the local-rank variable it sets
# beside it (gate.RANK_VARIABLES): torchrun's LOCAL_WORLD_SIZE ("equals to
# --nproc-per-node", torch.distributed.run, "Environment Variables"); srun's tasks per node
# of the step, this node's by SLURM_NODEID (SchedMD/slurm slurm-25-11-7-1 src/common/env.c
# env_array_for_step: uint16_array_to_str's "4(x2),2"); Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE
# (mpirun(1)); Hydra's MPI_LOCALNRANKS beside MPI_LOCALRANKID (MPICH
# src/pm/hydra/proxy/pmip_cb.c); MVAPICH2's MV2_COMM_WORLD_LOCAL_SIZE (user guide,
# "MPIRUN_RSH Parameters"); HPE Cray PALS's PALS_LOCAL_SIZE. Flux states none
# (flux-core doc/man7/flux-environment.rst: FLUX_TASK_LOCAL_ID, FLUX_JOB_SIZE only).
LOCAL_SIZES = {
    "LOCAL_RANK": "LOCAL_WORLD_SIZE",
    "SLURM_LOCALID": SLURM_TASKS,
    "OMPI_COMM_WORLD_LOCAL_RANK": "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALRANKID": "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_LOCAL_RANK": "MV2_COMM_WORLD_LOCAL_SIZE",
    "PALS_LOCAL_RANKID": "PALS_LOCAL_SIZE",
    "FLUX_TASK_LOCAL_ID": None,
}
_COUNT = re.compile(r"[1-9][0-9]{0,5}")                     # tasks on a node: 1 .. 999999
_SLURM_GROUP = re.compile(r"([0-9]{1,6})(?:\(x([1-9][0-9]{0,6})\))?")


@dataclasses.dataclass(frozen=True)
class LocalRanks:
    """The job's tasks on this node as the launcher counts them: local ranks 0 .. size-1,
    each on the GPU the rank rule gives it among the GPUs the tasks see."""

    variable: str                          # the launcher's count, e.g. LOCAL_WORLD_SIZE
    value: str                             # as set
    size: int
    visible: tuple[str, ...] | None        # CUDA_VISIBLE_DEVICES's entries, None: unset

    def matched(self, facts: GpuFacts) -> JobGpuSet:
        """The local ranks' GPUs (bus ids, in rank order, each once)."""
        named = JobGpus(self.variable, self.value,
                        tuple(GpuName(ORDINAL, str(rank)) for rank in range(self.size)))
        found: list[str] = []
        unmatched = []
        for rank in range(self.size):
            bus_id, why = physical_gpu(rank, facts, self.visible)
            if bus_id is None:
                unmatched.append((f"local rank {rank}", why))
            elif bus_id not in found:
                found.append(bus_id)
        return JobGpuSet(named, tuple(found), tuple(unmatched))


@dataclasses.dataclass(frozen=True)
class BoundTask:
    """A task that sees one GPU alone: the job's GPUs as the scheduler or the container
    runtime names them, and this task's own GPU, which is NCCL's whatever they say."""

    job: JobGpus
    visible: tuple[str, ...]

    def matched(self, facts: GpuFacts) -> JobGpuSet:
        named = self.job.matched(facts)
        own, _ = physical_gpu(0, facts, self.visible)
        if own is None or own in named.bus_ids:
            return named
        return dataclasses.replace(named, bus_ids=(*named.bus_ids, own))


Communicator = LocalRanks | BoundTask | JobGpus


def communicator(environ: Mapping[str, str]) -> Communicator | None:
    """The communicator's GPUs on this node as this process can name them: its launcher's
    local ranks, else the job's GPUs (None: nothing names them, every GPU of the node)."""
    rank = local_rank(environ)
    visible = visible_entries(environ)
    size = local_size(environ, rank[1]) if rank is not None else None
    if size is not None and rank[0] >= size:
        raise UsageError(f"{rank[1]}={rank[0]} but {LOCAL_SIZES[rank[1]]} counts {size} "
                         "tasks on this node", "fix the job script's launcher variables")
    if size is not None and (size == 1 or visible is None or len(visible) > 1):
        variable = LOCAL_SIZES[rank[1]]
        return LocalRanks(variable, environ[variable], size, visible)
    named = job_gpus(environ)
    if rank is None or visible is None or len(visible) != 1:
        return named
    if named is None or named.source == "CUDA_VISIBLE_DEVICES":
        return None          # this task's own GPU alone is not its communicator's
    return BoundTask(named, visible)


def local_size(environ: Mapping[str, str], rank_variable: str) -> int | None:
    """The launcher's count of its tasks on this node (None: it states none); a count that
    is not one is refused with its variable."""
    variable = LOCAL_SIZES[rank_variable]
    value = environ.get(variable, "").strip() if variable else ""
    if not value:
        return None
    if variable == SLURM_TASKS:
        return slurm_tasks_here(value, environ.get("SLURM_NODEID", "").strip())
    if not _COUNT.fullmatch(value):
        raise UsageError(f"{variable}={quoted(value)} is not a count of tasks on this node",
                         f"the launcher sets {variable} to 1, 2, ...; unset it or fix the "
                         "job script")
    return int(value)


def slurm_tasks_here(value: str, node_id: str) -> int:
    """This node's entry of Slurm's tasks per node ("4(x2),2": 4, 4, 2 by the step's node
    order), by SLURM_NODEID, the node's place in that order."""
    fix = f"srun sets {SLURM_TASKS} and SLURM_NODEID; unset them or fix the job script"
    if not is_decimal(node_id) or len(node_id) > 6:
        raise UsageError(f"SLURM_NODEID={quoted(node_id)} names no node of {SLURM_TASKS}={quoted(value)}",
                         fix)
    left = int(node_id)
    for group in value.split(","):
        found = _SLURM_GROUP.fullmatch(group.strip())
        if found is None or int(found.group(1)) == 0:
            raise UsageError(f"{SLURM_TASKS}={quoted(value)} is not a count of tasks per node", fix)
        repeat = int(found.group(2) or 1)
        if left < repeat:
            return int(found.group(1))
        left -= repeat
    raise UsageError(f"SLURM_NODEID={node_id} names no node of {SLURM_TASKS}={quoted(value)}", fix)
