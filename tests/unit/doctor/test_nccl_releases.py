"""NCCL's version and environment applied in full (issue 28, item 6): each rule keyed to the
NVIDIA/nccl release tag that introduced it (gdrprobe/nccl/versions.py), the communicator's
GPUs counted instead of the node's, and the settings that decide alone holding where the
topology cannot be read. Each test says what gdrprobe answered before."""

from __future__ import annotations

import dataclasses

import pytest

from gdrprobe.campaign import prelaunch
from gdrprobe.campaign.job_gpus import job_gpus
from gdrprobe.campaign.machine import machine_facts, nccl_use_of
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl.decision import decide
from gdrprobe.nccl.versions import NcclRules
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines as nm
from tests.unit.doctor.nccl_libraries import built_library
from tests.unit.fakes.prelaunch import check


def decisions(tmp_path, version=None, **environ):
    ctx = DoctorContext(SysRoot(str(tmp_path)), {})
    return {d.gpu_bdf: d for d in decide(ctx.nccl_node, environ, NcclRules(version))}


def job_decisions(tmp_path, job_gpus):
    ctx = DoctorContext(SysRoot(str(tmp_path)), {})
    return {d.gpu_bdf: d for d in decide(ctx.nccl_node, {}, job_gpus=job_gpus)}


def findings(report) -> dict:
    return {f.id: f for f in report.findings}


# ---- PXN (src/graph/paths.cc ncclTopoComputePaths) -------------------------------------------


@pytest.mark.parametrize("version, path, path_type", [((2, 29, 7), "pxn", "PXN"), ((2, 30, 3), "direct", "PHB")])
def test_the_pxn_relay_needs_gdr_only_from_2_30_3(tmp_path, version, path, path_type):
    """With NCCL_NET_GDR_READ=0 the relay GPU has no GDR to its NIC: 2.30.3 added the test
    ncclTopoCheckGdr(peer, read) to PXN, so GPU1 stays at PHB; 2.29.7 still relays through
    GPU0. Was: the 2.30.3 test for every release."""
    nm.hgx_8gpu_4nic(tmp_path)
    gpu1 = decisions(tmp_path, version, NCCL_NET_GDR_READ="0")["0000:1d:00.0"]
    assert (gpu1.path, gpu1.path_type) == (path, path_type)
    assert gpu1.gdr_write is (path == "pxn")


@pytest.mark.parametrize("version, nic, path", [((2, 27, 3), "mlx5_0", "pxn"), ((2, 27, 5), "mlx5_1", "c2c")])
def test_2_27_3_numbers_pxn_before_p2c(tmp_path, version, nic, path):
    """src/graph/topo.h in 2.27.3: PATH_PXN 6, PATH_P2C 7 (2.27.5 swapped them). GPU 0009's
    PXN path to mlx5_0 (through GPU 0008) and its own P2C path to mlx5_1 are equally fast, so
    ncclTopoGetLocal's lowest type picks the PXN one in 2.27.3 only. Was: always P2C first."""
    nm.grace_pair(tmp_path)
    found = decisions(tmp_path, version, NCCL_PXN_C2C="1")["0009:01:00.0"]
    assert (found.nic, found.path) == (nic, path)
    assert found.gdr_write


@pytest.mark.parametrize("version, gdr", [((2, 27, 3), False), ((2, 27, 5), True)])
def test_2_27_3_gdr_level_pxn_does_not_admit_p2c(tmp_path, version, gdr):
    """The level is compared as a number (paths.cc ncclTopoCheckGdr): P2C (7) > PXN (6) in
    2.27.3 only."""
    nm.gh200(tmp_path)
    (found,) = decisions(tmp_path, version, NCCL_NET_GDR_C2C="0", NCCL_NET_GDR_LEVEL="PXN").values()
    assert found.gdr_write is gdr


# ---- NCCL_NET_GDR_READ's default (paths.cc ncclTopoCheckGdr) ---------------------------------


@pytest.mark.parametrize("version, sends", [("2.18.6", False), ("2.19.1", True)])
def test_gdr_read_default_applies_to_every_gpu_before_2_19_1(tmp_path, version, sends):
    """Two H100s without NVLink: before 2.19.1 ``gdrReadParam < 0`` alone asks for an NVLink
    peer (the ``cudaCompCap < 80`` test came in 2.19.1), so sends stage through host memory.
    Was: GDR for sends on Hopper whatever the release."""
    tree = nm.hopper_pair_without_nvlink(tmp_path)
    built_library(tree, "/usr/lib64", version)
    report = run_doctor(str(tmp_path), environ={})
    assert [(d.gdr_write, d.gdr_read) for d in report.nccl] == [(True, sends)] * 2
    gpu = findings(report)["nccl.gpu.0000:1b:00.0"]
    assert gpu.status is (Status.OK if sends else Status.WARN)
    if not sends:
        assert "NCCL 2.18.6's NCCL_NET_GDR_READ default" in gpu.summary


# ---- NCCL_CUMEM_ENABLE (src/misc/cudawrap.cc ncclCuMemEnable) -------------------------------


@pytest.mark.parametrize("version, value, allocation", [
    ((2, 17, 1), "1", "malloc"),      # no cuMem before 2.18.1
    ((2, 18, 1), None, "malloc"),     # 2.18: default 0
    ((2, 18, 1), "-1", "vmm"),        # 2.18: (param == -2 && supported) || param
    ((2, 19, 1), None, "vmm"),        # -2: where the driver supports it
    ((2, 30, 7), "-1", "malloc"),     # param >= 0 ? param : (param == -2 && supported)
    ((2, 30, 7), "0", "malloc"),
    ((2, 30, 7), "2", "vmm"),
])
def test_cumem_enable_by_release(version, value, allocation):
    """Was: anything but 0 was cuMem, and 2.18's default 0 was not known."""
    environ = {} if value is None else {"NCCL_CUMEM_ENABLE": value}
    assert NcclRules(version).gpu_allocation(environ) == allocation


def test_the_check_allocates_as_the_jobs_nccl_does(tmp_path):
    """machine_facts carries the job's NCCL: a 2.18 library allocates with cudaMalloc."""
    tree = nm.dmabuf_only(tmp_path)
    built_library(tree, "/usr/lib64", "2.18.5")
    facts = machine_facts(str(tmp_path), {})
    assert facts.nccl_rules.version == (2, 18, 5)
    assert facts.nccl_rules.gpu_allocation(facts.nccl_environ) == "malloc"


# ---- MLO partitions (paths.cc ncclTopoCheckGdr, src/init.cc fillInfo; 2.30.7) ---------------


def mlo_node(tmp_path):
    tree = nm.dmabuf_only(tmp_path)
    nm.cuda_facts(tree, nm.gpu_bdfs(tree), name="NVIDIA GB300 MLOPart0")
    return tree


@pytest.mark.parametrize("version, environ, gdr", [
    ("2.30.7", {}, False), ("2.30.7", {"NCCL_NET_GDR_MLOPART": "1"}, True), ("2.30.4", {}, True)])
def test_mlo_partitions_get_no_gdr_by_default_from_2_30_7(tmp_path, version, environ, gdr):
    """Was: GDR like any GPU."""
    tree = mlo_node(tmp_path)
    built_library(tree, "/usr/lib64", version)
    report = run_doctor(str(tmp_path), environ=environ)
    assert {(d.gdr_write, d.gdr_read) for d in report.nccl} == {(gdr, gdr)}
    if not gdr:
        gpu = findings(report)["nccl.gpu.0000:1b:00.0"]
        assert "MLO partition 0" in gpu.summary and "NCCL_NET_GDR_MLOPART=1" in gpu.fix


def test_an_mlo_partition_without_gdr_is_nccls_policy_not_a_node_fault(tmp_path):
    mlo_node(tmp_path)
    for use in machine_facts(str(tmp_path), {}).nccl.values():
        assert not use.uses_gdr and not use.node_fault and use.settings == ()
        assert "NCCL_NET_GDR_MLOPART=1" in use.fix


# ---- the communicator's GPUs, not the node's (src/graph/topo.cc ncclTopoGetSystem) -----------


def test_a_job_with_one_gpu_here_is_the_only_gpu_for_the_gdr_read_default(tmp_path):
    """Two V100s without NVLink: NCCL keeps sends off GPUDirect unless the GPU is the
    communicator's only one (system->nodes[GPU].count == 1). Was: the node's two GPUs."""
    nm.v100_no_nvlink(tmp_path)
    assert [d.gdr_read for d in decisions(tmp_path).values()] == [False, False]
    (alone,) = job_decisions(tmp_path, {"0000:1b:00.0"}).values()
    assert alone.gdr_read and alone.gpu_bdf == "0000:1b:00.0"


def test_the_channels_nic_counts_the_jobs_gpus(tmp_path):
    """ncclTopoGetLocalNetType: dev % localGpuCount. GPU 1e (NVML index 1) alone in the job:
    1 % 1 = 0, mlx5_0; with GPU 1b in the job too: 1 % 2 = 1, mlx5_1."""
    nm.shared_switch(tmp_path)
    assert decisions(tmp_path)["0000:1e:00.0"].nic == "mlx5_1"
    facts = machine_facts(str(tmp_path), {}, job=job_gpus({}, "0000:1e:00.0"))
    assert facts.nics["0000:1e:00.0"].nic == "mlx5_0"
    assert set(facts.nccl) == {"0000:1e:00.0"}


# ---- settings that decide alone ------------------------------------------------------------


@pytest.mark.parametrize("environ, finding", [({"NCCL_IB_DISABLE": "1"}, "nccl.ib_disable"),
                                              ({"NCCL_NET": "sOcKeT"}, "nccl.net")])
def test_the_per_gpu_decision_agrees_with_a_transport_setting(tmp_path, environ, finding):
    """Was: nccl.ib_disable failed while nccl.gpu.* said GDR for sends and receives."""
    nm.dmabuf_only(tmp_path)
    report = run_doctor(str(tmp_path), environ=environ)
    found = findings(report)
    assert found[finding].status is Status.FAIL
    assert {(d.path, d.nic, d.gdr_write, d.gdr_read) for d in report.nccl} == {("socket", None, False, False)}
    gpu = found["nccl.gpu.0000:1b:00.0"]
    assert gpu.status is Status.FAIL and "WITHOUT GPUDirect RDMA" in gpu.summary


@pytest.mark.parametrize("version, value, selected", [
    ("2.12.12", "socket", False), ("2.12.12", "Socket", True), ("2.13.4", "socket", True),
    ("2.30.7", " Socket", False)])
def test_nccl_net_is_matched_as_the_release_matches_it(tmp_path, version, value, selected):
    """strcmp before 2.13.4, strcasecmp from it, and no blanks trimmed. Was: stripped and
    lowered for every release."""
    tree = nm.dmabuf_only(tmp_path)
    built_library(tree, "/usr/lib64", version)
    report = run_doctor(str(tmp_path), environ={"NCCL_NET": value})
    assert ("nccl.net" in findings(report)) is selected
    assert {d.path == "socket" for d in report.nccl} == {selected}


@pytest.mark.parametrize("environ, variable", [({"NCCL_NET_GDR_LEVEL": "LOC"}, "NCCL_NET_GDR_LEVEL=LOC"),
                                               ({"NCCL_IB_DISABLE": "1"}, "NCCL_IB_DISABLE=1"),
                                               ({"NCCL_NET": "socket"}, "NCCL_NET=socket")])
def test_a_setting_that_decides_alone_holds_without_the_topology(tmp_path, environ, variable):
    """CUDA lists a GPU sysfs does not show, the NIC is Soft-RoCE: NCCL's topology cannot be
    read, yet these settings keep NCCL off GPUDirect whatever it is. Was: no decision at all,
    so the check said engaged."""
    nm.gpu_outside_sysfs(tmp_path)
    facts = machine_facts(str(tmp_path), {**environ, "NCCL_DEBUG": "INFO"})
    assert facts.nccl == {}                                  # no topology, no decision
    use = nccl_use_of(facts, "0")
    assert use.gpu == "0000:00:05.0" and use.firm and not use.uses_gdr and not use.node_fault
    assert use.settings == (f"{variable} (environment)",)
    assert use.fix.startswith(f"if this job should use GPUDirect RDMA, unset {variable}")


def test_the_check_on_a_software_nic_with_gdr_level_loc_is_not_used_by_nccl(tmp_path, runs, locks,  # noqa: F811
                                                                          monkeypatch):
    """The lab's case: a GPU outside sysfs, Soft-RoCE, NCCL_NET_GDR_LEVEL=LOC, and an A/B that
    measures engaged. Was: engaged, exit 0, for a job that NCCL keeps off GPUDirect."""
    monkeypatch.setattr(prelaunch, "first_rdma_device", lambda: "rxe0")
    nm.gpu_outside_sysfs(tmp_path)
    facts = dataclasses.replace(machine_facts(str(tmp_path), {"NCCL_NET_GDR_LEVEL": "LOC"}),
                                software_nics=("rxe0",))
    report = check(facts, "0", locks)
    assert (report.verdict.classification, report.verdict.exit_code) == ("not used by NCCL", 10)
    assert report.verdict.nccl.settings == ("NCCL_NET_GDR_LEVEL=LOC (environment)",)


def test_a_setting_that_decides_alone_answers_for_a_gpu_nothing_identifies(tmp_path):
    """No CUDA facts either (the driver did not answer the doctor): the GPU is known only by
    its CUDA ordinal, and NCCL's environment still answers for it."""
    tree = nm.gpu_outside_sysfs(tmp_path)
    tree.path(f"{nm.CAPTURE}/cuda.json").unlink()
    use = nccl_use_of(machine_facts(str(tmp_path), {"NCCL_IB_DISABLE": "1"}), "0")
    assert (use.gpu, use.path, use.settings) == ("0", "socket", ("NCCL_IB_DISABLE=1 (environment)",))
    assert nccl_use_of(machine_facts(str(tmp_path), {}), "0") is None


@pytest.mark.parametrize("version, gdr", [("2.27.5", True), ("2.30.7", False)])
def test_the_doctor_fails_a_gdr_level_only_where_no_path_reaches_it(tmp_path, version, gdr):
    """NCCL_NET_GDR_LEVEL=C2C on Grace: 2.27 and 2.28 count the P2C path as C2C, so GDR stays
    on; from 2.29.2 P2C is compared as it is. Was: FAIL "no NIC is that close" while the
    per-GPU decision said GDR on."""
    tree = nm.gh200(tmp_path)
    built_library(tree, "/usr/lib64", version)
    report = run_doctor(str(tmp_path), environ={"NCCL_NET_GDR_LEVEL": "C2C"})
    (decision,) = report.nccl
    assert decision.gdr_write is gdr
    assert (findings(report)["nccl.net_gdr_level"].status is Status.FAIL) is not gdr


# ---- NCCL_IB_PCI_RELAXED_ORDERING (net_ib ncclIbRelaxedOrderingCapable), one reading -------


@pytest.mark.parametrize("value, relaxed", [("2", True), ("1", True), ("0", False), ("3", False), ("-1", False)])
def test_relaxed_ordering_is_on_for_1_and_2_only(tmp_path, value, relaxed):
    """``roMode == 1 || roMode == 2``. Was: the doctor said off only for 0, while run and
    check read it as NCCL does."""
    nm.dmabuf_only(tmp_path)
    report = run_doctor(str(tmp_path), environ={"NCCL_IB_PCI_RELAXED_ORDERING": value})
    assert ("nccl.ib_pci_relaxed_ordering" in findings(report)) is not relaxed
    assert NcclRules().relaxed_ordering({"NCCL_IB_PCI_RELAXED_ORDERING": value}) is relaxed


def test_no_relaxed_ordering_before_2_12_7():
    assert not NcclRules((2, 11, 4)).relaxed_ordering({})
    assert NcclRules((2, 12, 7)).relaxed_ordering({})


def test_run_and_bench_read_relaxed_ordering_where_nccl_does(tmp_path):
    """One reading for every command: NCCL's configuration files count (was: run read the
    process's environment only) and bench registers as NCCL does (was: always relaxed)."""
    from gdrprobe.campaign import bench, machine
    from tests.unit.fakes.bench import settings
    tree = nm.dmabuf_only(tmp_path)
    tree.write("/etc/nccl.conf", "NCCL_IB_PCI_RELAXED_ORDERING=0\n")
    environ, rules = machine.nccl_view(str(tmp_path), {})
    assert environ["NCCL_IB_PCI_RELAXED_ORDERING"] == "0" and not rules.relaxed_ordering(environ)
    facts = machine_facts(str(tmp_path), {})
    plan = bench.bench_plan(settings(), facts, (), ("mlx5_0",), 30.0)
    assert plan.options.relaxed_ordering is False
    built_library(tree, "/usr/lib64", "2.11.4")
    tree.write("/etc/nccl.conf", "")
    old = machine_facts(str(tmp_path), {})
    assert bench.bench_plan(settings(), old, (), ("mlx5_0",), 30.0).options.relaxed_ordering is False
