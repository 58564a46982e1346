from __future__ import annotations

from .stack_machines import dmabuf_inventory, legacy_inventory, module, peermem_unregistered, write, context

from gdrprobe.doctor.checks import stack
from gdrprobe.nccl.versions import PEERMEM_FILES
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import nccl_machines
from tests.unit.doctor.stack_machines import DenyingRoot
from gdrprobe.report.model import Status


def by_id(findings):
    return {finding.id: finding for finding in findings}


def test_dmabuf_node_without_peermem_is_healthy(tmp_path):
    found = by_id(stack.check(dmabuf_inventory(tmp_path)))
    assert found["stack.path"].status is Status.OK
    assert found["stack.path"].summary.startswith("NCCL can register GPU memory with every NIC through DMA-BUF")
    # No NIC probe was captured with this tree: the NIC half is inferred, and it says so.
    assert "(NIC side inferred)" in found["stack.path"].summary
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
    assert path.summary == "NCCL can register GPU memory with every NIC through peer memory (nvidia-peermem)"
    assert ("DMA-BUF, GPU 0000:1b:00.0", "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED=0 (needs the Open Kernel "
            "Module driver)") in [(e.source, e.value) for e in path.evidence]
    assert found["stack.peermem"].status is Status.OK
    assert found["stack.ofed"].evidence[0].source == "/sys/module/mlx_compat"
    assert found["stack.driver"].summary.endswith("proprietary kernel module")


def test_peermem_directory_without_version_file_is_not_counted(tmp_path):
    """nvidia-peermem's init fails unless it registered, so a loaded module always has its
    version file; a bare /sys/module directory (unloading) is what NCCL does not count."""
    found = by_id(stack.check(peermem_unregistered(tmp_path)))
    peermem = found["stack.peermem"]
    assert peermem.status is Status.WARN and "NCCL does not count it" in peermem.summary
    assert {e.source for e in peermem.evidence[1:]} == set(PEERMEM_FILES)
    assert found["stack.path"].status is Status.FAIL
    assert "reinstall the GPU driver" in found["stack.path"].fix


def test_peermem_on_kernel_6_8_without_memory_peers_is_healthy(tmp_path):
    """Was: "loaded but not registered, reinstall the driver". NCCL 2.23.4+ reads
    /sys/module/nvidia_peermem/version because 6.6+ has no /sys/kernel/mm/memory_peers."""
    nccl_machines.peermem_kernel_6_8(tmp_path)
    found = by_id(stack.check(DoctorContext(SysRoot(str(tmp_path)), {})))
    assert found["stack.path"].status is Status.OK
    assert "peer memory (nvidia-peermem)" in found["stack.path"].summary
    peermem = found["stack.peermem"]
    assert peermem.status is Status.OK
    assert peermem.summary.startswith("NCCL's peer-memory check passes: /sys/module/nvidia_peermem/version exists")
    assert "NCCL older than 2.23.4" in peermem.summary
    assert not [f for f in found.values() if f.status is Status.FAIL]


def test_nv_peer_mem_alone_is_a_working_legacy_path(tmp_path):
    """Was: "neither DMA-BUF nor nvidia-peermem". nv_peer_mem registers nv_mem, which NCCL counts."""
    nccl_machines.nv_peer_mem_only(tmp_path)
    found = by_id(stack.check(DoctorContext(SysRoot(str(tmp_path)), {})))
    assert found["stack.path"].status is Status.OK
    assert found["stack.peermem"].evidence[1].source == "/sys/kernel/mm/memory_peers/nv_mem/version"
    legacy = found["stack.nv_peer_mem"]
    assert legacy.status is Status.WARN and "it works" in legacy.summary
    assert "nvidia-peermem" in legacy.fix


def test_dmabuf_enable_zero_fails_where_dmabuf_is_the_only_path(tmp_path):
    nccl_machines.dmabuf_only(tmp_path)
    ctx = DoctorContext(SysRoot(str(tmp_path)), {"NCCL_DMABUF_ENABLE": "0"})
    path = by_id(stack.check(ctx))["stack.path"]
    assert path.status is Status.FAIL
    assert path.summary.startswith('NCCL will log "GPU Direct RDMA Disabled for HCA" for mlx5_0, mlx5_1')
    assert "NCCL_DMABUF_ENABLE=0" in path.summary
    assert path.fix == stack.DMABUF_ENABLE_FIX


def test_dmabuf_is_decided_per_nic_by_nccls_probe(tmp_path):
    """The GPU can export DMA-BUF, but mlx5_1's probe says EOPNOTSUPP: only mlx5_1 loses GDR."""
    tree = nccl_machines.dmabuf_only(tmp_path)
    nccl_machines.nic_probe(tree, {"mlx5_0": nccl_machines.EBADF, "mlx5_1": nccl_machines.EOPNOTSUPP})
    path = by_id(stack.check(DoctorContext(SysRoot(str(tmp_path)), {})))["stack.path"]
    assert path.status is Status.FAIL
    assert 'for mlx5_1:' in path.summary and "mlx5_0" not in path.summary.split(":")[0]
    assert "EOPNOTSUPP" in path.summary


def test_unreadable_driver_file_is_a_skip_that_says_run_as_root(tmp_path):
    nccl_machines.dmabuf_only(tmp_path)
    root = DenyingRoot(str(tmp_path), {"/proc/driver/nvidia/version"})
    (driver,) = stack.check(DoctorContext(root, {}))
    assert driver.status is Status.SKIP and "may not be read" in driver.summary
    assert driver.evidence[0].value == "permission denied" and "root" in driver.fix


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


def test_no_nvidia_driver_is_a_skip(tmp_path):
    findings = stack.check(context(tmp_path))
    assert [(f.id, f.status) for f in findings] == [("stack.driver", Status.SKIP)]


def test_dmabuf_confirmed_by_nccls_probe_is_not_called_inferred(tmp_path):
    nccl_machines.dmabuf_only(tmp_path)
    path = by_id(stack.check(DoctorContext(SysRoot(str(tmp_path)), {})))["stack.path"]
    assert (path.status, path.summary) == (Status.OK, "NCCL can register GPU memory with every NIC through DMA-BUF")
    assert ("DMA-BUF, NIC mlx5_0", "ibv_reg_dmabuf_mr(fd=-1) failed with EBADF, past the support check: "
            "the NIC path exists") in [(e.source, e.value) for e in path.evidence]
