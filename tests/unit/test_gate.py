"""The pair a rank will use (launcher variables, CUDA_VISIBLE_DEVICES, the doctor's NIC
decision) and the check's hard time budget. Pure: facts come in as data, time from a
stand-in clock."""

import os
import pathlib
import subprocess
import sys

import pytest

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.errors import UsageError
from gdrprobe.campaign import gate
from gdrprobe.campaign.ab import StopSampling
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.measure.options import ProbeOptions
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import machines
from tests.unit.machine import no_rdma_device_only

BUS = tuple(f"0000:{bus:02x}:00.0" for bus in (0x1b, 0x43, 0x52, 0x61))
CUDA = gate.GpuFacts(runtime_bus_ids=BUS, sysfs_bus_ids=BUS)
NO_CUDA = gate.GpuFacts(runtime_bus_ids=None, sysfs_bus_ids=BUS, runtime_error="no CUDA driver")
DECISIONS = {bus: gate.NicChoice(f"mlx5_{i}", f"NCCL: mlx5_{i} is PIX to {bus}")
             for i, bus in enumerate(BUS)}


def test_torchrun_local_rank_picks_the_ordinal_and_nccls_nic():
    pair = gate.rank_pair({"LOCAL_RANK": "2", "SLURM_LOCALID": "0"}, CUDA, DECISIONS)
    assert (pair.rank, pair.cuda_ordinal, pair.gpu, pair.nic) == (
        "LOCAL_RANK=2", 2, BUS[2], "mlx5_2")
    assert "cuDeviceGetPCIBusId" in pair.gpu_reason and "PIX" in pair.nic_reason


def test_slurm_task_bound_to_one_gpu_uses_it_whatever_its_rank():
    # srun --gpus-per-task=1: CUDA sees only the task's GPU, the driver maps it.
    facts = gate.GpuFacts(runtime_bus_ids=(BUS[3],), sysfs_bus_ids=BUS)
    pair = gate.rank_pair({"SLURM_LOCALID": "3", "CUDA_VISIBLE_DEVICES": "3"}, facts, DECISIONS)
    assert (pair.rank, pair.cuda_ordinal, pair.gpu, pair.nic) == ("SLURM_LOCALID=3", 0, BUS[3],
                                                                   "mlx5_3")


def test_without_a_driver_visible_devices_map_into_bus_order_and_say_so():
    pair = gate.rank_pair({"LOCAL_RANK": "1", "CUDA_VISIBLE_DEVICES": "2,3"}, NO_CUDA, DECISIONS)
    assert (pair.cuda_ordinal, pair.gpu, pair.nic) == (1, BUS[3], "mlx5_3")
    assert "PCI_BUS_ID" in pair.gpu_reason


def test_a_uuid_without_a_driver_leaves_the_gpu_unknown_and_the_first_device():
    pair = gate.rank_pair({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "GPU-8e0a,GPU-77c1"},
                          NO_CUDA, DECISIONS)
    assert (pair.gpu, pair.nic) == ("0", None)
    assert "GPU-8e0a" in pair.gpu_reason and "first RDMA device" in pair.nic_reason


def test_outside_a_job_gpu_0_and_given_values_win():
    assert gate.rank_pair({}, CUDA, DECISIONS).gpu == BUS[0]
    given = gate.rank_pair({"LOCAL_RANK": "3"}, CUDA, DECISIONS, gpu=BUS[1], device="mlx5_7")
    assert (given.gpu, given.nic, given.rank) == (BUS[1], "mlx5_7", "")
    by_ordinal = gate.rank_pair({}, CUDA, DECISIONS, gpu="2")
    assert (by_ordinal.gpu, by_ordinal.cuda_ordinal, by_ordinal.nic) == ("2", 2, "mlx5_2")


def test_visible_devices_end_at_the_first_invalid_entry():
    assert gate.visible_entries({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ("1",)
    assert gate.visible_entries({"CUDA_VISIBLE_DEVICES": ""}) == ()
    assert gate.visible_entries({}) is None


@pytest.mark.parametrize("environ, message", [
    ({"LOCAL_RANK": "four"}, "not a local rank"),
    ({"LOCAL_RANK": "4"}, "sees 4 GPUs"),
    ({"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "-1"}, "sees no GPU"),
])
def test_impossible_ranks_are_usage_errors(environ, message):
    facts = NO_CUDA if "CUDA_VISIBLE_DEVICES" in environ else CUDA
    with pytest.raises(UsageError, match=message):
        gate.rank_pair(environ, facts, DECISIONS)


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_the_budget_refuses_a_run_that_would_not_fit_and_caps_time_outs():
    clock = Clock()
    budget = gate.Budget(20.0, clock)
    options = gate.sized_for_budget(ProbeOptions(sizes=(1 << 20,), timeout_s=10), 60.0, runs=12)
    assert options.duration_s == pytest.approx(60 / 2 / 12 / 2.5)   # capped: MAX_WINDOW_S
    seen = []

    def make_run_once(run_options):
        def run_once(local, remote):
            seen.append(run_options.timeout_s)
            clock.now += 3.0          # each run costs 3 s, set-up included
            return "run"
        return run_once

    run_once = gate.budgeted(make_run_once, options, budget)
    clock.now += 1.0                  # the doctor
    assert [run_once(None, None) for _ in range(5)] == ["run"] * 5
    # 19, 16, 13, 10 and 7 s were left: the time-out is the run's own, then what is left.
    assert seen == [10.0, 10.0, 10.0, 10.0, pytest.approx(7.0)]
    with pytest.raises(StopSampling, match="holds no further run"):
        run_once(None, None)          # 4 s left: less than the shortest time-out


def test_a_check_window_is_short_and_holds_little_in_flight():
    small = gate.sized_for_budget(ProbeOptions(sizes=(1 << 20,)), 4.0, runs=4)
    assert small.duration_s == 0.5 and small.warmup_s == 0.125
    # 8 MiB of 1 MiB messages, every one signalled as perftest signals messages over 8 KiB:
    # the queue refills as each write completes instead of draining every batch.
    assert (small.tx_depth, small.cq_moderation) == (8, 1)
    asked = gate.sized_for_budget(ProbeOptions(sizes=(1 << 20,), cq_moderation=4), 4.0, runs=4,
                                  keep_cq_moderation=True)
    assert asked.cq_moderation == 4
    capped = gate.sized_for_budget(ProbeOptions(sizes=(4096,)), 600.0, runs=6)
    assert capped.duration_s == gate.MAX_WINDOW_S
    assert (capped.tx_depth, capped.cq_moderation) == (128, 100)   # as asked
    huge = gate.sized_for_budget(ProbeOptions(sizes=(64 << 20,)), 30.0, runs=6)
    assert huge.tx_depth == 1 and huge.cq_moderation == 1
    # On a fast link the bytes of perftest's default run end a window before the time does.
    assert small.window_bytes == capped.window_bytes == 65536 * 5000
    assert small.window_messages(1 << 20) == 313


def test_a_budget_spent_before_the_first_run_is_a_usage_error():
    clock = Clock()
    budget = gate.Budget(1.0, clock)
    options = gate.sized_for_budget(ProbeOptions(), 1.0, runs=4)
    clock.now += 2.0
    with pytest.raises(UsageError, match="cannot hold one run: 2.0 s went to set-up") as raised:
        gate.budgeted(lambda o: lambda local, remote: None, options, budget)(None, None)
    assert raised.value.fix == "give a time budget of at least 7 s"


def test_the_rank_gets_the_nic_the_doctors_nccl_decision_names(tmp_path):
    machines.pix_node(tmp_path)
    root = str(tmp_path)
    for environ in ({"LOCAL_RANK": "5"}, {"SLURM_LOCALID": "5", "NCCL_IB_HCA": "^mlx5_5"}):
        facts = machine_facts(root, environ)
        pair = gate.rank_pair(environ, facts.gpus, facts.nics)
        decision = DoctorContext(SysRoot(root), environ).nccl_decisions[5]
        assert (pair.gpu, pair.nic) == (decision.gpu_bdf, decision.nic)
        assert pair.nic_reason == "NCCL's choice: " + decision.why[0]
    assert pair.nic != "mlx5_5"      # NCCL_IB_HCA took the nearest NIC away


@no_rdma_device_only
@pytest.mark.parametrize("command", [["check", "-q"], ["run", "--loopback", "--mem", "gpu"]])
def test_no_rdma_device_under_a_gpu_arm_exits_9_at_once(command):
    done = subprocess.run([sys.executable, "-m", "gdrprobe", *command], capture_output=True,
                          text=True, env={**os.environ, "LOCAL_RANK": "0"}, timeout=60)
    assert done.returncode == 9, done.stderr
    assert "not testable: no RDMA device found" in done.stderr


def test_the_readme_prolog_table_is_the_commands_own():
    from gdrprobe.cli.check import SCHEDULER_ACTION

    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("| exit | meaning | prolog action |")[1].split("\n\n")[0]
    documented = {}
    for line in table.splitlines()[2:]:
        codes, _meaning, action = (cell.strip() for cell in line.strip().strip("|").split("|"))
        documented.update({int(code): action for code in codes.split(", ")})
    assert documented == {code: action for code, action in SCHEDULER_ACTION.items()}


def test_the_quiet_line_and_the_json_name_the_pair():
    import dataclasses
    import json

    from gdrprobe.cli.check import one_line
    from gdrprobe.memory.spec import MemorySpec
    from gdrprobe.campaign.ab import plan_arms, run_ab
    from gdrprobe.report.model import to_json
    from tests.unit.fakes.runs import fake_probe
    run_once, _ = fake_probe(gpu_gbps=30.0, mechanism="peermem")
    report = run_ab(run_once, plan_arms(MemorySpec.from_choice("gpu"), MemorySpec(), False), 2)
    pair = gate.rank_pair({"LOCAL_RANK": "1"}, CUDA, DECISIONS)
    report = dataclasses.replace(report, placement=pair)
    assert one_line(report).startswith(
        f"gdrprobe check: GPUDirect RDMA degraded, failing direction read on GPU {BUS[1]} via "
        "mlx5_1 (exit 1: drain): ")
    placement = json.loads(to_json(report))["placement"]
    assert (placement["rank"], placement["gpu"], placement["nic"]) == ("LOCAL_RANK=1", BUS[1],
                                                                       "mlx5_1")
