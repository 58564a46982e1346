"""NCCL's flush of a GPUDirect receive (gdrprobe/nccl/flush.py): where NCCL reads the bytes
back with an RDMA READ, by release, and where that is forced whatever the GPU's architecture.
Each expectation cites NVIDIA/nccl's source: src/graph/paths.cc ncclTopoNeedFlush,
src/transport/net_ib/connect.cc flushEnabled, src/transport/net_ib/init.cc forceFlush."""

from __future__ import annotations

import pytest

from gdrprobe.campaign.machine import machine_facts
from gdrprobe.campaign.nccl_use import receive_flush
from gdrprobe.nccl import flush as f
from tests.unit.doctor import nccl_machines as nm

HEALTHY = dict(gdr_receive=True, capability=90, gpu_c2c=False, nic_path_type="PIX",
               data_direct=False, peermem=False, nic_dmabuf=True, environ={})


def rule(version=None, **change):
    return f.nccl_flush(**(HEALTHY | change), version=version)


@pytest.mark.parametrize("change, flushes, forced, name", [
    ({}, False, False, f.ORDERED),                                       # H100 beside its NIC
    ({"capability": 80}, True, False, f.PRE_HOPPER),                     # "Ampere and earlier"
    ({"capability": 70}, True, False, f.PRE_HOPPER),
    ({"capability": None}, True, False, f.UNKNOWN_GPU),
    ({"gpu_c2c": True}, True, True, f.C2C),                              # GB200: NIC on PCIe
    ({"gpu_c2c": True, "nic_path_type": "PXB"}, True, True, f.C2C),
    ({"gpu_c2c": True, "nic_path_type": "P2C"}, False, False, f.ORDERED),  # NIC behind Grace
    ({"data_direct": True}, True, True, f.DATA_DIRECT),                  # mlx5 <dev>_dma
    ({"environ": {"NCCL_NET_FORCE_FLUSH": "1"}}, True, True, f.FORCED_BY_ENV),
    ({"environ": {"NCCL_NET_FORCE_FLUSH": "0"}, "capability": 80}, True, False, f.PRE_HOPPER),
    ({"environ": {"NCCL_GDR_FLUSH_DISABLE": "1"}, "data_direct": True}, False, False,
     f.DISABLED),                                                        # wins over everything
    ({"environ": {"NCCL_GDR_FLUSH_DISABLE": "0x0"}, "capability": 80}, True, False, f.PRE_HOPPER),
    ({"gdr_receive": False, "capability": 80}, False, False, f.NO_GDR),
])
def test_nccl_2_30_7_flushes_by_architecture_c2c_data_direct_and_settings(change, flushes,
                                                                          forced, name):
    answer = rule((2, 30, 7), **change)
    assert (answer.flushes, answer.forced, answer.rule) == (flushes, forced, name), answer
    assert "paths.cc" in answer.reason or "net_ib" in answer.reason or "net.cc" in answer.reason


@pytest.mark.parametrize("version, change, flushes, name", [
    # Before ncclTopoNeedFlush (2.15.1): every GPUDirect receive, even on sm90.
    ((2, 14, 3), {"peermem": True}, True, f.EVERY_RECEIVE),
    # 2.15.1 to 2.18.6: NCCL_NET_FORCE_FLUSH defaults to 1, so sm90 is still flushed.
    ((2, 18, 6), {}, True, f.FORCED_BY_ENV),
    ((2, 18, 6), {"environ": {"NCCL_NET_FORCE_FLUSH": "0"}}, False, f.ORDERED),
    ((2, 19, 1), {}, False, f.ORDERED),
    # Before 2.18.3 the IB transport enables its flush QP for peer memory only.
    ((2, 18, 1), {"capability": 80}, False, f.NO_FLUSH_QP),
    ((2, 18, 1), {"capability": 80, "peermem": True}, True, f.PRE_HOPPER),
    ((2, 18, 3), {"capability": 80}, True, f.PRE_HOPPER),
    # The C2C rule arrives in 2.26.2, the data-direct forceFlush in 2.27.3.
    ((2, 25, 1), {"gpu_c2c": True}, False, f.ORDERED),
    ((2, 26, 2), {"gpu_c2c": True}, True, f.C2C),
    ((2, 26, 6), {"data_direct": True}, False, f.ORDERED),
    ((2, 27, 3), {"data_direct": True}, True, f.DATA_DIRECT),
])
def test_older_releases_flush_by_their_own_rules(version, change, flushes, name):
    answer = rule(version, **change)
    assert (answer.flushes, answer.rule) == (flushes, name), answer


def test_the_default_force_flush_is_named_as_a_default():
    answer = rule((2, 17, 1), peermem=True)
    assert answer.forced and "NCCL_NET_FORCE_FLUSH=1 (its default before 2.19.1)" in answer.reason
    assert "NCCL 2.17.1" in answer.reason


@pytest.mark.parametrize("net, data_direct", [
    ("mlx5_0_dma", True), ("mlx5_0_dma:1", True), ("mlx5_0_dma+mlx5_1_dma", True),
    ("mlx5_0", False), ("mlx5_0+mlx5_1_dma", False), (None, False), ("", False)])
def test_a_data_direct_device_is_named_dev_dma(net, data_direct):
    assert f.data_direct_net(net) is data_direct


# ---- the machine's answer, through the doctor's facts and the check's NCCL decision ----------


@pytest.mark.parametrize("build, gpu, flushes, name", [
    (nm.hgx_8gpu_4nic, "0000:1b:00.0", False, f.ORDERED),      # H100 under its NIC's switch
    (nm.v100_no_nvlink, None, True, f.PRE_HOPPER),             # sm70
    (nm.gh200_nic_beside_gpu, "0009:03:00.0", True, f.C2C),    # C2C CPU, NIC on the GPU's switch
    (nm.gh200, "0009:01:00.0", False, f.ORDERED),              # NIC behind Grace: P2C
])
def test_the_check_knows_nccls_flush_for_each_gpu(tmp_path, build, gpu, flushes, name):
    tree = build(tmp_path)
    gpu = gpu or nm.gpu_bdfs(tree)[0]
    use = machine_facts(str(tmp_path), {}).nccl[gpu]
    assert use.flush is flushes and use.flush_rule.startswith(name), use
    assert bool(receive_flush(use)) is flushes
    assert receive_flush(use) == (use.flush_rule if flushes else "")


def test_nccl_gdr_flush_disable_keeps_the_check_from_flushing(tmp_path):
    nm.v100_no_nvlink(tmp_path)
    facts = machine_facts(str(tmp_path), {"NCCL_GDR_FLUSH_DISABLE": "1"})
    use = next(iter(facts.nccl.values()))
    assert not use.flush and use.flush_rule.startswith(f.DISABLED)
    assert receive_flush(use) == ""


def test_an_unknown_decision_is_flushed():
    assert receive_flush(None).startswith(f.UNKNOWN_DECISION)
