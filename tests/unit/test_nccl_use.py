"""Will NCCL use GPUDirect RDMA for a GPU at all, and is a setting or the node to blame?
NCCL's rules run on fixture machines (tests/unit/doctor/nccl_machines.py) under the
environments a job image or a node's /etc/nccl.conf sets."""

from __future__ import annotations

import pytest

from gdrprobe.campaign.machine import machine_facts
from tests.unit.doctor import machines, nccl_machines as nm
from tests.unit.doctor.nccl_libraries import built_library


def dual_socket(root):
    """GPU and NIC on different root complexes (PHB): beyond NCCL's default GDR level."""
    tree = machines.dual_socket_node(root)
    nm.links_everywhere(tree)
    for nic in ("mlx5_0", "mlx5_1"):
        nm.port_rate(tree, nic, 400)
    nm.healthy_stack(tree, nm.gpu_bdfs(tree), ["mlx5_0", "mlx5_1"])
    return tree


def uses(tmp_path, build, environ):
    build(tmp_path)
    return machine_facts(str(tmp_path), environ).nccl


@pytest.mark.parametrize("environ, variable", [
    ({"NCCL_NET_GDR_LEVEL": "LOC"}, "NCCL_NET_GDR_LEVEL=LOC"),
    ({"NCCL_DMABUF_ENABLE": "0"}, "NCCL_DMABUF_ENABLE=0"),      # DMA-BUF is the only path
    ({"NCCL_IB_DISABLE": "1"}, "NCCL_IB_DISABLE=1"),
    ({"NCCL_NET": "Socket"}, "NCCL_NET=Socket"),
    ({"NCCL_IB_HCA": "=mlx5_9"}, "NCCL_IB_HCA==mlx5_9"),       # every NIC excluded
])
def test_a_setting_that_keeps_nccl_off_gdr_is_named_and_is_not_the_nodes(tmp_path, environ,
                                                                         variable):
    found = uses(tmp_path, nm.dmabuf_only, {**environ, "NCCL_DEBUG": "INFO"})
    for use in found.values():
        assert not use.uses_gdr and not use.node_fault and use.firm
        assert use.settings == (f"{variable} (environment)",)    # NCCL_DEBUG is no cause
        assert use.cause.startswith(f"{variable} (environment): ")
        assert use.fix.startswith(f"if this job should use GPUDirect RDMA, unset {variable}")


def test_a_setting_from_etc_nccl_conf_says_where_it_comes_from(tmp_path):
    tree = nm.dmabuf_only(tmp_path)
    tree.write("/etc/nccl.conf", "NCCL_NET_GDR_LEVEL=LOC\n")
    found = machine_facts(str(tmp_path), {}).nccl
    assert {use.settings for use in found.values()} == {
        ("NCCL_NET_GDR_LEVEL=LOC (/etc/nccl.conf)",)}


def test_a_topology_beyond_nccls_gdr_level_is_the_nodes(tmp_path):
    found = uses(tmp_path, dual_socket, {})
    assert found and all(use.node_fault and not use.settings for use in found.values())
    use = found["0000:01:00.0"]
    assert "beyond the GDR level P2C (NCCL's default)" in use.cause
    assert use.fix.startswith("Put the NIC under the same PCIe switch")


def test_without_cuda_facts_the_decision_is_not_firm(tmp_path):
    found = uses(tmp_path, nm.pix_pairs, {})
    assert found and not any(use.firm for use in found.values())


def test_gdr_for_receives_only_still_counts_as_used(tmp_path):
    found = uses(tmp_path, nm.v100_no_nvlink, {})
    assert all(use.receives and not use.sends and use.uses_gdr for use in found.values())
    assert all(use.cause == "" for use in found.values())


def test_pxn_names_the_peer_whose_memory_the_nic_reads(tmp_path):
    found = uses(tmp_path, nm.hgx_8gpu_4nic, {})
    relayed = found["0000:1d:00.0"]
    assert (relayed.path, relayed.via_gpu, relayed.nic) == ("pxn", "0000:1b:00.0", "mlx5_0")
    assert relayed.uses_gdr


def test_the_machine_facts_carry_the_ports_and_the_environment_as_nccl_sees_it(tmp_path):
    tree = nm.dmabuf_only(tmp_path)
    tree.write("/etc/nccl.conf", "NCCL_IB_GID_INDEX=3\n")
    facts = machine_facts(str(tmp_path), {})
    assert facts.nccl_environ["NCCL_IB_GID_INDEX"] == "3"
    port = facts.ports["mlx5_0", 1]
    assert (port.rate_gbps, port.link_layer) == (400.0, "InfiniBand")
    assert facts.software_nics == ()



def test_the_gate_decides_by_the_rules_of_the_nccl_the_job_loads(tmp_path):
    """NCCL 2.25 has no GPUDirect RDMA to a NIC behind Grace's C2C (2.26.2 on): the gate
    says what the doctor's nccl.gpu finding says, not what 2.30.7 would do."""
    tree = nm.gh200(tmp_path)
    built_library(tree, "/opt/nccl/lib", "2.25.1")
    facts = machine_facts(str(tmp_path), {"LD_LIBRARY_PATH": "/opt/nccl/lib"})
    (use,) = facts.nccl.values()
    assert not use.uses_gdr and use.node_fault and not use.settings
    assert "beyond the GDR level PXB (NCCL's default)" in use.cause
