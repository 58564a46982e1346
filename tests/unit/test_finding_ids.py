"""A doctor finding's id is named once (gdrprobe.report.finding_ids): the check that produces
the finding and the verdict that reads it use the same constant, and no module spells an id
out on its own, where a rename on one side would leave the other matching nothing."""

from __future__ import annotations

import ast
import pathlib

from gdrprobe.campaign import verdict
from gdrprobe.doctor.runner import run_doctor
from gdrprobe.report import finding_ids as ids
from tests.unit.doctor import machines

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gdrprobe"
NAMED_IDS = {value for name, value in vars(ids).items()
             if name.isupper() and isinstance(value, str) and "." in value}


def strings_of(path: pathlib.Path) -> set[str]:
    return {node.value for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_no_module_spells_out_a_finding_id():
    spelled = {str(path.relative_to(PACKAGE)): sorted(strings_of(path) & NAMED_IDS)
               for path in PACKAGE.rglob("*.py") if path.name != "finding_ids.py"}
    assert {path: found for path, found in spelled.items() if found} == {}


def test_the_verdict_reads_the_constants_the_doctor_writes(tmp_path):
    machines.acs_node(tmp_path, pairs=1)
    findings = run_doctor(str(tmp_path), environ={}).findings
    acs = next(f for f in findings if f.id == ids.ACS_BRIDGE)
    distance = next(f for f in findings if f.id == ids.TOPOLOGY_DISTANCE)
    # The producer's id is the constant object itself, not an equal string spelled twice.
    assert acs.id is ids.ACS_BRIDGE and distance.id is ids.TOPOLOGY_DISTANCE
    assert verdict.SCATTER_TO_CQE is ids.NIC_MLX5_SCATTER_TO_CQE
    spoken = {f.id for f in findings if verdict.speaks_to_verdict(f.id)}
    assert {ids.ACS_BRIDGE, ids.TOPOLOGY_DISTANCE, ids.IOMMU_DOMAIN} <= spoken
    causes, _, fixes = verdict.doctor_causes(findings)
    assert any(cause.startswith("ACS:") and "confirmed by doctor" in cause for cause in causes)
    assert any("setpci" in fix for fix in fixes)


def test_per_device_ids_are_made_and_recognised_by_one_module():
    bar1 = ids.gpu_bar1("0000:3b:00.0")
    assert bar1 == "gpu.0000:3b:00.0.bar1" and ids.is_gpu_bar1(bar1) and verdict.speaks_to_verdict(bar1)
    assert not ids.is_gpu_bar1(ids.gpu_rdma("0000:3b:00.0"))
    assert ids.nccl_variable("NCCL_IB_HCA") == "nccl.ib_hca"
    assert ids.nic_port("mlx5_0", "1", "state") == "nic.mlx5_0.port1.state"
    assert ids.in_group(ids.IOMMU_CMDLINE, ids.IOMMU) and not ids.in_group("iommu_x.y", ids.IOMMU)
