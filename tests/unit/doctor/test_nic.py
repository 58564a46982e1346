from __future__ import annotations

from .stack_machines import context, pci_bus, rdma_device, rdma_port, write

from gdrprobe.doctor.checks import nic
from gdrprobe.report.model import Status

ROCE_V2_GID = "0000:0000:0000:0000:0000:ffff:0a00:0001"
LINK_LOCAL_GID = "fe80:0000:0000:0000:0202:c9ff:fe00:0001"


def by_id(findings):
    return {finding.id: finding for finding in findings}


def healthy_roce(root):
    pci_bus(root)
    rdma_device(root, "mlx5_0", "uverbs0")
    rdma_port(root, "mlx5_0", gids={0: (LINK_LOCAL_GID, "IB/RoCE v1"), 1: (LINK_LOCAL_GID, "RoCE v2"),
                                   3: (ROCE_V2_GID, "RoCE v2")})
    write(root, "/dev/infiniband/uverbs0")


def test_healthy_roce_port(tmp_path):
    healthy_roce(tmp_path)
    found = by_id(nic.check(context(tmp_path, {"MLX5_SCATTER_TO_CQE": "0"})))
    assert found["nic.devices"].status is Status.OK
    assert found["nic.ports"].status is Status.OK
    assert found["nic.dev_infiniband"].status is Status.OK
    assert found["nic.mlx5_scatter_to_cqe"].status is Status.OK
    assert not any(key.startswith("nic.mlx5_0.port1") for key in found)


def test_mlx5_without_scatter_setting_gets_advice(tmp_path):
    healthy_roce(tmp_path)
    advice = by_id(nic.check(context(tmp_path)))["nic.mlx5_scatter_to_cqe"]
    assert advice.status is Status.INFO
    assert advice.fix == "Set MLX5_SCATTER_TO_CQE=0 in the environment of the process."


def test_port_down_and_no_roce_v2_gid(tmp_path):
    pci_bus(tmp_path)
    rdma_device(tmp_path, "mlx5_0", "uverbs0")
    rdma_port(tmp_path, "mlx5_0", state="1: DOWN", gids={0: (LINK_LOCAL_GID, "IB/RoCE v1")})
    write(tmp_path, "/dev/infiniband/uverbs0")
    found = by_id(nic.check(context(tmp_path)))
    assert found["nic.ports"].status is Status.FAIL
    assert found["nic.mlx5_0.port1.state"].status is Status.WARN
    assert found["nic.mlx5_0.port1.state"].evidence[0].value == "1: DOWN"
    assert found["nic.mlx5_0.port1.roce_v2_gid"].status is Status.WARN


def test_infiniband_port_needs_no_roce_gid(tmp_path):
    pci_bus(tmp_path)
    rdma_device(tmp_path, "mlx5_0", "uverbs0")
    rdma_port(tmp_path, "mlx5_0", link_layer="InfiniBand")
    write(tmp_path, "/dev/infiniband/uverbs0")
    assert "nic.mlx5_0.port1.roce_v2_gid" not in by_id(nic.check(context(tmp_path)))


def test_missing_uverbs_in_a_container_says_pass_dev_infiniband(tmp_path):
    healthy_roce(tmp_path)
    (tmp_path / "dev/infiniband/uverbs0").unlink()
    write(tmp_path, "/.dockerenv")
    nodes = by_id(nic.check(context(tmp_path)))["nic.dev_infiniband"]
    assert nodes.status is Status.FAIL
    assert "mlx5_0 (uverbs0)" in nodes.summary
    assert "--device=/dev/infiniband" in nodes.fix


def test_missing_uverbs_on_the_host_says_load_ib_uverbs(tmp_path):
    healthy_roce(tmp_path)
    (tmp_path / "dev/infiniband/uverbs0").unlink()
    assert "modprobe ib_uverbs" in by_id(nic.check(context(tmp_path)))["nic.dev_infiniband"].fix


def test_no_rdma_device_names_the_missing_ib_driver(tmp_path):
    pci_bus(tmp_path)
    write(tmp_path, "/sys/module/mlx5_core/refcnt", "0")
    devices = by_id(nic.check(context(tmp_path)))["nic.devices"]
    assert devices.status is Status.FAIL
    assert ("/sys/module/mlx5_ib", "absent while mlx5_core is loaded") in [
        (e.source, e.value) for e in devices.evidence]
    assert devices.fix.startswith("Load mlx5_ib")


def test_sysfs_without_pci_devices(tmp_path):
    assert [(f.id, f.status) for f in nic.check(context(tmp_path))] == [("nic.sysfs", Status.FAIL)]
