"""The job's GPUs: which GPUs of the node a node check measures, and which of them the job
owns, from what the launcher or the scheduler says.

A node check runs for a job (a Slurm prolog, a Kubernetes init container): on a node that
jobs share, the GPUs that are not the job's belong to other jobs, and measuring them, or
meeting their owners' processes, says nothing about this job's. The job's GPUs come from
the first of these that is set (:data:`SOURCES`):

- ``--gpu`` (``gpus=`` in Python): CUDA ordinals as this process numbers them, PCI bus ids
  (``0000:3b:00.0`` or ``3b:00.0``), GPU UUIDs (``GPU-8932f937-...``, or a prefix that
  names one GPU, as CUDA accepts), MIG devices (``MIG-GPU-<uuid>/<gi>/<ci>``).
- ``SLURM_STEP_GPUS``, then ``SLURM_JOB_GPUS``: Slurm's index of each GPU of the step or
  the job on this node. slurmd writes the ``index`` of the node's GPU devices (their place
  in slurmd's list: gres.conf's ``File=`` order, or NVML's with ``AutoDetect=nvml``, which
  Slurm keeps in PCI bus order because "GPUs ... want it to match the order they enumerate
  on the PCI bus"), never a CUDA ordinal (SchedMD/slurm slurm-25-11-7-1,
  ``src/plugins/gres/common/gres_common.c``: ``gres_common_prep_set_env`` for the prolog's
  SLURM_JOB_GPUS, ``common_gres_set_env`` with ``use_dev_num`` false for GPUs for
  SLURM_STEP_GPUS; the same in 22.05). An index is taken as the node's NVIDIA GPU of that
  rank in PCI bus order.
- ``NVIDIA_VISIBLE_DEVICES``: what the NVIDIA container runtime was asked to expose (the
  Kubernetes device plugin sets it): "a comma-separated list of GPU UUID(s) or index(es)",
  ``all``, ``none`` (no GPU), ``void`` (neither GPUs nor driver) (NVIDIA Container Toolkit,
  "Specialized Configurations with Docker", GPU Enumeration); an index is nvidia-smi's (PCI
  bus order), ``N:M`` is MIG device M of GPU N; with the device plugin's
  ``volume-mounts`` strategy the variable holds ``/var/run/nvidia-container-devices`` and
  each device is a file of that name under it (NVIDIA/k8s-device-plugin v0.20.0
  ``internal/plugin/server.go``, ``updateResponseForDeviceMounts``). Empty is not a list:
  the next source decides.
- ``CUDA_VISIBLE_DEVICES``: as CUDA reads it (:func:`gdrprobe.campaign.gpus.visible_entries`).
  Where the CUDA driver answered it has applied it already, so the job's GPUs are the
  GPUs CUDA lists; without a driver, indices are taken in PCI bus order and UUIDs through
  the NVIDIA driver's ``/proc/driver/nvidia/gpus/BUS/information``.

With none of them set the job's GPUs are every GPU of the node, and the report says so. A
value that is not a list of GPUs in its variable's own syntax is a usage error (exit 2)
before anything is measured; a well-formed name no GPU of this node answers to is that
GPU's answer, "not testable" (exit 9), except for ``--gpu`` (a person's typing: exit 2).

Pure but for the volume-mounts listing: the facts come in as data.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable
from collections.abc import Mapping

from gdrprobe.campaign.gpus import GpuFacts, visible_entries
from gdrprobe.errors import UsageError, cut, quoted
from gdrprobe.numbers import decimal, is_decimal
from gdrprobe.sysroot import SysRoot, is_pci_bus_id, pci_bus_id

GIVEN = "--gpu"
SOURCES = (GIVEN, "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "NVIDIA_VISIBLE_DEVICES",
           "CUDA_VISIBLE_DEVICES")
SLURM_SOURCES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")

INDEX, ORDINAL, UUID, MIG_PARENT, MIG, BUS, ALL = ("index", "ordinal", "uuid", "mig-parent",
                                                   "mig", "bus", "all")
_UUID = re.compile(r"GPU-[0-9a-fA-F][0-9a-fA-F-]*")
# MIG-GPU-<GPU UUID>/<GPU instance>/<compute instance> (drivers before R470) names its GPU;
# MIG-<UUID> (R470 on) does not.
_MIG_WITH_PARENT = re.compile(r"MIG-(GPU-[0-9a-fA-F-]+)/[0-9]+/[0-9]+")
_MIG = re.compile(r"MIG-[0-9a-fA-F][0-9a-fA-F-]*")
_MIG_INDEX = re.compile(r"([0-9]+):[0-9]+")
VOLUME_MOUNTS = "/var/run/nvidia-container-devices"   # the device plugin's mount root


@dataclasses.dataclass(frozen=True)
class GpuName:
    """One entry naming a GPU, and how it names it."""

    kind: str     # index (the node's, PCI bus order) | ordinal (CUDA's) | uuid | mig | bus | all
    text: str


@dataclasses.dataclass(frozen=True)
class JobGpus:
    """The job's GPUs as a source names them (not yet matched to this node's GPUs)."""

    source: str                    # --gpu, SLURM_JOB_GPUS, ...
    value: str                     # the text as given
    names: tuple[GpuName, ...]     # empty: the job has no GPU

    @property
    def described(self) -> str:
        return f"{self.source}={cut(self.value)}"

    def matched(self, facts: GpuFacts) -> JobGpuSet:
        return match(self, facts)


@dataclasses.dataclass(frozen=True)
class JobGpuSet:
    """The job's GPUs matched to this node's: bus ids, and the names no GPU answers to."""

    job: JobGpus | None            # None: nothing named them; every GPU of the node
    bus_ids: tuple[str, ...]
    unmatched: tuple[tuple[str, str], ...] = ()   # (the name, why no GPU here is it)

    @property
    def described(self) -> str:
        if self.job is None:
            return ("every GPU of the node: no job's GPUs were named (--gpu, "
                    + ", ".join(SOURCES[1:]) + " unset)")
        if not self.job.names:
            return f"{self.job.described}: the job has no GPU on this node"
        return f"{self.job.described}: " + (", ".join(self.bus_ids) or "none found here")


# ---- what each source says ---------------------------------------------------------------


def job_gpus(environ: Mapping[str, str], given: str | None = None,
             listdir: Callable[[str], list[str]] | None = None) -> JobGpus | None:
    """The job's GPUs from the first source that names them (None: none does); a value that
    is not a GPU list in its source's syntax is a UsageError naming the source and the fix."""
    if given is not None:
        return JobGpus(GIVEN, given, given_names(given))
    for source in SOURCES[1:]:
        value = environ.get(source)
        if value is None or (source == "NVIDIA_VISIBLE_DEVICES" and not value.strip()):
            continue
        if source in SLURM_SOURCES:
            return JobGpus(source, value, slurm_names(source, value))
        if source == "NVIDIA_VISIBLE_DEVICES":
            return JobGpus(source, value, container_names(value, listdir))
        return JobGpus(source, value, cuda_names(environ))
    return None


def _entries(value: str) -> list[str]:
    return [entry.strip() for entry in value.split(",")] if value.strip() else []


def _refuse(source: str, value: str, entry: str, expected: str) -> UsageError:
    return UsageError(f"{source}={quoted(value)}: {quoted(entry)} names no GPU ({expected})",
                      f"fix or unset {source}" if source != GIVEN else
                      "e.g. --gpu 0,1, --gpu 0000:3b:00.0 or --gpu GPU-8932f937")


def given_names(value: str) -> tuple[GpuName, ...]:
    names = []
    for entry in _entries(value) or [value]:
        name = (GpuName(ORDINAL, entry) if is_decimal(entry) else uuid_or_bus(entry))
        if name is None:
            raise _refuse(GIVEN, value, entry, "a CUDA ordinal, a PCI bus id, a GPU or MIG "
                                               "UUID, comma-separated")
        names.append(name)
    return tuple(names)


def uuid_or_bus(entry: str) -> GpuName | None:
    if _MIG_WITH_PARENT.fullmatch(entry):
        return GpuName(MIG_PARENT, entry)
    if _MIG.fullmatch(entry):
        return GpuName(MIG, entry)
    if _UUID.fullmatch(entry):
        return GpuName(UUID, entry)
    bus_id = as_bus_id(entry)
    return GpuName(BUS, bus_id) if bus_id else None


def as_bus_id(entry: str) -> str | None:
    """A PCI bus id, with or without its domain, as sysfs spells it; None: not one."""
    bus_id = pci_bus_id(entry if entry.count(":") == 2 else "0000:" + entry)
    return bus_id if is_pci_bus_id(bus_id) else None


def slurm_names(source: str, value: str) -> tuple[GpuName, ...]:
    names = []
    for entry in _entries(value):
        if not is_decimal(entry):
            raise _refuse(source, value, entry, "Slurm writes the index of each GPU: 0,1,...")
        names.append(GpuName(INDEX, entry))
    return tuple(names)


def container_names(value: str, listdir: Callable[[str], list[str]] | None) -> tuple[GpuName, ...]:
    source = "NVIDIA_VISIBLE_DEVICES"
    text = value.strip()
    if text.lower() in ("none", "void"):
        return ()
    if text.lower() == "all":
        return (GpuName(ALL, text),)
    entries = _entries(text)
    if text.startswith("/"):     # the device plugin's volume-mounts: one file per device
        entries = [entry for entry in (listdir or SysRoot().listdir)(text) if entry != "imex"]
    names = []
    for entry in entries:
        mig_index = _MIG_INDEX.fullmatch(entry)
        name = (GpuName(INDEX, entry) if is_decimal(entry) else
                GpuName(INDEX, mig_index.group(1)) if mig_index else uuid_or_bus(entry))
        if name is None or name.kind == BUS:
            raise _refuse(source, value, entry, "GPU UUIDs or nvidia-smi indices, all, none "
                                                "or void")
        names.append(name)
    return tuple(names)


def cuda_names(environ: Mapping[str, str]) -> tuple[GpuName, ...]:
    """CUDA_VISIBLE_DEVICES's entries up to the first CUDA ignores the rest from."""
    return tuple(GpuName(ORDINAL, entry) if is_decimal(entry) else
                 (uuid_or_bus(entry) or GpuName(UUID, entry))
                 for entry in visible_entries(environ) or ())


# ---- matched to this node's GPUs ---------------------------------------------------------


def match(job: JobGpus | None, facts: GpuFacts) -> JobGpuSet:
    """The job's GPUs among this node's (bus ids, in the order named, each once)."""
    if job is None or any(name.kind == ALL for name in job.names):
        return JobGpuSet(job, node_gpus(facts))
    if job.source == "CUDA_VISIBLE_DEVICES" and facts.runtime_bus_ids is not None:
        return JobGpuSet(job, facts.runtime_bus_ids)     # the driver applied it already
    found: list[str] = []
    unmatched = []
    for name in job.names:
        bus_id, why = resolve(name, job.source, facts)
        if bus_id is None:
            unmatched.append((cut(name.text), why))
        elif bus_id not in found:
            found.append(bus_id)
    if job.source == GIVEN and unmatched:
        text, why = unmatched[0]
        raise UsageError(f"--gpu {quoted(job.value)}: {quoted(text)}: {why}",
                         "name GPUs this node has: 'nvidia-smi -L' lists their UUIDs, "
                         "'nvidia-smi --query-gpu=pci.bus_id --format=csv' their bus ids")
    return JobGpuSet(job, tuple(found), tuple(unmatched))


def node_gpus(facts: GpuFacts) -> tuple[str, ...]:
    return facts.runtime_bus_ids if facts.runtime_bus_ids else facts.sysfs_bus_ids


def resolve(name: GpuName, source: str, facts: GpuFacts) -> tuple[str | None, str]:
    """(the bus id of the GPU a name means, or None and why not)."""
    if name.kind == INDEX or (name.kind == ORDINAL and facts.runtime_bus_ids is None):
        return by_index(decimal(name.text), facts.sysfs_bus_ids, source)
    if name.kind == ORDINAL:
        ordinal, cuda = decimal(name.text), facts.runtime_bus_ids
        if ordinal < len(cuda):
            return cuda[ordinal], ""
        return None, f"CUDA sees {len(cuda)} GPU(s) in this process, none with ordinal {ordinal}"
    if name.kind == BUS:
        if name.text in (*facts.sysfs_bus_ids, *(facts.runtime_bus_ids or ())):
            return name.text, ""
        return None, f"no NVIDIA GPU at {cut(name.text)} on this node"
    if name.kind == MIG:
        return None, ("a MIG device named by its own UUID: its GPU is not known here (name "
                      "the GPU by bus id or UUID with --gpu)")
    uuid = _MIG_WITH_PARENT.fullmatch(name.text).group(1) if name.kind == MIG_PARENT else name.text
    return by_uuid(uuid, facts)


def by_index(index: int, sysfs_bus_ids: tuple[str, ...], source: str) -> tuple[str | None, str]:
    if index < len(sysfs_bus_ids):
        return sysfs_bus_ids[index], ""
    why = f"the node has {len(sysfs_bus_ids)} NVIDIA GPU(s) in sysfs, none of index {index}"
    if source in SLURM_SOURCES:
        why += (" (Slurm counts MIG devices one by one, and a GPU gone from the PCI bus "
                "leaves Slurm's count above sysfs's)")
    return None, why


def by_uuid(uuid: str, facts: GpuFacts) -> tuple[str | None, str]:
    """A GPU UUID, or a prefix that names one GPU (as CUDA takes CUDA_VISIBLE_DEVICES)."""
    known = [bus for full, bus in facts.uuids.items() if full.lower().startswith(uuid.lower())]
    if len(known) == 1:
        return known[0], ""
    if known:
        return None, f"{cut(uuid)} is the prefix of {len(known)} GPUs' UUIDs"
    return None, (f"no GPU with UUID {cut(uuid)} ({len(facts.uuids)} known from the NVIDIA driver's "
                  "/proc/driver/nvidia/gpus)")


def uuid_of(information: str) -> str | None:
    """The GPU UUID in /proc/driver/nvidia/gpus/BUS/information, whose "GPU UUID:" line the
    NVIDIA kernel module writes (open-gpu-kernel-modules kernel-open/nvidia/nv-procfs.c,
    nv_procfs_read_gpu_info)."""
    for line in information.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "GPU UUID" and value.strip():
            return value.strip()
    return None


def gpu_uuids(root: SysRoot, bus_ids) -> dict[str, str]:
    """UUID -> bus id of every NVIDIA GPU whose driver states its UUID."""
    found = {}
    for bus_id in bus_ids:
        uuid = uuid_of(root.read(f"/proc/driver/nvidia/gpus/{bus_id}/information") or "")
        if uuid:
            found[uuid] = bus_id
    return found
