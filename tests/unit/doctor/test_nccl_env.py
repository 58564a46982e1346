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
