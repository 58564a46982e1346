"""Facts that several layers need have one definition each, in the lowest pure module every
user can import: what the probe pins (gdrprobe.defaults), how a PCI bus id is spelled
(gdrprobe.sysroot), the IPv4 RoCE v2 GID of a port and a port's line rate
(gdrprobe.rdma.verbs). Where a twin could only be seen by reading the source, the test greps."""

from __future__ import annotations

import ast
import pathlib
import re
import types

from gdrprobe import defaults
from gdrprobe.doctor.checks import probe_needs
from gdrprobe.doctor.facts import pci
from gdrprobe.rdma import verbs
from gdrprobe.sysroot import SysRoot, is_pci_bus_id, pci_bus_id

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "gdrprobe"
RAW_STRING = re.compile(r"""\b[rR]("|')(.*?)\1""")


def sources() -> dict[str, str]:
    return {str(path.relative_to(PACKAGE)): path.read_text() for path in PACKAGE.rglob("*.py")}


def raw_strings_with(fragment: str) -> list[str]:
    """The files with a raw string (a regular expression) that contains ``fragment``."""
    return sorted(name for name, text in sources().items()
                  if any(fragment in match.group(2) for match in RAW_STRING.finditer(text)))


def files_mentioning(word: str) -> list[str]:
    return sorted(name for name, text in sources().items() if re.search(rf"\b{word}\b", text))


# ---- what the probe pins ------------------------------------------------------------------


def numbers_assigned(path: pathlib.Path, names: set[str]) -> set[str]:
    """Names of ``names`` a module sets to a number it computes itself (not another's name)."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and not isinstance(node.value, (ast.Attribute, ast.Name)):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name) and t.id in names)
    return found


def test_the_integrity_caps_are_set_in_defaults_only():
    caps = {"INTEGRITY_CAP_BYTES", "MAX_SLOTS", "PAGE"}
    setting = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
               if numbers_assigned(path, caps)}
    assert setting == {"defaults.py"}


def test_the_doctor_compares_with_what_a_sweep_really_pins():
    from gdrprobe.measure.options import ProbeOptions

    sweep = ProbeOptions(sizes=defaults.SWEEP_SIZES)
    assert probe_needs.PROBE_ARM_PINNED_BYTES == 2 * sweep.buffer_bytes == 32 << 20
    assert probe_needs.PROBE_MEMLOCK_BYTES == 2 * probe_needs.PROBE_ARM_PINNED_BYTES + (4 << 20)


def test_the_doctor_and_the_check_agree_on_the_least_memlock_the_check_needs():
    """What the doctor calls enough for gdrprobe check is what the check pins with one
    integrity slot at its message size, both ends in loopback (campaign/memlock.py)."""
    from gdrprobe.campaign.memlock import fewest_slots, pinned_bytes
    from gdrprobe.measure.options import ProbeOptions

    check = fewest_slots(ProbeOptions(sizes=(defaults.A_B_SIZE,)))
    assert probe_needs.CHECK_MEMLOCK_BYTES == pinned_bytes(check, ends=2) == 8 << 20


# ---- a PCI bus id ---------------------------------------------------------------------------


def test_one_spelling_of_a_bus_id():
    assert pci_bus_id("00000000:3B:00.0") == pci_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert pci_bus_id("GPU-UUID") == "gpu-uuid"
    assert is_pci_bus_id("0000:3b:00.0") and not is_pci_bus_id("00000000:3B:00.0")
    assert raw_strings_with("[0-7]") == ["sysroot.py"]


# ---- the IPv4 RoCE v2 GID of a port --------------------------------------------------------

V4 = "0000:0000:0000:0000:0000:ffff:0a4d:0001"
V6 = "fe80:0000:0000:0000:5054:00ff:fe00:0001"


def test_the_ipv4_roce_v2_gid_is_found_in_one_place():
    gids = [(0, V6, "RoCE v1"), (1, V6, "RoCE v2"), (2, V4, "RoCE v1"), (3, V4, "RoCE v2")]
    assert verbs.ipv4_roce_v2_gid(gids) == (3, V4)
    assert verbs.ipv4_roce_v2_gid(gids[:3]) is None
    assert files_mentioning("ipv4_mapped") == ["rdma/verbs.py"]
    assert set(files_mentioning("ipv4_roce_v2_gid")) == {"rdma/verbs.py", "campaign/cluster.py"}


# ---- a port's line rate ---------------------------------------------------------------------


def test_the_doctor_reads_the_same_line_rate_verbs_computes(tmp_path):
    ports = tmp_path / "sys/class/infiniband/mlx5_0/ports/1"
    ports.mkdir(parents=True)
    (ports / "rate").write_text("100 Gb/sec (4X EDR)\n")
    (ports / "state").write_text("4: ACTIVE\n")
    (port,) = pci.rdma_ports(SysRoot(str(tmp_path)), "mlx5_0")
    edr_4x = types.SimpleNamespace(active_speed=32, active_width=2)   # EDR lanes, 4X
    assert port.rate_gbps == verbs.port_rate_gbps(edr_4x) == 100.0
    assert raw_strings_with("Gb/sec") == ["rdma/verbs.py"]
    assert set(files_mentioning("SPEED_GBPS")) <= {"rdma/verbs.py", "rdma/devices.py"}
