"""RCCL's GDR rules by the ROCm release of the job's RCCL (issue 39 item 8), each from RCCL's
source and CHANGELOG.md (gdrprobe/nccl/rccl.py cites them): DMA-BUF on by default and peer
memory preferred from 7.12, any peer-memory client and a registration probe from 7.14, more
kernel configuration files from 7.11, RCCL_FORCE_ENABLE_DMABUF from 7.1. Before, every RCCL
was judged by the 6.3 line's rules."""

from __future__ import annotations

import pytest

from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.nccl import rccl
from gdrprobe.nccl.rccl import MEMORY_PEERS_FILES
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import rocm_machines
from tests.unit.doctor.nccl_libraries import torch

OTHER_CLIENT = "/sys/kernel/mm/memory_peers/ib_peer_mem_client/version"


def first(root, **environ):
    return DoctorContext(SysRoot(str(root)), environ).nccl_decisions[0]


def receive(decision) -> str:
    return next(why for why in decision.why if why.startswith("receive:"))


@pytest.mark.parametrize("rocm, mechanism", [("6.3.0", None), ("7.0.0", None), ("7.11.0", None),
                                             ("7.12.0", "dmabuf")])
def test_dmabuf_is_on_by_default_from_rocm_7_12(tmp_path, rocm, mechanism):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=rocm)
    rocm_machines.kernel_config(tree)
    decision = first(tmp_path)
    assert decision.mechanism == mechanism
    if mechanism is None:
        assert "RCCL's default is 0 before ROCm 7.12" in receive(decision)


@pytest.mark.parametrize("rocm, mechanism", [("7.0.0", "dmabuf"), ("7.12.0", "peermem")])
def test_where_both_hold_rccl_prefers_peer_memory_from_7_12(tmp_path, rocm, mechanism):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=rocm)
    rocm_machines.kernel_config(tree)
    rocm_machines.memory_peers(tree, MEMORY_PEERS_FILES[0])
    decision = first(tmp_path, NCCL_DMABUF_ENABLE="1")
    assert (decision.gdr_write, decision.mechanism) == (True, mechanism)
    if mechanism == "peermem":
        assert "wherever it has it (DMA-BUF is its fallback)" in decision.mechanism_reason


def test_force_enable_dmabuf_skips_peer_memory_from_7_12_and_the_kernel_from_7_1(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm="7.12.0")
    rocm_machines.memory_peers(tree, MEMORY_PEERS_FILES[0])          # no kernel configuration
    decision = first(tmp_path, RCCL_FORCE_ENABLE_DMABUF="1")
    assert (decision.gdr_write, decision.mechanism) == (True, "dmabuf")
    assert "RCCL_FORCE_ENABLE_DMABUF=1 skips the kernel's configuration" in decision.mechanism_reason
    old = rocm_machines.mi300x_node(tmp_path / "6.4", rocm="6.4.0")
    rocm_machines.memory_peers(old, MEMORY_PEERS_FILES[0])
    assert first(tmp_path / "6.4", RCCL_FORCE_ENABLE_DMABUF="1", NCCL_DMABUF_ENABLE="1").mechanism == "peermem"


@pytest.mark.parametrize("rocm, gdr", [("7.12.0", False), ("7.14.0", True)])
def test_any_peer_memory_client_counts_from_7_14(tmp_path, rocm, gdr):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=rocm)
    rocm_machines.memory_peers(tree, OTHER_CLIENT)
    decision = first(tmp_path, NCCL_DMABUF_ENABLE="0")
    assert decision.gdr_write is gdr
    if gdr:
        assert OTHER_CLIENT in decision.mechanism_reason


def test_without_a_client_rocm_7_14_probes_with_a_registration_the_ab_makes_too(tmp_path):
    rocm_machines.mi300x_node(tmp_path, rocm="7.14.0")
    decision = first(tmp_path, NCCL_DMABUF_ENABLE="0")
    assert (decision.gdr_write, decision.mechanism) == (True, "peermem")
    assert rccl.PROBE in decision.mechanism_reason


def test_from_7_11_the_first_kernel_configuration_that_opens_decides(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm="7.11.0")
    rocm_machines.proc_config(tree)                    # /proc/config.gz only
    assert first(tmp_path, NCCL_DMABUF_ENABLE="1").mechanism == "dmabuf"
    old = rocm_machines.mi300x_node(tmp_path / "6.3", rocm="6.3.0")
    rocm_machines.proc_config(old)
    assert "which RCCL does not read" in receive(first(tmp_path / "6.3", NCCL_DMABUF_ENABLE="1"))


def test_from_7_11_without_a_configuration_file_kallsyms_decides(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm="7.11.0")
    tree.write("/gdrprobe-capture/rocm.json", '{"kallsyms_symbol": false, "kallsyms_dmabuf": '
                                              '["dma_buf_move_notify"], "hsa": {"dmabuf_supported": '
                                              'true, "export_symbol": true}}')
    decision = first(tmp_path, NCCL_DMABUF_ENABLE="1")
    assert decision.mechanism is None and "/proc/kallsyms lacks pci_p2pdma" in receive(decision)


def test_the_release_comes_from_rccls_version_where_the_file_name_has_none(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path, rocm=None)
    site = "/opt/venv/lib/python3.12/site-packages"          # PyTorch's ROCm wheel, renamed librccl.so
    torch(tree, site, library="libtorch_hip.so", needed=("libamdhip64.so", "librccl.so"), rpath="$ORIGIN")
    tree.write(f"{site}/torch/lib/librccl.so", rocm_machines.rccl_bytes("2.28.3"))
    rules = DoctorContext(SysRoot(str(tmp_path)), {}).nccl_rules
    assert rules.rocm == (7, 13, 0) and "RCCL 2.28.3's" in rules.described


def test_an_unknown_release_is_judged_by_the_newest_rules(tmp_path):
    rocm_machines.mi300x_node(tmp_path, rocm=None)
    rules = DoctorContext(SysRoot(str(tmp_path)), {}).nccl_rules
    assert rules.rocm is None and rules.release == rccl.MODELLED_ROCM
    assert "of an unknown ROCm: 7.14.0's" in rules.described


@pytest.mark.parametrize("name, release", [("librccl.so.1.0.60300", (6, 3, 0)),
                                           ("librccl.so.1.0.71200", (7, 12, 0)),
                                           ("librccl.so.1", None), ("librccl.so", None)])
def test_rocms_file_name_states_its_release(name, release):
    assert rccl.rocm_from_file_name(f"/opt/rocm/lib/{name}") == release
