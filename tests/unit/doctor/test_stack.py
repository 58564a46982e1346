from __future__ import annotations

from .stack_machines import dmabuf_inventory, legacy_inventory, module, peermem_unregistered, write, context

from gdrprobe.doctor import stack
from gdrprobe.report.model import Status


def by_id(findings):
    return {finding.id: finding for finding in findings}


def test_dmabuf_node_without_peermem_is_healthy(tmp_path):
    found = by_id(stack.check(dmabuf_inventory(tmp_path)))
    assert found["stack.path"].status is Status.OK
    assert "DMA-BUF path available" in found["stack.path"].summary
    assert found["stack.peermem"].status is Status.OK
    assert "expected on the DMA-BUF path" in found["stack.peermem"].summary
    assert "Open Kernel Module" in found["stack.driver"].summary
    assert found["stack.kernel"].evidence[0].value == "5.15.0-118-generic"
    assert "12.8" in found["stack.cuda_driver"].summary
    assert found["stack.ofed"].summary.startswith("no MLNX_OFED")
    assert all(finding.group == "stack" for finding in found.values())


def test_legacy_node_with_registered_peermem_is_healthy_as_legacy(tmp_path):
    found = by_id(stack.check(legacy_inventory(tmp_path)))
    path = found["stack.path"]
    assert path.status is Status.OK
    assert path.summary.startswith("legacy nvidia-peermem path")
    assert "not the Open Kernel Module" in path.summary and "older than 5.12" in path.summary
    assert found["stack.peermem"].status is Status.OK
    assert found["stack.ofed"].evidence[0].source == "/sys/module/mlx_compat"
    assert found["stack.driver"].summary.endswith("proprietary kernel module")


def test_peermem_loaded_but_not_registered_is_its_own_failure(tmp_path):
    found = by_id(stack.check(peermem_unregistered(tmp_path)))
    unregistered = found["stack.peermem.unregistered"]
    assert unregistered.status is Status.FAIL
    assert unregistered.evidence[0].source == "/sys/module/nvidia_peermem"
    assert {e.source for e in unregistered.evidence[1:]} == set(stack.MEMORY_PEER_FILES)
    assert "reinstall" in unregistered.fix
    assert found["stack.path"].status is Status.FAIL
    assert "stack.peermem" not in found


def test_neither_path_fails_with_install_fix(tmp_path):
    write(tmp_path, "/proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.06")
    write(tmp_path, "/proc/sys/kernel/osrelease", "5.15.0-118-generic")
    found = by_id(stack.check(context(tmp_path)))
    assert found["stack.path"].status is Status.FAIL
    assert "Open Kernel Module" in found["stack.path"].fix and "reinstall" in found["stack.path"].fix
    assert found["stack.peermem"].status is Status.INFO
    assert found["stack.cuda_driver"].status is Status.SKIP


def test_old_cuda_driver_blocks_dmabuf(tmp_path):
    ctx = dmabuf_inventory(tmp_path)
    ctx.cuda_facts["driver_version"] = 11040
    found = by_id(stack.check(ctx))
    assert found["stack.path"].status is Status.FAIL
    assert "CUDA driver 11.4 is older than 11.7" in found["stack.path"].summary


def test_nv_peer_mem_beside_nvidia_peermem_conflicts_and_gdrdrv_is_gdrcopy(tmp_path):
    ctx = legacy_inventory(tmp_path)
    module(tmp_path, "nv_peer_mem")
    module(tmp_path, "gdrdrv")
    found = by_id(stack.check(ctx))
    assert found["stack.nv_peer_mem"].status is Status.FAIL
    assert found["stack.gdrcopy"].status is Status.INFO
    assert "not GPUDirect RDMA" in found["stack.gdrcopy"].summary


def test_nv_peer_mem_alone_is_deprecated(tmp_path):
    ctx = peermem_unregistered(tmp_path)
    module(tmp_path, "nv_peer_mem")
    import shutil
    shutil.rmtree(tmp_path / "sys/module/nvidia_peermem")
    assert by_id(stack.check(ctx))["stack.nv_peer_mem"].status is Status.WARN


def test_no_nvidia_driver_is_a_skip(tmp_path):
    findings = stack.check(context(tmp_path))
    assert [(f.id, f.status) for f in findings] == [("stack.driver", Status.SKIP)]
