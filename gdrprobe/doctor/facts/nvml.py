"""GPU facts from NVML: what NCCL reads there, read the way NCCL reads it, from the driver's
own ``libnvidia-ml.so.1`` (:mod:`gdrprobe.doctor.facts.nvml_library`: NVLink ends, C2C
links, NVML's index, the compute capability; no Python package needed), and where
nvidia-ml-py (``pynvml``, the optional extra ``gdrprobe[nvml]``) is installed, what only
the doctor asks: BAR1 total and used, persistence mode, the driver version, and the common
PCI ancestor of each GPU pair (what ``nvidia-smi topo -m`` prints) as a cross-check of the
sysfs tree. This is the one module that imports ``pynvml``, and only for those.

Result (JSON-ready, stored by ``gdrprobe capture``), the GPUs in NVML's index order::

    {"library": "libnvidia-ml.so.1", "device_count": 2,
     "gpus": [{"pci_bus_id": "0000:1b:00.0", "compute_capability": [9, 0],
               "c2c_link_count": 0, "c2c_bw_mbps": 0,
               "nvlinks": [{"link": 0, "remote_type": 2, "remote_bus_id": ""}, ...],
               # with nvidia-ml-py:
               "bar1_total_bytes": ..., "bar1_used_bytes": ..., "persistence_mode": true}],
     "unread": {"0000:3d:00.0": "nvmlDeviceGetHandleByPciBusId() failed: Not Found (6)"},
     "driver_version": "570.86.15", "common_ancestor": {"0000:1b:00.0": {"0000:9b:00.0": "SYS"}}}

or ``{"error": reason}`` where NCCL's own reading would fail: no library, nvmlInit failing,
or no answer in :data:`NVML_TIMEOUT_S`. Captures of earlier releases hold
``nvlink_remote_bus_ids`` instead of ``nvlinks``; they replay as before.
"""

from __future__ import annotations

import threading
from typing import Any

from gdrprobe.doctor.facts import nvml_library
from gdrprobe.errors import extra_fix
from gdrprobe.sysroot import pci_bus_id

NVML_FIX = ("NCCL reads NVLink and C2C from the NVIDIA driver's libnvidia-ml.so.1: install the driver's "
            "user-space libraries (in a container: NVIDIA_DRIVER_CAPABILITIES with 'utility', or the "
            "driver's libraries mounted by the NVIDIA container toolkit)")
EXTRAS_FIX = f"install the optional extra for BAR1 use and persistence mode: {extra_fix('nvml')}"
# NVML's own calls answer in milliseconds; a driver that does not answer in this long is
# wedged, and the doctor goes on without its facts (the reading thread is left behind).
NVML_TIMEOUT_S = 15.0
# nvmlGpuTopologyLevel_t -> the nvidia-smi topo -m name of the common ancestor.
TOPOLOGY_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def import_nvml():
    """pynvml, or ImportError with the fix."""
    try:
        import pynvml
    except ImportError as error:
        raise ImportError(f"nvidia-ml-py is not installed ({error}); {EXTRAS_FIX}") from error
    return pynvml


def text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---- what only the doctor asks, through nvidia-ml-py -----------------------------------------


def extra_gpu_facts(nvml, handle) -> dict[str, Any]:
    bar1 = nvml.nvmlDeviceGetBAR1MemoryInfo(handle)
    return {"pci_bus_id": pci_bus_id(text(nvml.nvmlDeviceGetPciInfo(handle).busId)),
            "bar1_total_bytes": int(bar1.bar1Total), "bar1_used_bytes": int(bar1.bar1Used),
            "persistence_mode": nvml.nvmlDeviceGetPersistenceMode(handle) == nvml.NVML_FEATURE_ENABLED}


def common_ancestors(nvml, handles: list, bus_ids: list[str]) -> dict[str, dict[str, str]]:
    """Each pair's common ancestor; a pair NVML does not answer for is left out."""
    matrix: dict[str, dict[str, str]] = {}
    for i, first in enumerate(handles):
        for j in range(i + 1, len(handles)):
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(first, handles[j])
            except nvml.NVMLError:
                continue
            matrix.setdefault(bus_ids[i], {})[bus_ids[j]] = TOPOLOGY_LEVELS.get(int(level), str(level))
    return matrix


def extras_from(nvml) -> dict[str, Any]:
    """BAR1, persistence mode, the driver version and the common ancestors, by NVML index."""
    nvml.nvmlInit()
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        gpus = [extra_gpu_facts(nvml, handle) for handle in handles]
        return {"driver_version": text(nvml.nvmlSystemGetDriverVersion()), "gpus": gpus,
                "common_ancestor": common_ancestors(nvml, handles, [g["pci_bus_id"] for g in gpus])}
    finally:
        nvml.nvmlShutdown()


def with_extras(facts: dict[str, Any], nvml=None) -> dict[str, Any]:
    """NCCL's facts with nvidia-ml-py's where it is installed (``nvml`` replaces pynvml in
    tests), else with why not (``extras_error``)."""
    try:
        nvml = import_nvml() if nvml is None else nvml
        extras = extras_from(nvml)
    except ImportError as error:
        return {**facts, "extras_error": str(error)}
    except nvml.NVMLError as error:
        return {**facts, "extras_error": f"nvidia-ml-py: NVML call failed: {error}"}
    extra_gpus = extras.pop("gpus")
    gpus = [{**extra, **{k: v for k, v in ours.items() if v is not None}}
            for ours, extra in zip(facts["gpus"], extra_gpus)] + facts["gpus"][len(extra_gpus):]
    return {**facts, **extras, "gpus": gpus}


# ---- collecting, bounded in time --------------------------------------------------------------


def read_all(bus_ids: list[str], library: str, extras, answer: dict) -> None:
    """The reading thread: answer["facts"] is set on every path (answer["nvml"], once the
    library is open, says which call is in progress)."""
    try:
        answer["nvml"] = nvml = nvml_library.Nvml(library)
        answer["facts"] = with_extras(nvml_library.read_nccl_facts(nvml, bus_ids), extras)
    except OSError as error:
        answer["facts"] = {"error": f"{library} could not be loaded: {error}"}
    except nvml_library.NvmlError as error:
        answer["facts"] = {"error": f"NVML call failed: {error} (no NVIDIA driver loaded?)"}
    except Exception as error:  # noqa: BLE001 - any other failure leaves the facts unread, said
        answer["facts"] = {"error": f"reading NVML failed: {error!r}"}


def collect_nvml_facts(bus_ids: list[str], library: str = nvml_library.LIBRARY, extras=None,
                       timeout_s: float = NVML_TIMEOUT_S) -> dict[str, Any]:
    """NVML's facts for these GPUs (sysfs bus ids), or ``{"error": reason}``; ``library`` a
    path replaces the driver's in tests, ``extras`` pynvml."""
    answer: dict[str, Any] = {}
    reader = threading.Thread(target=read_all, args=(list(bus_ids), library, extras, answer),
                              name="gdrprobe-nvml", daemon=True)
    reader.start()
    reader.join(timeout_s)
    if "facts" not in answer:
        calling = getattr(answer.get("nvml"), "calling", "") or "loading the library"
        return {"error": f"NVML did not answer within {timeout_s:g} s (in {calling}): the driver is wedged"}
    return answer["facts"]


# ---- reading the facts back -----------------------------------------------------------------


def usable(facts: dict[str, Any] | None) -> bool:
    return bool(facts) and "error" not in facts


def gpu_entry(facts: dict[str, Any] | None, bdf: str) -> dict[str, Any] | None:
    if not usable(facts):
        return None
    return next((gpu for gpu in facts["gpus"] if gpu.get("pci_bus_id") == bdf), None)


def unread_reason(facts: dict[str, Any] | None, bdf: str) -> str:
    """Why NCCL's NVML facts of this GPU are unknown ("": they were read)."""
    if facts is None:
        return "no NVML facts were captured with this tree"
    if not usable(facts):
        return facts["error"]
    if bdf in facts.get("unread", {}):
        return facts["unread"][bdf]
    return "" if gpu_entry(facts, bdf) is not None else f"NVML lists no GPU at {bdf}"
