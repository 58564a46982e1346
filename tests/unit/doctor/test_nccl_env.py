from __future__ import annotations

import pytest

from gdrprobe.doctor.checks import nccl_env
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines
from gdrprobe.nccl.cparse import strtoll
from gdrprobe.nccl.env import gdr_level
from gdrprobe.nccl.params import NET_GDR_READ
from gdrprobe.report.model import Status


def check(tmp_path, **environ):
    nccl_machines.pix_and_pxb(tmp_path)
    findings = nccl_env.check(DoctorContext(SysRoot(str(tmp_path)), environ))
    return {finding.id: finding for finding in findings}


def test_no_nccl_variables_is_one_ok_and_a_decision_per_gpu(tmp_path):
    nccl_machines.pix_and_pxb(tmp_path)
    findings = nccl_env.check(DoctorContext(SysRoot(str(tmp_path)), {"PATH": "/usr/bin"}))
    assert [(f.id, f.status, f.group) for f in findings] == [
        ("nccl.library", Status.SKIP, "nccl"), ("nccl.env", Status.OK, "nccl"),
        ("nccl.gpu.0000:1b:00.0", Status.OK, "nccl"), ("nccl.gpu.0000:9d:00.0", Status.OK, "nccl")]
    assert findings[3].summary == ("GPU1 (0000:9d:00.0): NCCL uses mlx5_1 direct PXB path with GPUDirect "
                                   "RDMA for sends and receives")


def test_harmless_nccl_variables_are_listed_as_evidence(tmp_path):
    found = check(tmp_path, NCCL_DEBUG="INFO", NCCL_IB_DISABLE="0")
    assert found["nccl.env"].status is Status.OK
    assert [e.source for e in found["nccl.env"].evidence] == ["environment NCCL_DEBUG", "environment NCCL_IB_DISABLE"]


@pytest.mark.parametrize("variable, value, finding_id, status", [
    ("NCCL_IB_DISABLE", "1", "nccl.ib_disable", Status.FAIL),
    ("NCCL_NET", "Socket", "nccl.net", Status.FAIL),
    ("NCCL_NET_GDR_READ", "0", "nccl.net_gdr_read", Status.WARN),
    ("NCCL_DMABUF_ENABLE", "0", "nccl.dmabuf_enable", Status.FAIL),    # DMA-BUF is the only path
    ("NCCL_IB_DISABLE", "0x1", "nccl.ib_disable", Status.FAIL),          # strtoll base 0: 1
    ("NCCL_NET_GDR_READ", "false", "nccl.net_gdr_read", Status.WARN),    # no digits: 0
    ("NCCL_NET_GDR_LEVEL", "08", "nccl.net_gdr_level", Status.FAIL),     # strtol base 0: 0, LOC
    ("NCCL_TOPO_FILE", "/etc/nccl/topo.xml", "nccl.topo_file", Status.INFO),
    ("NCCL_IB_CUDA_SUPPORT", "1", "nccl.ib_cuda_support", Status.WARN),
    ("NCCL_NET_GDR_LEVEL", "0", "nccl.net_gdr_level", Status.FAIL),
    ("NCCL_NET_GDR_LEVEL", "LOC", "nccl.net_gdr_level", Status.FAIL),
    ("NCCL_NET_GDR_LEVEL", "pxb", "nccl.net_gdr_level", Status.WARN),
    ("NCCL_NET_GDR_LEVEL", "NODE", "nccl.net_gdr_level", Status.WARN),
    ("NCCL_NET_GDR_LEVEL", "PXB", "nccl.net_gdr_level", Status.INFO),
    ("NCCL_NET_GDR_LEVEL", "4", "nccl.net_gdr_level", Status.INFO),
])
def test_restricting_variables(tmp_path, variable, value, finding_id, status):
    found = check(tmp_path, **{variable: value})
    assert found[finding_id].status is status
    assert found[finding_id].evidence[0].value == value
    assert "nccl.env" not in found


def test_gdr_level_pix_turns_gdr_off_for_the_pxb_gpu(tmp_path):
    level = check(tmp_path, NCCL_NET_GDR_LEVEL="PIX")["nccl.net_gdr_level"]
    assert level.status is Status.WARN
    assert [(e.source, e.value) for e in level.evidence[1:]] == [("GPU 0000:9d:00.0 -> mlx5_1", "PXB")]


def test_gdr_level_legacy_digits():
    levels = [gdr_level({"NCCL_NET_GDR_LEVEL": v}) for v in ("0", "1", "2", "3", "4", "7")]
    assert [level.name for level in levels] == ["LOC", "PIX", "PXB", "PHB", "SYS", "SYS"]
    assert gdr_level({"NCCL_NET_GDR_LEVEL": "sys"}).ignored


@pytest.mark.parametrize("text, value", [
    ("08", 0), ("010", 8), ("0x1", 1), ("0X1f", 31), ("yes", 0), ("1abc", 1), (" -1", -1), ("0x", 0),
    ("99999999999999999999", None),
])
def test_numbers_are_read_with_strtoll_base_0(text, value):
    """src/misc/param.cc ncclLoadParam: strtoll(str, NULL, 0); ERANGE keeps the default."""
    assert strtoll(text) == value
    assert NET_GDR_READ.number({"NCCL_NET_GDR_READ": text}) == (-2 if value is None else value)


@pytest.mark.parametrize("text, level", [("08", "LOC"), ("0x2", "PXB"), ("010", "SYS"), ("03", "PHB")])
def test_gdr_level_numbers_are_strtol_base_0(text, level):
    assert gdr_level({"NCCL_NET_GDR_LEVEL": text}).name == level


@pytest.mark.parametrize("value, excluded", [
    ("^mlx5_0", ["mlx5_0"]),          # exclusion
    ("mlx5_1:1", ["mlx5_0"]),         # selection with a port
    ("=mlx5_1,mlx5_0:1", []),         # exact names
    ("=mlx5", ["mlx5_0", "mlx5_1"]),  # exact: "mlx5" is no device
    ("mlx5", []),                     # prefix keeps both
    ("^=mlx5", []),                   # exact exclusion of a name no device has
])
def test_ib_hca_against_nccls_choice(tmp_path, value, excluded):
    hca = check(tmp_path, NCCL_IB_HCA=value)["nccl.ib_hca"]
    named = [e.source.rsplit(" ", 1)[1] for e in hca.evidence[1:]]
    assert named == excluded
    assert hca.status is (Status.WARN if excluded else Status.INFO)


# ---- the wording by release (gdrprobe.nccl.effects) ------------------------------------------
@pytest.mark.parametrize("version, c2c, kind", [
    ((2, 25, 1), True, "not-read"),           # no C2C GDR before 2.26.2: NCCL does not read it
    ((2, 26, 6), True, "the-default"),        # 0 is 2.26's default
    ((2, 27, 3), True, "c2c-gdr-off"),        # default 1 from 2.27.3
    ((2, 30, 7), True, "c2c-gdr-off"),
    ((2, 30, 7), False, "not-here"),          # no GPU on C2C: nothing changes on this node
    ((2, 30, 7), None, "c2c-gdr-off"),        # not known: NCCL's rule stands
])
def test_net_gdr_c2c_0_warns_only_where_it_changes_something(version, c2c, kind):
    from gdrprobe.nccl import effects
    from gdrprobe.nccl.versions import NcclRules

    (effect,) = effects.effects({"NCCL_NET_GDR_C2C": "0"}, NcclRules(version), c2c)
    assert effect.kind == kind
    if version >= (2, 29, 2) and kind == "c2c-gdr-off":
        assert "P2C to PXB" in effect.detail


def test_net_gdr_c2c_0_on_a_node_without_c2c_is_information(tmp_path):
    tree = nccl_machines.pix_and_pxb(tmp_path)
    nccl_machines.nvml_facts(tree, nccl_machines.gpu_bdfs(tree))      # NVML: no C2C link
    found = {f.id: f for f in nccl_env.check(DoctorContext(SysRoot(str(tmp_path)), {"NCCL_NET_GDR_C2C": "0"}))}
    assert found["nccl.net_gdr_c2c"].status is Status.INFO and "no effect here" in found["nccl.net_gdr_c2c"].summary


def test_net_gdr_c2c_0_on_grace_warns(tmp_path):
    nccl_machines.gh200(tmp_path)
    found = {f.id: f for f in nccl_env.check(DoctorContext(SysRoot(str(tmp_path)), {"NCCL_NET_GDR_C2C": "0"}))}
    assert found["nccl.net_gdr_c2c"].status is Status.WARN
    assert "C2C GPU" in found["nccl.net_gdr_c2c"].summary


@pytest.mark.parametrize("variable, value, version", [
    ("NCCL_PXN_DISABLE", "1", (2, 11, 4)), ("NCCL_IB_PCI_RELAXED_ORDERING", "0", (2, 11, 4)),
    ("NCCL_NETDEVS_POLICY", "bogus", (2, 27, 7))])
def test_a_variable_the_release_does_not_read_changes_nothing(variable, value, version):
    from gdrprobe.nccl import effects
    from gdrprobe.nccl.versions import NcclRules

    (effect,) = effects.effects({variable: value}, NcclRules(version))
    assert effect.kind == effects.NOT_READ and "does not read it" in effect.detail
