"""NVLink and C2C read as NCCL reads them: the driver's libnvidia-ml.so.1 through dlopen, no
Python package (issue 39 item 1). The library is the project's stand-in
(tests/nvml_standin), compiled at test time and set up by environment; where NVML cannot
be read, a GPU NVLink or C2C could give GPUDirect back is not decided and never drained on."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import pytest

from gdrprobe.campaign.machine import machine_facts
from gdrprobe.campaign.verdict import with_nccl
from gdrprobe.doctor.facts import nvml, nvml_library
from gdrprobe.doctor.facts.nccl_node import nvlink_ends
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.errors import ExitCode
from gdrprobe.nccl.topo import NOT_VISIBLE
from gdrprobe.report.check import ENGAGED, Verdict
from gdrprobe.report.model import Status
from tests.nvml_standin import build as standin
from tests.unit.doctor import nccl_machines

A, B, C = "0000:1b:00.0", "0000:1d:00.0", "0000:3b:00.0"
SWITCH = "0000:05:00.0"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture
def no_pynvml(monkeypatch):
    def missing():
        raise ImportError("nvidia-ml-py is not installed (No module named 'pynvml')")
    monkeypatch.setattr(nvml, "import_nvml", missing)


def read(monkeypatch, bus_ids, variant: str = "", **stand_in) -> dict:
    for name, value in standin.settings(**stand_in).items():
        monkeypatch.setenv(name, value)
    return nvml.collect_nvml_facts(bus_ids, library=str(standin.build(variant)))


def called() -> set[str]:
    library = ctypes.CDLL(str(standin.build()))
    library.standin_nvml_called.restype = ctypes.c_char_p
    return set(filter(None, library.standin_nvml_called().decode().split(",")))


def test_nvlinks_and_c2c_are_read_as_nccls_xml_cc_reads_them(monkeypatch, no_pynvml):
    facts = read(monkeypatch, [A, B, C], gpus=[(A, 90), (B, 90), (C, 80)],
                 nvlinks=[f"{A}>{B}*2", f"{A}>switch*4", f"{A}>{B}*1:inactive", f"{A}>{B}*1:nop2p",
                          f"{B}>{A}*2", f"{C}>switch={SWITCH}*3"],
                 c2c=[f"{A}=2/1", f"{C}=4"])
    a, b, c = facts["gpus"]
    assert [g["pci_bus_id"] for g in facts["gpus"]] == [A, B, C] and "unread" not in facts
    # Only links that may carry P2P and are up; the far end's type and bus id of each.
    assert [(link["remote_type"], link["remote_bus_id"]) for link in a["nvlinks"]] == (
        [(0, B)] * 2 + [(2, "")] * 4)
    assert (a["c2c_link_count"], a["c2c_bw_mbps"]) == (1, 450000)      # one of two C2C links is up
    assert b["c2c_link_count"] == 0
    # sm80: NVLink state through nvmlDeviceGetNvLinkState, and no C2C asked for (sm90 on).
    assert [link["remote_bus_id"] for link in c["nvlinks"]] == [SWITCH] * 3 and c["c2c_link_count"] == 0
    assert c["compute_capability"] == [8, 0]
    assert "nvmlDeviceGetNvLinkState" in called()
    assert called() <= set(nvml_library.ENTRY_POINTS)           # NCCL's entry points, nothing else
    assert "nvidia-ml-py is not installed" in facts["extras_error"]


def test_each_release_reads_the_far_end_as_its_nvml_wrapper_does(monkeypatch, no_pynvml):
    """2.30.7 takes the far end's bus id (empty: an NVSwitch it does not show); 2.31 asks the
    far end's type first, and a driver without nvmlDeviceGetNvLinkRemoteDeviceType shows it
    no NVLink at all (xml.cc ncclTopoGetXmlFromGpu)."""
    links = dict(gpus=[(A, 90), (B, 90)], nvlinks=[f"{A}>{B}*2", f"{A}>switch*2"])
    (a, _) = read(monkeypatch, [A, B], **links)["gpus"]
    assert nvlink_ends(a, by_type=False) == (B, B, NOT_VISIBLE, NOT_VISIBLE)
    assert nvlink_ends(a, by_type=True) == (B, B, NOT_VISIBLE, NOT_VISIBLE)
    (old, _) = read(monkeypatch, [A, B], variant="no-remote-device-type", **links)["gpus"]
    assert nvlink_ends(old, by_type=False) == (B, B, NOT_VISIBLE, NOT_VISIBLE)
    assert nvlink_ends(old, by_type=True) == ()
    # A capture of an earlier gdrprobe holds 2.30.7's bus ids.
    assert nvlink_ends({"nvlink_remote_bus_ids": [B]}, by_type=True) == (B,)


def test_what_nccl_cannot_do_without_is_an_error_and_a_gpu_without_a_handle_is_unread(monkeypatch, no_pynvml):
    missing = nvml.collect_nvml_facts([A], library="/nonexistent/libnvidia-ml.so.1")
    assert "libnvidia-ml.so.1 could not be loaded" in missing["error"]
    failed = read(monkeypatch, [A], gpus=[(A, 90)], fail=["nvmlInit_v2=9"])
    assert failed["error"].startswith("NVML call failed: nvmlInit_v2() failed: Driver Not Loaded (9)")
    partial = read(monkeypatch, [A, C], gpus=[(A, 90)])
    assert list(partial["unread"]) == [C] and "Not Found" in partial["unread"][C]
    assert nvml.unread_reason(partial, A) == "" and "Not Found" in nvml.unread_reason(partial, C)
    assert nvml.unread_reason(missing, A) == missing["error"]


def child(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env={**env, "PYTHONPATH": ROOT}, capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_no_python_package_is_needed_the_library_is_found_by_its_soname():
    """What the OCI image has: no nvidia-ml-py, the driver's library on the loader's path."""
    code = ("import sys, json; sys.modules['pynvml'] = None\n"
            "from gdrprobe.doctor.facts.nvml import collect_nvml_facts\n"
            f"print(json.dumps(collect_nvml_facts([{A!r}])))")
    env = standin.environment(gpus=[(A, 90)], nvlinks=[f"{A}>switch*18"], c2c=[f"{A}=1"])
    done = child(code, env)
    facts = json.loads(done.stdout)
    assert len(facts["gpus"][0]["nvlinks"]) == 18 and facts["gpus"][0]["c2c_link_count"] == 1
    assert "nvidia-ml-py is not installed" in facts["extras_error"]


def test_a_wedged_driver_costs_the_doctor_its_time_bound_not_a_hang():
    code = ("from gdrprobe.doctor.facts.nvml import collect_nvml_facts\n"
            f"print(collect_nvml_facts([{A!r}], timeout_s=0.5)['error'])")
    done = child(code, standin.environment(gpus=[(A, 90)], hang=["nvmlInit_v2=30"]))
    assert done.stdout.strip() == ("NVML did not answer within 0.5 s (in nvmlInit_v2): the driver is wedged")


# ---- the decision where NVML could not be read -------------------------------------------


def without_nvml(tree, error: str = "libnvidia-ml.so.1 could not be loaded: no such file") -> None:
    tree.write(f"{nccl_machines.CAPTURE}/nvml.json", json.dumps({"error": error}))


def test_a_grace_nic_without_nvml_is_not_decided_and_never_a_node_fault(tmp_path):
    """GH200: the NIC on Grace's PCIe is P2C to NCCL only through NVML's C2C link; without
    it the path looks PHB, beyond the default GDR level. Was: FAIL, node fault, an engaged
    A/B exit 1."""
    without_nvml(nccl_machines.gh200(tmp_path))
    report = run_doctor(str(tmp_path), environ={})
    (decision,) = report.nccl
    assert not decision.gdr_write and decision.unread.startswith("not decided: NVLink and C2C could not be read")
    gpu_finding = next(f for f in report.findings if f.id == f"nccl.gpu.{decision.gpu_bdf}")
    assert gpu_finding.status is Status.WARN and "libnvidia-ml.so.1" in gpu_finding.fix
    assert report.exit_code == 0
    nvml_finding = next(f for f in report.findings if f.id == "gpu.nvml")
    assert nvml_finding.status is Status.WARN and "NCCL itself fails to initialise" in nvml_finding.summary
    (use,) = machine_facts(str(tmp_path), {}).nccl.values()
    assert not use.node_fault and not use.firm and use.cause == decision.unread
    engaged = Verdict(classification=ENGAGED, mechanism="dmabuf", ratio=0.98)
    assert with_nccl(engaged, use).exit_code == ExitCode.OK


def test_every_gpu_nccl_serves_through_pxn_is_not_decided_without_nvml(tmp_path):
    """HGX with a NIC per two GPUs: the odd GPUs reach a NIC only through PXN. Their
    neighbours beside a NIC stay decided (PIX, GDR on whatever NVLink says)."""
    without_nvml(nccl_machines.hgx_8gpu_4nic(tmp_path))
    uses = machine_facts(str(tmp_path), {}).nccl
    relayed, beside = uses["0000:1d:00.0"], uses["0000:1b:00.0"]
    assert not relayed.uses_gdr and not relayed.node_fault and not relayed.firm
    assert beside.uses_gdr and beside.firm


def test_a_nic_that_cannot_do_gdr_stays_a_node_fault_whatever_nvml_could_say(tmp_path):
    """No peer memory and no DMA-BUF NCCL can use: NVLink and C2C give nothing back."""
    tree = nccl_machines.hgx_8gpu_4nic(tmp_path)
    without_nvml(tree)
    nccl_machines.nic_probe(tree, {f"mlx5_{k}": nccl_machines.EOPNOTSUPP for k in range(4)})
    uses = machine_facts(str(tmp_path), {}).nccl
    assert uses and all(use.node_fault and use.firm and not use.uses_gdr for use in uses.values())


def test_with_nvml_read_from_the_driver_the_grace_nic_is_p2c(tmp_path):
    nccl_machines.gh200(tmp_path)
    (decision,) = run_doctor(str(tmp_path), environ={}).nccl
    assert (decision.path_type, decision.gdr_write, decision.unread) == ("P2C", True, "")
