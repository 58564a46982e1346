"""A rank's check counts the GPUs NCCL counts (issue 39 item 10): NCCL's topology holds the
communicator's GPUs on this node, not the node's (NVIDIA/nccl src/graph/topo.cc
ncclTopoGetSystem fuses the local ranks' own GPUs), so the NIC it picks for a GPU, its PXN
relay and "the only GPU" are decided among the job's local ranks' GPUs
(campaign/communicator.py). The machine is a fixture tree read by the real doctor; the run
engine is replaced by a recorder (the runs fixture)."""

from __future__ import annotations

import math

import pytest

import gdrprobe
from gdrprobe.campaign import communicator, gate, machine, memlock
from gdrprobe.campaign.gate import GpuFacts
from gdrprobe.errors import UsageError
from tests.unit.doctor import nccl_machines as nm

LAUNCHER = gate.RANK_VARIABLES + tuple(size for size in communicator.LOCAL_SIZES.values() if size) + (
    "SLURM_NODEID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES")
# hgx_8gpu_4nic's GPUs in PCI bus order
GPUS = ("0000:1b:00.0", "0000:1d:00.0", "0000:3d:00.0", "0000:3f:00.0", "0000:9d:00.0",
        "0000:9f:00.0", "0000:bd:00.0", "0000:bf:00.0")


@pytest.fixture
def hgx(tmp_path, monkeypatch):
    """The HGX fixture as this process's machine, no launcher variable set, locks and the
    locked-memory limit out of the way; job(**variables) sets a launcher's variables, and
    CUDA then shows the GPUs CUDA_VISIBLE_DEVICES leaves, as the driver would."""
    tree = nm.hgx_8gpu_4nic(tmp_path)
    for name in LAUNCHER:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GDRPROBE_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setattr(memlock, "locked_memory",
                        lambda: memlock.LockedMemory(math.inf, math.inf))
    real, environ = machine.machine_facts, {}
    monkeypatch.setattr(machine, "machine_facts",
                        lambda **asked: real(str(tmp_path), environ, **asked))

    def job(**variables: str) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        if "CUDA_VISIBLE_DEVICES" in variables:
            environ["CUDA_VISIBLE_DEVICES"] = variables["CUDA_VISIBLE_DEVICES"]
            nm.cuda_facts(tree, [GPUS[int(index)]
                                 for index in variables["CUDA_VISIBLE_DEVICES"].split(",")])
    return job


def test_a_rank_check_picks_the_nic_nccl_picks_among_the_jobs_gpus(hgx, runs):
    """torchrun --nproc-per-node 2 with CUDA_VISIBLE_DEVICES=1,3: the communicator holds
    GPUs 1 and 3 of the node. Counted among all eight, NCCL would relay GPU 1's sends
    through GPU 0 (PXN) to mlx5_0; among the job's two it sends from its own memory on
    mlx5_1, and that is the pair the check must measure (GPU 0 is not the job's)."""
    hgx(LOCAL_RANK="0", LOCAL_WORLD_SIZE="2", CUDA_VISIBLE_DEVICES="1,3")
    report = gdrprobe.check(time_budget_s=None, repeats=2)
    assert report.placement.gpu == GPUS[1]
    assert (report.placement.nic, report.placement.send_gpu) == ("mlx5_1", GPUS[1])
    assert {endpoint.device for endpoint, *_ in runs} == {"mlx5_1"}
    assert "LOCAL_WORLD_SIZE=2" in report.placement.nic_reason


def test_outside_a_job_nothing_names_the_communicator_and_the_reason_says_so(hgx, runs):
    report = gdrprobe.check(gpu=GPUS[1], time_budget_s=None, repeats=2)
    assert report.placement.nic == "mlx5_0"                 # NCCL's choice among all eight
    assert "every GPU of the node" in report.placement.nic_reason


@pytest.mark.parametrize("environ, named", [
    ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}, ("LOCAL_WORLD_SIZE", 4)),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"},
     ("OMPI_COMM_WORLD_LOCAL_SIZE", 8)),
    ({"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}, ("MPI_LOCALNRANKS", 2)),
    ({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "2"},
     ("SLURM_STEP_TASKS_PER_NODE", 2)),
    ({"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x2),2", "SLURM_NODEID": "1"},
     ("SLURM_STEP_TASKS_PER_NODE", 4)),
])
def test_each_launcher_counts_its_tasks_on_this_node(environ, named):
    ranks = communicator.communicator(environ)
    assert (ranks.variable, ranks.size) == named


def test_the_local_ranks_gpus_are_the_ordinals_they_use():
    """Local rank r uses CUDA ordinal r (gate.rank_pair's rule): with the driver, CUDA's
    r-th GPU; without, CUDA_VISIBLE_DEVICES's r-th entry in PCI bus order."""
    ranks = communicator.communicator({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                                       "CUDA_VISIBLE_DEVICES": "5,2,7"})
    assert ranks.matched(GpuFacts(None, GPUS)).bus_ids == (GPUS[5], GPUS[2])
    assert ranks.matched(GpuFacts((GPUS[5], GPUS[2], GPUS[7]), GPUS)).bus_ids == (GPUS[5],
                                                                                  GPUS[2])


def test_a_task_bound_to_one_gpu_takes_the_jobs_gpus_from_the_scheduler():
    """srun --gpus-per-task=1: each task sees its own GPU alone; the step's GPUs on this node
    are SLURM_STEP_GPUS, Slurm's indices (campaign/job_gpus.py)."""
    environ = {"SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NODEID": "0",
               "CUDA_VISIBLE_DEVICES": "0", "SLURM_STEP_GPUS": "2,3"}
    named = communicator.communicator(environ)
    assert named.job.source == "SLURM_STEP_GPUS"
    assert named.matched(GpuFacts((GPUS[3],), GPUS)).bus_ids == (GPUS[2], GPUS[3])
    # The task's own GPU is NCCL's whatever Slurm's index says (a gres.conf out of PCI order).
    assert named.matched(GpuFacts((GPUS[0],), GPUS)).bus_ids == (GPUS[2], GPUS[3], GPUS[0])
    alone = {key: value for key, value in environ.items() if key != "SLURM_STEP_GPUS"}
    assert communicator.communicator(alone) is None     # this task's GPU alone is not NCCL's count


def test_a_launcher_without_a_count_falls_back_to_the_jobs_gpus():
    assert communicator.communicator({"FLUX_TASK_LOCAL_ID": "0"}) is None
    named = communicator.communicator({"FLUX_TASK_LOCAL_ID": "0", "SLURM_JOB_GPUS": "0,1"})
    assert named.source == "SLURM_JOB_GPUS"


@pytest.mark.parametrize("environ", [
    {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "two"},
    {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "0"},
    {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "4(x)", "SLURM_NODEID": "0"},
    {"SLURM_LOCALID": "0", "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_NODEID": "3"},
    {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
])
def test_a_count_that_is_not_one_is_refused_with_its_variable(environ):
    with pytest.raises(UsageError, match="is not|names no|counts 2 tasks"):
        communicator.communicator(environ)


def test_every_launchers_local_rank_has_its_count_or_says_it_has_none():
    assert set(communicator.LOCAL_SIZES) == set(gate.RANK_VARIABLES)
