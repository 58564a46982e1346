"""Per-GPU facts from the CUDA driver, and the BAR1 aperture the NIC reads GPU memory through.

:func:`collect_cuda_facts` is the only place the doctor talks to the CUDA driver; its
result is plain JSON so that the capture command can store it and a replay can read it
back (see :mod:`gdrprobe.doctor.context`).
"""

from __future__ import annotations

import functools
from typing import Any

from gdrprobe import cuda
from gdrprobe.cuda import c_string, device_attribute, import_driver, sysfs_bdf
from gdrprobe.doctor.context import DoctorContext
from gdrprobe.errors import GdrprobeError
from gdrprobe.report import Evidence, Finding, Status

finding = functools.partial(Finding, group="gpu")

MiB = 1 << 20
# What the probe pins per arm: a source and a destination buffer of 8 MiB.
PROBE_BUFFERS_PER_ARM = 2
PROBE_BUFFER_BYTES = 8 * MiB
PROBE_ARM_PINNED_BYTES = PROBE_BUFFERS_PER_ARM * PROBE_BUFFER_BYTES
# A BAR1 this small means the firmware did not resize the BAR: the probe fits, real
# workloads (NCCL registers far more) will fail to register GPU memory.
SMALL_BAR1_BYTES = 256 * MiB

# cuDeviceGetAttribute names (CU_DEVICE_ATTRIBUTE_<name>) and the fact keys they fill.
DEVICE_ATTRIBUTES = {
    "GPU_DIRECT_RDMA_SUPPORTED": "gpu_direct_rdma_supported",
    "DMA_BUF_SUPPORTED": "dma_buf_supported",
    "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS": "gpu_direct_rdma_flush_writes_options",
    "GPU_DIRECT_RDMA_WRITES_ORDERING": "gpu_direct_rdma_writes_ordering",
}
FLUSH_OPTION_NAMES = {1: "host", 2: "memops"}
WRITES_ORDERING_NAMES = {0: "none", 100: "owner", 200: "all devices"}


# ---- collecting facts from the driver ---------------------------------------


def gpu_facts(driver, ordinal: int) -> dict[str, Any]:
    device = cuda.check(driver.cuDeviceGet(ordinal), "cuDeviceGet")
    facts: dict[str, Any] = {
        "ordinal": ordinal,
        "name": c_string(cuda.check(driver.cuDeviceGetName(256, device), "cuDeviceGetName")),
        "pci_bus_id": sysfs_bdf(c_string(cuda.check(driver.cuDeviceGetPCIBusId(64, device),
                                               "cuDeviceGetPCIBusId"))),
        "total_memory_bytes": int(cuda.check(driver.cuDeviceTotalMem(device), "cuDeviceTotalMem")),
    }
    for name, key in DEVICE_ATTRIBUTES.items():
        facts[key] = device_attribute(driver, device, name)
    return facts


def facts_from_driver(driver) -> dict[str, Any]:
    cuda.check(driver.cuInit(0), "cuInit(0)")
    count = cuda.check(driver.cuDeviceGetCount(), "cuDeviceGetCount")
    return {
        "driver_version": int(cuda.check(driver.cuDriverGetVersion(), "cuDriverGetVersion")),
        "gpus": [gpu_facts(driver, ordinal) for ordinal in range(count)],
    }


def collect_cuda_facts(driver=None) -> dict[str, Any]:
    """Facts from the CUDA driver as JSON-ready data.

    Success: ``{"driver_version": 12080, "gpus": [{"ordinal", "name", "pci_bus_id",
    "total_memory_bytes", "gpu_direct_rdma_supported", "dma_buf_supported",
    "gpu_direct_rdma_flush_writes_options", "gpu_direct_rdma_writes_ordering"}, ...]}``
    (an attribute the driver does not know is None). Failure: ``{"error": reason}``.
    ``driver`` replaces cuda-python's module in tests.
    """
    if driver is None:
        try:
            driver = import_driver()
        except ImportError as error:
            return {"error": f"cuda-python is not installed ({error})"}
    try:
        return facts_from_driver(driver)
    except GdrprobeError as error:
        return {"error": f"CUDA driver call failed: {error.cause}"}
    except RuntimeError as error:
        # No libcuda: the bindings load it lazily and the first call raises.
        return {"error": f"no CUDA driver: {error}"}


# ---- BAR1 -------------------------------------------------------------------


def resource_path(bdf: str) -> str:
    return f"/sys/bus/pci/devices/{bdf}/resource"


def bar1_bytes(resource_text: str) -> int | None:
    """BAR1 size from a sysfs ``resource`` file (line 1: start, end, flags in hex)."""
    lines = resource_text.splitlines()
    if len(lines) < 2:
        return None
    start, end, _flags = (int(field, 16) for field in lines[1].split())
    return end - start + 1 if end > start else None


def format_mib(size: int) -> str:
    return f"{size // MiB} MiB"


def bar1_finding(ctx: DoctorContext, bdf: str) -> Finding:
    path = resource_path(bdf)
    text = ctx.root.read(path)
    size = bar1_bytes(text) if text else None
    finding_id = f"gpu.{bdf}.bar1"
    if size is None:
        return finding(id=finding_id, status=Status.SKIP, summary=f"BAR1 size of {bdf} could not be read",
                       evidence=(Evidence(path, str(text)),))
    evidence = (Evidence(path + " (line 1)", text.splitlines()[1]),)
    resize_fix = ("Enable \"Above 4G Decoding\" and \"Resizable BAR\" in the BIOS, then power-cycle; "
                  "some servers also need a VBIOS update.")
    if size < PROBE_ARM_PINNED_BYTES:
        return finding(id=finding_id, status=Status.FAIL,
                       summary=f"BAR1 of {bdf} is {format_mib(size)}, smaller than the "
                               f"{format_mib(PROBE_ARM_PINNED_BYTES)} the probe pins per arm",
                       evidence=evidence, fix=resize_fix)
    if size <= SMALL_BAR1_BYTES:
        return finding(id=finding_id, status=Status.WARN,
                       summary=f"BAR1 of {bdf} is only {format_mib(size)}: the probe fits, but registering "
                               "larger GPU buffers (NCCL) will fail",
                       evidence=evidence, fix=resize_fix)
    return finding(id=finding_id, status=Status.OK, summary=f"BAR1 of {bdf} is {format_mib(size)}",
                   evidence=evidence)


# ---- per-GPU findings from the CUDA facts -----------------------------------


def attribute_evidence(gpu: dict[str, Any], name: str) -> Evidence:
    return Evidence(f"cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_{name}, {gpu['ordinal']})",
                    str(gpu.get(DEVICE_ATTRIBUTES[name])))


def rdma_support_finding(gpu: dict[str, Any]) -> Finding:
    supported = gpu.get("gpu_direct_rdma_supported")
    label = f"GPU {gpu['ordinal']} ({gpu['name']}, {gpu['pci_bus_id']})"
    return finding(
        id=f"gpu.{gpu['pci_bus_id']}.rdma",
        status=Status.OK if supported else Status.FAIL,
        summary=f"{label} {'supports' if supported else 'does not support'} GPUDirect RDMA",
        evidence=(attribute_evidence(gpu, "GPU_DIRECT_RDMA_SUPPORTED"),),
        fix="" if supported else "Use a data-centre or professional GPU (GeForce parts do not expose "
                                 "GPUDirect RDMA) and a driver that supports it.",
    )


def dmabuf_finding(gpu: dict[str, Any]) -> Finding:
    supported = gpu.get("dma_buf_supported")
    return finding(
        id=f"gpu.{gpu['pci_bus_id']}.dmabuf",
        status=Status.OK if supported else Status.WARN,
        summary=f"GPU {gpu['ordinal']} {'can' if supported else 'cannot'} export memory as DMA-BUF"
                + ("" if supported else "; only the legacy nvidia-peermem path is left"),
        evidence=(attribute_evidence(gpu, "DMA_BUF_SUPPORTED"),),
        fix="" if supported else "DMA-BUF export needs the Open Kernel Module driver, CUDA 11.7+ and kernel 5.12+.",
    )


def write_visibility_finding(gpu: dict[str, Any]) -> Finding:
    """How writes a NIC made into GPU memory become visible to CUDA work (probe's verification)."""
    options = gpu.get("gpu_direct_rdma_flush_writes_options") or 0
    ordering = gpu.get("gpu_direct_rdma_writes_ordering")
    option_names = [name for bit, name in FLUSH_OPTION_NAMES.items() if options & bit] or ["none"]
    return finding(
        id=f"gpu.{gpu['pci_bus_id']}.write_ordering",
        status=Status.INFO,
        summary=f"GPU {gpu['ordinal']}: RDMA writes ordering {WRITES_ORDERING_NAMES.get(ordering, ordering)}, "
                f"flush options {', '.join(option_names)}",
        evidence=(attribute_evidence(gpu, "GPU_DIRECT_RDMA_WRITES_ORDERING"),
                  attribute_evidence(gpu, "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS")),
    )


def gpu_bdfs(ctx: DoctorContext, facts: dict[str, Any] | None) -> list[str]:
    """GPUs to read BAR1 of: those CUDA sees, or, without a driver, those on the PCI bus."""
    if facts and facts.get("gpus"):
        return [gpu["pci_bus_id"] for gpu in facts["gpus"]]
    return [gpu.bdf for gpu in ctx.topology.gpus]


def no_driver_finding(facts: dict[str, Any] | None) -> Finding:
    reason = facts["error"] if facts else "no CUDA facts were captured with this tree"
    return finding(id="gpu.cuda", status=Status.SKIP,
                   summary=f"per-GPU CUDA checks skipped: {reason}",
                   evidence=(Evidence("cuInit(0)", reason),))


def check(ctx: DoctorContext) -> list[Finding]:
    facts = ctx.cuda_facts
    findings: list[Finding] = []
    if not facts or "error" in facts:
        findings.append(no_driver_finding(facts))
    else:
        for gpu in facts["gpus"]:
            findings += [rdma_support_finding(gpu), dmabuf_finding(gpu), write_visibility_finding(gpu)]
    findings += [bar1_finding(ctx, bdf) for bdf in gpu_bdfs(ctx, facts)]
    return findings
