"""What the doctor reads of a CUDA node (the CUDA runtime's collector,
:mod:`gdrprobe.doctor.facts.runtimes`): the driver's inventory of its GPUs, the NVIDIA GPUs
the driver should list and the ones it lost, and NCCL as its collective library.

The inventory (:func:`gpu_inventory`) asks the driver through the same door as the GPU arm
(:mod:`gdrprobe.memory.cuda_driver`), imported when collected, so the doctor replays a
capture where cuda-python is absent. Which GPUs CUDA should list and the rules that turn a
shortfall into a node fault (:mod:`gdrprobe.memory.cuda_results`) are NVIDIA's: a GPU lost to
CUDA fails ``gpu.cuda`` and the gate drains on it (exit 11).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gdrprobe.doctor.facts import CAPTURE_DIR, pci
from gdrprobe.doctor.facts.nccl_library import NCCL
from gdrprobe.errors import GdrprobeError, GpuUnusable
from gdrprobe.sysroot import SysRoot, pci_bus_id

if TYPE_CHECKING:
    from gdrprobe.doctor.facts.context import DoctorContext
    from gdrprobe.nccl.gdr_support import MemoryPaths

COLLECTIVE = NCCL
FACTS_FILE = CAPTURE_DIR + "/cuda.json"
# The NVIDIA driver's own list of its GPUs, a directory per bus id. The NVIDIA container
# runtime shows a container only the GPUs it was given there (libnvidia-container
# src/nvc_mount.c: mount_procfs covers /proc/driver/nvidia with a tmpfs, mount_procfs_gpu
# binds back each given GPU's directory).
NVIDIA_PROCFS_GPUS = "/proc/driver/nvidia/gpus"
# cuDeviceGetName of a MIG device ("NVIDIA A100-SXM4-80GB MIG 1g.10gb"): a process
# enumerates one MIG device (MIG user guide, "CUDA Device Enumeration"), so CUDA's count
# says nothing of the GPUs then.
MIG_NAME_WORD = "MIG"


# ---- the inventory ---------------------------------------------------------------------


def device_facts(module, ordinal: int) -> dict:
    """What the doctor records about one GPU, as JSON-ready data."""
    from gdrprobe.memory.cuda import device_bus_id, device_name, read_attributes
    from gdrprobe.memory.cuda_driver import call, device_attribute

    device = call(module, "cuDeviceGet", ordinal, what=f"cuDeviceGet({ordinal})")
    return {"ordinal": ordinal, "name": device_name(module, device),
            "pci_bus_id": device_bus_id(module, device),
            "total_memory_bytes": int(call(module, "cuDeviceTotalMem", device)),
            # NCCL's send-side GDR default depends on it (paths.cc ncclTopoCheckGdr: sm80).
            "compute_capability_major": device_attribute(module, device, "COMPUTE_CAPABILITY_MAJOR"),
            "compute_capability_minor": device_attribute(module, device, "COMPUTE_CAPABILITY_MINOR"),
            # NCCL turns GIN off without it (src/init.cc globalCuMemGdrSupport; nccl/gin.py).
            "gpu_direct_rdma_with_cuda_vmm_supported": device_attribute(
                module, device, "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED"),
            **read_attributes(module, device).as_dict()}


def gpu_inventory(module=None) -> dict:
    """The driver's version and every GPU it sees (:func:`device_facts`); module replaces
    cuda-python's in tests. Raises the error that says why there is no driver."""
    from gdrprobe.memory.cuda_driver import call, driver, driver_version, initialised

    module = driver() if module is None else initialised(module)
    count = call(module, "cuDeviceGetCount", what="cuDeviceGetCount()")
    return {"driver_version": driver_version(module),
            "gpus": [device_facts(module, ordinal) for ordinal in range(count)]}


def collect_cuda_facts(driver=None) -> dict[str, Any]:
    """:func:`gpu_inventory` as JSON-ready data, or ``{"error": reason}`` when there is no
    driver to ask, with ``"result"`` and ``"call"``: the CUresult's name and the call that
    returned it, where the driver answered one (:mod:`gdrprobe.memory.cuda_results`).
    ``driver`` replaces cuda-python's module in tests."""
    try:
        return gpu_inventory(driver)
    except GdrprobeError as error:
        reason = "; ".join(part for part in (error.cause, error.evidence) if part)
        result = getattr(error, "cuda_result", "")
        answer = {"result": result, "call": error.cuda_call} if result else {}
        return {"error": reason, **answer}


def collect(ctx: DoctorContext) -> dict[str, Any]:
    return collect_cuda_facts()


def listed_gpus(root: SysRoot, runtime: Any) -> tuple[str, ...]:
    """NVIDIA's GPU functions on the bus: what NCCL places in its topology."""
    return runtime.bus_gpus(root)


def memory_paths(ctx: DoctorContext, paths: MemoryPaths) -> MemoryPaths:
    """NCCL's registration rules are the memory paths' own (:mod:`gdrprobe.nccl.gdr_support`)."""
    return paths


# ---- the GPUs CUDA should list -----------------------------------------------------------


def gpus_for_cuda(ctx: DoctorContext) -> tuple[str, ...]:
    """The NVIDIA GPUs in sysfs that CUDA should list: not handed to a virtual machine and,
    where the driver's procfs list exists, in it."""
    driver_listed = {pci_bus_id(name) for name in ctx.root.listdir(NVIDIA_PROCFS_GPUS)}
    return tuple(bdf for bdf in ctx.runtime.bus_gpus(ctx.root)
                 if not pci.passed_through(ctx.root, bdf)
                 and (not driver_listed or bdf in driver_listed))


def why_not_compared(ctx: DoctorContext, facts: dict[str, Any]) -> str | None:
    """Why CUDA's view cannot be held against sysfs here, or None when it can."""
    hidden = ctx.runtime.hidden_by(ctx.process_environ)
    if hidden:
        # CUDA shows the devices it lists, none when empty (CUDA C++ Programming Guide,
        # CUDA_VISIBLE_DEVICES): the view is the job's choice, not the node's.
        return f"{' and '.join(hidden)} {'is' if len(hidden) == 1 else 'are'} set"
    if ctx.container.kind is not None:
        return f"in a {ctx.container.kind} container sysfs lists the host's GPUs"
    if any(MIG_NAME_WORD in gpu.get("name", "").split() for gpu in facts.get("gpus", ())):
        return "MIG devices: CUDA enumerates one per process"
    return None


def lost_gpus(ctx: DoctorContext) -> GpuUnusable | None:
    """The node fault where CUDA lost GPUs sysfs lists: cuInit failing with a lost-GPU
    result, or fewer GPUs than sysfs has (:mod:`gdrprobe.memory.cuda_results`)."""
    from gdrprobe.memory.cuda_results import lost_gpus_error, missing_gpus_error

    facts = ctx.gpu_facts or {}
    if not facts or why_not_compared(ctx, facts):
        return None
    expected = gpus_for_cuda(ctx)
    if "gpus" in facts:
        return missing_gpus_error([gpu["pci_bus_id"] for gpu in facts["gpus"]], expected)
    return lost_gpus_error(facts.get("result", ""), expected, facts.get("call", "cuInit(0)"))
