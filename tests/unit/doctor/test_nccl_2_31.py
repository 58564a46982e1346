"""NCCL moved on (issue 39 item 9): the rules of 2.31, read from NVIDIA/nccl's source (the
dev branch at 2.31.0a7 against v2.30.7-1), and what 2.32.3, whose source is not in the
mirror, changes by its release notes. Each expectation cites the file that decides it."""

from __future__ import annotations

import pytest

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.nccl import flush as f
from gdrprobe.nccl.decision import decide
from gdrprobe.nccl.topo import inter_cpu_bandwidth
from gdrprobe.nccl.versions import MODELLED, NcclRules
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines

OLD, NEW = (2, 30, 7), (2, 31, 2)


def test_an_unknown_release_is_decided_by_the_newest_rules_read_from_source():
    assert MODELLED >= (2, 31, 0)
    assert NcclRules().described == "NCCL (version unknown: 2.31.0's rules)"
    differences = " ".join(NcclRules(OLD).differences())
    assert "NVLink's far end by its bus id alone" in differences
    assert "AMD CPU" in differences and "data-direct NIC's receives are always flushed" in differences
    assert NcclRules(NEW).differences() == ()


@pytest.mark.parametrize("cpuinfo, old, new", [
    # topo.cc ncclTopoAddCpu: AMD by CPUID family from 2.31 (Zen 1/2 16, Zen 3/4 24, Zen 5 32)
    ("vendor_id\t: AuthenticAMD\ncpu family\t: 23\nmodel\t\t: 49\n", 16.0, 16.0),
    ("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n", 16.0, 24.0),
    ("vendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n", 16.0, 32.0),
    # Granite Rapids (0xAD) and Sierra Forest (0xAF) count as Emerald Rapids from 2.31
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 173\n", 22.0, 40.0),
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 175\n", 22.0, 40.0),
    ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n", 22.0, 22.0),
])
def test_the_inter_cpu_link_by_release(cpuinfo, old, new):
    assert inter_cpu_bandwidth(cpuinfo, NcclRules(OLD).inter_cpu_by_generation).gbs == old
    assert inter_cpu_bandwidth(cpuinfo, NcclRules(NEW).inter_cpu_by_generation).gbs == new


def test_a_cross_socket_nic_is_rated_by_the_releases_cpu_table(tmp_path):
    tree = nccl_machines.pix_and_pxb(tmp_path)
    nccl_machines.cpu(tree, "AuthenticAMD", 25, 17)
    node = DoctorContext(SysRoot(str(tmp_path)), {}).nccl_node
    environ = {"NCCL_IB_HCA": "=mlx5_1"}
    old, new = (decide(node, environ, NcclRules(version))[0] for version in (OLD, NEW))
    assert (old.path_type, old.bandwidth_gbs, new.bandwidth_gbs) == ("SYS", 16.0, 24.0)


@pytest.mark.parametrize("version, gpu_c2c, flushes, name", [
    ((2, 30, 7), False, True, f.DATA_DIRECT),      # init.cc forceFlush on <dev>_dma
    ((2, 31, 2), False, False, f.ORDERED),         # 2.31 no longer forces it
    ((2, 31, 2), True, True, f.C2C),               # GB300: the C2C rule flushes anyway
])
def test_a_data_direct_nic_forces_the_flush_only_before_2_31(version, gpu_c2c, flushes, name):
    answer = f.nccl_flush(gdr_receive=True, capability=100, gpu_c2c=gpu_c2c, nic_path_type="PIX",
                          data_direct=True, peermem=False, nic_dmabuf=True, environ={}, version=version)
    assert (answer.flushes, answer.rule) == (flushes, name), answer


def test_2_32_says_what_it_changes_that_the_doctor_does_not_model():
    """2.32.3's release notes: ConnectX-9 rail and plane detection; its source is not in the
    mirror, so the doctor says it applies 2.31's rules there."""
    assert NcclRules(NEW).unmodelled() == ()
    (note,) = NcclRules((2, 32, 3)).unmodelled()
    assert "ConnectX-9" in note and "rail and plane" in note and "2.31" in note
