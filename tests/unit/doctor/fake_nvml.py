"""A stand-in for ``pynvml`` (nvidia-ml-py) answering what only the doctor asks it (BAR1 use,
persistence mode, the driver version, the common PCI ancestor of each GPU pair: the extras
of gdrprobe.doctor.facts.nvml) from a dict in the capture's shape. What NCCL reads of NVML
comes from the stand-in libnvidia-ml.so.1 (tests/nvml_standin) instead."""

from __future__ import annotations

import types

NVML_FEATURE_ENABLED = 1
LEVELS = {"X": 0, "PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


class NVMLError(Exception):
    pass


def nvml_bus_id(bdf: str) -> str:
    """0000:1b:00.0 as NVML spells it: 00000000:1B:00.0."""
    domain, rest = bdf.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


class FakeNvml:
    NVMLError = NVMLError
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED

    def __init__(self, facts: dict):
        self.facts = facts
        self.initialised = 0

    def nvmlInit(self):
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        return self.facts["driver_version"]

    def nvmlDeviceGetCount(self):
        return len(self.facts["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index):
        return self.facts["gpus"][index]

    def nvmlDeviceGetPciInfo(self, gpu):
        return types.SimpleNamespace(busId=nvml_bus_id(gpu["pci_bus_id"]).encode())

    def nvmlDeviceGetBAR1MemoryInfo(self, gpu):
        return types.SimpleNamespace(bar1Total=gpu["bar1_total_bytes"], bar1Used=gpu["bar1_used_bytes"],
                                     bar1Free=gpu["bar1_total_bytes"] - gpu["bar1_used_bytes"])

    def nvmlDeviceGetPersistenceMode(self, gpu):
        return NVML_FEATURE_ENABLED if gpu["persistence_mode"] else 0

    def nvmlDeviceGetTopologyCommonAncestor(self, first, second):
        level = self.facts["common_ancestor"].get(first["pci_bus_id"], {}).get(second["pci_bus_id"])
        if level is None:
            raise NVMLError("Not Supported")
        return LEVELS[level]
