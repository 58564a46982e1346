"""On an AMD node the doctor decides GPUDirect RDMA as RCCL does (ROCm/rccl's rules,
gdrprobe/nccl/rccl.py), for the GPUs amdkfd lists. Before, an MI300X node had no GPUs for
the doctor (only NVIDIA's PCI functions counted) and no per-GPU decision at all."""

from __future__ import annotations

import json

import pytest

from gdrprobe.doctor.capture import capture
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.nccl.rccl import MEMORY_PEERS_FILES
from gdrprobe.report.model import Status
from gdrprobe.sysroot import SysRoot
from tests.unit.doctor import rocm_machines


def context(root, **environ) -> DoctorContext:
    return DoctorContext(SysRoot(str(root)), environ)


def decisions(root, **environ):
    return context(root, **environ).nccl_decisions


def test_the_gpus_are_amdkfds_by_pci_bus_id_and_each_gets_a_decision(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    found = decisions(tmp_path)
    assert [d.gpu_bdf for d in found] == rocm_machines.amd_gpus(tree) == ["0000:1b:00.0", "0000:2d:00.0"]
    assert [d.nic for d in found] == ["mlx5_0", "mlx5_1"]


@pytest.mark.parametrize("path", MEMORY_PEERS_FILES)
def test_amdkfd_in_memory_peers_in_each_of_its_three_places_is_peer_memory(tmp_path, path):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.memory_peers(tree, path)
    ctx = context(tmp_path)
    for decision in ctx.nccl_decisions:
        assert (decision.gdr_write, decision.mechanism) == (True, "peermem")
        assert path in decision.mechanism_reason
    assert ctx.memory_paths.mechanism("mlx5_0", "0000:1b:00.0") == "peer memory (amdkfd)"


def test_the_kernels_peer_memory_symbol_is_peer_memory_where_no_file_is(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.rocm_facts(tree, kallsyms=True)
    (first, second) = decisions(tmp_path)
    assert (first.gdr_write, first.mechanism) == (True, "peermem")
    assert "/proc/kallsyms: ib_register_peer_memory_client" in first.mechanism_reason


def test_neither_file_nor_symbol_nor_dmabuf_is_gdr_off_with_rccls_reason(tmp_path):
    rocm_machines.mi300x_node(tmp_path)
    first = decisions(tmp_path)[0]
    assert (first.gdr_write, first.gdr_read, first.mechanism) == (False, False, None)
    receive = next(why for why in first.why if why.startswith("receive:"))
    assert receive.startswith('receive: RCCL says "GPU Direct RDMA Disabled for HCA" mlx5_0: ')
    assert "/proc/kallsyms has no ib_register_peer_memory_client" in receive
    assert "NCCL_DMABUF_ENABLE is not set and RCCL's default is 0" in receive


def test_kallsyms_is_read_from_the_machine_where_the_capture_has_no_answer(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    tree.write("/gdrprobe-capture/rocm.json", json.dumps({"hsa": {}}))
    tree.write("/proc/kallsyms", "0000000000000000 T ib_register_peer_memory_client\t[ib_core]\n")
    assert decisions(tmp_path)[0].mechanism == "peermem"
    tree.write("/proc/kallsyms", "0000000000000000 U ib_register_peer_memory_client\n")
    assert decisions(tmp_path)[0].mechanism is None


def test_force_enable_gdrdma_is_peer_memory_without_any_check(tmp_path):
    rocm_machines.mi300x_node(tmp_path)
    first = decisions(tmp_path, RCCL_FORCE_ENABLE_GDRDMA="1")[0]
    assert (first.gdr_write, first.mechanism) == (True, "peermem")
    assert "RCCL_FORCE_ENABLE_GDRDMA=1" in first.mechanism_reason


@pytest.mark.parametrize("relaxed, numa, gdr", [("0", "1", False), ("2", "1", True), ("0", "0", True)])
def test_on_hyper_v_numa_balancing_with_relaxed_ordering_off_turns_peer_memory_off(
        tmp_path, relaxed, numa, gdr):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.memory_peers(tree, MEMORY_PEERS_FILES[0])
    rocm_machines.hyper_v(tree, numa_balancing=numa)
    first = decisions(tmp_path, NCCL_IB_PCI_RELAXED_ORDERING=relaxed)[0]
    assert first.gdr_write is gdr
    if not gdr:
        assert "on Hyper-V" in next(why for why in first.why if why.startswith("receive:"))


def test_on_hyper_v_the_kernel_symbol_is_never_looked_for(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.rocm_facts(tree, kallsyms=True)
    rocm_machines.hyper_v(tree, numa_balancing="0")
    first = decisions(tmp_path)[0]
    assert first.gdr_write is False
    assert "on Hyper-V RCCL does not look in /proc/kallsyms" in \
        next(why for why in first.why if why.startswith("receive:"))


def test_dmabuf_with_the_variable_hsa_and_both_kernel_options(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.kernel_config(tree)
    first = decisions(tmp_path, NCCL_DMABUF_ENABLE="1")[0]
    assert (first.gdr_write, first.mechanism) == (True, "dmabuf")
    assert "HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED is true" in first.mechanism_reason
    # RCCL's HIP build has no send-side NVLink rule: sends use GDR without CUDA's facts.
    assert first.gdr_read is True
    assert not any("compute capability" in why for why in first.why)


def test_dmabuf_is_off_without_the_variable_even_where_everything_else_can(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.kernel_config(tree)
    rocm_machines.memory_peers(tree, MEMORY_PEERS_FILES[1])
    first = decisions(tmp_path)[0]
    assert first.mechanism == "peermem"
    assert "RCCL's default is 0" in first.mechanism_reason


@pytest.mark.parametrize("config, proc, words", [
    (None, None, "/boot/config-6.8.0-45-generic does not exist"),
    (None, rocm_machines.BOTH_OPTIONS, "/proc/config.gz has CONFIG_DMABUF_MOVE_NOTIFY=y and "
                                       "CONFIG_PCI_P2PDMA=y, which RCCL does not read"),
    ("CONFIG_DMABUF_MOVE_NOTIFY=y\n", None, "lacks CONFIG_PCI_P2PDMA=y"),
    ("CONFIG_PCI_P2PDMA=y\n# CONFIG_DMABUF_MOVE_NOTIFY is not set\n", None,
     "lacks CONFIG_DMABUF_MOVE_NOTIFY=y"),
])
def test_dmabuf_needs_both_options_in_the_boot_config(tmp_path, config, proc, words):
    tree = rocm_machines.mi300x_node(tmp_path)
    if config is not None:
        rocm_machines.kernel_config(tree, config)
    if proc is not None:
        rocm_machines.proc_config(tree, proc)
    first = decisions(tmp_path, NCCL_DMABUF_ENABLE="1")[0]
    assert (first.gdr_write, first.mechanism) == (False, None)
    assert words in next(why for why in first.why if why.startswith("receive:"))


@pytest.mark.parametrize("hsa_dmabuf, export, words", [
    (False, True, "HSA_AMD_SYSTEM_INFO_DMABUF_SUPPORTED is false"),
    (True, False, "no hsa_amd_portable_export_dmabuf")])
def test_dmabuf_needs_hsas_attribute_and_export(tmp_path, hsa_dmabuf, export, words):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.kernel_config(tree)
    rocm_machines.rocm_facts(tree, hsa_dmabuf=hsa_dmabuf, export=export)
    first = decisions(tmp_path, NCCL_DMABUF_ENABLE="1")[0]
    assert first.mechanism is None
    assert words in next(why for why in first.why if why.startswith("receive:"))


def test_rccls_warnings_are_evidence_and_decide_nothing(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.memory_peers(tree, MEMORY_PEERS_FILES[0])
    tree.cmdline("BOOT_IMAGE=/boot/vmlinuz root=UUID=0000 ro")
    paths = context(tmp_path).memory_paths
    notes = [item.value for item in paths.evidence() if item.source == "RCCL warns"]
    assert any("no iommu=pt" in note for note in notes)
    assert any("HSA_FORCE_FINE_GRAIN_PCIE" in note for note in notes)
    assert decisions(tmp_path)[0].gdr_write is True


def test_a_capture_of_an_amd_node_replays_rccls_decision(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path / "node")
    rocm_machines.rocm_facts(tree, kallsyms=True)
    rocm_machines.kernel_config(tree, "CONFIG_DMABUF_MOVE_NOTIFY=y\n")
    capture(str(tmp_path / "copy"), root=str(tmp_path / "node"),
            environ={"NCCL_DMABUF_ENABLE": "1", "RCCL_FORCE_ENABLE_GDRDMA": "0"})
    replayed = DoctorContext(SysRoot(str(tmp_path / "copy")))
    assert replayed.environ["RCCL_FORCE_ENABLE_GDRDMA"] == "0"
    first = replayed.nccl_decisions[0]
    assert (first.gpu_bdf, first.mechanism) == ("0000:1b:00.0", "peermem")
    assert "lacks CONFIG_PCI_P2PDMA=y" in first.mechanism_reason


def test_amd_gpus_are_not_gpus_cuda_lost(tmp_path):
    """An AMD node's runtime is ROCm: CUDA's answer is not held against its GPUs (an AMD
    node without CUDA is no node whose GPUs fell off the bus; that would drain it)."""
    tree = rocm_machines.mi300x_node(tmp_path)
    tree.write("/gdrprobe-capture/cuda.json", json.dumps(
        {"error": "no CUDA driver", "result": "CUDA_ERROR_NO_DEVICE", "call": "cuInit(0)"}))
    found = {f.id: f for f in run_doctor(str(tmp_path), environ={}).findings}
    assert "gpu.cuda" not in found and "gpu.rocm" not in found    # ROCm lists every GPU here
    assert found["topology.devices"].summary.startswith("2 GPU(s) and 2 RDMA NIC(s)")


def test_the_doctor_says_rccl_decided_and_how_to_turn_gdr_on(tmp_path):
    rocm_machines.mi300x_node(tmp_path)
    found = {f.id: f for f in run_doctor(str(tmp_path), environ={}).findings}
    gpu = found["nccl.gpu.0000:1b:00.0"]
    assert gpu.status is Status.FAIL
    assert gpu.summary.startswith("GPU0 (0000:1b:00.0): RCCL uses mlx5_0 ")
    assert "memory_peers/amdkfd/version" in gpu.fix and "NCCL_DMABUF_ENABLE=1" in gpu.fix
    assert ("RCCL of ROCm 6.3.0 (by its file name) (ROCm/rccl's GDR rules, on NCCL 2.21.5's "
            "topology)") in found["nccl.library"].summary


def test_hsa_is_asked_where_rccl_loads_it_from(tmp_path):
    """RCCL dlopens RCCL_ROCR_PATH + libhsa-runtime64.so (rocmwrap.cc); none there is an
    answer naming the path, and the DMA-BUF half is then inferred."""
    from gdrprobe.doctor.facts.rocm import collect_hsa_facts

    answer = collect_hsa_facts({"RCCL_ROCR_PATH": f"{tmp_path}/"})
    assert answer["error"].startswith(f"dlopen({tmp_path}/libhsa-runtime64.so): ")
    tree = rocm_machines.mi300x_node(tmp_path / "node")
    rocm_machines.kernel_config(tree)
    tree.write("/gdrprobe-capture/rocm.json", json.dumps({"kallsyms_symbol": False, "hsa": answer}))
    half = context(tmp_path / "node", NCCL_DMABUF_ENABLE="1").memory_paths.gpu_half("0000:1b:00.0")
    assert (half.supported, half.inferred) == (True, True)
    assert "HSA's DMA-BUF support not asked" in half.reason


def test_an_unreadable_kallsyms_is_said_as_such(tmp_path):
    tree = rocm_machines.mi300x_node(tmp_path)
    rocm_machines.rocm_facts(tree, kallsyms=None)
    receive = next(why for why in decisions(tmp_path)[0].why if why.startswith("receive:"))
    assert "/proc/kallsyms could not be read" in receive
