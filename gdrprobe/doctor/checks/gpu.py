"""Per-GPU findings from the CUDA driver's facts (collected once, in
:mod:`gdrprobe.doctor.facts.context`), NVML's facts (:mod:`gdrprobe.doctor.facts.nvml`), and
the BAR1 aperture the NIC reads GPU memory through (NVML's total and used, else the size
sysfs shows).

Also whether the node's GPU runtime lists the GPUs the PCI bus has (its collector's
``lost_gpus``: CUDA's answer against the NVIDIA GPUs sysfs lists, by the rules of
:mod:`gdrprobe.memory.cuda_results`; amdkfd's GPUs against the AMD GPUs on the bus); a GPU
lost to the runtime fails ``gpu.<runtime>`` (``gpu.cuda``, ``gpu.rocm``) and the gate drains
on it (exit 11).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from gdrprobe.doctor.checks.probe_needs import MiB, PROBE_ARM_PINNED_BYTES, format_mib
from gdrprobe.doctor.facts import cuda, nvml, pci
from gdrprobe.doctor.facts.context import DoctorContext
from gdrprobe.errors import GpuUnusable
from gdrprobe.report import finding_ids as ids
from gdrprobe.report.model import Evidence, Finding, Status

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


HEX_FIELD = re.compile(r"(0x)?[0-9a-fA-F]{1,16}")   # a 64-bit address, as sysfs writes it


def bar1_bytes(resource_text: str) -> int | None:
    """BAR1 size from a sysfs ``resource`` file (line 1: start, end, flags in hex)."""
    lines = resource_text.splitlines()
    if len(lines) < 2:
        return None
    fields = lines[1].split()
    if len(fields) != 3 or not all(HEX_FIELD.fullmatch(field) for field in fields):
        return None
    start, end, _flags = (int(field, 16) for field in fields)
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


def nvml_gpu_line(gpu: dict[str, Any]) -> str:
    links = len(gpu["nvlinks"]) if "nvlinks" in gpu else len(gpu.get("nvlink_remote_bus_ids", []))
    persistence = gpu.get("persistence_mode")
    return (f"NVLink links up {links}, C2C links active {gpu.get('c2c_link_count', 0)}"
            + ("" if persistence is None else f", persistence {'on' if persistence else 'off'}"))


def nvml_finding(facts: dict[str, Any] | None) -> Finding:
    """What NVML told (NCCL's facts from the driver's libnvidia-ml.so.1, the doctor's extras
    from nvidia-ml-py), or why it told nothing."""
    if not nvml.usable(facts):
        # Read and failed: NCCL opens the same library the same way, and its topology detection
        # fails without it (src/misc/nvmlwrap.cc ncclNvmlEnsureInitialized, src/graph/xml.cc
        # ncclTopoFillGpu): a job in this environment would not start. Not captured: unknown.
        failed = facts is not None
        reason = (facts or {}).get("error", "no NVML facts were captured with this tree")
        return finding(id=ids.GPU_NVML, status=Status.WARN if failed else Status.SKIP,
                       summary="NVML unavailable: NCCL's NVLink and C2C facts are unknown, so a GPU that PXN or "
                               "P2C could serve is not decided, and BAR1 is read from sysfs without its usage"
                               + ("; NCCL itself fails to initialise where it cannot open and initialise NVML "
                                  "(src/misc/nvmlwrap.cc)" if failed else ""),
                       evidence=(Evidence("dlopen libnvidia-ml.so.1; nvmlInit_v2", reason),), fix=nvml.NVML_FIX)
    gpus = facts["gpus"]
    unread = facts.get("unread", {})
    evidence = tuple(Evidence(f"NVML {gpu.get('pci_bus_id') or f'index {index}'}", nvml_gpu_line(gpu))
                     for index, gpu in enumerate(gpus))
    evidence += tuple(Evidence(f"NVML {bdf}", f"unread: {why}") for bdf, why in unread.items())
    extras = facts.get("extras_error")
    return finding(id=ids.GPU_NVML, status=Status.WARN if unread else Status.INFO,
                   summary=f"NVML ({facts.get('library', 'nvidia-ml-py')}): {len(gpus)} GPU(s)"
                           + (f", driver {facts['driver_version']}" if facts.get("driver_version") else "")
                           + (f"; no handle for {len(unread)} GPU(s) sysfs lists, whose NVLink and C2C are "
                              "unknown" if unread else ""),
                   evidence=evidence + ((Evidence("nvidia-ml-py", extras),) if extras else ()),
                   fix=nvml.NVML_FIX if unread else "")


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


# ---- the GPUs the runtime should list -------------------------------------------------


def runtime_gpu_fault(ctx: DoctorContext) -> GpuUnusable | None:
    """The node fault where the node's GPU runtime lost GPUs the PCI bus holds (its
    collector's ``lost_gpus``), or None."""
    return ctx.gpu_collector.lost_gpus(ctx)


def lost_gpu_finding(ctx: DoctorContext, fault: GpuUnusable) -> Finding:
    return finding(id=ids.gpu_runtime(ctx.runtime.key), status=Status.FAIL, summary=fault.cause,
                   evidence=(Evidence(f"sysfs and {ctx.runtime.name}", fault.evidence),),
                   fix=fault.fix)


def check(ctx: DoctorContext) -> list[Finding]:
    facts = ctx.cuda_facts
    findings: list[Finding] = []
    fault = runtime_gpu_fault(ctx)
    if fault is not None:
        findings.append(lost_gpu_finding(ctx, fault))
    elif ctx.gpu_collector is cuda and (not facts or "error" in facts):
        findings.append(no_driver_finding(facts))
    if facts and "gpus" in facts:
        for gpu in facts["gpus"]:
            findings += [rdma_support_finding(gpu), dmabuf_finding(gpu), write_visibility_finding(gpu)]
    bdfs = gpu_bdfs(ctx, facts)
    findings += [bar1_finding(ctx, bdf) for bdf in bdfs]
    # NVML is NVIDIA's: RCCL reads none on an AMD node.
    return findings + ([nvml_finding(ctx.nvml_facts)] if bdfs and ctx.nccl_rules.library != "RCCL" else [])
