"""A stand-in for ``pynvml`` that answers from captured NVML facts (the JSON gdrprobe.doctor.facts.nvml
writes), so the collector runs on a machine without a GPU. Only the calls the collector makes."""

from __future__ import annotations

import types

NVML_SUCCESS = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 18
NVML_FI_DEV_C2C_LINK_COUNT = 170
LEVELS = {"X": 0, "PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}


class NVMLError(Exception):
    pass


def nvml_bus_id(bdf: str) -> str:
    """0000:1b:00.0 as NVML spells it: 00000000:1B:00.0."""
    domain, rest = bdf.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


class FakeNvml:
    NVMLError = NVMLError
    NVML_SUCCESS = NVML_SUCCESS
    NVML_FEATURE_ENABLED = NVML_FEATURE_ENABLED
    NVML_NVLINK_MAX_LINKS = NVML_NVLINK_MAX_LINKS
    NVML_FI_DEV_C2C_LINK_COUNT = NVML_FI_DEV_C2C_LINK_COUNT

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

    def nvmlDeviceGetNvLinkState(self, gpu, link):
        if link >= len(gpu["nvlink_remote_bus_ids"]):
            raise NVMLError("Not Supported")
        return NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, gpu, link):
        return types.SimpleNamespace(busId=nvml_bus_id(gpu["nvlink_remote_bus_ids"][link]))

    def nvmlDeviceGetFieldValues(self, gpu, fields):
        assert fields == [NVML_FI_DEV_C2C_LINK_COUNT]
        value = types.SimpleNamespace(uiVal=gpu["c2c_link_count"])
        return [types.SimpleNamespace(nvmlReturn=NVML_SUCCESS, value=value)]

    def nvmlDeviceGetTopologyCommonAncestor(self, first, second):
        return LEVELS[self.facts["common_ancestor"][first["pci_bus_id"]][second["pci_bus_id"]]]
