"""GPU facts from NVML through nvidia-ml-py (``pynvml``), the library NVIDIA keeps for it.

This is the one module that imports ``pynvml``, and only when live facts are asked for
(the optional extra ``gdrprobe[nvml]``). What NCCL itself takes from NVML is what the
doctor needs beyond sysfs: NVLink state and the PCI bus id at each link's far end (NCCL
2.30.7 ``src/graph/xml.cc`` ncclTopoGetXmlFromGpu; that is how PXN peers are found), the
C2C link count (``src/graph/topo.cc`` ncclTopoAddC2c, NVML_FI_DEV_C2C_LINK_COUNT: Grace),
plus BAR1 total and used, persistence mode, the driver version and the common PCI ancestor
of each GPU pair (what ``nvidia-smi topo -m`` prints) as a cross-check of the sysfs tree.

Result (JSON-ready, stored by ``gdrprobe capture``)::

    {"driver_version": "570.86.15",
     "gpus": [{"pci_bus_id": "0000:1b:00.0", "bar1_total_bytes": ..., "bar1_used_bytes": ...,
               "persistence_mode": true, "c2c_link_count": 0,
               "nvlink_remote_bus_ids": ["0000:05:00.0", ...]}],
     "common_ancestor": {"0000:1b:00.0": {"0000:9b:00.0": "SYS"}}}

or ``{"error": reason}`` when nvidia-ml-py or the NVIDIA driver is missing.
"""

from __future__ import annotations

from typing import Any

from gdrprobe.errors import extra_fix
from gdrprobe.sysroot import pci_bus_id

NVML_FIX = f"install the optional extra: {extra_fix('nvml')}"
# nvmlGpuTopologyLevel_t -> the nvidia-smi topo -m name of the common ancestor.
TOPOLOGY_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVML_NVLINK_MAX_LINKS = 18
NVML_FI_DEV_C2C_LINK_COUNT = 170      # nvml.h; NCCL reads the same field


def import_nvml():
    """pynvml, or ImportError with the fix."""
    try:
        import pynvml
    except ImportError as error:
        raise ImportError(f"nvidia-ml-py is not installed ({error}); {NVML_FIX}") from error
    return pynvml


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvlink_remotes(nvml, handle) -> list[str]:
    """Bus ids at the far end of every active NVLink (GPUs or NVSwitches)."""
    remotes = []
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", NVML_NVLINK_MAX_LINKS)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            remotes.append(pci_bus_id(text(remote.busId)))
        except nvml.NVMLError:
            continue        # no such link on this GPU, or NVLink not supported at all
    return remotes


def c2c_link_count(nvml, handle) -> int:
    field = getattr(nvml, "NVML_FI_DEV_C2C_LINK_COUNT", NVML_FI_DEV_C2C_LINK_COUNT)
    try:
        (value,) = nvml.nvmlDeviceGetFieldValues(handle, [field])
    except nvml.NVMLError:
        return 0
    return int(value.value.uiVal) if value.nvmlReturn == nvml.NVML_SUCCESS else 0


def gpu_facts(nvml, handle) -> dict[str, Any]:
    bar1 = nvml.nvmlDeviceGetBAR1MemoryInfo(handle)
    return {"pci_bus_id": pci_bus_id(text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
            "bar1_total_bytes": int(bar1.bar1Total), "bar1_used_bytes": int(bar1.bar1Used),
            "persistence_mode": nvml.nvmlDeviceGetPersistenceMode(handle) == nvml.NVML_FEATURE_ENABLED,
            "c2c_link_count": c2c_link_count(nvml, handle),
            "nvlink_remote_bus_ids": nvlink_remotes(nvml, handle)}


def common_ancestors(nvml, handles: list, bus_ids: list[str]) -> dict[str, dict[str, str]]:
    matrix: dict[str, dict[str, str]] = {}
    for i, first in enumerate(handles):
        for j in range(i + 1, len(handles)):
            level = nvml.nvmlDeviceGetTopologyCommonAncestor(first, handles[j])
            matrix.setdefault(bus_ids[i], {})[bus_ids[j]] = TOPOLOGY_LEVELS.get(int(level), str(level))
    return matrix


def facts_from(nvml) -> dict[str, Any]:
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        gpus = [gpu_facts(nvml, handle) for handle in handles]
        return {"driver_version": text(nvml.nvmlSystemGetDriverVersion()), "gpus": gpus,
                "common_ancestor": common_ancestors(nvml, handles, [g["pci_bus_id"] for g in gpus])}
    finally:
        nvml.nvmlShutdown()


def collect_nvml_facts(nvml=None) -> dict[str, Any]:
    """NVML's facts, or ``{"error": reason}``; ``nvml`` replaces pynvml in tests."""
    try:
        nvml = import_nvml() if nvml is None else nvml
    except ImportError as error:
        return {"error": str(error)}
    try:
        return facts_from(nvml)
    except nvml.NVMLError as error:
        return {"error": f"NVML call failed: {error} (no NVIDIA driver loaded?)"}


def usable(facts: dict[str, Any] | None) -> bool:
    return bool(facts) and "error" not in facts


def gpu_entry(facts: dict[str, Any] | None, bdf: str) -> dict[str, Any] | None:
    if not usable(facts):
        return None
    return next((gpu for gpu in facts["gpus"] if gpu["pci_bus_id"] == bdf), None)
