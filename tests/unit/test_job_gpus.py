"""The job's GPUs (campaign/job_gpus.py): each source's syntax, the order they are asked in,
malformed values refused before anything runs, and names matched to this node's GPUs by
index, ordinal, bus id and UUID. Pure: the machine comes in as data."""

from __future__ import annotations

import pytest

import gdrprobe
from gdrprobe.campaign import job_gpus as jg
from gdrprobe.campaign.gate import GpuFacts
from gdrprobe.errors import UsageError
from gdrprobe.sysroot import SysRoot

BUS = ("0000:1b:00.0", "0000:3d:00.0", "0000:9b:00.0", "0000:bd:00.0")
UUIDS = {"GPU-8932f937-d72c-4106-c12f-20bd9faed9f6": BUS[0],
         "GPU-89aa0000-0000-0000-0000-000000000001": BUS[1],
         "GPU-77c1e2a4-5b6d-4e8f-9a0b-1c2d3e4f5a6b": BUS[3]}
NO_CUDA = GpuFacts(None, BUS, "no CUDA driver", UUIDS)
CUDA = GpuFacts(BUS, BUS, uuids=UUIDS)


def matched(environ, given=None, facts=NO_CUDA, listdir=None):
    return jg.match(jg.job_gpus(environ, given, listdir), facts)


@pytest.mark.parametrize("environ, source", [
    ({"SLURM_STEP_GPUS": "1", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0"},
     "SLURM_STEP_GPUS"),
    ({"SLURM_JOB_GPUS": "0,1", "NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0"},
     "SLURM_JOB_GPUS"),
    ({"NVIDIA_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "0"}, "NVIDIA_VISIBLE_DEVICES"),
    ({"NVIDIA_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": "0"}, "CUDA_VISIBLE_DEVICES"),
])
def test_the_first_source_that_is_set_names_the_jobs_gpus(environ, source):
    assert jg.job_gpus(environ).source == source
    assert jg.job_gpus(environ, given="2").source == "--gpu"


def test_nothing_named_is_every_gpu_of_the_node():
    assert jg.job_gpus({"SLURM_JOB_ID": "42"}) is None
    every = jg.match(None, CUDA)
    assert every.bus_ids == BUS and every.described.startswith("every GPU of the node")


def test_slurms_index_is_the_nodes_gpu_in_pci_bus_order_not_a_cuda_ordinal():
    # CUDA in this process sees GPUs 2 and 3 only (the prolog's CUDA_VISIBLE_DEVICES): its
    # ordinal 0 is BUS[2], Slurm's index 0 is still BUS[0].
    facts = GpuFacts(BUS[2:], BUS, uuids=UUIDS)
    assert matched({"SLURM_JOB_GPUS": "0,3"}, facts=facts).bus_ids == (BUS[0], BUS[3])
    assert matched({"CUDA_VISIBLE_DEVICES": "2,3"}, facts=facts).bus_ids == BUS[2:]


def test_uuids_and_their_prefixes_and_old_mig_names_find_their_gpu():
    found = matched({"NVIDIA_VISIBLE_DEVICES":
                     "GPU-77c1e2a4-5b6d-4e8f-9a0b-1c2d3e4f5a6b,GPU-8932f937,"
                     "MIG-GPU-8932f937-d72c-4106-c12f-20bd9faed9f6/1/0"})
    assert found.bus_ids == (BUS[3], BUS[0]) and found.unmatched == ()
    ambiguous = matched({"CUDA_VISIBLE_DEVICES": "GPU-89"})
    assert ambiguous.bus_ids == () and "the prefix of 2 GPUs' UUIDs" in ambiguous.unmatched[0][1]
    mig = matched({"NVIDIA_VISIBLE_DEVICES": "MIG-6f3a1c2d-1111-2222-3333-444455556666"})
    assert mig.unmatched[0][0].startswith("MIG-") and "MIG device" in mig.unmatched[0][1]


def test_the_container_runtimes_values():
    assert matched({"NVIDIA_VISIBLE_DEVICES": "all"}).bus_ids == BUS
    assert matched({"NVIDIA_VISIBLE_DEVICES": "none"}).bus_ids == ()
    assert matched({"NVIDIA_VISIBLE_DEVICES": "void"}).described.endswith(
        "the job has no GPU on this node")
    assert matched({"NVIDIA_VISIBLE_DEVICES": "1,2:0"}).bus_ids == (BUS[1], BUS[2])
    # The device plugin's volume-mounts strategy: one file per device under the path.
    listed = {jg.VOLUME_MOUNTS: ["GPU-77c1e2a4-5b6d-4e8f-9a0b-1c2d3e4f5a6b", "imex"]}
    mounted = matched({"NVIDIA_VISIBLE_DEVICES": jg.VOLUME_MOUNTS}, listdir=listed.get)
    assert mounted.bus_ids == (BUS[3],)


def test_given_gpus_are_cuda_ordinals_bus_ids_or_uuids():
    assert matched({}, given="1,0000:9b:00.0,bd:00.0", facts=CUDA).bus_ids == (BUS[1], BUS[2],
                                                                              BUS[3])
    assert matched({}, given="GPU-8932f937", facts=CUDA).bus_ids == (BUS[0],)
    with pytest.raises(UsageError, match="CUDA sees 4 GPU.s. in this process, none with "
                                         "ordinal 9") as raised:
        matched({}, given="9", facts=CUDA)
    assert "nvidia-smi -L" in raised.value.fix


@pytest.mark.parametrize("environ, given, words", [
    ({"SLURM_JOB_GPUS": "gpu0"}, None, "SLURM_JOB_GPUS='gpu0': 'gpu0' names no GPU (Slurm writes"),
    ({"SLURM_STEP_GPUS": "0,,1"}, None, "SLURM_STEP_GPUS='0,,1': '' names no GPU"),
    ({"NVIDIA_VISIBLE_DEVICES": "0000:1b:00.0"}, None, "GPU UUIDs or nvidia-smi indices"),
    ({"NVIDIA_VISIBLE_DEVICES": "gpu-1"}, None, "'gpu-1' names no GPU"),
    ({}, "", "--gpu='': '' names no GPU"),
    ({}, "0,zz", "'zz' names no GPU (a CUDA ordinal, a PCI bus id, a GPU or MIG UUID"),
])
def test_a_malformed_list_is_a_usage_error_naming_the_source(environ, given, words):
    with pytest.raises(UsageError) as raised:
        jg.job_gpus(environ, given)
    assert words in raised.value.cause and raised.value.exit_code == 2
    assert raised.value.fix


def test_check_node_refuses_a_malformed_list_before_it_reads_the_machine(monkeypatch):
    import gdrprobe.campaign.machine as machine

    def never(*args, **kwargs):
        raise AssertionError("the machine was read before the job's GPUs were checked")

    monkeypatch.setattr(machine, "machine_facts", never)
    monkeypatch.setenv("SLURM_JOB_GPUS", "0;1")
    with pytest.raises(UsageError, match="SLURM_JOB_GPUS='0;1'"):
        gdrprobe.check_node(time_budget_s=10)


def test_the_nvidia_driver_states_each_gpus_uuid_in_proc(tmp_path):
    folder = tmp_path / "proc/driver/nvidia/gpus" / BUS[1]
    folder.mkdir(parents=True)
    (folder / "information").write_text(
        "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\n"
        "GPU UUID: \t GPU-89aa0000-0000-0000-0000-000000000001\nVideo BIOS: \t 96.00.99.00.01\n"
        "Bus Type: \t PCIe\nBus Location: \t 0000:3d:00.0\nDevice Minor: \t 1\n")
    assert jg.gpu_uuids(SysRoot(str(tmp_path)), BUS) == {
        "GPU-89aa0000-0000-0000-0000-000000000001": BUS[1]}
