"""The doctor's room and NCCL's: NCCL's rules live in gdrprobe/nccl/ and take the machine's
facts as data; the doctor's facts and checks sit in rooms of their own, and the runner names
its checks as modules a search can follow."""

from __future__ import annotations

import ast
import pathlib
import types

import pytest

from gdrprobe.doctor import runner
from gdrprobe.nccl.decision import GpuFacts, NodeFacts, decide
from gdrprobe.nccl.gdr_support import Half, MemoryPaths
from gdrprobe.nccl.topo import PcieLink, Port
from gdrprobe.report import finding_ids as ids

PACKAGE = pathlib.Path(__file__).resolve().parents[3] / "gdrprobe"


def gdrprobe_names(path: pathlib.Path) -> set[str]:
    """Every gdrprobe module a file imports, or names in a string (an import by name)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and " " not in node.value:
            names.add(node.value)
    return {name for name in names if name.startswith("gdrprobe.")}


@pytest.mark.parametrize("path", sorted((PACKAGE / "nccl").glob("*.py")), ids=lambda p: p.name)
def test_nccl_imports_nothing_of_the_doctor(path):
    assert sorted(n for n in gdrprobe_names(path) if n.startswith("gdrprobe.doctor")) == []


def top_level_names(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names


def test_the_doctor_keeps_no_nccl_rule_of_its_own():
    rules = {"decide", "Machine", "PATH_RANK", "link_bandwidth_gbs", "inter_cpu_bandwidth",
             "nccl_ports", "mirror_bits", "MemoryPaths", "pcie_distance", "strtoll"}
    defined = {str(path.relative_to(PACKAGE)): sorted(top_level_names(path) & rules)
               for path in (PACKAGE / "doctor").rglob("*.py")}
    assert {path: names for path, names in defined.items() if names} == {}


class Endpoint:
    """What NCCL's rules need of a device, and nothing of the doctor's."""

    def __init__(self, name: str, bdf: str, bridges: tuple[str, ...]):
        self.name, self.bdf, self.bridges = name, bdf, bridges
        self.numa_node, self.host_bridge = 0, "pci0000:00"


def two_gpus_one_switch_nic(**gpu) -> NodeFacts:
    """GPU0 under the NIC's switch (PIX), GPU1 on another root port (PHB)."""
    gpu0 = Endpoint("GPU0", "0000:1b:00.0", ("0000:00:01.0", "0000:19:00.0"))
    gpu1 = Endpoint("GPU1", "0000:5b:00.0", ("0000:00:03.0",))
    nic = Endpoint("mlx5_0", "0000:1c:00.0", ("0000:00:01.0", "0000:19:01.0"))
    gen5 = PcieLink("32.0 GT/s PCIe", "32.0 GT/s PCIe", "16", "16")
    yes = Half(True, "yes")
    return NodeFacts(
        gpus=(gpu0, gpu1), nics=(nic,), ports={"mlx5_0": (Port(1, "4: ACTIVE", 400.0),)},
        links={d.bdf: gen5 for d in (gpu0, gpu1, nic)},
        gpu_facts={g.bdf: GpuFacts(capability=90, **gpu) for g in (gpu0, gpu1)},
        nvml_order=None, cpuinfo="",
        gdr_support=MemoryPaths(None, True, None, {}, yes, {}, yes, ("mlx5_0",), (gpu0.bdf, gpu1.bdf)))


def test_nccls_decision_takes_the_facts_as_data():
    """No sysfs, no doctor: the facts are handed in, NCCL's rules decide."""
    near, far = decide(two_gpus_one_switch_nic(), {})
    assert (near.nic, near.path_type, near.bandwidth_gbs, near.gdr_write) == ("mlx5_0", "PIX", 48.0, True)
    assert (far.path_type, far.gdr_write) == ("PHB", False)
    assert "beyond the GDR level P2C (NCCL's default)" in far.why[1]
    (refused, _) = decide(two_gpus_one_switch_nic(gdr_supported=False), {"NCCL_NET_GDR_LEVEL": "SYS"})
    assert not refused.gdr_write and "GPU_DIRECT_RDMA_SUPPORTED=0" in refused.why[1]


def test_the_runner_names_its_checks_as_modules_in_flowchart_order():
    assert all(isinstance(check, types.ModuleType) for check in runner.CHECKS)
    assert runner.GROUP_ORDER == (ids.TOPOLOGY, ids.STACK, ids.GPU, ids.MEMLOCK, ids.IOMMU, ids.ACS,
                                  ids.NCCL, ids.NIC, ids.GIN, ids.ACCESS)
    check_files = {path.stem for path in (PACKAGE / "doctor" / "checks").glob("*.py")}
    assert {check.__name__.rsplit(".", 1)[1] for check in runner.CHECKS} == check_files - {
        "__init__", "probe_needs"}
    assert "importlib" not in (PACKAGE / "doctor" / "runner.py").read_text()


@pytest.mark.parametrize("package", ["doctor", "doctor/facts", "doctor/checks", "nccl"])
def test_every_room_says_what_it_is_for(package):
    docstring = ast.get_docstring(ast.parse((PACKAGE / package / "__init__.py").read_text()))
    assert docstring and len(docstring.split()) > 20
