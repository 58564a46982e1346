"""The GPUs this process can know: CUDA's list (the driver has applied
``CUDA_VISIBLE_DEVICES``), sysfs's in PCI bus order, the NVIDIA driver's UUIDs, and
``CUDA_VISIBLE_DEVICES`` as CUDA reads it. What the rank's pair (:mod:`gdrprobe.campaign.gate`)
and the job's GPUs (:mod:`gdrprobe.campaign.job_gpus`) are matched against, and the one
place the campaigns read a visible-devices variable (CUDA's; each runtime's record names its
own: ``GpuRuntime.visible_devices``). Pure data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from gdrprobe.numbers import decimal


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """What this process can know about its GPUs."""

    runtime_bus_ids: tuple[str, ...] | None  # the GPU runtime's visible GPUs by ordinal; None: none
    sysfs_bus_ids: tuple[str, ...]         # the runtime's GPUs in sysfs, in PCI bus order
    runtime_error: str = ""                # why there is no runtime list
    # GPU UUID -> bus id, as the NVIDIA driver states them (campaign.job_gpus.gpu_uuids)
    uuids: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_doctor(cls, runtime_facts: Mapping | None, sysfs_bus_ids,
                    uuids: Mapping[str, str] | None = None) -> GpuFacts:
        """From the doctor's facts of the GPU runtime (an inventory, ``{"gpus": [...]}``, as
        :func:`gdrprobe.doctor.facts.cuda.gpu_inventory` gives, or ``{"error": ...}``), its
        topology's GPUs and the GPUs' UUIDs."""
        facts = runtime_facts or {"error": "no GPU runtime facts"}
        known = dict(uuids or {})
        if "gpus" not in facts:
            return cls(None, tuple(sysfs_bus_ids), str(facts.get("error", "")), known)
        return cls(tuple(gpu["pci_bus_id"] for gpu in facts["gpus"]), tuple(sysfs_bus_ids),
                   uuids=known)

    def bus_id(self, gpu: str) -> str:
        """A CUDA ordinal as the bus id CUDA gives it (bus ids do not move); else as given."""
        cuda, ordinal = self.runtime_bus_ids, decimal(gpu)
        if ordinal is not None and cuda is not None and ordinal < len(cuda):
            return cuda[ordinal]
        return gpu


def visible_entries(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: entries up to the first empty or negative one
    (CUDA hides everything from an invalid entry on); None when unset."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    entries = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry or entry.startswith("-"):
            break
        entries.append(entry)
    return tuple(entries)
