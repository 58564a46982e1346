"""GPU-initiated networking as NCCL (and NVSHMEM) decide it (issue 44): the mode per GPU and
NIC on fixture machines, each keyed to the source line that decides it (gdrprobe/nccl/gin.py,
gdrprobe/nccl/ibgda.py). Before issue 44 the doctor said nothing about GIN."""

from __future__ import annotations

import json

import pytest

from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.facts.gin import driver_params, find_ofi_plugin, ofi_plugin_facts
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl.gin import CPU_PROXY, GPU_INITIATED, NO_GIN, asked_for_gin
from gdrprobe.nccl.ibgda import nvshmem_bool
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import gin_machines as gm

GPU0, EFA_GPU = "0000:1b:00.0", "0000:1b:00.0"


def gin(report, bdf=GPU0, nvshmem=False):
    wanted = ids.gin_nvshmem(bdf) if nvshmem else ids.gin_gpu(bdf)
    return next(f for f in report.findings if f.id == wanted)


def mode_of(finding) -> str:
    return finding.evidence[0].value


def test_legacy_nv_peer_mem_alone_gives_the_cpu_proxy_backend(tmp_path):
    """NCCL 2.29.7+ src/transport/net_ib/gin.cc ncclGinIbGdrSupport: GDAKI asks
    ncclIbPeerMemSupport (nvidia_peermem's module file only), the proxy ncclIbGdrSupport, which
    counts the nv_mem client nv_peer_mem registers; no DMA-BUF here."""
    gm.legacy_nv_peer_mem(tmp_path)
    finding = gin(run_doctor(str(tmp_path), environ={}))
    assert mode_of(finding) == f"{CPU_PROXY} (proxy)"
    assert "never the legacy nv_mem client" in finding.summary and "Unable to use GIN" in finding.summary
    assert finding.status is Status.WARN and "modprobe nvidia-peermem" in finding.fix


def test_nvidia_peermem_without_the_registry_key_predicts_the_cpu_doorbell(tmp_path):
    """GDAKI is chosen (mlx5 NICs, nvidia_peermem); DOCA's cudaHostRegister(IoMemory) of the
    UAR is what the registry key lets through (doca_gpunetio.cpp "Enabling CPU proxy mode")."""
    gm.peermem_without_key(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    finding = gin(report)
    assert mode_of(finding) == f"{CPU_PROXY} (GDAKI)" and "Enabling CPU proxy mode" in finding.summary
    assert finding.status is Status.WARN and "PeerMappingOverride=1" in finding.fix
    assert "check --gin" in finding.summary
    params = next(f for f in report.findings if f.id == ids.GIN_DRIVER_PARAMS)
    assert params.status is Status.WARN and params.evidence[0].value.startswith('RegistryDwords: ""')
    assert report.exit_code == 0          # a job that did not ask for GIN is only warned


def test_the_key_and_nvidia_peermem_predict_the_gpu_rings_the_doorbell(tmp_path):
    gm.peermem_with_key(tmp_path)
    report = run_doctor(str(tmp_path), environ={})
    finding = gin(report)
    assert mode_of(finding) == f"{GPU_INITIATED} (GDAKI)" and finding.status is Status.OK
    assert next(f for f in report.findings if f.id == ids.GIN_DRIVER_PARAMS).status is Status.OK


def test_a_non_mlx5_roce_nic_takes_the_proxy_backend_as_information(tmp_path):
    """ncclGinIbGdakiInitOnce counts IB_PROVIDER_MLX5 devices only (mlx5dv_is_supported); the
    kernel driver bnxt_en says this one is not."""
    gm.broadcom_roce(tmp_path)
    finding = gin(run_doctor(str(tmp_path), environ={}))
    assert mode_of(finding) == f"{CPU_PROXY} (proxy)" and "IB_PROVIDER_MLX5" in finding.summary
    assert finding.status is Status.INFO and finding.fix == ""


def test_a_job_that_asks_gdaki_on_a_non_mlx5_nic_fails(tmp_path):
    gm.broadcom_roce(tmp_path)
    finding = gin(run_doctor(str(tmp_path), environ={"NCCL_GIN_TYPE": "3"}))
    assert mode_of(finding) == NO_GIN and "asks GDAKI only" in finding.summary
    assert finding.status is Status.FAIL


def test_nccl_gin_enable_0_turns_gin_off(tmp_path):
    """src/gin/gin_host.cc ncclGinConnectOnce: "GIN is disabled."; read with strtoll base 0."""
    gm.pix_gin(tmp_path)
    finding = gin(run_doctor(str(tmp_path), environ={"NCCL_GIN_ENABLE": "0x0"}))
    assert mode_of(finding) == NO_GIN and "GIN is disabled." in finding.summary
    assert finding.status is Status.INFO and "unset NCCL_GIN_ENABLE" in finding.fix


def test_an_nccl_before_gin_has_none(tmp_path):
    """src/gin/ is in v2.28.7-1 and not in v2.28.3-1."""
    gm.pix_gin(tmp_path, nccl="2.28.3")
    finding = gin(run_doctor(str(tmp_path), environ={}))
    assert mode_of(finding) == NO_GIN and "NCCL 2.28.3 has no GIN" in finding.summary
    gm.pix_gin(tmp_path / "new", nccl="2.28.7")
    assert mode_of(gin(run_doctor(str(tmp_path / "new"), environ={}))) == f"{GPU_INITIATED} (GDAKI)"


def test_cumem_off_leaves_no_symmetric_memory_and_no_gin(tmp_path):
    """src/init.cc: symmetricSupport needs ncclCuMemEnable(); ncclGinConnectOnce needs it."""
    gm.pix_gin(tmp_path)
    finding = gin(run_doctor(str(tmp_path), environ={"NCCL_CUMEM_ENABLE": "0"}))
    assert mode_of(finding) == NO_GIN and "symmetric memory" in finding.summary
    asked = gin(run_doctor(str(tmp_path), environ={"NCCL_CUMEM_ENABLE": "0", "NCCL_GIN_ENABLE": "1"}))
    assert asked.status is Status.WARN      # the job's own setting: the node is fine


def test_fused_nics_turn_gin_off_only_in_2_29_2_to_2_30_4(tmp_path):
    """src/init.cc globalNicFused (2.29.2-2.30.4; gone in 2.30.7)."""
    from gdrprobe.nccl.gin import GinGpu, GinNic, GinNode, gin_mode
    from gdrprobe.nccl.versions import NcclRules

    nic = GinNic(name="mlx5_0", provider="mlx5", dmabuf=True, fused=True)
    node = GinNode(rules=NcclRules((2, 30, 4)), environ={}, mlx5_nics=("mlx5_0",), verbs_nics=("mlx5_0",),
                   peermem_module=True, peer_memory=True, first_nic_dmabuf=True)
    assert gin_mode(node, GinGpu("0000:1b:00.0"), nic).mode == NO_GIN
    newer = GinNode(**{**node.__dict__, "rules": NcclRules((2, 30, 7))})
    assert gin_mode(newer, GinGpu("0000:1b:00.0"), nic).mode != NO_GIN


@pytest.mark.parametrize("environ, plugin, libfabric, mode", [
    ({}, "1.21.1", (2, 6), f"{CPU_PROXY} (proxy)"),                  # NCCL 2.31's default on EFA
    ({"NCCL_GIN_TYPE": "5"}, "1.21.1", (2, 6), f"{GPU_INITIATED} (EFA-GDA)"),
    ({"NCCL_GIN_TYPE": "5"}, "1.21.1", (2, 5), f"{GPU_INITIATED} (EFA-GDA)"),  # the code's gate: 2.5
    ({"NCCL_GIN_TYPE": "5"}, "1.21.1", (2, 4), f"{NO_GIN} (EFA-GDA)"),
    ({"NCCL_GIN_TYPE": "5"}, "1.20.0", (2, 6), NO_GIN),                # no GIN v14 table before 1.21
    ({"NCCL_GIN_TYPE": "5"}, "1.21.1", None, f"{NO_GIN} (EFA-GDA)")])
def test_an_efa_node_at_the_plugin_and_libfabric_releases(tmp_path, environ, plugin, libfabric, mode):
    """aws-ofi-nccl doc/gin-getting-started.md (1.21: NCCL 2.31.2+, GDRCopy 2.5+, NCCL_GIN_TYPE=5
    for EFA-GDA) and include/rdma/gin/nccl_ofi_gin_gdaki.h (fi_version() >= FI_VERSION(2, 5))."""
    gm.efa_node(tmp_path, plugin=plugin, libfabric=libfabric)
    finding = gin(run_doctor(str(tmp_path), environ=environ), EFA_GPU)
    assert mode_of(finding) == mode
    if mode.startswith(NO_GIN):
        assert finding.status is Status.FAIL          # the job asked for EFA-GDA
    if libfabric == (2, 4):
        assert "libfabric 2.5+" in finding.summary and "2.6.0" in finding.fix


def test_efa_gda_needs_the_instance_types_with_the_hardware_counter(tmp_path):
    """platform-aws.cpp: efa_hw_comp_cntr on p5en/p6-b200 and p6-b300 only;
    OFI_NCCL_GDAKI_EFA_HW_COUNTER=on overrides."""
    gm.efa_node(tmp_path, product="p5.48xlarge")
    refused = gin(run_doctor(str(tmp_path), environ={"NCCL_GIN_TYPE": "5"}), EFA_GPU)
    assert mode_of(refused) == f"{NO_GIN} (EFA-GDA)" and "p5.48xlarge" in refused.summary
    forced = gin(run_doctor(str(tmp_path), environ={"NCCL_GIN_TYPE": "5", "OFI_NCCL_GDAKI_EFA_HW_COUNTER": "on"}),
                 EFA_GPU)
    assert mode_of(forced) == f"{GPU_INITIATED} (EFA-GDA)"


def test_efa_needs_nccl_2_31_2_and_gdrcopy(tmp_path):
    gm.efa_node(tmp_path, nccl="2.30.7", gdrdrv=None)
    finding = gin(run_doctor(str(tmp_path), environ={}), EFA_GPU)
    assert mode_of(finding) == NO_GIN and "NCCL 2.31.2" in finding.summary and "GDRCopy 2.5" in finding.summary
    assert finding.status is Status.WARN      # the job did not ask, and the node can be fixed


def test_a_job_that_forces_the_gpu_doorbell_without_the_key_fails(tmp_path):
    """NCCL_GIN_GDAKI_NIC_HANDLER=2 (GPU_SM_DB): doca_gpu_verbs_export_qp gives up ("Can't
    export UAR to GPU.") instead of falling back."""
    gm.peermem_without_key(tmp_path)
    report = run_doctor(str(tmp_path), environ={"NCCL_GIN_ENABLE": "1", "NCCL_GIN_GDAKI_NIC_HANDLER": "2"})
    finding = gin(report)
    assert mode_of(finding) == f"{NO_GIN} (GDAKI)" and finding.status is Status.FAIL
    assert "NCCL_GIN_ENABLE=1" in finding.summary and report.exit_code == 1


def test_nvshmem_ibgda_is_answered_where_its_variables_are_set(tmp_path):
    """ibgda.cpp: auto maps the UAR for the GPU, else falls back to the CPU (GDRCopy, else CUDA
    host memory)."""
    gm.peermem_without_key(tmp_path)
    assert not any(f.id.startswith("gin.nvshmem.") for f in run_doctor(str(tmp_path), environ={}).findings)
    report = run_doctor(str(tmp_path), environ={"NVSHMEM_IB_ENABLE_IBGDA": "1"})
    finding = gin(report, nvshmem=True)
    assert mode_of(finding) == f"{CPU_PROXY} (cpu_host_memory)" and finding.status is Status.FAIL
    tmp = tmp_path / "gdrcopy"
    gm.peermem_with_key(tmp)
    assert mode_of(gin(run_doctor(str(tmp), environ={"NVSHMEM_IB_ENABLE_IBGDA": "y"}), nvshmem=True)) == \
        f"{GPU_INITIATED} (gpu)"
    off = gin(run_doctor(str(tmp), environ={"NVSHMEM_IB_ENABLE_IBGDA": "false"}), nvshmem=True)
    assert mode_of(off) == NO_GIN and off.status is Status.INFO


def test_asked_for_gin_and_nvshmem_booleans_read_as_the_libraries_read_them():
    assert asked_for_gin({"NCCL_GIN_ENABLE": "1"}) == "NCCL_GIN_ENABLE=1"
    assert asked_for_gin({"NCCL_GIN_ENABLE": "0"}) == "" and asked_for_gin({"NCCL_GIN_TYPE": "-1"}) == ""
    assert asked_for_gin({"NCCL_GIN_TYPE": "0x3"}) == "NCCL_GIN_TYPE=0x3"
    assert nvshmem_bool({"X": ""}, "X") and not nvshmem_bool({"X": "No"}, "X") and not nvshmem_bool({}, "X")


def test_the_params_file_is_parsed_as_the_driver_prints_it(tmp_path):
    tree = gm.pix_gin(tmp_path, registry="PeerMappingOverride = 0x1 ; RMUseSwI2c=1")
    params = driver_params(SysRoot(str(tmp_path)))
    assert params.peer_mapping_override and params.stream_memops == 0
    gm.driver_params(tree, "PeerMappingOverride=1;PeerMappingOverride=0")
    assert not driver_params(SysRoot(str(tmp_path))).peer_mapping_override   # the last one wins
    assert not driver_params(SysRoot(str(tmp_path / "none"))).readable


def test_the_ofi_plugin_is_found_as_the_loader_finds_it(tmp_path):
    tree = gm.efa_node(tmp_path)
    gm.ofi_plugin_library(tree, "/opt/amazon/ofi-nccl/lib", "1.21.1")
    root, environ = SysRoot(str(tmp_path)), {"LD_LIBRARY_PATH": "/opt/amazon/ofi-nccl/lib"}
    assert find_ofi_plugin(root, environ) == "/opt/amazon/ofi-nccl/lib/libnccl-net.so"
    assert ofi_plugin_facts(root, environ)["version"].startswith("1.21.1")
    assert find_ofi_plugin(root, {}) is None
    assert find_ofi_plugin(root, {**environ, "NCCL_NET_PLUGIN": "aws"}) is None   # libnccl-net-aws.so


def test_a_capture_keeps_what_gin_reads_and_replays_the_same(tmp_path):
    """capture copies what the readers touched (/proc/driver/nvidia/params, /sys/module/gdrdrv,
    the NIC's driver link) and gin.json; the replay gives the same findings."""
    source = tmp_path / "machine"
    gm.efa_node(source)
    environ = {"NCCL_GIN_TYPE": "5"}
    before = [(f.id, f.status, f.summary) for f in run_doctor(str(source), environ=environ).findings
              if f.group == ids.GIN]
    copied = capture(str(tmp_path / "cap"), root=str(source), environ=environ)
    assert "/proc/driver/nvidia/params" in copied and "/sys/module/gdrdrv/version" in copied
    replay = run_doctor(str(tmp_path / "cap"))
    assert [(f.id, f.status, f.summary) for f in replay.findings if f.group == ids.GIN] == before
    assert json.loads((tmp_path / "cap/gdrprobe-capture/gin.json").read_text())["libfabric"]["api"] == [2, 6]
    ctx = DoctorContext(SysRoot(str(tmp_path / "cap")))
    assert ctx.gin_node.ofi.product_name == "p5en.48xlarge"


def test_a_damaged_gin_json_is_named_before_any_check(tmp_path):
    """doctor/capture_shape.py: gin.json as collect_gin_facts writes it, or DamagedCapture."""
    from gdrprobe.doctor.capture_shape import DamagedCapture

    tree = gm.efa_node(tmp_path)
    tree.write("/gdrprobe-capture/gin.json", json.dumps({"libfabric": {"api": "2.6"}}))
    with pytest.raises(DamagedCapture, match="gin.json"):
        DoctorContext(SysRoot(str(tmp_path)), {}).check_capture()
