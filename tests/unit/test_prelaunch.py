"""One GPU's gate (campaign/prelaunch.py): the memory NCCL will use (GPU memory at both
ends, PXN's peer for the sends), NCCL's environment, the floor against the port's line rate,
NCCL's decision in the verdict, and the NIC's lock. The machine is a fixture tree read by the
real doctor; the run engine is replaced by a recorder."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gdrprobe.campaign import prelaunch
from gdrprobe.campaign.arguments import check_floor
from gdrprobe.campaign.gate import PortFacts
from gdrprobe.campaign.machine import machine_facts
from gdrprobe.campaign.nic_lock import nic_lock
from gdrprobe.errors import NotTestable
from gdrprobe.nccl.gid import GidPreference
from gdrprobe.report.model import to_json
from tests.unit.doctor import nccl_machines as nm
from tests.unit.fakes.prelaunch import check
def gpu_arm_buffers(made) -> set[tuple[str, str]]:
    return {(local.gpu if local.kind == "gpu" else "host",
             remote.gpu if remote.kind == "gpu" else "host")
            for _, _, local, remote in made if "gpu" in (local.kind, remote.kind)}


def test_gpu_memory_at_both_ends_on_nccls_nic(tmp_path, runs, locks):
    nm.hgx_8gpu_4nic(tmp_path)
    report = check(machine_facts(str(tmp_path), {}), "0000:1b:00.0", locks)
    assert gpu_arm_buffers(runs) == {("0000:1b:00.0", "0000:1b:00.0")}
    assert {endpoint.device for endpoint, *_ in runs} == {"mlx5_0"}
    assert report.verdict.classification == "engaged"
    assert report.placement.send_gpu == "0000:1b:00.0"
    assert report.floor.applied and report.floor.line_rate_gbps == 400.0
    assert report.arms[1].direction == "both"


def test_pxn_sends_from_the_peers_memory_and_receives_into_its_own(tmp_path, runs, locks):
    nm.hgx_8gpu_4nic(tmp_path)
    report = check(machine_facts(str(tmp_path), {}), "0000:1d:00.0", locks)
    assert gpu_arm_buffers(runs) == {("0000:1b:00.0", "0000:1d:00.0")}
    assert report.placement.send_gpu == "0000:1b:00.0"
    assert "PXN" in report.placement.send_gpu_reason
    assert "no PXN on receive" in report.placement.send_gpu_reason


def test_a_pxn_peer_this_process_cannot_see_leaves_the_sends_unmeasured(tmp_path, runs, locks):
    nm.hgx_8gpu_4nic(tmp_path)
    facts = machine_facts(str(tmp_path), {})
    alone = dataclasses.replace(facts, gpus=dataclasses.replace(
        facts.gpus, runtime_bus_ids=("0000:1d:00.0",)))      # CUDA_VISIBLE_DEVICES: this GPU only
    report = check(alone, "0000:1d:00.0", locks)
    assert gpu_arm_buffers(runs) == {("host", "0000:1d:00.0")}
    assert report.placement.send_gpu is None
    assert "not visible to this process" in report.placement.send_gpu_reason
    assert report.arms[1].direction == "write"


@pytest.mark.parametrize("link_layer, gid_index", [("Ethernet", 3), ("InfiniBand", None)])
def test_nccl_ib_gid_index_picks_the_gid_on_roce_only(tmp_path, runs, locks, link_layer,
                                                      gid_index):
    nm.dmabuf_only(tmp_path)
    facts = machine_facts(str(tmp_path), {})
    facts = dataclasses.replace(facts, nccl_environ={"NCCL_IB_GID_INDEX": "3"},
                                ports={("mlx5_0", 1): PortFacts(400.0, link_layer)})
    report = check(facts, "0000:1b:00.0", locks)
    assert {endpoint.gid_index for endpoint, *_ in runs} == {gid_index}
    assert ("NCCL_IB_GID_INDEX" in report.placement.nic_reason) == (gid_index is not None)


def test_nccl_s_gid_walk_follows_the_job_s_address_family_roce_version_and_range(
        tmp_path, runs, locks):
    nm.dmabuf_only(tmp_path)
    facts = machine_facts(str(tmp_path), {})
    facts = dataclasses.replace(facts, nccl_environ={
        "NCCL_IB_ADDR_FAMILY": "AF_INET6", "NCCL_IB_ROCE_VERSION_NUM": "1",
        "NCCL_IB_ADDR_RANGE": "fd00::/8"}, ports={("mlx5_0", 1): PortFacts(400.0, "Ethernet")})
    check(facts, "0000:1b:00.0", locks)
    assert {endpoint.gid_preference for endpoint, *_ in runs} == {
        GidPreference(family=6, roce_version=1, address_range="fd00::/8")}


def test_an_nccl_setting_that_keeps_nccl_off_gdr_is_exit_10(tmp_path, runs, locks):
    nm.dmabuf_only(tmp_path)
    facts = machine_facts(str(tmp_path), {"NCCL_DMABUF_ENABLE": "0"})
    report = check(facts, "0000:1b:00.0", locks)
    assert report.verdict.classification == "not used by NCCL"
    assert report.verdict.exit_code == 10
    assert report.verdict.nccl.settings == ("NCCL_DMABUF_ENABLE=0 (environment)",)


def test_a_software_device_is_said_and_the_floor_not_applied(tmp_path, runs, locks):
    nm.dmabuf_only(tmp_path)
    facts = dataclasses.replace(machine_facts(str(tmp_path), {}), software_nics=("rxe0",))
    report = check(facts, "0000:1b:00.0", locks, device="rxe0")
    assert report.floor.software_device and not report.floor.applied
    assert "can never do GPUDirect RDMA" in report.floor.note
    assert report.verdict.classification == "engaged"


def test_without_nccls_choice_the_report_names_the_device_measured(tmp_path, runs, locks,
                                                                   monkeypatch):
    monkeypatch.setattr(prelaunch, "first_rdma_device", lambda: "rxe0")
    facts = machine_facts(str(tmp_path), {})             # an empty machine: no decision
    report = check(facts, "0", locks)
    assert report.placement.nic == "rxe0"
    assert "first RDMA device" in report.placement.nic_reason
    assert json.loads(to_json(report))["placement"]["nic"] == "rxe0"
    assert report.floor.software_device is None and not report.floor.applied


def test_the_runs_fill_the_port_as_perftest_does(tmp_path, runs, locks):
    nm.dmabuf_only(tmp_path)
    check(machine_facts(str(tmp_path), {}), "0000:1b:00.0", locks)
    options = {options for _, options, *_ in runs}
    assert {(o.qps, o.tx_depth, o.cq_moderation) for o in options} == {(2, 8, 1)}


def test_the_check_holds_its_nics_lock_and_says_so(tmp_path, runs, locks):
    nm.dmabuf_only(tmp_path)
    report = check(machine_facts(str(tmp_path), {}), "0000:1b:00.0", locks)
    assert report.placement.lock.startswith(f"{locks['GDRPROBE_LOCK_DIR']}/mlx5_0.lock, "
                                            "waited ")


def test_a_nic_another_check_holds_is_waited_for_within_the_budget_only(tmp_path, locks):
    clock = iter(range(100)).__next__          # one second per look at the clock
    with nic_lock("mlx5_0", 0.0, locks) as (held, _):
        assert held.path is not None
        with pytest.raises(NotTestable, match="another gdrprobe check on this node held "
                                              "mlx5_0") as raised:
            with nic_lock("mlx5_0", 2.0, locks, clock=clock, sleep=lambda s: None):
                pass
    assert raised.value.exit_code == 9 and "mlx5_0.lock" in raised.value.evidence
    with nic_lock("mlx5_0", 0.0, locks) as (again, _):     # released with its holder
        assert again.path == held.path


def test_no_usable_lock_directory_runs_without_a_lock_and_says_why(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with nic_lock("mlx5_0", 0.0, {"GDRPROBE_LOCK_DIR": str(blocker / "locks")}) as (held, why):
        assert held.path is None and "GDRPROBE_LOCK_DIR" in why
        assert held.describe(why).startswith("no lock (set GDRPROBE_LOCK_DIR")


def test_a_floor_outside_zero_to_one_is_refused():
    from gdrprobe.errors import UsageError

    with pytest.raises(UsageError, match="--floor 1.5"):
        check_floor(1.5)
