"""Per-GPU findings from the CUDA driver's facts (collected once, in
:mod:`gdrprobe.doctor.facts.context`), NVML's facts (:mod:`gdrprobe.doctor.facts.nvml`), and
the BAR1 aperture the NIC reads GPU memory through (NVML's total and used, else the size
sysfs shows).

Also whether CUDA lists the GPUs the PCI bus has (:func:`cuda_gpu_fault`): the GPUs sysfs
lists that CUDA should see are compared with CUDA's answer by the rules of
:mod:`gdrprobe.memory.cuda_results`; a GPU lost to CUDA fails ``gpu.cuda`` and the gate
drains on it (exit 11).
"""

from __future__ import annotations

import functools
from typing import Any

from gdrprobe.doctor.checks.probe_needs import MiB, PROBE_ARM_PINNED_BYTES, format_mib
from gdrprobe.doctor.facts import nvml, pci
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.errors import GpuUnusable
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status
from gdrprobe.sysroot import pci_bus_id

GROUP = ids.GPU
finding = functools.partial(Finding, group=GROUP)

# A BAR1 this small means the firmware did not resize the BAR: the probe fits, real
# workloads (NCCL registers far more) will fail to register GPU memory.
SMALL_BAR1_BYTES = 256 * MiB

FLUSH_OPTION_NAMES = {1: "host", 2: "memops"}
WRITES_ORDERING_NAMES = {0: "none", 100: "owner", 200: "all devices"}


# ---- BAR1 -------------------------------------------------------------------


def resource_path(bdf: str) -> str:
    return f"{pci.device_dir(bdf)}/resource"


def bar1_bytes(resource_text: str) -> int | None:
    """BAR1 size from a sysfs ``resource`` file (line 1: start, end, flags in hex)."""
    lines = resource_text.splitlines()
    if len(lines) < 2:
        return None
    start, end, _flags = (int(field, 16) for field in lines[1].split())
    return end - start + 1 if end > start else None


def bar1_reading(ctx: DoctorContext, bdf: str) -> tuple[int | None, int | None, Evidence]:
    """(BAR1 size, bytes in use or None, evidence): NVML when it answered, else sysfs."""
    entry = nvml.gpu_entry(ctx.nvml_facts, bdf)
    if entry is not None:
        total, used = entry["bar1_total_bytes"], entry["bar1_used_bytes"]
        return total, used, Evidence("nvmlDeviceGetBAR1MemoryInfo",
                                     f"total {format_mib(total)}, used {format_mib(used)}")
    path = resource_path(bdf)
    text = ctx.root.read(path)
    size = bar1_bytes(text) if text else None
    if size is None:
        return None, None, Evidence(path, "permission denied" if ctx.root.is_denied(path) else str(text))
    return size, None, Evidence(path + " (line 1)", text.splitlines()[1] + " (NVML unavailable: size only)")


def bar1_finding(ctx: DoctorContext, bdf: str) -> Finding:
    size, used, evidence = bar1_reading(ctx, bdf)
    finding_id = ids.gpu_bar1(bdf)
    if size is None:
        return finding(id=finding_id, status=Status.SKIP, summary=f"BAR1 size of {bdf} could not be read",
                       evidence=(evidence,))
    resize_fix = ("Enable \"Above 4G Decoding\" and \"Resizable BAR\" in the BIOS, then power-cycle; "
                  "some servers also need a VBIOS update.")
    in_use = "" if used is None else f" ({format_mib(used)} in use)"
    if size < PROBE_ARM_PINNED_BYTES:
        return finding(id=finding_id, status=Status.FAIL,
                       summary=f"BAR1 of {bdf} is {format_mib(size)}, smaller than the "
                               f"{format_mib(PROBE_ARM_PINNED_BYTES)} the probe pins per arm",
                       evidence=(evidence,), fix=resize_fix)
    if used is not None and size - used < PROBE_ARM_PINNED_BYTES:
        return finding(id=finding_id, status=Status.WARN,
                       summary=f"BAR1 of {bdf} is {format_mib(size)}{in_use}: less than the "
                               f"{format_mib(PROBE_ARM_PINNED_BYTES)} the probe pins is free",
                       evidence=(evidence,), fix="Stop the processes that hold GPU memory registered with a NIC.")
    if size <= SMALL_BAR1_BYTES:
        return finding(id=finding_id, status=Status.WARN,
                       summary=f"BAR1 of {bdf} is only {format_mib(size)}{in_use}: the probe fits, but registering "
                               "larger GPU buffers (NCCL) will fail",
                       evidence=(evidence,), fix=resize_fix)
    return finding(id=finding_id, status=Status.OK, summary=f"BAR1 of {bdf} is {format_mib(size)}{in_use}",
                   evidence=(evidence,))


def nvml_finding(facts: dict[str, Any] | None) -> Finding:
    if not nvml.usable(facts):
        reason = (facts or {}).get("error", "no NVML facts were captured with this tree")
        return finding(id=ids.GPU_NVML, status=Status.SKIP,
                       summary="NVML unavailable, so the doctor falls back to sysfs and CUDA: BAR1 size without "
                               "usage, and no NVLink or C2C, so PXN and P2C paths are not judged",
                       evidence=(Evidence("import pynvml; nvmlInit()", reason),), fix=nvml.NVML_FIX)
    gpus = facts["gpus"]
    persistent = sum(bool(gpu.get("persistence_mode")) for gpu in gpus)
    return finding(id=ids.GPU_NVML, status=Status.INFO,
                   summary=f"NVML: driver {facts.get('driver_version')}, {len(gpus)} GPU(s), persistence mode on "
                           f"for {persistent}",
                   evidence=tuple(Evidence(f"NVML {gpu['pci_bus_id']}",
                                           f"NVLink links {len(gpu.get('nvlink_remote_bus_ids', []))}, "
                                           f"C2C links {gpu.get('c2c_link_count', 0)}, "
                                           f"persistence {'on' if gpu.get('persistence_mode') else 'off'}")
                                  for gpu in gpus))


# ---- per-GPU findings from the CUDA facts -----------------------------------


def attribute_evidence(gpu: dict[str, Any], key: str) -> Evidence:
    from gdrprobe.memory.cuda import ATTRIBUTE_NAMES

    name = ATTRIBUTE_NAMES[key]
    return Evidence(f"cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_{name}, {gpu['ordinal']})",
                    str(gpu.get(key)))


def rdma_support_finding(gpu: dict[str, Any]) -> Finding:
    supported = gpu.get("gpu_direct_rdma_supported")
    label = f"GPU {gpu['ordinal']} ({gpu['name']}, {gpu['pci_bus_id']})"
    return finding(
        id=ids.gpu_rdma(gpu['pci_bus_id']),
        status=Status.OK if supported else Status.FAIL,
        summary=f"{label} {'supports' if supported else 'does not support'} GPUDirect RDMA",
        evidence=(attribute_evidence(gpu, "gpu_direct_rdma_supported"),),
        fix="" if supported else "Use a data-centre or professional GPU (GeForce parts do not expose "
                                 "GPUDirect RDMA) and a driver that supports it.",
    )


def dmabuf_finding(gpu: dict[str, Any]) -> Finding:
    supported = gpu.get("dma_buf_supported")
    return finding(
        id=ids.gpu_dmabuf(gpu['pci_bus_id']),
        status=Status.OK if supported else Status.WARN,
        summary=f"GPU {gpu['ordinal']} {'can' if supported else 'cannot'} export memory as DMA-BUF"
                + ("" if supported else "; only the legacy nvidia-peermem path is left"),
        evidence=(attribute_evidence(gpu, "dma_buf_supported"),),
        fix="" if supported else "DMA-BUF export needs the Open Kernel Module driver, CUDA 11.7+ and kernel 5.12+.",
    )


def write_visibility_finding(gpu: dict[str, Any]) -> Finding:
    """How writes a NIC made into GPU memory become visible to CUDA work (probe's verification)."""
    options = gpu.get("gpu_direct_rdma_flush_writes_options") or 0
    ordering = gpu.get("gpu_direct_rdma_writes_ordering")
    option_names = [name for bit, name in FLUSH_OPTION_NAMES.items() if options & bit] or ["none"]
    return finding(
        id=ids.gpu_write_ordering(gpu['pci_bus_id']),
        status=Status.INFO,
        summary=f"GPU {gpu['ordinal']}: RDMA writes ordering {WRITES_ORDERING_NAMES.get(ordering, ordering)}, "
                f"flush options {', '.join(option_names)}",
        evidence=(attribute_evidence(gpu, "gpu_direct_rdma_writes_ordering"),
                  attribute_evidence(gpu, "gpu_direct_rdma_flush_writes_options")),
    )


def gpu_bdfs(ctx: DoctorContext, facts: dict[str, Any] | None) -> list[str]:
    """GPUs to read BAR1 of: those CUDA sees, or, without a driver, those on the PCI bus."""
    if facts and facts.get("gpus"):
        return [gpu["pci_bus_id"] for gpu in facts["gpus"]]
    return [gpu.bdf for gpu in ctx.topology.gpus]


def no_driver_finding(facts: dict[str, Any] | None) -> Finding:
    reason = facts["error"] if facts else "no CUDA facts were captured with this tree"
    return finding(id=ids.GPU_CUDA, status=Status.SKIP,
                   summary=f"per-GPU CUDA checks skipped: {reason}",
                   evidence=(Evidence("cuInit(0)", reason),))


# ---- the GPUs CUDA should list ------------------------------------------------

# Drivers that hand a PCI function to a virtual machine: such a GPU is not this host's CUDA's.
PASSTHROUGH_DRIVERS = ("vfio-pci", "pci-stub")
# The NVIDIA driver's own list of its GPUs, a directory per bus id. The NVIDIA container
# runtime shows a container only the GPUs it was given there (libnvidia-container
# src/nvc_mount.c: mount_procfs covers /proc/driver/nvidia with a tmpfs, mount_procfs_gpu
# binds back each given GPU's directory).
NVIDIA_PROCFS_GPUS = "/proc/driver/nvidia/gpus"
# cuDeviceGetName of a MIG device ("NVIDIA A100-SXM4-80GB MIG 1g.10gb"): a process
# enumerates one MIG device (MIG user guide, "CUDA Device Enumeration"), so CUDA's count
# says nothing of the GPUs then.
MIG_NAME_WORD = "MIG"


def bound_driver(ctx: DoctorContext, bdf: str) -> str | None:
    """The kernel driver a PCI function is bound to (its sysfs ``driver`` link), or None."""
    link = ctx.root.readlink(f"{pci.device_dir(bdf)}/driver")
    return link.rstrip("/").rsplit("/", 1)[-1] if link else None


def gpus_for_cuda(ctx: DoctorContext) -> tuple[str, ...]:
    """The NVIDIA GPUs in sysfs that CUDA should list: not handed to a virtual machine and,
    where the driver's procfs list exists, in it."""
    driver_listed = {pci_bus_id(name) for name in ctx.root.listdir(NVIDIA_PROCFS_GPUS)}
    return tuple(gpu.bdf for gpu in ctx.topology.gpus
                 if pci.is_nvidia_gpu(ctx.root, gpu.bdf)
                 and bound_driver(ctx, gpu.bdf) not in PASSTHROUGH_DRIVERS
                 and (not driver_listed or gpu.bdf in driver_listed))


def why_not_compared(ctx: DoctorContext, facts: dict[str, Any]) -> str | None:
    """Why CUDA's view cannot be held against sysfs here, or None when it can."""
    if "CUDA_VISIBLE_DEVICES" in ctx.process_environ:
        # CUDA shows the devices it lists, none when empty (CUDA C++ Programming Guide,
        # CUDA_VISIBLE_DEVICES): the view is the job's choice, not the node's.
        return "CUDA_VISIBLE_DEVICES is set"
    if ctx.container.kind is not None:
        return f"in a {ctx.container.kind} container sysfs lists the host's GPUs"
    if any(MIG_NAME_WORD in gpu.get("name", "").split() for gpu in facts.get("gpus", ())):
        return "MIG devices: CUDA enumerates one per process"
    return None


def cuda_gpu_fault(ctx: DoctorContext) -> GpuUnusable | None:
    """The node fault where CUDA lost GPUs sysfs lists: cuInit failing with a lost-GPU
    result, or fewer GPUs than sysfs has (:mod:`gdrprobe.memory.cuda_results`)."""
    from gdrprobe.memory.cuda_results import lost_gpus_error, missing_gpus_error

    facts = ctx.cuda_facts or {}
    if not facts or why_not_compared(ctx, facts):
        return None
    expected = gpus_for_cuda(ctx)
    if "gpus" in facts:
        return missing_gpus_error([gpu["pci_bus_id"] for gpu in facts["gpus"]], expected)
    return lost_gpus_error(facts.get("result", ""), expected, facts.get("call", "cuInit(0)"))


def lost_gpu_finding(fault: GpuUnusable) -> Finding:
    return finding(id=ids.GPU_CUDA, status=Status.FAIL, summary=fault.cause,
                   evidence=(Evidence("sysfs and the CUDA driver", fault.evidence),),
                   fix=fault.fix)


def check(ctx: DoctorContext) -> list[Finding]:
    facts = ctx.cuda_facts
    findings: list[Finding] = []
    fault = cuda_gpu_fault(ctx)
    if fault is not None:
        findings.append(lost_gpu_finding(fault))
    elif not facts or "error" in facts:
        findings.append(no_driver_finding(facts))
    if facts and "gpus" in facts:
        for gpu in facts["gpus"]:
            findings += [rdma_support_finding(gpu), dmabuf_finding(gpu), write_visibility_finding(gpu)]
    bdfs = gpu_bdfs(ctx, facts)
    findings += [bar1_finding(ctx, bdf) for bdf in bdfs]
    return findings + ([nvml_finding(ctx.nvml_facts)] if bdfs else [])
