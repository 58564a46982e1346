"""Data-direct as NCCL opens it (issue 39, items 2-4), on the GB300-like fixture tray:

- the devices NCCL exposes by release and NCCL_IB_DATA_DIRECT (``src/transport/net_ib.cc``
  ncclIbInitDevices in 2.27.3-2.28.x, ``net_ib/init.cc`` from 2.29.2): 2.27.3-2.27.5 open
  ``<dev>_dma`` beside the device for any non-zero value; 2.27.6-2.27.7 open ``<dev>_dma``
  alone for 1, both for 2, the device alone for any other value; 2.28.3 on: 0 or below the
  device alone, 2 both, any other ``<dev>_dma`` alone;
- from 2.28.3 a lookup error other than ENODEV, on a device NCCL opens a port of, stops NCCL's
  IB transport (``mlx5dvwrap.cc`` wrap_mlx5dv_get_data_direct_sysfs_path, init.cc ``return
  res``): NCCL falls to another network, which the per-GPU decision and the check answer as
  "not used by NCCL", the node's fault, with the fix;
- the registration NCCL makes for a GPU is the one of the device its decision chose: on
  ``<dev>_dma`` only ``mlx5dv_reg_dmabuf_mr(..., DATA_DIRECT)``, on the device itself
  ``ibv_reg_dmabuf_mr``, whatever face gdrprobe could have tried (``net_ib/reg.cc``)."""

from __future__ import annotations

import pytest

from gdrprobe.campaign.machine import follow_nccl, machine_facts
from gdrprobe.campaign.verdict import NOT_USED, with_nccl
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.errors import ExitCode
from gdrprobe.memory.spec import MemorySpec
from gdrprobe.nccl import data_direct
from gdrprobe.nccl.decision import SOCKET_PATH, decide
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.check import Verdict
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import data_direct_machines as machines

GPU0, GPU1 = "0008:03:00.0", "0009:03:00.0"
EIO = 5


def decisions(root, version=None, **environ):
    ctx = DoctorContext(SysRoot(str(root)), environ)
    return decide(ctx.nccl_node, ctx.environ, NcclRules(version))


def broken_tray(root, code: int = EIO) -> machines.machines.SysfsTree:
    """mlx5_0's lookup fails with ``code``; mlx5_1 is no data-direct NIC (ENODEV)."""
    tree = machines.gb300_tray(root)
    machines.data_direct_probe(tree, {"mlx5_0": machines.not_data_direct(code),
                                      "mlx5_1": machines.not_data_direct()})
    return tree


# ---- the devices by release (item 4) -------------------------------------------------------
@pytest.mark.parametrize("version, setting, faces", [
    ((2, 27, 3), None, ("ordinary", "data-direct")), ((2, 27, 5), "3", ("ordinary", "data-direct")),
    ((2, 27, 5), "0", ("ordinary",)),
    ((2, 27, 6), None, ("data-direct",)), ((2, 27, 6), "1", ("data-direct",)),
    ((2, 27, 6), "2", ("ordinary", "data-direct")), ((2, 27, 7), "3", ("ordinary",)),
    ((2, 27, 7), "-1", ("ordinary",)), ((2, 27, 7), "0", ("ordinary",)),
    ((2, 28, 3), "3", ("data-direct",)), ((2, 28, 3), "-1", ("ordinary",)),
])
def test_the_devices_each_release_exposes(version, setting, faces):
    environ = {} if setting is None else {"NCCL_IB_DATA_DIRECT": setting}
    assert data_direct.exposed(NcclRules(version), environ) == faces


def test_2_27_6_opens_the_data_direct_device_alone_by_default(tmp_path):
    machines.gb300_tray(tmp_path)
    assert [d.net for d in decisions(tmp_path, (2, 27, 6))] == ["mlx5_0_dma", "mlx5_1_dma"]
    # any value but 1 and 2: neither data-direct exposure, the device itself
    assert [d.net for d in decisions(tmp_path, (2, 27, 7), NCCL_IB_DATA_DIRECT="3")] == ["mlx5_0", "mlx5_1"]


# ---- a lookup error that stops NCCL's IB transport (item 2) ----------------------------------
def test_a_lookup_error_sends_every_gpu_off_ib_from_2_28_3(tmp_path):
    broken_tray(tmp_path)
    for decision in decisions(tmp_path):
        assert decision.path == SOCKET_PATH and not decision.gdr_write and decision.nic is None
        assert "mlx5dv_get_data_direct_sysfs_path" in decision.why[0] and "mlx5_0" in decision.why[0]
        assert "EIO" in decision.why[0]
    # 2.27.x takes the error as "not data-direct" and opens the device
    assert [d.net for d in decisions(tmp_path, (2, 27, 7))] == ["mlx5_0", "mlx5_1"]


@pytest.mark.parametrize("environ", [{"NCCL_IB_DATA_DIRECT": "0"}, {"NCCL_IB_HCA": "mlx5_1"},
                                     {"NCCL_IB_HCA": "^mlx5_0"}])
def test_nccl_asks_only_where_it_opens_a_port_and_the_variable_is_positive(tmp_path, environ):
    broken_tray(tmp_path)
    assert all(d.path != SOCKET_PATH for d in decisions(tmp_path, **environ))


def test_a_device_without_an_active_port_is_never_asked(tmp_path):
    tree = broken_tray(tmp_path)
    tree.write("/sys/class/infiniband/mlx5_0/ports/1/state", "1: DOWN\n")
    assert [d.net for d in decisions(tmp_path)] == ["mlx5_1", "mlx5_1"]


def test_the_doctor_fails_the_node_with_the_fix(tmp_path):
    broken_tray(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    broken = next(f for f in report.findings if f.id == ids.NCCL_DATA_DIRECT)
    assert broken.status is Status.FAIL and "NCCL_IB_DATA_DIRECT=0" in broken.fix
    gpu = next(f for f in report.findings if f.id == ids.nccl_gpu(GPU0))
    assert gpu.status is Status.FAIL and "NCCL_IB_DATA_DIRECT=0" in gpu.fix


def test_the_check_answers_not_used_by_nccl_a_node_fault_not_start(tmp_path):
    broken_tray(tmp_path)
    use = machine_facts(str(tmp_path), {}).nccl[GPU0]
    assert not use.uses_gdr and use.node_fault and use.firm and not use.settings
    assert "mlx5dv_get_data_direct_sysfs_path" in use.cause and "NCCL_IB_DATA_DIRECT=0" in use.fix
    verdict = with_nccl(Verdict("engaged", "dmabuf", ratio=0.98), use)
    assert verdict.classification == NOT_USED and verdict.exit_code == ExitCode.VERDICT_NOT_OK


def test_a_gpu_the_doctor_could_not_place_gets_the_same_answer(tmp_path):
    broken_tray(tmp_path)
    everywhere = machine_facts(str(tmp_path), {}).nccl_everywhere
    assert everywhere.node_fault and everywhere.path == SOCKET_PATH and "NCCL_IB_DATA_DIRECT=0" in everywhere.fix
    assert machine_facts(str(tmp_path), {"NCCL_IB_DISABLE": "1"}).nccl_everywhere.settings   # the setting first


def test_the_variable_set_to_a_positive_value_is_still_the_node_s_fault(tmp_path):
    broken_tray(tmp_path)
    use = machine_facts(str(tmp_path), {"NCCL_IB_DATA_DIRECT": "1"}).nccl[GPU0]
    assert use.node_fault and not use.settings


# ---- the registration NCCL makes on the device it chose (items 3 and 4) -----------------------
@pytest.mark.parametrize("version, environ, face", [
    (None, {}, data_direct.DATA_DIRECT),                              # 2.28.3+: <dev>_dma alone
    (None, {"NCCL_IB_DATA_DIRECT": "0"}, data_direct.ORDINARY),       # the doctor's own fix
    ((2, 27, 3), {}, data_direct.DATA_DIRECT),     # both opened: the decision takes <dev>_dma (PIX)
    ((2, 26, 6), {}, data_direct.ORDINARY),        # no data-direct devices before 2.27.3
])
def test_the_registration_follows_the_device_nccl_chose(tmp_path, monkeypatch, version, environ, face):
    machines.gb300_tray(tmp_path)
    facts = machine_facts(str(tmp_path), environ)
    if version is not None:
        import dataclasses

        from gdrprobe.campaign.nccl_use import deciding, nccl_uses
        rules = NcclRules(version)
        ctx = DoctorContext(SysRoot(str(tmp_path)), environ)
        uses = nccl_uses(deciding(ctx.nccl_node, rules), ctx.environ, ctx.environ_source, True, rules=rules)
        facts = dataclasses.replace(facts, nccl=uses, nccl_rules=rules)
    for mechanism in ("gpu", "dmabuf"):
        spec = follow_nccl(MemorySpec.from_choice(mechanism, gpu=GPU0), facts)
        assert spec.nic_face == face, mechanism
        assert spec.nic_face_reason


def test_without_a_decision_the_release_s_single_face_decides(tmp_path):
    machines.gb300_tray(tmp_path)
    assert data_direct.nccl_face(NcclRules(), {}, None)[0] == data_direct.DATA_DIRECT
    assert data_direct.nccl_face(NcclRules(), {"NCCL_IB_DATA_DIRECT": "0"}, None)[0] == data_direct.ORDINARY
    # both faces opened and no decision for this device: either may register
    assert data_direct.nccl_face(NcclRules((2, 27, 3)), {}, None)[0] == ""
    assert data_direct.nccl_face(NcclRules(), {}, True)[0] == data_direct.DATA_DIRECT
    assert data_direct.nccl_face(NcclRules((2, 27, 3)), {}, False)[0] == data_direct.ORDINARY
