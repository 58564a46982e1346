"""Ports of one card fused into one virtual NIC, as NCCL 2.24.3 and later do at the default
NCCL_NET_MERGE_LEVEL (PORT): src/transport/net_ib/init.cc ncclIbGetPciPath puts a card's
second function where its first is, src/graph/topo.cc ncclTopoAutoMerge merges devices at
most the merge level apart, ncclIbMakeVDeviceInternal names the result and adds the speeds.
Was: mlx5_0 and mlx5_1 two NICs of 25 GB/s, one per GPU."""

from __future__ import annotations

import pytest

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.nccl.decision import decide
from gdrprobe.nccl.env import merge_level
from gdrprobe.nccl.nets import mapped_function
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines


def decisions(tmp_path, **environ):
    return DoctorContext(SysRoot(str(tmp_path)), environ).nccl_decisions


def test_the_two_ports_of_a_card_are_one_virtual_nic_with_their_summed_speed(tmp_path):
    nccl_machines.dual_port_card(tmp_path)
    first, second = decisions(tmp_path)
    for choice in (first, second):
        assert (choice.nic, choice.net, choice.candidates) == ("mlx5_0", "mlx5_0+mlx5_1", ("mlx5_0+mlx5_1",))
        # 2 x 200 Gb/s = 50 GB/s, above the card's Gen5 x16 link (48 GB/s), which then limits it.
        assert choice.bandwidth_gbs == 48.0 and choice.gdr_write
    assert any("fused from mlx5_0, mlx5_1" in why for why in first.why)
    assert [c.net for c in first.channels] == ["mlx5_0+mlx5_1"]


@pytest.mark.parametrize("environ", [{"NCCL_NET_MERGE_LEVEL": "LOC"}, {"NCCL_IB_MERGE_NICS": "0"},
                                     {"NCCL_NET_MERGE_LEVEL": "none"}])
def test_fusion_switched_off_leaves_two_nics(tmp_path, environ):
    nccl_machines.dual_port_card(tmp_path)
    first, second = decisions(tmp_path, **environ)
    assert (first.net, second.net, first.bandwidth_gbs) == ("mlx5_0", "mlx5_1", 25.0)


def test_ports_of_different_link_layers_are_not_fused(tmp_path):
    nccl_machines.dual_port_card(tmp_path, link_layers=("InfiniBand", "Ethernet"))
    assert {d.net for d in decisions(tmp_path)} == {"mlx5_0", "mlx5_1"}


def test_nccl_before_2_24_3_does_not_fuse(tmp_path):
    nccl_machines.dual_port_card(tmp_path)
    ctx = DoctorContext(SysRoot(str(tmp_path)), {})
    assert {d.net for d in decide(ctx.nccl_node, {}, NcclRules((2, 23, 4)))} == {"mlx5_0", "mlx5_1"}


@pytest.mark.parametrize("bdf, merge_vfs, mapped", [("0000:1c:00.1", True, "0000:1c:00.0"),
                                                    ("0000:1c:01.3", True, "0000:1c:00.0"),
                                                    ("0000:1c:01.3", False, "0000:1c:01.0")])
def test_the_pci_function_ncclibgetpcipath_names(bdf, merge_vfs, mapped):
    assert mapped_function(bdf, merge_vfs) == mapped


@pytest.mark.parametrize("raw, name", [(None, "PORT"), ("PIX", "PIX"), ("PORTS", "PORT"), ("pix", "LOC")])
def test_merge_level_is_read_as_kvconverttoint_reads_it(raw, name):
    assert merge_level({} if raw is None else {"NCCL_NET_MERGE_LEVEL": raw}).name == name
